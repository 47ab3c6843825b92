//! `tidings bench`: what Tidings costs, each figure next to the raw limit
//! measured in the same run on the same machine.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde::{Deserialize, Serialize};
use sqlx::Executor;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use tidings_consumer::{Consumer, Context, Handler, HandlerError};
use tidings_core::{Envelope, Kind, LagSource, Message, Outbox, OutgoingMessage};
use tidings_example_checkout::demo::Transport;
use tidings_relay::{Relay, RelayConfig};
use tidings_store_postgres::PgStore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// What the relay-scaling scenario runs.
#[derive(Debug, Clone)]
pub(crate) struct RelayBench {
    /// PostgreSQL (the bench works in a schema of its own, dropped at the end).
    pub(crate) database: String,
    /// The transport URL; the database log when `None`.
    pub(crate) broker: Option<String>,
    /// Events in each backlog.
    pub(crate) events: usize,
    /// Relay instances to compare, each count draining its own backlog.
    pub(crate) instances: Vec<usize>,
    /// Outbox partitions.
    pub(crate) partitions: u32,
    /// Records per relay batch.
    pub(crate) batch_size: usize,
}

/// One drain of the backlog.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Drain {
    /// Relay instances, or connections for the SQL-only drain.
    pub(crate) instances: usize,
    /// Wall-clock time.
    pub(crate) seconds: f64,
    /// Events per second.
    pub(crate) per_second: f64,
}

/// Relay throughput by number of instances, beside the raw limits.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct RelayScaling {
    /// The transport (no credentials).
    pub(crate) transport: String,
    /// Events per backlog.
    pub(crate) events: usize,
    /// Outbox partitions.
    pub(crate) partitions: u32,
    /// Records per batch.
    pub(crate) batch_size: usize,
    /// Raw limit of the database: the same claim (`DELETE ... FOR UPDATE
    /// SKIP LOCKED ... RETURNING`, one transaction per batch) in batches,
    /// publishing nothing, by connections.
    pub(crate) sql_drain: Vec<Drain>,
    /// Raw limit of the transport: the same batches published and confirmed
    /// one after another, without the outbox.
    pub(crate) publish_only: Drain,
    /// The relays, by instances.
    pub(crate) relays: Vec<Drain>,
}

#[derive(Serialize, Deserialize)]
struct BenchEvent {
    key: String,
    seq: u64,
    note: String,
}

impl Message for BenchEvent {
    const TYPE: &'static str = "BenchEvent";
    const VERSION: u32 = 1;
    const KIND: Kind = Kind::Event;
    const AGGREGATE: &'static str = "bench";
    const TOPIC: &'static str = "bench.events";
    fn key(&self) -> String {
        self.key.clone()
    }
}

fn event(seq: usize) -> OutgoingMessage {
    let envelope = Envelope::new(
        "bench",
        &BenchEvent {
            key: format!("key-{}", seq % 1000),
            seq: seq as u64,
            note: "an order-sized payload, about as large as a small business event".into(),
        },
    )
    .expect("a bench event encodes");
    OutgoingMessage {
        topic: BenchEvent::TOPIC.to_owned(),
        envelope,
    }
}

/// A PostgreSQL schema of the bench's own.
struct Schema {
    store: PgStore,
    name: String,
    admin: sqlx::PgPool,
}

