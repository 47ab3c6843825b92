//! `tidings demo checkout`: the whole system in one process, or one of its
//! parts per process ([`Role`]).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use indicatif::{ProgressBar, ProgressStyle};
use rand::Rng;
use serde::Serialize;
use tidings::sql::StoreOptions;
use tidings::{AnyBroker, AnyStore, Topology, TransportOptions};
use tidings_broker_kafka::KafkaOptions;
use tidings_broker_nats::NatsOptions;
use tidings_broker_rabbitmq::RabbitOptions;
use tidings_consumer::{Consumer, ConsumerConfig, ConsumerStats, Handler};
use tidings_core::duplicating::Duplicating;
use tidings_core::log::LogBackend;
use tidings_core::retry::Retry;
use tidings_core::secret::redact_url as redact;
use tidings_core::{Backoff, Envelope, Message, OutgoingMessage, Publisher, Subscriber};
use tidings_log::LogReaderConfig;
use tidings_relay::{Relay, RelayConfig};
use tidings_store_sqlite::SqliteStore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::handlers::{Analytics, Checkout, Email, EmailProvider, Inventory, Loyalty, ProviderTally};
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
    /// Give up waiting for the system to drain after this long.
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
}

impl Default for DemoOptions {
    fn default() -> Self {
        DemoOptions {
            orders: 1000,
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
        }
    }
}

/// How the demo shows its progress on stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// Nothing.
    Off,
    /// A progress bar (for a terminal).
    Bar,
    /// A line every two seconds (for logs).
    Lines,
}

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
        let list = |m: &BTreeMap<String, i64>| {
            if m.is_empty() {
                "0".to_owned()
            } else {
                m.iter()
                    .map(|(k, v)| format!("{k} {v}"))
                    .collect::<Vec<_>>()
                    .join(" · ")
            }
        };
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
        writeln!(
            f,
            "  drained              {}",
            if self.drained { "yes" } else { "NO (timed out)" }
        )?;
        write!(
            f,
            "  elapsed              {:.1} s",
            self.elapsed_ms as f64 / 1000.0
        )
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
    let store = tidings::open_store_with(&url, store_options)
        .await
        .with_context(|| {
            let database = tidings::database_named(&url).unwrap_or("the database");
            format!("connecting to {database} at {}", redact(&url))
        })?;
    match store {
        AnyStore::Postgres(store) => {
            // The provider is another system: it gets its own connections, or a
            // handler holding a pool connection could wait on the same pool.
            let provider_pool = sqlx::postgres::PgPoolOptions::new()
                .max_connections(4)
                .connect(&url)
                .await?;
            let provider = EmailProvider::Postgres(provider_pool);
            let label = format!("postgres ({})", redact(&url));
            run_on(store, provider, options, label, role, shutdown).await
        }
        AnyStore::MySql(store) => {
            // The provider is another system: it gets its own connections.
            let provider_pool = sqlx::mysql::MySqlPoolOptions::new()
                .max_connections(4)
                .connect(&url)
                .await?;
            let provider = EmailProvider::MySql(provider_pool);
            let label = format!("mysql ({})", redact(&url));
            run_on(store, provider, options, label, role, shutdown).await
        }
        AnyStore::Sqlite(store) => {
            let path = url
                .strip_prefix("sqlite://")
                .or_else(|| url.strip_prefix("sqlite:"))
                .unwrap_or(&url);
            // The provider is another system: it gets its own file.
            let provider_db = SqliteStore::connect(&format!("{path}.provider")).await?;
            let provider = EmailProvider::Sqlite(provider_db.pool().clone());
            let label = format!("sqlite ({path})");
            run_on(store, provider, options, label, role, shutdown).await
        }
        other => anyhow::bail!(
            "the demo runs on PostgreSQL, MySQL or SQLite, not {}",
            other.database()
        ),
    }
}

