//! `tidings demo checkout`: the whole system in one process, or one of its
//! parts per process ([`Role`]).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use rand::Rng;
use serde::Serialize;
use tidings::AnyStore;
use tidings::sql::StoreOptions;
use tidings_cdc_postgres::{CdcOptions, CdcStore};
use tidings_consumer::{ConsumerStats, Handler};
use tidings_core::retry::{Retry, transient};
use tidings_core::{Envelope, Message, OutgoingMessage};
use tidings_demo_kit::{Calls, Meter, Runner, Scale, SidePool, ThirdParty};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

pub use tidings_demo_kit::Transport;

use crate::handlers::{Analytics, Checkout, Email, Inventory, Loyalty};
use crate::messages::*;
use crate::system::{CheckoutStore, Tally};

/// The consumers of order events.
pub const EVENT_CONSUMERS: [&str; 4] = ["inventory", "email", "analytics", "loyalty"];
/// The consumer of checkout commands.
pub const COMMAND_CONSUMER: &str = "checkout";

/// The embedded default database.
pub const DEFAULT_DATABASE: &str = "sqlite://tidings-demo.db";

/// Which part of the system a process runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Role {
    /// Everything, then a summary ([`run`]).
    #[default]
    All,
    /// The relays, until shut down.
    Relay,
    /// The five consumers (each a member of its group), until shut down.
    /// Prints `ready` on stdout once every group exists on the transport.
    Consumers,
    /// Places the orders, then returns.
    Producer,
}

/// How to run the demo.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// Orders to place.
    pub orders: usize,
    /// At most this many orders a second; `None`: as fast as the database
    /// takes them.
    pub order_rate: Option<std::num::NonZeroU32>,
    /// `postgres://...` or `sqlite://path` (default: [`DEFAULT_DATABASE`]).
    pub database: Option<String>,
    /// `nats://host:port`, `amqp://user:pw@host:port/vhost`, or `None` for the database-log transport.
    pub broker: Option<String>,
    /// Fraction of deliveries redelivered a second time.
    pub duplicate_rate: f64,
    /// Fraction of orders the inventory service cannot handle.
    pub poison_rate: f64,
    /// The inventory service's fix has shipped: it handles poisoned orders
    /// (redrive their dead letters, then run with this set).
    pub warehouse_fixed: bool,
    /// How to show progress on stderr.
    pub progress: Progress,
    /// Give up waiting for the system to drain this long after the orders
    /// are placed.
    pub drain_timeout: Duration,
    /// Concurrent order producers.
    pub producers: usize,
    /// Members of each consumer group, sharing its partitions.
    pub members: usize,
    /// Relays, sharing the outbox's partitions.
    pub relays: usize,
    /// Partitions of every topic. Keep it from one run to the next: a new
    /// count gives each group new partitions to read from the start.
    pub partitions: u32,
    /// Measure lag this often into the metrics gauges
    /// ([`tidings_core::metrics::sample_lag`]); `None`: not at all.
    pub sample_lag: Option<Duration>,
    /// The store's pool size, shared by the producers, relays and consumer
    /// lanes of the process (default: the store's, 32). The simulated
    /// email provider keeps 4 connections of its own.
    pub max_connections: Option<u32>,
    /// On PostgreSQL, relay from logical replication (CDC) as this relay
    /// group (slot and publication `tidings_<group>`, dropped when a whole
    /// run ends) rather than by polling the outbox.
    pub cdc_group: Option<String>,
}

impl Default for DemoOptions {
    fn default() -> Self {
        DemoOptions {
            orders: 1000,
            order_rate: None,
            database: None,
            broker: None,
            duplicate_rate: 0.0,
            poison_rate: 0.0,
            warehouse_fixed: false,
            progress: Progress::Off,
            drain_timeout: Duration::from_secs(300),
            producers: 8,
            members: 1,
            relays: 1,
            partitions: 4,
            sample_lag: None,
            max_connections: None,
            cdc_group: None,
        }
    }
}

