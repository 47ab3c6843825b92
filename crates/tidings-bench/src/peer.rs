//! A peer, side by side: the npm package `pg-transactional-outbox` relaying
//! an outbox to the same RabbitMQ from the same PostgreSQL, driven by
//! `bench/peer/peer.js`, beside Tidings' relay on the same drain and the
//! same latency run.

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context as _;
use serde::{Deserialize, Serialize};

use super::{LatencyBench, RelayBench, latency, relays};

/// What the peer scenario runs.
#[derive(Debug, Clone, clap::Args)]
pub struct PeerBench {
    /// PostgreSQL (both sides work in schemas of their own, dropped at the end).
    #[arg(long, env = "TIDINGS_DATABASE_URL")]
    pub(crate) database: String,
    /// RabbitMQ, `amqp://...` (the peer's examples publish there).
    #[arg(long, env = "TIDINGS_BROKER_URL")]
    pub(crate) broker: String,
    /// Events in the backlog each side drains.
    #[arg(long, default_value_t = 2000)]
    pub(crate) events: usize,
    /// Events per second in the latency run.
    #[arg(long, default_value_t = 500)]
    pub(crate) rate: u32,
    /// Seconds of the latency run.
    #[arg(long, default_value_t = 10.0)]
    pub(crate) seconds: f64,
    /// Where the peer's harness is (`package.json`, `peer.js`); its
    /// dependencies are installed there with `npm ci` on first use.
    #[arg(long, default_value_os_t = default_dir())]
    pub(crate) peer_dir: PathBuf,
}

/// `bench/peer` in this source tree.
pub(super) fn default_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/peer")
}

impl PeerBench {
    /// Refuses what cannot run, with one line.
    pub(crate) fn check(&self) -> anyhow::Result<()> {
        super::ensure_postgres(&self.database, "peer")?;
        anyhow::ensure!(
            self.broker.starts_with("amqp://") || self.broker.starts_with("amqps://"),
            "the peer bench runs over RabbitMQ (--broker amqp://...)"
        );
        anyhow::ensure!(
            self.events > 0 && self.rate > 0 && self.seconds > 0.0,
            "--events, --rate and --seconds must be positive"
        );
        Ok(())
    }
}

/// The peer's drain, as `peer.js` reports it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct PeerDrain {
    /// Events drained.
    pub(crate) events: usize,
    /// Messages the peer's listener loads per poll.
    pub(crate) batch: usize,
    /// Wall-clock time.
    pub(crate) seconds: f64,
    /// Events published and confirmed per second.
    pub(crate) per_second: f64,
}

/// The peer's latency, from each commit's return to the broker's confirmation.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct PeerLatency {
    /// Events per second committed.
    pub(crate) rate: u32,
    /// Events measured.
    pub(crate) events: usize,
    /// The listener's polling interval, milliseconds.
    pub(crate) poll_ms: u64,
    /// Median, milliseconds.
    pub(crate) p50_ms: f64,
    /// 90th percentile, milliseconds.
    pub(crate) p90_ms: f64,
    /// 99th percentile, milliseconds.
    pub(crate) p99_ms: f64,
    /// Largest, milliseconds.
    pub(crate) max_ms: f64,
}

/// Tidings beside the peer.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct PeerComparison {
    /// The peer and its version.
    pub(crate) peer: String,
    /// The transport (no credentials).
    pub(crate) transport: String,
    /// The peer's drain.
    pub(crate) peer_drain: PeerDrain,
    /// One Tidings relay on a backlog of the same size, events/s.
    pub(crate) tidings_drain_per_second: f64,
    /// The broker's raw confirmed publish in the same run, events/s.
    pub(crate) raw_publish_per_second: Option<f64>,
    /// The peer's latency run (it polls; it has no wake-up).
    pub(crate) peer_latency: PeerLatency,
    /// Tidings at the same rate, commit to the broker's confirmation
    /// (the relay's part): wake-up p50 and p99, then polling p50 and p99 (ms).
    pub(crate) tidings_relay_latency_ms: [(f64, f64); 2],
}