impl Schema {
    async fn create(url: &str) -> anyhow::Result<Schema> {
        let admin = PgPoolOptions::new()
            .max_connections(1)
            .connect(url)
            .await
            .with_context(|| {
                format!(
                    "connecting to PostgreSQL at {}",
                    url.split('@').next_back().unwrap_or(url)
                )
            })?;
        let name = format!("tidings_bench_{}", uuid::Uuid::new_v4().simple());
        admin
            .execute(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {name}")))
            .await?;
        let options = PgConnectOptions::from_str(url)?.options([("search_path", name.as_str())]);
        let pool = PgPoolOptions::new()
            .max_connections(24)
            .connect_with(options)
            .await?;
        let store = PgStore::new(pool);
        store.migrate().await?;
        Ok(Schema { store, name, admin })
    }

    async fn drop(self) {
        self.store.pool().close().await;
        let _ = self
            .admin
            .execute(sqlx::AssertSqlSafe(format!("DROP SCHEMA {} CASCADE", self.name)))
            .await;
    }
}

/// Fills the outbox with `n` events, committed 1000 to a transaction by 4 writers.
async fn fill(store: &PgStore, n: usize) -> anyhow::Result<()> {
    let mut writers = JoinSet::new();
    for w in 0..4 {
        let store = store.clone();
        writers.spawn(async move {
            for chunk in (w * 1000..n).step_by(4000) {
                let mut tx = store.pool().begin().await?;
                for seq in chunk..(chunk + 1000).min(n) {
                    store.enqueue(&mut tx, &event(seq)).await?;
                }
                tx.commit().await?;
            }
            anyhow::Ok(())
        });
    }
    while let Some(done) = writers.join_next().await {
        done??;
    }
    Ok(())
}

fn drain(instances: usize, events: usize, started: Instant) -> Drain {
    let seconds = started.elapsed().as_secs_f64();
    Drain {
        instances,
        seconds,
        per_second: events as f64 / seconds.max(1e-9),
    }
}

/// The database's limit: claim-and-delete in batches, publishing nothing.
async fn sql_drain(store: &PgStore, connections: usize, batch: usize) -> anyhow::Result<()> {
    let mut drainers = JoinSet::new();
    for _ in 0..connections {
        let pool = store.pool().clone();
        drainers.spawn(async move {
            loop {
                // The relay's planner settings (see the PostgreSQL store's claim), so
                // that this limit is not measured on a worse plan than the relay gets.
                let mut tx = pool
                    .begin_with("BEGIN; SET LOCAL enable_bitmapscan = off; SET LOCAL enable_seqscan = off")
                    .await?;
                let rows: Vec<(Vec<u8>,)> = sqlx::query_as(
                    "DELETE FROM tidings_outbox WHERE seq IN (
                         SELECT seq FROM tidings_outbox WHERE published_at IS NULL
                         ORDER BY seq LIMIT $1 FOR UPDATE SKIP LOCKED)
                     RETURNING body",
                )
                .bind(batch as i64)
                .fetch_all(&mut *tx)
                .await?;
                tx.commit().await?;
                if rows.is_empty() {
                    return anyhow::Ok(());
                }
            }
        });
    }
    while let Some(done) = drainers.join_next().await {
        done??;
    }
    Ok(())
}

/// Runs the relay-scaling scenario.
pub(crate) async fn relays(bench: RelayBench) -> anyhow::Result<RelayScaling> {
    let schema = Schema::create(&bench.database).await?;
    let result = relays_in(&schema.store, &bench).await;
    schema.drop().await;
    result
}