pub use tidings_demo_kit::Progress;

/// What the run did, read back from the database at the end.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// Which database (no credentials).
    pub database: String,
    /// Which transport (no credentials).
    pub transport: String,
    /// The prefix of this system's resources on the broker (streams, queues), if any.
    pub broker_namespace: Option<String>,
    /// Members per consumer group.
    pub members: usize,
    /// Relays.
    pub relays: usize,
    /// Partitions per topic.
    pub partitions: u32,
    /// Orders placed by this run.
    pub orders_placed: usize,
    /// Orders in the database (all runs).
    pub orders_total: i64,
    /// Poisoned orders in the database.
    pub poisoned_orders: i64,
    /// Commands committed through the outbox.
    pub commands_committed: i64,
    /// Events committed through the outbox.
    pub events_committed: i64,
    /// Messages the relay published (and the transport confirmed) in this run.
    pub published: u64,
    /// Messages handled (processed markers) per consumer.
    pub handled: BTreeMap<String, i64>,
    /// Duplicate deliveries injected by this run.
    pub duplicates_delivered: u64,
    /// Duplicate deliveries recognised and skipped by this run.
    pub duplicates_suppressed: u64,
    /// Handler attempts retried by this run.
    pub retries: u64,
    /// Dead letters per consumer.
    pub dead_lettered: BTreeMap<String, i64>,
    /// Messages parked per consumer: held behind a dead letter of their
    /// order, waiting for it to be redriven or skipped.
    pub parked: BTreeMap<String, i64>,
    /// Committed messages neither handled, dead-lettered nor parked by a consumer that should have.
    pub lost: i64,
    /// Events a consumer saw after a later event of the same order.
    pub order_violations: i64,
    /// Emails sent twice for the same order and kind.
    pub duplicated_effects: i64,
    /// Provider calls repeated with the same idempotency key (and so not repeated as emails).
    pub provider_retries_absorbed: i64,
    /// Whether derived state disagrees with the events (loyalty points, analytics counts).
    pub state_mismatches: Vec<String>,
    /// Whether everything was handled before the timeout.
    pub drained: bool,
    /// Wall-clock time of this run.
    pub elapsed_ms: u64,
}

impl Summary {
    /// True when nothing was lost, reordered, duplicated or left behind.
    pub fn ok(&self) -> bool {
        self.drained
            && self.lost == 0
            && self.order_violations == 0
            && self.duplicated_effects == 0
            && self.state_mismatches.is_empty()
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list = tidings_demo_kit::counts;
        writeln!(f, "checkout demo on {} over {}", self.database, self.transport)?;
        writeln!(
            f,
            "  scale                {} relay(s), {} member(s) per consumer group, {} partitions",
            self.relays, self.members, self.partitions
        )?;
        writeln!(
            f,
            "  orders placed        {} ({} in the database, {} poisoned)",
            self.orders_placed, self.orders_total, self.poisoned_orders
        )?;
        writeln!(f, "  commands committed   {}", self.commands_committed)?;
        writeln!(f, "  events committed     {}", self.events_committed)?;
        writeln!(f, "  published            {} (this run)", self.published)?;
        writeln!(f, "  handled              {}", list(&self.handled))?;
        writeln!(
            f,
            "  duplicates           {} delivered, {} suppressed",
            self.duplicates_delivered, self.duplicates_suppressed
        )?;
        writeln!(f, "  retries              {}", self.retries)?;
        writeln!(f, "  dead-lettered        {}", list(&self.dead_lettered))?;
        writeln!(
            f,
            "  parked               {} (behind their order's dead letter)",
            list(&self.parked)
        )?;
        writeln!(f, "  lost                 {}", self.lost)?;
        writeln!(f, "  order violations     {}", self.order_violations)?;
        writeln!(
            f,
            "  duplicated effects   {} ({} provider retries absorbed by idempotency keys)",
            self.duplicated_effects, self.provider_retries_absorbed
        )?;
        if !self.state_mismatches.is_empty() {
            writeln!(f, "  state mismatches     {}", self.state_mismatches.join("; "))?;
        }
        tidings_demo_kit::outcome(f, self.drained, &[], self.elapsed_ms)
    }
}

