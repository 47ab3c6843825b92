//! `tidings demo payments`: a payment provider's webhooks through the
//! inbox, the intake, the ledger and the notifications, then a replay of
//! the whole run that must change nothing.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde::Serialize;
use tidings::AnyStore;
use tidings::sql::StoreOptions;
use tidings_consumer::Handler;
use tidings_core::replay::{ReplayCounts, ReplaySource};
use tidings_core::secret::Secret;
use tidings_demo_kit::{Calls, Meter, RunOptions, Runner, SidePool, ThirdParty, Transport, counts};
use tidings_inbox::{Inbox, Provider};
use tokio_util::sync::CancellationToken;

use crate::handlers::{CURRENCIES, Intake, Ledger, Notify, account};
use crate::messages::PAYMENTS;
use crate::provider::{Habits, ProviderReport};
use crate::stripe::STRIPE;
use crate::system::{PaymentsStore, Tally};

/// The consumers, in the order events reach them.
pub const CONSUMERS: [&str; 3] = ["intake", "ledger", "notify"];

/// How to run the demo.
#[derive(Debug, Clone)]
pub struct PaymentsOptions {
    /// Payments the simulated provider makes (0: none, only what is posted to `listen`).
    pub payments: usize,
    /// Fraction of payments in a currency the ledger has no accounts for.
    pub poison_rate: f64,
    /// Serve the inbox here (else on a free loopback port), and wait for
    /// `stop` before summing up, so that others can post to it.
    pub listen: Option<SocketAddr>,
    /// The endpoint's signing secret, from this file (else a fresh one).
    pub secret_file: Option<PathBuf>,
    /// With `listen`: serve until this is cancelled.
    pub stop: CancellationToken,
    /// The database, the broker, the scale, progress.
    pub run: RunOptions,
}

impl Default for PaymentsOptions {
    fn default() -> Self {
        PaymentsOptions {
            payments: 500,
            poison_rate: 0.0,
            listen: None,
            secret_file: None,
            stop: CancellationToken::new(),
            run: RunOptions::default(),
        }
    }
}

/// What the run did, read back from the database, and the invariants.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// Which database (no credentials).
    pub database: String,
    /// Which transport (no credentials).
    pub transport: String,
    /// The prefix of this system's resources on the broker (streams, queues), if any.
    pub broker_namespace: Option<String>,
    /// Where the inbox listened.
    pub webhook_url: String,
    /// What the simulated provider did (its truth).
    pub provider: ProviderReport,
    /// Stripe events the inbox took in this run (each once).
    pub stripe_events: i64,
    /// Payments captured in this run.
    pub captured_payments: i64,
    /// Payments refunded in this run.
    pub refunded_payments: i64,
    /// Refunds that arrived before their capture and waited for it (this run).
    pub refunds_waited: i64,
    /// Refunds still waiting for their capture (all runs): with `--webhook-listen`,
    /// a refund posted without its capture.
    pub refunds_waiting: i64,
    /// Payment events the intake emitted (this run).
    pub payment_events: i64,
    /// Messages handled per consumer (all runs).
    pub handled: BTreeMap<String, i64>,
    /// Dead letters per consumer (all runs).
    pub dead_lettered: BTreeMap<String, i64>,
    /// Messages parked behind a dead letter of their payment (all runs).
    pub parked: BTreeMap<String, i64>,
    /// Messages committed but neither handled, dead-lettered nor parked.
    pub lost: i64,
    /// Events a consumer saw after a later event of the same payment.
    pub order_violations: i64,
    /// Duplicate deliveries the transport injected, and those recognised.
    pub duplicates_delivered: u64,
    /// Duplicate deliveries recognised and skipped.
    pub duplicates_suppressed: u64,
    /// Ledger balances moved by this run: account -> currency -> amount.
    pub balances: BTreeMap<String, BTreeMap<String, i64>>,
    /// Ledger entries written by this run.
    pub ledger_entries: i64,
    /// Notifications sent by this run, and calls made (a retry with the same key is a call).
    pub notifications: i64,
    /// Calls to the notification service.
    pub notification_calls: i64,
    /// Notifications sent twice for one payment and kind (all runs).
    pub duplicated_effects: i64,
    /// What the replay of the run re-delivered, per consumer.
    pub replay: BTreeMap<String, ReplayCounts>,
    /// What the replay changed (ledger, balances, notifications); empty when nothing.
    pub replay_changed: Vec<String>,
    /// Broken invariants, each in a sentence; empty when all hold.
    pub broken: Vec<String>,
    /// Whether everything was handled before the timeout.
    pub drained: bool,
    /// Wall-clock time of this run.
    pub elapsed_ms: u64,
}