async fn relays_in(store: &PgStore, bench: &RelayBench) -> anyhow::Result<RelayScaling> {
    let transport = open_transport(store, bench.broker.as_deref(), bench.partitions).await?;
    // A queue for what is published (RabbitMQ refuses what no queue takes).
    transport
        .subscriber
        .ensure_group("bench", BenchEvent::TOPIC)
        .await?;
    let n = bench.events;

    // A first drain to warm the caches, so that the first figure is not the cold one.
    fill(store, n.min(10_000)).await?;
    sql_drain(store, 1, bench.batch_size).await?;
    let mut sql = Vec::new();
    for connections in [1, 2] {
        fill(store, n).await?;
        let started = Instant::now();
        sql_drain(store, connections, bench.batch_size).await?;
        sql.push(drain(connections, n, started));
    }

    let batches = (0..n)
        .map(event)
        .collect::<Vec<_>>()
        .chunks(bench.batch_size)
        .map(<[OutgoingMessage]>::to_vec)
        .collect::<Vec<_>>();
    let started = Instant::now();
    for batch in &batches {
        transport.publisher.publish(batch).await?;
    }
    let publish_only = drain(1, n, started);

    let mut relays = Vec::new();
    for &instances in &bench.instances {
        fill(store, n).await?;
        let stop = CancellationToken::new();
        let started = Instant::now();
        let config = relay_config(bench.partitions)
            .batch_size(bench.batch_size)
            .poll_interval(Duration::from_millis(50));
        let (mut running, stats) = start_relays(store, &transport, instances, config, &stop);
        // Watch the relays' own counters: querying the outbox while it drains
        // would take CPU from the relays and PostgreSQL.
        loop {
            let published: u64 = stats.iter().map(|s| s.published()).sum();
            if published as usize >= n {
                break;
            }
            if let Some(done) = running.try_join_next() {
                done??;
                anyhow::bail!("a relay stopped before the backlog was drained");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        relays.push(drain(instances, n, started));
        let pending = store.lag().await?.outbox_pending;
        anyhow::ensure!(
            pending == 0,
            "{pending} events left in the outbox after the drain"
        );
        stop.cancel();
        while let Some(done) = running.join_next().await {
            done??;
        }
    }
    transport.remove(BenchEvent::TOPIC, &["bench"]).await?;
    Ok(RelayScaling {
        transport: transport.label.clone(),
        events: n,
        partitions: bench.partitions,
        batch_size: bench.batch_size,
        sql_drain: sql,
        publish_only,
        relays,
    })
}

impl fmt::Display for RelayScaling {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "relay scaling · PostgreSQL outbox -> {} · {} events per backlog · {} partitions · batches of {}",
            self.transport, self.events, self.partitions, self.batch_size
        )?;
        for d in &self.sql_drain {
            writeln!(
                f,
                "  raw limit: SQL claim-and-delete, {} connection(s)   {:>9.0} events/s",
                d.instances, d.per_second
            )?;
        }
        writeln!(
            f,
            "  raw limit: publish only, confirmed batches          {:>9.0} events/s",
            self.publish_only.per_second
        )?;
        let best_sql = self.sql_drain.iter().map(|d| d.per_second).fold(0.0, f64::max);
        let one = self.relays.first().map_or(0.0, |d| d.per_second);
        for d in &self.relays {
            writeln!(
                f,
                "  {} relay(s)                                        {:>9.0} events/s  ({:.2}x one relay · {:.2} of the SQL drain · {:.2} of publish-only)",
                d.instances,
                d.per_second,
                d.per_second / one.max(1e-9),
                d.per_second / best_sql.max(1e-9),
                d.per_second / self.publish_only.per_second.max(1e-9),
            )?;
        }
        Ok(())
    }
}

/// What the producer-tax scenario runs.
#[derive(Debug, Clone)]
pub(crate) struct ProducerBench {
    /// PostgreSQL (a schema of the bench's own).
    pub(crate) database: String,
    /// Concurrent producer connections.
    pub(crate) connections: usize,
    /// Seconds per variant, split into rounds that alternate the variants.
    pub(crate) seconds: f64,
}

/// Committed transactions per second of one way of writing.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Throughput {
    /// Which way.
    pub(crate) variant: &'static str,
    /// Transactions committed.
    pub(crate) transactions: u64,
    /// Per second.
    pub(crate) per_second: f64,
}

/// What writing an event with the business row costs a producer.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ProducerTax {
    /// Connections writing at once.
    pub(crate) connections: usize,
    /// The business insert alone (the raw limit).
    pub(crate) business_only: Throughput,
    /// The business insert and an outbox insert written by hand (the raw equivalent).
    pub(crate) raw_outbox: Throughput,
    /// The business insert and `Outbox::enqueue`, then the relay woken after commit.
    pub(crate) tidings: Throughput,
}