/// Messages committed but neither handled, dead-lettered nor parked, summed over consumers.
pub fn lost(t: &Tally) -> i64 {
    let missing = |consumer: &str, expected: i64| {
        (expected - t.processed_by(consumer) - t.dead_by(consumer) - t.parked_by(consumer)).max(0)
    };
    missing(COMMAND_CONSUMER, t.commands) + EVENT_CONSUMERS.iter().map(|c| missing(c, t.events)).sum::<i64>()
}

/// Runs the whole demo on the database the options name, and sums it up.
pub async fn run(options: DemoOptions) -> anyhow::Result<Summary> {
    let summary = open_and_run(options, Role::All, CancellationToken::new()).await?;
    Ok(summary.expect("the whole system sums up"))
}

/// Runs one part of the system until `shutdown` (the producer: until its
/// orders are placed), as one process of a system spread over several.
pub async fn run_role(options: DemoOptions, role: Role, shutdown: CancellationToken) -> anyhow::Result<()> {
    open_and_run(options, role, shutdown).await.map(drop)
}

/// Every message the system writes is checked against its schema and for
/// secrets before the outbox takes it.
fn guard() -> anyhow::Result<std::sync::Arc<tidings_schema::SchemaGuard>> {
    Ok(std::sync::Arc::new(tidings_schema::SchemaGuard::new(
        &crate::schemas(),
    )?))
}

async fn open_and_run(
    options: DemoOptions,
    role: Role,
    shutdown: CancellationToken,
) -> anyhow::Result<Option<Summary>> {
    let url = options
        .database
        .clone()
        .unwrap_or_else(|| DEFAULT_DATABASE.to_owned());
    let mut store_options = StoreOptions::default().source("checkout").guard(guard()?);
    if let Some(n) = options.max_connections {
        store_options = store_options.max_connections(n);
    }
    let store = tidings_demo_kit::open_store(&url, store_options).await?;
    // The email provider is another system: connections (or a file) of its own.
    let provider = ThirdParty::new(SidePool::open(&url, "provider").await?, "email");
    let label = tidings_demo_kit::label(&url);
    let cdc = match (&options.cdc_group, &store) {
        (None, _) => None,
        (Some(group), AnyStore::Postgres(pg)) => {
            let cdc = CdcStore::new(pg.clone(), &url, CdcOptions::default().group(group))?;
            // The publication names the outbox table: it must be there.
            pg.migrate().await.context("migrating Tidings' tables")?;
            cdc.prepare().await.context("preparing the CDC relay's slot")?;
            Some(cdc)
        }
        (Some(_), other) => anyhow::bail!(
            "--relay-mode cdc reads PostgreSQL's logical replication, not {}",
            other.database()
        ),
    };
    let whole = role == Role::All;
    let summary = match store {
        AnyStore::Postgres(store) => {
            run_on(store, provider, options, label, role, cdc.clone(), shutdown).await
        }
        AnyStore::MySql(store) => run_on(store, provider, options, label, role, None, shutdown).await,
        AnyStore::Sqlite(store) => run_on(store, provider, options, label, role, None, shutdown).await,
        other => anyhow::bail!(
            "the demo runs on PostgreSQL, MySQL or SQLite, not {}",
            other.database()
        ),
    };
    // A whole run leaves no slot behind: a slot nobody reads keeps the
    // server's log. A relay of a run spread over processes keeps it.
    if let (Some(cdc), true) = (cdc, whole) {
        cdc.close().await;
        tidings_cdc_postgres::slot::drop(cdc.pg().pool(), cdc.slot())
            .await
            .context("dropping the CDC relay's slot")?;
    }
    summary
}

