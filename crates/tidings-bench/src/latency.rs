//! Commit-to-handler latency at fixed rates, in wake-up and polling modes.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use tidings_consumer::{Consumer, Context, Handler, HandlerError};
use tidings_core::{Outbox, OutgoingMessage};
use tidings_relay::{Relay, RelayConfig};
use tidings_sql::{Dialect, SqlStore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::database::{BenchDialect, OnDatabase, ensure_measured, on_scratch};
use super::{event, open_transport, short_id};

/// What the latency scenario runs.
#[derive(Debug, Clone, clap::Args)]
pub struct LatencyBench {
    /// PostgreSQL or MySQL (the bench works in a schema or database of its
    /// own, dropped at the end).
    #[arg(long, env = "TIDINGS_DATABASE_URL")]
    pub(crate) database: String,
    /// `nats://...`, `amqp://...`, `kafka://...`, `sqs://...` or `pubsub://PROJECT`; the database log when left out.
    #[arg(long, env = "TIDINGS_BROKER_URL")]
    pub(crate) broker: Option<String>,
    /// Events per second, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "500,2000")]
    pub(crate) rates: Vec<u32>,
    /// Seconds per run.
    #[arg(long, default_value_t = 10.0)]
    pub(crate) seconds: f64,
    /// Milliseconds between polls in the polling mode.
    #[arg(long, default_value_t = 100)]
    pub(crate) poll_ms: u64,
    /// Also write the latency distributions as an SVG plot to this file.
    #[arg(long)]
    pub(crate) plot: Option<std::path::PathBuf>,
}

impl LatencyBench {
    /// Refuses what cannot run, with one line.
    pub(crate) fn check(&self) -> anyhow::Result<()> {
        ensure_measured(&self.database, "latency")?;
        anyhow::ensure!(
            !self.rates.is_empty() && !self.rates.contains(&0) && self.seconds > 0.0 && self.poll_ms > 0,
            "--rates, --seconds and --poll-ms must be positive"
        );
        Ok(())
    }

    fn poll_interval(&self) -> Duration {
        Duration::from_millis(self.poll_ms)
    }
}

/// Commit-to-handler latency of one run.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Latency {
    /// `wake-up` or `polling`.
    pub(crate) mode: &'static str,
    /// Events per second produced.
    pub(crate) rate: u32,
    /// Events measured.
    pub(crate) events: usize,
    /// Percentiles, milliseconds.
    pub(crate) p50_ms: f64,
    /// 90th percentile, milliseconds.
    pub(crate) p90_ms: f64,
    /// 99th percentile, milliseconds.
    pub(crate) p99_ms: f64,
    /// Largest, milliseconds.
    pub(crate) max_ms: f64,
    /// The relay's part, from commit to the transport's confirmation: p50, p99 (ms).
    pub(crate) relay_p50_p99_ms: (f64, f64),
    /// The delivery's part, from the confirmation to the handler's start: p50, p99 (ms).
    pub(crate) delivery_p50_p99_ms: (f64, f64),
    /// Of which the transport's, from the confirmation until the message
    /// comes off the subscription: p50, p99 (ms).
    pub(crate) transport_p50_p99_ms: (f64, f64),
    /// The distribution: (share of events, latency in ms) at every percent,
    /// then 99.9% and the largest.
    pub(crate) distribution_ms: Vec<(f64, f64)>,
}

/// Latencies by mode and rate.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Latencies {
    /// The database of the outbox.
    pub(crate) database: &'static str,
    /// How its producers wake the relay and the log readers in the wake-up mode.
    pub(crate) wakeups: &'static str,
    /// The transport (no credentials).
    pub(crate) transport: String,
    /// The polling interval of the polling mode, milliseconds.
    pub(crate) poll_interval_ms: f64,
    /// The runs.
    pub(crate) runs: Vec<Latency>,
}

/// Notes when the transport confirmed each event the relay published.
pub(crate) struct Confirmed {
    pub(crate) inner: Arc<dyn tidings_core::Publisher>,
    pub(crate) at: Arc<Mutex<HashMap<uuid::Uuid, Instant>>>,
}

#[async_trait::async_trait]
impl tidings_core::Publisher for Confirmed {
    async fn publish(&self, batch: &[OutgoingMessage]) -> tidings_core::Result<()> {
        self.inner.publish(batch).await?;
        let now = Instant::now();
        let mut at = self.at.lock().expect("confirmed lock");
        for m in batch {
            at.entry(m.envelope.id).or_insert(now);
        }
        Ok(())
    }
}

/// The times (ms) from `from` to `to`, per event id, sorted.
pub(crate) fn spans(from: &HashMap<uuid::Uuid, Instant>, to: &HashMap<uuid::Uuid, Instant>) -> Vec<f64> {
    let mut ms = from
        .iter()
        .filter_map(|(id, at)| {
            to.get(id)
                .map(|t| t.saturating_duration_since(*at).as_secs_f64() * 1000.0)
        })
        .collect::<Vec<_>>();
    ms.sort_by(f64::total_cmp);
    ms
}