async fn run_on<S>(
    store: S,
    provider: EmailProvider,
    options: DemoOptions,
    label: String,
    role: Role,
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

    let mut tasks = JoinSet::new();
    let (relays, consumers) = (role != Role::Consumers, role != Role::Relay);

    let system = format!("demo-{}", store.system_id().await?);
    let transport = Transport::open(&store, options.broker.as_deref(), options.partitions, &system).await?;
    if transport.namespace.is_some() {
        // A broker (the log takes any event): an order it could not take
        // fails at the front door.
        store.refuse_what_it_refuses(transport.publisher.clone())?;
    }
    // Every group exists on the transport before anything is published (on
    // RabbitMQ, a queue only receives what is published after it exists).
    for (group, topic) in [(COMMAND_CONSUMER, COMMANDS)]
        .into_iter()
        .chain(EVENT_CONSUMERS.map(|c| (c, ORDERS)))
        .filter(|_| consumers)
    {
        transport.subscriber.ensure_group(group, topic).await?;
    }
    // Each relay one of its own, as if in its own process, sharing the outbox's partitions.
    let mut relay_stats = Vec::new();
    for _ in 0..options.relays.max(1) * usize::from(relays) {
        let relay = Relay::new(store.clone(), transport.publisher.clone()).config(
            RelayConfig::default()
                .poll_interval(Duration::from_millis(100))
                .partitions(options.partitions)
                .lease_ttl(Duration::from_secs(3)),
        );
        relay_stats.push(relay.stats());
        tasks.spawn(relay.run(shutdown.clone()));
    }

    if let Some(every) = options.sample_lag {
        let sampler = tidings_core::metrics::sample_lag(store.clone(), every, shutdown.clone());
        tasks.spawn(async move {
            sampler.await;
            Ok(())
        });
    }

    let duplicating = Duplicating::new(transport.subscriber.clone(), options.duplicate_rate);
    let injected = duplicating.injected();
    let subscriber: Arc<dyn Subscriber> = Arc::new(duplicating);
    // (The relay publishes through `transport.publisher`; consumers read through `subscriber`.)

    let config = ConsumerConfig::default()
        .lanes(8)
        .max_attempts(4)
        .lease_ttl(Duration::from_secs(3))
        .backoff(Backoff::new(Duration::from_millis(5), Duration::from_millis(50)));
    let mut stats: Vec<Arc<ConsumerStats>> = Vec::new();
    macro_rules! spawn_consumer {
        ($name:expr, $topic:expr, $handler:expr) => {{
            // Each member a consumer of its own, as if in its own process.
            for _ in 0..options.members.max(1) * usize::from(consumers) {
                let consumer = Consumer::new($name, store.clone(), $handler)
                    .topic($topic)
                    .config(config.clone().source($name));
                stats.push(consumer.stats());
                let subscriber = subscriber.clone();
                let shutdown = shutdown.clone();
                tasks.spawn(async move { consumer.run(&*subscriber, shutdown).await });
            }
        }};
    }
    spawn_consumer!(COMMAND_CONSUMER, COMMANDS, Checkout);
    spawn_consumer!(
        "inventory",
        ORDERS,
        Inventory {
            warehouse_fixed: options.warehouse_fixed
        }
    );
    spawn_consumer!(
        "email",
        ORDERS,
        Email {
            provider: provider.clone()
        }
    );
    spawn_consumer!("analytics", ORDERS, Analytics);
    spawn_consumer!("loyalty", ORDERS, Loyalty);

    if role != Role::All {
        if consumers {
            tasks.spawn(report_stats(store.clone(), stats.clone(), shutdown.clone()));
            println!("ready");
        }
        // Biased: tasks end when shut down too, and that is not them stopping on their own.
        let stopped = tokio::select! {
            biased;
            _ = shutdown.cancelled() => None,
            done = tasks.join_next() => done,
        };
        shutdown.cancel();
        if let Some(done) = stopped {
            done.context("a demo task panicked")??;
            anyhow::bail!("a relay or consumer stopped on its own");
        }
        while let Some(joined) = tasks.join_next().await {
            joined.context("a demo task panicked")??;
        }
        return Ok(None);
    }

    // Roughly: 3 commands and 3 events per order, each event handled by 4 consumers.
    let expected_work = (options.orders * 15) as u64;
    let bar = if options.progress == Progress::Bar {
        ProgressBar::new(expected_work)
    } else {
        ProgressBar::hidden()
    };
    let mut last_line = Instant::now();
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} messages handled · {msg}",
        )
        .expect("valid template"),
    );

    let placed = Arc::new(AtomicUsize::new(0));
    let producers = place_orders(&store, &options, placed.clone());
    tokio::pin!(producers);
    let mut producing = true;
    let mut drained = false;
    let deadline = Instant::now() + options.drain_timeout;
    let mut tally;
    loop {
        if producing {
            tokio::select! {
                done = &mut producers => { done?; producing = false; }
                _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            }
        } else {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tally = match store.tally().await {
            Ok(tally) => tally,
            // The database restarting or failing over: the figures wait for
            // the next tick, as the producers, relays and consumers wait.
            Err(e) if transient(&store, &e) && Instant::now() < deadline => {
                tracing::warn!(error = %e, "reading the figures failed; trying again");
                continue;
            }
            Err(e) => return Err(e),
        };
        bar.set_position(work_done(&tally).saturating_sub(baseline_work));
        let placed_now = placed.load(Ordering::Relaxed);
        bar.set_message(format!("{placed_now} / {} orders placed", options.orders));
        if options.progress == Progress::Lines && last_line.elapsed() >= Duration::from_secs(2) {
            last_line = Instant::now();
            eprintln!(
                "[{:>5.1} s] {placed_now} / {} orders placed, {} messages handled, {} dead-lettered, outbox {}",
                started.elapsed().as_secs_f64(),
                options.orders,
                work_done(&tally).saturating_sub(baseline_work),
                tally.dead_letters.iter().map(|(_, n)| n).sum::<i64>(),
                tally.outbox_pending,
            );
        }
        if !producing && lost(&tally) == 0 && tally.outbox_pending == 0 {
            drained = true;
            break;
        }
        if Instant::now() > deadline {
            break;
        }
        // A relay or consumer that stopped on its own stopped on an error
        // (a refused configuration, say): waiting longer cannot help.
        if let Some(done) = tasks.try_join_next() {
            shutdown.cancel();
            done.context("a demo task panicked")??;
            anyhow::bail!("a relay or consumer stopped before the work was done");
        }
    }
    bar.finish_and_clear();
    shutdown.cancel();
    while let Some(joined) = tasks.join_next().await {
        joined.context("a demo task panicked")??;
    }
    let provider_tally = provider.tally().await?;
    Ok(Some(summarize(
        &transport,
        relay_stats.iter().map(|s| s.published()).sum(),
        label,
        &options,
        placed.load(Ordering::Relaxed),
        &tally,
        &provider_tally,
        &stats,
        injected.load(Ordering::Relaxed),
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

/// A transport opened from a URL: the database log, or a broker.
pub struct Transport {
    /// What the relays publish through.
    pub publisher: Arc<dyn Publisher>,
    /// What the consumers read.
    pub subscriber: Arc<dyn Subscriber>,
    /// Which transport (no credentials).
    pub label: String,
    /// The prefix of the system's resources on the broker, if any.
    pub namespace: Option<String>,
    broker: AnyBroker,
}

impl fmt::Debug for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Transport")
            .field("label", &self.label)
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

impl Transport {
    /// Opens `broker` (`nats://...`, `amqp://...`, `kafka://...`, or `None`
    /// / `log` for the database log of `store`) with `partitions` per
    /// topic, through [`tidings::open_transport_with`]. The broker's
    /// streams, exchanges and queues or topics are named after `system`, so
    /// that one system's resources stay apart from another's.
    pub async fn open<S: LogBackend + Clone>(
        store: &S,
        broker: Option<&str>,
        partitions: u32,
        system: &str,
    ) -> anyhow::Result<Transport> {
        let url = broker.unwrap_or("log");
        let mut options = TransportOptions::new(Topology::default().partitions(partitions));
        options.log = LogReaderConfig::default().poll_interval(Duration::from_millis(100));
        // A short ack wait: a member taking over a partition waits one out
        // when the previous reader left messages unacknowledged.
        let nats = format!("TIDINGS_{}", system.to_uppercase().replace('-', "_"));
        options.nats = NatsOptions::default()
            .stream_prefix(&nats)
            .ack_wait(Duration::from_secs(5));
        options.rabbitmq = RabbitOptions::default().prefix(format!("tidings-{system}"));
        options.kafka = KafkaOptions::default().prefix(format!("tidings-{system}."));
        let opened = tidings::open_transport_with(url, &options, store)
            .await
            .with_context(|| format!("opening the transport at {}", redact(url)))?;
        let namespace = match &opened.broker {
            AnyBroker::Nats(_) => Some(nats),
            AnyBroker::RabbitMq(_) => Some(format!("tidings-{system}")),
            AnyBroker::Kafka(_) => Some(format!("tidings-{system}.")),
            _ => None,
        };
        Ok(Transport {
            publisher: opened.publisher.clone(),
            subscriber: opened.subscriber.clone(),
            label: opened.label().to_owned(),
            namespace,
            broker: opened.broker,
        })
    }

    /// Removes what this system created on the broker for `topic` and its
    /// `groups`: the NATS stream or Kafka topic, or the groups' RabbitMQ
    /// queues (the database log keeps its rows).
    pub async fn remove(&self, topic: &str, groups: &[&str]) -> anyhow::Result<()> {
        match &self.broker {
            AnyBroker::Nats(nats) => nats.delete_topic(topic).await?,
            AnyBroker::Kafka(kafka) => kafka.delete_topic(topic).await?,
            AnyBroker::RabbitMq(rabbit) => {
                for group in groups {
                    rabbit.delete_group(topic, group).await?;
                }
            }
            _ => {}
        }
        Ok(())
    }
}

fn work_done(t: &Tally) -> u64 {
    let sum = |counts: &[(String, i64)]| counts.iter().map(|(_, n)| n).sum::<i64>();
    (sum(&t.processed) + sum(&t.dead_letters) + sum(&t.parked)).max(0) as u64
}

#[allow(clippy::too_many_arguments)]
fn summarize(
    transport: &Transport,
    published: u64,
    database: String,
    options: &DemoOptions,
    placed: usize,
    t: &Tally,
    provider: &ProviderTally,
    stats: &[Arc<ConsumerStats>],
    injected: u64,
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
        published,
        handled: t.processed.iter().cloned().collect(),
        duplicates_delivered: injected,
        duplicates_suppressed: stats.iter().map(|s| s.duplicates()).sum(),
        retries: stats.iter().map(|s| s.retries()).sum(),
        dead_lettered: t.dead_letters.iter().cloned().collect(),
        parked: t.parked.iter().cloned().collect(),
        lost: lost(t),
        order_violations: t.violations,
        duplicated_effects: provider.duplicated,
        provider_retries_absorbed: provider.calls - provider.sent,
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
    for _ in 0..options.producers.max(1) {
        let store = store.clone();
        let next = next.clone();
        let placed = placed.clone();
        let (orders, poison_rate) = (options.orders, options.poison_rate);
        producers.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= orders {
                    return anyhow::Ok(());
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

/// Whether `e` is worth another try: a lost connection, a database
/// restarting ([`Error::class`](tidings_core::Error::class)).
fn transient<S: CheckoutStore>(store: &S, e: &anyhow::Error) -> bool {
    if let Some(e) = e.downcast_ref::<tidings_core::Error>() {
        return e.class().is_retryable();
    }
    e.downcast_ref::<sqlx::Error>()
        .is_some_and(|e| store.error_class(e).is_retryable())
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