async fn run_on<S>(
    store: S,
    provider: ThirdParty,
    options: DemoOptions,
    label: String,
    role: Role,
    cdc: Option<CdcStore>,
    shutdown: CancellationToken,
) -> anyhow::Result<Option<Summary>>
where
    S: CheckoutStore,
    Checkout: Handler<S::Database>,
    Inventory: Handler<S::Database>,
    Email: Handler<S::Database>,
    Analytics: Handler<S::Database>,
    Loyalty: Handler<S::Database>,
{
    let started = Instant::now();
    store.setup().await.context("setting up the checkout schema")?;
    provider.setup().await.context("setting up the email provider")?;
    if role == Role::Producer {
        place_orders(&store, &options, Arc::default()).await?;
        return Ok(None);
    }
    let baseline = store.tally().await?;
    let baseline_work = work_done(&baseline);

    let (relays, consumers) = (role != Role::Consumers, role != Role::Relay);
    let system = format!("demo-{}", store.system_id().await?);
    let transport = Transport::open(&store, options.broker.as_deref(), options.partitions, &system).await?;
    if transport.namespace.is_some() {
        // A broker (the log takes any event): an order it could not take
        // fails at the front door.
        store.refuse_what_it_refuses(transport.publisher.clone())?;
    }
    // Every group exists on the transport before anything is published (on
    // RabbitMQ, a queue only receives what is published after it exists);
    // all at once, for a broker that answers slowly.
    let groups = [(COMMAND_CONSUMER, COMMANDS)]
        .into_iter()
        .chain(EVENT_CONSUMERS.map(|c| (c, ORDERS)))
        .filter(|_| consumers)
        .map(|(group, topic)| {
            let transport = &transport;
            async move {
                // A broker away for a moment (restarting, frozen) is waited for.
                let what = format!("making consumer group {group}'s subscription of {topic}");
                transient(&Retry::default(), &what, || {
                    transport.subscriber.ensure_group(group, topic)
                })
                .await
            }
        });
    futures::future::try_join_all(groups).await?;
    let scale = Scale {
        members: options.members,
        relays: options.relays,
        partitions: options.partitions,
        duplicate_rate: options.duplicate_rate,
    };
    let mut system = Runner::new(store.clone(), &transport, scale, shutdown);
    match (relays, cdc) {
        (false, _) => {}
        (true, Some(cdc)) => system.relays_on(cdc, 1),
        (true, None) => system.relays(),
    }
    if let Some(every) = options.sample_lag {
        system.sample_lag(every);
    }
    if consumers {
        let config = tidings_demo_kit::consumer_config();
        system.consumer(COMMAND_CONSUMER, COMMANDS, Checkout, &config);
        let inventory = Inventory {
            warehouse_fixed: options.warehouse_fixed,
        };
        system.consumer("inventory", ORDERS, inventory, &config);
        let email = Email {
            provider: provider.clone(),
        };
        system.consumer("email", ORDERS, email, &config);
        system.consumer("analytics", ORDERS, Analytics, &config);
        system.consumer("loyalty", ORDERS, Loyalty, &config);
    }

    if role != Role::All {
        if consumers {
            let stats = system.consumer_stats().to_vec();
            let shutdown = system.shutdown().clone();
            system.spawn(report_stats(store.clone(), stats, shutdown));
            println!("ready");
        }
        system.until_shutdown().await?;
        return Ok(None);
    }

    // Roughly: 3 commands and 3 events per order, each event handled by 4 consumers.
    let mut meter = Meter::new(options.progress, (options.orders * 15) as u64, "messages handled");
    let placed = Arc::new(AtomicUsize::new(0));
    let producers = place_orders(&store, &options, placed.clone());
    let (tally, drained) = system
        .drain(
            producers,
            options.drain_timeout,
            || store.tally(),
            |tally, produced| {
                meter.show(
                    work_done(tally).saturating_sub(baseline_work),
                    &format!(
                        "{} / {} orders placed, {} dead-lettered, outbox {}",
                        placed.load(Ordering::Relaxed),
                        options.orders,
                        tally.dead_letters.iter().map(|(_, n)| n).sum::<i64>(),
                        tally.outbox_pending,
                    ),
                );
                produced && lost(tally) == 0 && tally.outbox_pending == 0
            },
        )
        .await?;
    meter.finish();
    system.stop().await?;
    let provider_tally = provider.calls().await?;
    Ok(Some(summarize(
        &transport,
        &system,
        label,
        &options,
        placed.load(Ordering::Relaxed),
        &tally,
        &provider_tally,
        drained,
        started.elapsed(),
    )))
}