impl Summary {
    /// True when every invariant holds.
    pub fn ok(&self) -> bool {
        self.broken.is_empty()
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list = counts;
        let p = &self.provider;
        writeln!(f, "payments demo on {} over {}", self.database, self.transport)?;
        writeln!(f, "  webhook endpoint     {}", self.webhook_url)?;
        if p.payments > 0 {
            writeln!(
                f,
                "  provider             {} payments ({} refunded, {} in a currency the ledger lacks), {} events",
                p.payments, p.refunded_payments, p.poisoned_payments, p.events
            )?;
            writeln!(
                f,
                "  deliveries           {} ({} sent twice, {} retried, {} refused), {} refunds sent before their capture",
                p.deliveries, p.redeliveries, p.retries, p.rejected, p.refunds_before_capture
            )?;
            writeln!(
                f,
                "  forged               {} sent, {} refused (401)",
                p.forged, p.forged_refused
            )?;
        }
        writeln!(
            f,
            "  inbox                {} Stripe events taken, each once",
            self.stripe_events
        )?;
        writeln!(
            f,
            "  intake               {} captured, {} refunded, {} refunds waited for their capture, {} events emitted",
            self.captured_payments, self.refunded_payments, self.refunds_waited, self.payment_events
        )?;
        if self.refunds_waiting > 0 {
            writeln!(
                f,
                "  still waiting        {} refunds for their capture",
                self.refunds_waiting
            )?;
        }
        writeln!(f, "  handled              {}", list(&self.handled))?;
        writeln!(
            f,
            "  duplicates           {} delivered, {} suppressed",
            self.duplicates_delivered, self.duplicates_suppressed
        )?;
        writeln!(f, "  dead-lettered        {}", list(&self.dead_lettered))?;
        writeln!(
            f,
            "  parked               {} (behind their payment's dead letter)",
            list(&self.parked)
        )?;
        for (account, per) in &self.balances {
            let amounts: Vec<String> = per.iter().map(|(c, a)| format!("{c} {a}")).collect();
            writeln!(f, "  {:<20} {}", format!("ledger {account}"), amounts.join(" · "))?;
        }
        writeln!(f, "  ledger entries       {}", self.ledger_entries)?;
        writeln!(
            f,
            "  notifications        {} sent ({} calls)",
            self.notifications, self.notification_calls
        )?;
        let replayed: Vec<String> = self
            .replay
            .iter()
            .map(|(c, r)| {
                format!(
                    "{c} {} re-delivered, {} suppressed, {} handled",
                    r.delivered, r.suppressed, r.handled
                )
            })
            .collect();
        writeln!(
            f,
            "  replay of the run    {}",
            if replayed.is_empty() {
                "-".to_owned()
            } else {
                replayed.join(" · ")
            }
        )?;
        writeln!(
            f,
            "  replay changed       {}",
            if self.replay_changed.is_empty() {
                "nothing".to_owned()
            } else {
                self.replay_changed.join("; ")
            }
        )?;
        writeln!(f, "  lost                 {}", self.lost)?;
        writeln!(f, "  order violations     {}", self.order_violations)?;
        writeln!(f, "  duplicated effects   {}", self.duplicated_effects)?;
        tidings_demo_kit::outcome(f, self.drained, &self.broken, self.elapsed_ms)
    }
}

/// Every message is checked against its registered schema before the
/// outbox takes it: Stripe's deliveries (at the inbox) as the system's own.
fn guard() -> anyhow::Result<Arc<tidings_schema::SchemaGuard>> {
    Ok(Arc::new(tidings_schema::SchemaGuard::new(&crate::schemas())?))
}

/// Runs the whole demo, and sums it up.
pub async fn run(options: PaymentsOptions) -> anyhow::Result<Summary> {
    // Sent records are kept a day: a replay of the run reads them on a broker.
    let store_options = StoreOptions::default()
        .source("payments")
        .guard(guard()?)
        .retention(Duration::from_secs(86_400));
    let (store, label) = options.run.open_store(store_options).await?;
    // The notification service is another system: connections (or a file) of its own.
    let side = SidePool::open(&options.run.database_url(), "provider").await?;
    let sender = ThirdParty::new(side, "notifications");
    match store {
        AnyStore::Postgres(store) => run_on(store, sender, options, label).await,
        AnyStore::MySql(store) => run_on(store, sender, options, label).await,
        AnyStore::Sqlite(store) => run_on(store, sender, options, label).await,
        other => anyhow::bail!(
            "the demo runs on PostgreSQL, MySQL or SQLite, not {}",
            other.database()
        ),
    }
}