pub(crate) fn percentile(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() as f64 * q) as usize).min(sorted.len().saturating_sub(1))]
}

/// Notes when each message comes off the transport's subscription.
struct Received {
    inner: Arc<dyn tidings_core::Subscriber>,
    at: Arc<Mutex<HashMap<uuid::Uuid, Instant>>>,
}

#[async_trait::async_trait]
impl tidings_core::Subscriber for Received {
    fn partitions(&self, topic: &str) -> u32 {
        self.inner.partitions(topic)
    }

    async fn ensure_group(&self, group: &str, topic: &str) -> tidings_core::Result<()> {
        self.inner.ensure_group(group, topic).await
    }

    async fn subscribe_partition(
        &self,
        group: &str,
        topic: &str,
        partition: tidings_core::Partition,
    ) -> tidings_core::Result<tidings_core::Subscription> {
        let at = self.at.clone();
        let inner = self.inner.subscribe_partition(group, topic, partition).await?;
        Ok(inner.inspect(move |item| {
            if let Ok(Ok(envelope)) = item.as_ref().map(|d| d.message.decode()) {
                at.lock()
                    .expect("received lock")
                    .entry(envelope.id)
                    .or_insert_with(Instant::now);
            }
        }))
    }
}

/// Notes when each event's handler started.
#[derive(Clone, Default)]
struct Stopwatch {
    started: Arc<Mutex<HashMap<uuid::Uuid, Instant>>>,
}

#[async_trait::async_trait]
impl<DB: sqlx::Database> Handler<DB> for Stopwatch {
    async fn handle(&self, ctx: &mut Context<'_, DB>) -> Result<(), HandlerError> {
        let now = Instant::now();
        self.started
            .lock()
            .expect("stopwatch lock")
            .insert(ctx.envelope().id, now);
        Ok(())
    }
}

/// Runs the latency scenario: for each mode and rate, producers commit
/// events at the rate through the outbox, a relay publishes them and a
/// consumer handles them; the time from each commit's return to its
/// handler's start is measured.
pub(crate) async fn latency(bench: LatencyBench) -> anyhow::Result<Latencies> {
    let latencies = on_scratch(&bench.database, &bench).await?;
    if let Some(path) = &bench.plot {
        std::fs::write(path, super::plot::latency_svg(&[&latencies]))?;
    }
    Ok(latencies)
}

impl OnDatabase for LatencyBench {
    type Figures = Latencies;

    async fn run_on<D: BenchDialect>(
        &self,
        store: &SqlStore<D>,
        _scratch: &str,
    ) -> anyhow::Result<Latencies> {
        latency_in(store, self).await
    }
}

async fn latency_in<D: BenchDialect>(store: &SqlStore<D>, bench: &LatencyBench) -> anyhow::Result<Latencies> {
    let mut runs = Vec::new();
    let mut label = String::new();
    for mode in ["wake-up", "polling"] {
        for &rate in &bench.rates {
            let (run, transport) = latency_run(store, bench, mode, rate).await?;
            label = transport;
            runs.push(run);
        }
    }
    Ok(Latencies {
        database: D::NAME,
        wakeups: D::WAKEUPS,
        transport: label,
        poll_interval_ms: bench.poll_interval().as_secs_f64() * 1000.0,
        runs,
    })
}