const BUSINESS: &str = "INSERT INTO bench_orders (id, customer, total_cents) VALUES ($1, $2, $3)";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Write {
    BusinessOnly,
    RawOutbox,
    Tidings,
}

/// One producer transaction of the given kind.
async fn write_one(store: &PgStore, kind: Write, seq: u64) -> anyhow::Result<()> {
    let order = BenchEvent {
        key: format!("order-{seq}"),
        seq,
        note: "an order-sized payload, about as large as a small business event".into(),
    };
    let mut tx = store.pool().begin().await?;
    sqlx::query(BUSINESS)
        .bind(uuid::Uuid::now_v7())
        .bind(&order.key)
        .bind(seq as i64)
        .execute(&mut *tx)
        .await?;
    match kind {
        Write::BusinessOnly => {}
        // What a hand-rolled outbox writes: the event as JSON, its key and type.
        Write::RawOutbox => {
            sqlx::query(
                "INSERT INTO tidings_outbox (id, topic, aggregate_key, message_type, body) VALUES ($1, $2, $3, $4, $5)",
            )
            .bind(uuid::Uuid::now_v7())
            .bind(BenchEvent::TOPIC)
            .bind(&order.key)
            .bind(BenchEvent::TYPE)
            .bind(serde_json::to_vec(&order)?)
            .execute(&mut *tx)
            .await?;
        }
        Write::Tidings => {
            let envelope = Envelope::new("bench", &order)?;
            let message = OutgoingMessage {
                topic: BenchEvent::TOPIC.to_owned(),
                envelope,
            };
            store.enqueue(&mut tx, &message).await?;
        }
    }
    tx.commit().await?;
    if kind == Write::Tidings {
        store.wake();
    }
    Ok(())
}

/// Runs `kind` on `connections` writers for `duration`; transactions committed.
async fn write_for(
    store: &PgStore,
    kind: Write,
    connections: usize,
    duration: Duration,
) -> anyhow::Result<u64> {
    let deadline = Instant::now() + duration;
    let mut writers = JoinSet::new();
    for w in 0..connections {
        let store = store.clone();
        writers.spawn(async move {
            let mut done = 0u64;
            while Instant::now() < deadline {
                write_one(&store, kind, (w as u64) << 40 | done).await?;
                done += 1;
            }
            anyhow::Ok(done)
        });
    }
    let mut total = 0;
    while let Some(done) = writers.join_next().await {
        total += done??;
    }
    Ok(total)
}

/// Runs the producer-tax scenario: the three variants alternate in rounds,
/// so that drift of a shared machine falls on all three alike.
pub(crate) async fn producer(bench: ProducerBench) -> anyhow::Result<ProducerTax> {
    let schema = Schema::create(&bench.database).await?;
    let result = producer_in(&schema.store, &bench).await;
    schema.drop().await;
    result
}

async fn producer_in(store: &PgStore, bench: &ProducerBench) -> anyhow::Result<ProducerTax> {
    create_orders(store).await?;
    const ROUNDS: u32 = 3;
    let round = Duration::from_secs_f64(bench.seconds / f64::from(ROUNDS));
    let kinds = [Write::BusinessOnly, Write::RawOutbox, Write::Tidings];
    write_for(
        store,
        Write::Tidings,
        bench.connections,
        Duration::from_millis(500),
    )
    .await?;
    let mut totals = [0u64; 3];
    for _ in 0..ROUNDS {
        for (i, kind) in kinds.iter().enumerate() {
            totals[i] += write_for(store, *kind, bench.connections, round).await?;
        }
    }
    let seconds = round.as_secs_f64() * f64::from(ROUNDS);
    let figure = |variant, transactions: u64| Throughput {
        variant,
        transactions,
        per_second: transactions as f64 / seconds,
    };
    Ok(ProducerTax {
        connections: bench.connections,
        business_only: figure("business insert only", totals[0]),
        raw_outbox: figure("business + outbox insert by hand", totals[1]),
        tidings: figure("business + Outbox::enqueue", totals[2]),
    })
}