/// Keeps this process's consumer counters in the database, twice a
/// second, so that a system spread over processes (some killed) can be
/// summed up: a killed process loses at most its last half second.
async fn report_stats<S: CheckoutStore>(
    store: S,
    stats: Vec<Arc<ConsumerStats>>,
    shutdown: CancellationToken,
) -> tidings_core::Result<()> {
    let process = uuid::Uuid::new_v4().to_string();
    loop {
        let duplicates = stats.iter().map(|s| s.duplicates()).sum::<u64>();
        let retries = stats.iter().map(|s| s.retries()).sum::<u64>();
        if let Err(e) = store
            .record_process(&process, duplicates as i64, retries as i64)
            .await
        {
            tracing::warn!(error = %e, "recording the process's counters failed");
        }
        if shutdown.is_cancelled() {
            return Ok(());
        }
        tidings_core::lease::sleep_unless(&shutdown, Duration::from_millis(500)).await;
    }
}

fn work_done(t: &Tally) -> u64 {
    let sum = |counts: &[(String, i64)]| counts.iter().map(|(_, n)| n).sum::<i64>();
    (sum(&t.processed) + sum(&t.dead_letters) + sum(&t.parked)).max(0) as u64
}

#[allow(clippy::too_many_arguments)]
fn summarize<S: CheckoutStore>(
    transport: &Transport,
    system: &Runner<S>,
    database: String,
    options: &DemoOptions,
    placed: usize,
    t: &Tally,
    provider: &Calls,
    drained: bool,
    elapsed: Duration,
) -> Summary {
    let mut mismatches = Vec::new();
    if drained && t.points_credited != t.points_expected {
        mismatches.push(format!(
            "loyalty credited {} points for shipped orders worth {}",
            t.points_credited, t.points_expected
        ));
    }
    if drained && t.analytics_counted != t.processed_by("analytics") {
        mismatches.push(format!(
            "analytics counted {} events but processed {}",
            t.analytics_counted,
            t.processed_by("analytics")
        ));
    }
    Summary {
        database,
        transport: transport.label.clone(),
        broker_namespace: transport.namespace.clone(),
        members: options.members.max(1),
        relays: options.relays.max(1),
        partitions: options.partitions,
        orders_placed: placed,
        orders_total: t.orders,
        poisoned_orders: t.poisoned_orders,
        commands_committed: t.commands,
        events_committed: t.events,
        published: system.published(),
        handled: t.processed.iter().cloned().collect(),
        duplicates_delivered: system.duplicates_delivered(),
        duplicates_suppressed: system.duplicates_suppressed(),
        retries: system.retries(),
        dead_lettered: t.dead_letters.iter().cloned().collect(),
        parked: t.parked.iter().cloned().collect(),
        lost: lost(t),
        order_violations: t.violations,
        duplicated_effects: provider.duplicated,
        provider_retries_absorbed: provider.calls - provider.done,
        state_mismatches: mismatches,
        drained,
        elapsed_ms: elapsed.as_millis() as u64,
    }
}