/// The figures that a replay must leave as they are.
#[derive(Debug, Clone, PartialEq)]
struct Books {
    balances: Vec<(String, String, i64)>,
    entries: i64,
    notifications: Calls,
    violations: i64,
}

async fn books<S: PaymentsStore>(store: &S, sender: &ThirdParty) -> anyhow::Result<Books> {
    let t = store.tally().await?;
    Ok(Books {
        balances: t.balances,
        entries: t.ledger_entries,
        notifications: sender.calls().await?,
        violations: t.violations,
    })
}

async fn run_on<S>(
    store: S,
    sender: ThirdParty,
    options: PaymentsOptions,
    label: String,
) -> anyhow::Result<Summary>
where
    S: PaymentsStore,
    Intake: Handler<S::Database>,
    Ledger: Handler<S::Database>,
    Notify: Handler<S::Database>,
{
    let started = Instant::now();
    store.setup().await.context("setting up the payments schema")?;
    sender
        .setup()
        .await
        .context("setting up the notification service")?;
    // What this run writes is written from now on: the replay's range.
    let since = chrono::Utc::now();
    let baseline = store.tally().await?;
    let baseline_calls = sender.calls().await?;

    let system = format!("demo-{}", store.system_id().await?);
    let transport = Transport::open(
        &store,
        options.run.broker.as_deref(),
        options.run.scale.partitions,
        &system,
    )
    .await?;
    for (group, topic) in [("intake", STRIPE), ("ledger", PAYMENTS), ("notify", PAYMENTS)] {
        transport
            .subscriber
            .ensure_group(group, topic)
            .await
            .with_context(|| format!("creating the group {group} of {topic} on {}", transport.label))?;
    }
    let shutdown = CancellationToken::new();
    // Whatever ends the run, an error included, stops the webhook server.
    let _stop_serving = shutdown.clone().drop_guard();
    let mut running = Runner::new(store.clone(), &transport, options.run.scale, shutdown.clone());
    running.relays();
    let config = tidings_demo_kit::consumer_config();
    running.consumer("intake", STRIPE, Intake, &config);
    running.consumer("ledger", PAYMENTS, Ledger, &config);
    running.consumer(
        "notify",
        PAYMENTS,
        Notify {
            sender: sender.clone(),
        },
        &config,
    );

    // The webhook endpoint.
    let secret = match &options.secret_file {
        Some(path) => tidings_inbox::secret_from_file(path)?,
        None => Secret::new(format!("whsec_{}", uuid::Uuid::new_v4().simple())),
    };
    let router = Inbox::new(store.clone())
        .provider(Provider::stripe(secret.clone()).topic(STRIPE))
        .router()?;
    let listen = options
        .listen
        .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0)));
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("listening for webhooks on {listen}"))?;
    let address = listener.local_addr()?;
    let webhook_url = format!("http://{address}/stripe");
    let serving = shutdown.clone();
    let server = tokio::spawn(tidings_inbox::serve(listener, router, async move {
        serving.cancelled().await
    }));

    let habits = Habits {
        payments: options.payments,
        poison_rate: options.poison_rate,
        ..Habits::default()
    };
    let posted = Arc::new(AtomicU64::new(0));
    let mut meter = Meter::new(
        options.run.progress,
        (options.payments * 4) as u64,
        "messages handled",
    );
    let provider = {
        let (url, secret, posted) = (webhook_url.clone(), secret.clone(), posted.clone());
        async move {
            let report = crate::provider::deliver(&url, &secret, habits, posted).await?;
            if options.listen.is_some() {
                eprintln!("webhooks: POST {url} (Stripe-Signature); stop with Ctrl-C or SIGTERM to sum up");
                options.stop.cancelled().await;
            }
            anyhow::Ok(report)
        }
    };
    let report = Arc::new(std::sync::Mutex::new(ProviderReport::default()));
    let work = {
        let report = report.clone();
        async move {
            *report.lock().expect("not poisoned") = provider.await?;
            Ok(())
        }
    };
    let baseline_work = baseline.work.done();
    let simulated = options.listen.is_none();
    let (tally, drained) = running
        .drain(
            work,
            options.run.drain_timeout,
            || store.tally(),
            |t, delivered| {
                meter.show(
                    t.work.done().saturating_sub(baseline_work),
                    &format!(
                        "{} deliveries posted, {} Stripe events taken, outbox {}",
                        posted.load(Ordering::Relaxed),
                        t.stripe_events - baseline.stripe_events,
                        t.outbox_pending
                    ),
                );
                // A refund posted by others may wait for a capture that never comes.
                let waiting_ok = t.refunds_waiting == 0 || !simulated;
                delivered && lost(t) == 0 && t.outbox_pending == 0 && waiting_ok
            },
        )
        .await?;
    meter.finish();
    let report = report.lock().expect("not poisoned").clone();
    let calls = sender.calls().await?;
    // (The replay's suppressed deliveries are counted apart.)
    let duplicates = (running.duplicates_delivered(), running.duplicates_suppressed());

    // The replay of the run: what the ledger and the notifications were
    // given is given again, and must change nothing.
    let before = books(&store, &sender).await?;
    let source = if transport.namespace.is_some() {
        ReplaySource::Outbox
    } else {
        ReplaySource::Log
    };
    let until = chrono::Utc::now() + chrono::Duration::seconds(1);
    let mut replay = BTreeMap::new();
    if drained {
        for consumer in ["ledger", "notify"] {
            let done = tidings_demo_kit::replay_and_wait(
                &store,
                consumer,
                &[PAYMENTS],
                source,
                (since, until),
                10_000.0,
                options.run.drain_timeout,
            )
            .await?;
            if let Some(done) = done {
                replay.insert(consumer.to_owned(), done.counts);
            }
        }
    }
    let after = books(&store, &sender).await?;
    running.stop().await?;
    server.await.context("the webhook server panicked")?;

    let summary = summarize(Run {
        label,
        transport: &transport,
        webhook_url,
        report,
        baseline: &baseline,
        tally: &tally,
        baseline_calls,
        calls,
        replay,
        replay_changed: changes(&before, &after),
        duplicates,
        drained,
        elapsed: started.elapsed(),
        simulated: options.listen.is_none(),
    });
    Ok(summary)
}