/// Runs the peer scenario.
pub(crate) async fn peer(bench: PeerBench) -> anyhow::Result<PeerComparison> {
    let dir = bench.peer_dir.clone();
    install(&dir).await?;
    eprintln!("bench: the peer drains {} events", bench.events);
    let peer_drain: PeerDrain = run_peer(&dir, &bench, "drain").await?;
    eprintln!("bench: Tidings drains {} events", bench.events);
    let ours = relays(RelayBench::new(
        bench.database.clone(),
        Some(bench.broker.clone()),
        bench.events,
        vec![1],
    ))
    .await?;
    eprintln!("bench: the peer at {}/s", bench.rate);
    let peer_latency: PeerLatency = run_peer(&dir, &bench, "latency").await?;
    eprintln!("bench: Tidings at {}/s", bench.rate);
    let our_latency = latency(LatencyBench {
        database: bench.database.clone(),
        broker: Some(bench.broker.clone()),
        rates: vec![bench.rate],
        seconds: bench.seconds,
        poll_ms: peer_latency.poll_ms,
        plot: None,
    })
    .await?;
    let relay_part = |mode: &str| {
        our_latency
            .runs
            .iter()
            .find(|r| r.mode == mode)
            .map_or((f64::NAN, f64::NAN), |r| r.relay_p50_p99_ms)
    };
    Ok(PeerComparison {
        peer: format!("pg-transactional-outbox {}", peer_version(&dir)),
        transport: ours.transport.clone(),
        peer_drain,
        tidings_drain_per_second: ours.relays.first().map_or(0.0, |d| d.per_second),
        raw_publish_per_second: ours.raw_publish.as_ref().map(|d| d.per_second),
        peer_latency,
        tidings_relay_latency_ms: [relay_part("wake-up"), relay_part("polling")],
    })
}

/// Installs the harness's pinned dependencies, once.
async fn install(dir: &Path) -> anyhow::Result<()> {
    if dir.join("node_modules/pg-transactional-outbox").exists() {
        return Ok(());
    }
    eprintln!("bench: installing the peer with npm ci in {}", dir.display());
    let mut npm = Command::new("npm");
    npm.args(["ci", "--no-audit", "--no-fund", "--loglevel=error"])
        .current_dir(dir);
    let out = tokio::task::spawn_blocking(move || npm.output())
        .await?
        .context("running npm (the peer bench needs Node.js and npm)")?;
    anyhow::ensure!(
        out.status.success(),
        "npm ci failed in {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

/// Runs `peer.js` in `mode` and reads its figures.
async fn run_peer<T: serde::de::DeserializeOwned>(
    dir: &Path,
    bench: &PeerBench,
    mode: &str,
) -> anyhow::Result<T> {
    let mut node = Command::new("node");
    node.arg("peer.js")
        .current_dir(dir)
        .env("PEER_MODE", mode)
        .env("PEER_DATABASE_URL", &bench.database)
        .env("PEER_AMQP_URL", &bench.broker)
        .env("PEER_EVENTS", bench.events.to_string())
        .env("PEER_RATE", bench.rate.to_string())
        .env("PEER_SECONDS", bench.seconds.to_string());
    let out = tokio::task::spawn_blocking(move || node.output())
        .await?
        .context("running node (the peer bench needs Node.js)")?;
    anyhow::ensure!(
        out.status.success(),
        "the peer's {mode} run failed: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    serde_json::from_slice(&out.stdout).with_context(|| format!("reading the peer's {mode} figures"))
}

/// The installed version of the peer.
fn peer_version(dir: &Path) -> String {
    std::fs::read(dir.join("node_modules/pg-transactional-outbox/package.json"))
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .and_then(|v| v["version"].as_str().map(str::to_owned))
        .unwrap_or_else(|| "(version unknown)".to_owned())
}

impl fmt::Display for PeerComparison {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "side by side · {} · PostgreSQL outbox -> {}",
            self.peer, self.transport
        )?;
        if let Some(raw) = self.raw_publish_per_second {
            writeln!(
                f,
                "  raw limit: the broker's client, 500 in flight  {raw:>9.0} events/s"
            )?;
        }
        writeln!(
            f,
            "  drain of {} events · peer (batches of {})       {:>9.0} events/s",
            self.peer_drain.events, self.peer_drain.batch, self.peer_drain.per_second
        )?;
        writeln!(
            f,
            "  drain of {} events · Tidings, one relay         {:>9.0} events/s  ({:.1}x the peer)",
            self.peer_drain.events,
            self.tidings_drain_per_second,
            self.tidings_drain_per_second / self.peer_drain.per_second.max(1e-9)
        )?;
        let l = &self.peer_latency;
        writeln!(
            f,
            "  commit to confirmed at {}/s · peer, polling every {} ms   p50 {:.2} ms · p99 {:.2} ms · max {:.2} ms",
            l.rate, l.poll_ms, l.p50_ms, l.p99_ms, l.max_ms
        )?;
        let [(wake50, wake99), (poll50, poll99)] = self.tidings_relay_latency_ms;
        writeln!(
            f,
            "  commit to confirmed at {}/s · Tidings, polling             p50 {poll50:.2} ms · p99 {poll99:.2} ms  (peer p99 / Tidings p99: {:.1})",
            l.rate,
            l.p99_ms / poll99.max(1e-9)
        )?;
        writeln!(
            f,
            "  commit to confirmed at {}/s · Tidings, wake-up             p50 {wake50:.2} ms · p99 {wake99:.2} ms",
            l.rate
        )
    }
}