impl fmt::Display for ProducerTax {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "producer tax · PostgreSQL · {} connections · committed transactions/s",
            self.connections
        )?;
        let base = self.business_only.per_second.max(1e-9);
        for t in [&self.business_only, &self.raw_outbox, &self.tidings] {
            writeln!(
                f,
                "  {:<36} {:>8.0}/s  ({:.2} of business only)",
                t.variant,
                t.per_second,
                t.per_second / base
            )?;
        }
        writeln!(
            f,
            "  Tidings / raw outbox                 {:>8.2}   (target: at least 0.95)",
            self.tidings.per_second / self.raw_outbox.per_second.max(1e-9)
        )
    }
}

/// What the steady-state scenario runs.
#[derive(Debug, Clone)]
pub(crate) struct SteadyBench {
    /// PostgreSQL (a schema of the bench's own).
    pub(crate) database: String,
    /// The transport URL; the database log when `None`.
    pub(crate) broker: Option<String>,
    /// Producer connections.
    pub(crate) connections: usize,
    /// Seconds the producers run with the relays.
    pub(crate) seconds: f64,
    /// Relays.
    pub(crate) relays: usize,
    /// Outbox partitions.
    pub(crate) partitions: u32,
}

/// Producers at full speed with the relays running: does the relay keep up?
#[derive(Debug, Clone, Serialize)]
pub(crate) struct SteadyState {
    /// The transport (no credentials).
    pub(crate) transport: String,
    /// Producer connections.
    pub(crate) connections: usize,
    /// Relays.
    pub(crate) relays: usize,
    /// The raw limit: producers alone (business + `enqueue`), no relay, transactions/s.
    pub(crate) producers_alone: f64,
    /// Producers with the relays running, transactions/s.
    pub(crate) producers_with_relays: f64,
    /// Events the relays published per second over the run.
    pub(crate) published_per_second: f64,
    /// The largest backlog sampled (every 100 ms) while producers ran.
    pub(crate) max_backlog: u64,
    /// From the producers' last commit to an empty outbox, seconds.
    pub(crate) drained_after_stop: f64,
}

async fn backlog(store: &PgStore) -> anyhow::Result<u64> {
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM tidings_outbox WHERE published_at IS NULL")
        .fetch_one(store.pool())
        .await?;
    Ok(n.max(0) as u64)
}

/// Runs the steady-state scenario.
pub(crate) async fn steady(bench: SteadyBench) -> anyhow::Result<SteadyState> {
    let schema = Schema::create(&bench.database).await?;
    let result = steady_in(&schema.store, &bench).await;
    schema.drop().await;
    result
}