/// Messages committed but neither handled, dead-lettered nor parked, summed over consumers.
pub fn lost(t: &Tally) -> i64 {
    let events = t.payment_events();
    t.work.missing("intake", t.stripe_events)
        + t.work.missing("ledger", events)
        + t.work.missing("notify", events)
}

fn changes(before: &Books, after: &Books) -> Vec<String> {
    let mut changed = Vec::new();
    if before.balances != after.balances {
        changed.push(format!(
            "balances {:?} became {:?}",
            before.balances, after.balances
        ));
    }
    if before.entries != after.entries {
        changed.push(format!(
            "{} ledger entries became {}",
            before.entries, after.entries
        ));
    }
    if before.notifications.done != after.notifications.done {
        changed.push(format!(
            "{} notifications became {}",
            before.notifications.done, after.notifications.done
        ));
    }
    if before.violations != after.violations {
        changed.push(format!(
            "{} order violations became {}",
            before.violations, after.violations
        ));
    }
    changed
}

struct Run<'a> {
    label: String,
    transport: &'a Transport,
    webhook_url: String,
    report: ProviderReport,
    baseline: &'a Tally,
    tally: &'a Tally,
    baseline_calls: Calls,
    calls: Calls,
    replay: BTreeMap<String, ReplayCounts>,
    replay_changed: Vec<String>,
    duplicates: (u64, u64),
    drained: bool,
    elapsed: Duration,
    simulated: bool,
}