async fn latency_run<D: BenchDialect>(
    store: &SqlStore<D>,
    bench: &LatencyBench,
    mode: &'static str,
    rate: u32,
) -> anyhow::Result<(Latency, String)> {
    let waking = mode == "wake-up";
    // Woken, the relay and the log readers could wait a second; polling, they wait the interval.
    let idle = if waking {
        Duration::from_secs(1)
    } else {
        bench.poll_interval()
    };
    let topic = format!("bench.latency.{}", short_id());
    let transport = open_transport(store, bench.broker.as_deref(), 1).await?;
    let subscriber: Arc<dyn tidings_core::Subscriber> = match bench.broker.as_deref() {
        None | Some("log") => Arc::new(tidings_log::LogSubscriber::new(
            Arc::new(store.clone()),
            tidings_log::LogReaderConfig::default().poll_interval(idle),
        )),
        Some(_) => transport.subscriber.clone(),
    };
    let received: Arc<Mutex<HashMap<uuid::Uuid, Instant>>> = Arc::default();
    let subscriber: Arc<dyn tidings_core::Subscriber> = Arc::new(Received {
        inner: subscriber,
        at: received.clone(),
    });
    subscriber.ensure_group("latency", &topic).await?;
    let stop = CancellationToken::new();
    let confirmed: Arc<Mutex<HashMap<uuid::Uuid, Instant>>> = Arc::default();
    let publisher = Confirmed {
        inner: transport.publisher.clone(),
        at: confirmed.clone(),
    };
    let relay = Relay::new(store.clone(), publisher).config(RelayConfig::default().poll_interval(idle));
    let relay = tokio::spawn(relay.run(stop.clone()));
    let stopwatch = Stopwatch::default();
    let consumer = Consumer::new("latency", store.clone(), stopwatch.clone()).topic(&topic);
    let consumer = tokio::spawn({
        let (stop, subscriber) = (stop.clone(), subscriber.clone());
        async move { consumer.run(&*subscriber, stop).await }
    });
    // Let the relay and the consumer take their leases before the clock starts.
    tokio::time::sleep(Duration::from_secs(1)).await;

    let total = (f64::from(rate) * bench.seconds) as usize;
    let committed = paced(store, &topic, rate, total, waking).await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while stopwatch.started.lock().expect("stopwatch lock").len() < total {
        anyhow::ensure!(
            Instant::now() < deadline,
            "{mode} at {rate}/s: not every event was handled within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.cancel();
    relay.await??;
    consumer.await??;
    transport.remove(&topic, &["latency"]).await?;

    let confirmed = confirmed.lock().expect("confirmed lock");
    let started = stopwatch.started.lock().expect("stopwatch lock");
    let ms = spans(&committed, &started);
    let relaying = spans(&committed, &confirmed);
    let delivering = spans(&confirmed, &started);
    let received = received.lock().expect("received lock");
    let transporting = spans(&confirmed, &received);
    anyhow::ensure!(!ms.is_empty(), "{mode} at {rate}/s: no event measured");
    let run = Latency {
        mode,
        rate,
        events: ms.len(),
        p50_ms: percentile(&ms, 0.50),
        p90_ms: percentile(&ms, 0.90),
        p99_ms: percentile(&ms, 0.99),
        max_ms: ms[ms.len() - 1],
        relay_p50_p99_ms: (percentile(&relaying, 0.50), percentile(&relaying, 0.99)),
        delivery_p50_p99_ms: (percentile(&delivering, 0.50), percentile(&delivering, 0.99)),
        transport_p50_p99_ms: (percentile(&transporting, 0.50), percentile(&transporting, 0.99)),
        distribution_ms: (0..100)
            .map(|p| f64::from(p) / 100.0)
            .chain([0.999, 1.0])
            .map(|q| (q, percentile(&ms, q)))
            .collect(),
    };
    Ok((run, transport.label.clone()))
}

/// Commits `total` events to `topic` at `rate` per second, one transaction
/// each (waking the relay after each commit when `wake`), and returns when
/// each commit returned, by event id.
pub(crate) async fn paced<D: Dialect>(
    store: &SqlStore<D>,
    topic: &str,
    rate: u32,
    total: usize,
    wake: bool,
) -> anyhow::Result<HashMap<uuid::Uuid, Instant>> {
    let committed: Arc<Mutex<HashMap<uuid::Uuid, Instant>>> = Arc::default();
    let mut ticks = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(rate)));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut producers = JoinSet::new();
    for seq in 0..total {
        ticks.tick().await;
        let (store, committed, topic) = (store.clone(), committed.clone(), topic.to_owned());
        producers.spawn(async move {
            let message = OutgoingMessage { topic, ..event(seq) };
            let id = message.envelope.id;
            let mut tx = store.pool().begin().await?;
            store.enqueue_outgoing(&mut tx, &message).await?;
            tx.commit().await?;
            committed
                .lock()
                .expect("committed lock")
                .insert(id, Instant::now());
            if wake {
                store.wake();
            }
            anyhow::Ok(())
        });
        while let Some(done) = producers.try_join_next() {
            done??;
        }
    }
    while let Some(done) = producers.join_next().await {
        done??;
    }
    let committed = std::mem::take(&mut *committed.lock().expect("committed lock"));
    Ok(committed)
}

impl fmt::Display for Latencies {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "commit-to-handler latency · {} outbox -> {} · wake-ups {} · polling every {:.0} ms in the polling mode",
            self.database, self.transport, self.wakeups, self.poll_interval_ms
        )?;
        writeln!(
            f,
            "  mode       rate/s  events     p50 ms    p90 ms    p99 ms    max ms   relay p50/p99   delivery p50/p99  (off the transport)"
        )?;
        for r in &self.runs {
            writeln!(
                f,
                "  {:<9} {:>7} {:>7} {:>10.2} {:>9.2} {:>9.2} {:>9.2} {:>8.2}/{:<8.2} {:>8.2}/{:<8.2} ({:.2}/{:.2})",
                r.mode,
                r.rate,
                r.events,
                r.p50_ms,
                r.p90_ms,
                r.p99_ms,
                r.max_ms,
                r.relay_p50_p99_ms.0,
                r.relay_p50_p99_ms.1,
                r.delivery_p50_p99_ms.0,
                r.delivery_p50_p99_ms.1,
                r.transport_p50_p99_ms.0,
                r.transport_p50_p99_ms.1
            )?;
        }
        writeln!(
            f,
            "  targets: wake-up p50 at most 2 ms and p99 at most 10 ms; polling p99 at most the interval + 5 ms"
        )
    }
}