async fn steady_in(store: &PgStore, bench: &SteadyBench) -> anyhow::Result<SteadyState> {
    create_orders(store).await?;
    let transport = open_transport(store, bench.broker.as_deref(), bench.partitions).await?;
    transport
        .subscriber
        .ensure_group("bench", BenchEvent::TOPIC)
        .await?;
    let run = Duration::from_secs_f64(bench.seconds);

    // The raw limit: the same producers with no relay (their rows are cleared after).
    let alone =
        write_for(store, Write::Tidings, bench.connections, run / 2).await? as f64 / (run / 2).as_secs_f64();
    sqlx::query("DELETE FROM tidings_outbox")
        .execute(store.pool())
        .await?;

    let stop = CancellationToken::new();
    let config = relay_config(bench.partitions).poll_interval(Duration::from_millis(100));
    let (mut running, stats) = start_relays(store, &transport, bench.relays.max(1), config, &stop);
    // Let the relays take their leases before the clock starts.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let sampling = CancellationToken::new();
    let sampler = tokio::spawn({
        let (store, sampling) = (store.clone(), sampling.clone());
        async move {
            let mut max = 0;
            while !sampling.is_cancelled() {
                max = max.max(backlog(&store).await?);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            anyhow::Ok(max)
        }
    });
    let published_before: u64 = stats.iter().map(|s| s.published()).sum();
    let started = Instant::now();
    let committed = write_for(store, Write::Tidings, bench.connections, run).await?;
    let producing = started.elapsed();
    let stopped = Instant::now();
    sampling.cancel();
    let max_backlog = sampler.await??;
    let drained_after_stop = loop {
        if backlog(store).await? == 0 {
            break stopped.elapsed();
        }
        anyhow::ensure!(
            stopped.elapsed() < Duration::from_secs(120),
            "the outbox did not drain within 120 s of the producers stopping"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let published: u64 = stats.iter().map(|s| s.published()).sum::<u64>() - published_before;
    stop.cancel();
    while let Some(done) = running.join_next().await {
        done??;
    }
    transport.remove(BenchEvent::TOPIC, &["bench"]).await?;
    Ok(SteadyState {
        transport: transport.label.clone(),
        connections: bench.connections,
        relays: bench.relays.max(1),
        producers_alone: alone,
        producers_with_relays: committed as f64 / producing.as_secs_f64(),
        published_per_second: published as f64 / (producing + drained_after_stop).as_secs_f64(),
        max_backlog,
        drained_after_stop: drained_after_stop.as_secs_f64(),
    })
}

impl fmt::Display for SteadyState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "steady state · PostgreSQL outbox -> {} · {} producer connections · {} relay(s)",
            self.transport, self.connections, self.relays
        )?;
        writeln!(
            f,
            "  raw limit: producers alone           {:>8.0} transactions/s",
            self.producers_alone
        )?;
        writeln!(
            f,
            "  producers with the relays running    {:>8.0} transactions/s  ({:.2} of alone)",
            self.producers_with_relays,
            self.producers_with_relays / self.producers_alone.max(1e-9)
        )?;
        writeln!(
            f,
            "  relays published                     {:>8.0} events/s",
            self.published_per_second
        )?;
        writeln!(
            f,
            "  largest backlog sampled              {:>8}",
            self.max_backlog
        )?;
        writeln!(
            f,
            "  empty outbox after producers stop    {:>8.3} s  (target: at most 1 s)",
            self.drained_after_stop
        )
    }
}

/// What the latency scenario runs.
#[derive(Debug, Clone)]
pub(crate) struct LatencyBench {
    /// PostgreSQL (a schema of the bench's own).
    pub(crate) database: String,
    /// The transport URL; the database log when `None`.
    pub(crate) broker: Option<String>,
    /// Events per second.
    pub(crate) rates: Vec<u32>,
    /// Seconds per run.
    pub(crate) seconds: f64,
    /// The polling interval of the polling mode.
    pub(crate) poll_interval: Duration,
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
}

/// Latencies by mode and rate.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Latencies {
    /// The transport (no credentials).
    pub(crate) transport: String,
    /// The polling interval of the polling mode, milliseconds.
    pub(crate) poll_interval_ms: f64,
    /// The runs.
    pub(crate) runs: Vec<Latency>,
}