fn summarize(run: Run<'_>) -> Summary {
    let (t, b, p) = (run.tally, run.baseline, &run.report);
    // What the ledger's balances moved by in this run.
    let mut balances: BTreeMap<String, BTreeMap<String, i64>> = BTreeMap::new();
    for (account, currency, balance) in &t.balances {
        let moved = balance - b.balance(account, currency);
        balances
            .entry(account.clone())
            .or_default()
            .insert(currency.clone(), moved);
    }
    let moved = |account: &str, currency: &str| {
        balances
            .get(account)
            .and_then(|m| m.get(currency))
            .copied()
            .unwrap_or(0)
    };
    let figures = |tally: &Tally, currency: &str| {
        tally
            .currencies
            .iter()
            .find(|c| c.currency == currency)
            .map_or((0, 0, 0), |c| (c.payments, c.captured, c.refunded))
    };
    let mut broken = Vec::new();
    if !run.drained {
        broken.push("the system did not drain before the timeout".to_owned());
    }
    let lost = lost(t);
    if lost > 0 {
        broken.push(format!("{lost} messages lost"));
    }
    if t.violations > 0 {
        broken.push(format!("{} order violations", t.violations));
    }
    if run.calls.duplicated > 0 {
        broken.push(format!("{} notifications sent twice", run.calls.duplicated));
    }
    if run.simulated && t.refunds_waiting > 0 {
        broken.push(format!(
            "{} refunds still wait for their capture",
            t.refunds_waiting
        ));
    }
    // Double entry: every currency's balances sum to zero, in every run.
    for currency in CURRENCIES {
        let sum: i64 = t
            .balances
            .iter()
            .filter(|(_, c, _)| c == currency)
            .map(|(_, _, b)| b)
            .sum();
        if sum != 0 {
            broken.push(format!("the ledger's {currency} balances sum to {sum}, not 0"));
        }
        // The ledger agrees with the intake's record of this run.
        let (_, captured, refunded) = figures(t, currency);
        let (_, captured_before, refunded_before) = figures(b, currency);
        let (captured, refunded) = (captured - captured_before, refunded - refunded_before);
        if moved(account::PROVIDER_BALANCE, currency) != captured - refunded
            || moved(account::SALES, currency) != -captured
            || moved(account::REFUNDS, currency) != refunded
        {
            broken.push(format!(
                "the ledger moved {currency} by provider balance {}, sales {}, refunds {}, but {captured} was captured and {refunded} refunded",
                moved(account::PROVIDER_BALANCE, currency),
                moved(account::SALES, currency),
                moved(account::REFUNDS, currency)
            ));
        }
        // The intake's record agrees with what the provider did.
        if run.simulated
            && (captured != p.captured.get(currency).copied().unwrap_or(0)
                || refunded != p.refunded.get(currency).copied().unwrap_or(0))
        {
            broken.push(format!(
                "the intake recorded {captured} captured and {refunded} refunded in {currency}, the provider {} and {}",
                p.captured.get(currency).copied().unwrap_or(0),
                p.refunded.get(currency).copied().unwrap_or(0)
            ));
        }
    }
    let stripe_events = t.stripe_events - b.stripe_events;
    let payment_events = t.payment_events() - b.payment_events();
    let notifications = run.calls.done - run.baseline_calls.done;
    if run.simulated {
        if stripe_events != p.events as i64 {
            broken.push(format!(
                "the inbox took {stripe_events} events, the provider sent {}",
                p.events
            ));
        }
        if p.rejected > 0 {
            broken.push(format!("{} genuine deliveries refused", p.rejected));
        }
        if p.forged_refused != p.forged {
            broken.push(format!(
                "{} of {} forged deliveries not refused with 401",
                p.forged - p.forged_refused,
                p.forged
            ));
        }
    }
    if run.drained && notifications != payment_events {
        broken.push(format!(
            "{notifications} notifications for {payment_events} payment events"
        ));
    }
    if !run.replay_changed.is_empty() {
        broken.push(format!("the replay changed {}", run.replay_changed.join("; ")));
    }
    if run.drained && run.replay.is_empty() && payment_events > 0 {
        broken.push("the replay found no retained events to re-deliver".to_owned());
    }
    Summary {
        database: run.label,
        transport: run.transport.label.clone(),
        broker_namespace: run.transport.namespace.clone(),
        webhook_url: run.webhook_url,
        provider: run.report,
        stripe_events,
        captured_payments: t.captured_payments - b.captured_payments,
        refunded_payments: t.refunded_payments - b.refunded_payments,
        refunds_waited: t.refunds_waited - b.refunds_waited,
        refunds_waiting: t.refunds_waiting,
        payment_events,
        handled: t.work.processed.iter().cloned().collect(),
        dead_lettered: t.work.dead_letters.iter().cloned().collect(),
        parked: t.work.parked.iter().cloned().collect(),
        lost,
        order_violations: t.violations,
        duplicates_delivered: run.duplicates.0,
        duplicates_suppressed: run.duplicates.1,
        balances,
        ledger_entries: t.ledger_entries - b.ledger_entries,
        notifications,
        notification_calls: run.calls.calls - run.baseline_calls.calls,
        duplicated_effects: run.calls.duplicated,
        replay: run.replay,
        replay_changed: run.replay_changed,
        broken,
        drained: run.drained,
        elapsed_ms: run.elapsed.as_millis() as u64,
    }
}