/// The front end: `producers` tasks placing orders, each order a sequence
/// of commands in separate transactions, interleaved with other orders.
async fn place_orders<S: CheckoutStore>(
    store: &S,
    options: &DemoOptions,
    placed: Arc<AtomicUsize>,
) -> anyhow::Result<()> {
    let next = Arc::new(AtomicUsize::new(0));
    let mut producers = JoinSet::new();
    let start = tokio::time::Instant::now();
    for _ in 0..options.producers.max(1) {
        let store = store.clone();
        let next = next.clone();
        let placed = placed.clone();
        let (orders, poison_rate, rate) = (options.orders, options.poison_rate, options.order_rate);
        producers.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= orders {
                    return anyhow::Ok(());
                }
                // Order i is due i / rate seconds after the start.
                if let Some(rate) = rate {
                    let due = Duration::from_secs_f64(i as f64 / f64::from(rate.get()));
                    tokio::time::sleep_until(start + due).await;
                }
                // One order, one trace: its commands start in this span.
                let span = tracing::info_span!("checkout.place_order", order = i);
                place_one(&store, i, poison_rate).instrument(span).await?;
                placed.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    while let Some(done) = producers.join_next().await {
        done??;
    }
    Ok(())
}

/// Submits one step of an order as a client would: a database restarting
/// or failing over mid-transaction is a pause, not the end of the client.
async fn submit<S: CheckoutStore>(store: &S, step: i64, command: &OutgoingMessage) -> anyhow::Result<()> {
    tidings_core::retry::transaction(&Retry::default(), || store.submit(step, command)).await?;
    Ok(())
}

async fn place_one<S: CheckoutStore>(store: &S, i: usize, poison_rate: f64) -> anyhow::Result<()> {
    let (poisoned, customer, sku, quantity, total, cancel) = {
        let mut rng = rand::rng();
        let poisoned = rng.random_bool(poison_rate.clamp(0.0, 1.0));
        (
            poisoned,
            rng.random_range(0..200),
            rng.random_range(1..50),
            rng.random_range(1..5),
            rng.random_range(500..50_000),
            rng.random_bool(0.1),
        )
    };
    let order_id = format!("ord-{}", uuid::Uuid::now_v7().simple());
    let place = PlaceOrder {
        order_id: order_id.clone(),
        customer_id: format!("cus-{customer}"),
        sku: if poisoned {
            format!("POISON-{i}")
        } else {
            format!("SKU-{sku}")
        },
        quantity,
        total_cents: total,
    };
    let first = command(&place, None)?;
    // The client's later calls for the order carry its correlation id and trace.
    let order = Some(&first.envelope);
    submit(store, 1, &first).await?;
    pause().await;
    let capture = command(
        &CapturePayment {
            order_id: order_id.clone(),
        },
        order,
    )?;
    submit(store, 2, &capture).await?;
    pause().await;
    let last = if cancel {
        command(&CancelOrder { order_id }, order)?
    } else {
        command(&ShipOrder { order_id }, order)?
    };
    submit(store, 3, &last).await
}

/// A command from the checkout API; after the first of an order, in the
/// first's conversation: its correlation id, and its trace.
fn command<M: Message>(message: &M, order: Option<&Envelope>) -> anyhow::Result<OutgoingMessage> {
    let mut envelope = Envelope::new("checkout-api", message)?;
    if let Some(first) = order {
        envelope.correlation_id = first.correlation_id;
        if let Some(trace) = first.trace() {
            envelope = envelope.header(tidings_core::trace::TRACEPARENT, trace.child().to_header());
        }
    }
    Ok(OutgoingMessage {
        topic: M::TOPIC.to_owned(),
        envelope,
    })
}

/// Lets other orders' commands interleave with this one's.
async fn pause() {
    let ms = rand::rng().random_range(0..3);
    tokio::time::sleep(Duration::from_millis(ms)).await;
}