/// Notes when the transport confirmed each event the relay published.
struct Confirmed {
    inner: Arc<dyn tidings_core::Publisher>,
    at: Arc<Mutex<HashMap<uuid::Uuid, Instant>>>,
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
fn spans(from: &HashMap<uuid::Uuid, Instant>, to: &HashMap<uuid::Uuid, Instant>) -> Vec<f64> {
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

fn percentile(sorted: &[f64], q: f64) -> f64 {
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
impl Handler<sqlx::Postgres> for Stopwatch {
    async fn handle(&self, ctx: &mut Context<'_, sqlx::Postgres>) -> Result<(), HandlerError> {
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
    let schema = Schema::create(&bench.database).await?;
    let result = latency_in(&schema.store, &bench).await;
    schema.drop().await;
    result
}

async fn latency_in(store: &PgStore, bench: &LatencyBench) -> anyhow::Result<Latencies> {
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
        transport: label,
        poll_interval_ms: bench.poll_interval.as_secs_f64() * 1000.0,
        runs,
    })
}

async fn latency_run(
    store: &PgStore,
    bench: &LatencyBench,
    mode: &'static str,
    rate: u32,
) -> anyhow::Result<(Latency, String)> {
    let waking = mode == "wake-up";
    // Woken, the relay and the log readers could wait a second; polling, they wait the interval.
    let idle = if waking {
        Duration::from_secs(1)
    } else {
        bench.poll_interval
    };
    let topic = format!("bench.latency.{}", short_id());
    let transport = open_transport(store, bench.broker.as_deref(), 1).await?;
    let subscriber: Arc<dyn tidings_core::Subscriber> = match bench.broker.as_deref() {
        None | Some("log") => Arc::new(tidings_core::log::LogSubscriber::new(
            Arc::new(store.clone()),
            tidings_core::log::LogReaderConfig::default().poll_interval(idle),
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

    let committed: Arc<Mutex<HashMap<uuid::Uuid, Instant>>> = Arc::default();
    let total = (f64::from(rate) * bench.seconds) as usize;
    let mut ticks = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(rate)));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut producers = JoinSet::new();
    for seq in 0..total {
        ticks.tick().await;
        let (store, committed, topic) = (store.clone(), committed.clone(), topic.clone());
        producers.spawn(async move {
            let envelope = Envelope::new(
                "bench",
                &BenchEvent {
                    key: format!("key-{}", seq % 1000),
                    seq: seq as u64,
                    note: "latency probe".into(),
                },
            )?;
            let id = envelope.id;
            let mut tx = store.pool().begin().await?;
            store
                .enqueue(&mut tx, &OutgoingMessage { topic, envelope })
                .await?;
            tx.commit().await?;
            committed
                .lock()
                .expect("committed lock")
                .insert(id, Instant::now());
            if waking {
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

    let committed = committed.lock().expect("committed lock");
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
    };
    Ok((run, transport.label.clone()))
}

impl fmt::Display for Latencies {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "commit-to-handler latency · PostgreSQL outbox -> {} · polling every {:.0} ms in the polling mode",
            self.transport, self.poll_interval_ms
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

/// The business table the producer scenarios write.
async fn create_orders(store: &PgStore) -> anyhow::Result<()> {
    sqlx::query(
        "CREATE TABLE bench_orders (id UUID PRIMARY KEY, customer TEXT NOT NULL, total_cents BIGINT NOT NULL,
         created_at TIMESTAMPTZ NOT NULL DEFAULT now())",
    )
    .execute(store.pool())
    .await?;
    Ok(())
}

/// The relays' configuration in the bench: `partitions`, 5 s leases.
fn relay_config(partitions: u32) -> RelayConfig {
    RelayConfig::default()
        .partitions(partitions)
        .lease_ttl(Duration::from_secs(5))
}

type Relays = (
    JoinSet<tidings_core::Result<()>>,
    Vec<Arc<tidings_relay::RelayStats>>,
);

/// Starts `n` relays sharing the outbox, until `stop`; their tasks and counters.
fn start_relays(
    store: &PgStore,
    transport: &Transport,
    n: usize,
    config: RelayConfig,
    stop: &CancellationToken,
) -> Relays {
    let mut running = JoinSet::new();
    let mut stats = Vec::new();
    for _ in 0..n {
        let relay = Relay::new(store.clone(), transport.publisher.clone()).config(config.clone());
        stats.push(relay.stats());
        running.spawn(relay.run(stop.clone()));
    }
    (running, stats)
}

/// A short random id, to name what one run creates.
fn short_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..8].to_owned()
}

/// The transport a run publishes through, its broker resources named for the run.
async fn open_transport(store: &PgStore, broker: Option<&str>, partitions: u32) -> anyhow::Result<Transport> {
    Transport::open(store, broker, partitions, &format!("bench-{}", short_id())).await
}
