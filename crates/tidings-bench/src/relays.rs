//! Relay throughput by number of instances, beside the SQL-only drain and publish-only limits.

use std::fmt;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde::{Deserialize, Serialize};
use tidings_core::{LagSource, Message, OutgoingMessage};
use tidings_demo_kit::Transport;
use tidings_sql::SqlStore;
use tidings_store_mysql::My;
use tidings_store_postgres::Pg;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::database::{BenchDialect, OnDatabase, Scratch, ensure_measured, on_scratch, opens};
use super::{BenchEvent, Drain, drain, event, fill, raw, relay_config, short_id, start_relays, status_mib};

/// What the relay-scaling scenario runs.
#[derive(Debug, Clone, clap::Args)]
pub struct RelayBench {
    /// PostgreSQL or MySQL (the bench works in a schema or database of its
    /// own, dropped at the end).
    #[arg(long, env = "TIDINGS_DATABASE_URL")]
    pub(crate) database: String,
    /// `nats://...`, `amqp://...`, `kafka://...`, `sqs://...` or `pubsub://PROJECT`; the database log when left out.
    #[arg(long, env = "TIDINGS_BROKER_URL")]
    pub(crate) broker: Option<String>,
    /// Events in each backlog.
    #[arg(long, default_value_t = 200_000)]
    pub(crate) events: usize,
    /// Relay instances to compare, each count draining its own backlog; comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    pub(crate) instances: Vec<usize>,
    /// Outbox partitions.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub(crate) partitions: u32,
    /// Records per relay batch.
    #[arg(long, default_value_t = 500)]
    pub(crate) batch_size: usize,
    /// Batches each relay keeps in flight at once, one per partition it holds.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub(crate) window: u32,
}

impl RelayBench {
    /// `events` per backlog drained by each count of `instances`, with the
    /// command line's defaults: 8 partitions, batches of 500, 4 in flight.
    pub(crate) fn new(
        database: String,
        broker: Option<String>,
        events: usize,
        instances: Vec<usize>,
    ) -> Self {
        RelayBench {
            database,
            broker,
            events,
            instances,
            partitions: 8,
            batch_size: 500,
            window: 4,
        }
    }

    /// Refuses what cannot run, with one line.
    pub(crate) fn check(&self) -> anyhow::Result<()> {
        ensure_measured(&self.database, "relay")?;
        anyhow::ensure!(
            self.events > 0 && self.batch_size > 0,
            "--events and --batch-size must be positive"
        );
        anyhow::ensure!(
            !self.instances.is_empty() && !self.instances.contains(&0),
            "--instances needs counts of at least 1"
        );
        Ok(())
    }
}

/// Relay throughput by number of instances, beside the raw limits.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct RelayScaling {
    /// The database of the outbox.
    pub(crate) database: &'static str,
    /// The transport (no credentials).
    pub(crate) transport: String,
    /// Events per backlog.
    pub(crate) events: usize,
    /// Outbox partitions.
    pub(crate) partitions: u32,
    /// Records per batch.
    pub(crate) batch_size: usize,
    /// Batches each relay keeps in flight.
    pub(crate) window: u32,
    /// Raw limit of the database: a hand-written claim (the oldest unsent
    /// rows `FOR UPDATE SKIP LOCKED`, read and deleted, one transaction per
    /// batch), publishing nothing, by connections.
    pub(crate) sql_drain: Vec<Drain>,
    /// The same batches published through the transport adapter and
    /// confirmed one after another, without the outbox.
    pub(crate) publish_only: Drain,
    /// Raw limit of the broker: its own client publishing the same events
    /// with confirmations, up to 500 in flight, no Tidings code (none for
    /// the database log).
    pub(crate) raw_publish: Option<Drain>,
    /// The relays, by instances.
    pub(crate) relays: Vec<Drain>,
    /// One relay in a process of its own draining a backlog of the same
    /// size: its rate and its peak resident memory.
    pub(crate) relay_process: RelayProcessRun,
}

/// The database's limit: claim-and-delete in batches, publishing nothing.
pub(crate) async fn sql_drain<D: BenchDialect>(
    store: &SqlStore<D>,
    connections: usize,
    batch: usize,
) -> anyhow::Result<()> {
    let mut drainers = JoinSet::new();
    for _ in 0..connections {
        let pool = store.pool().clone();
        drainers.spawn(async move {
            loop {
                match D::drain_batch(&pool, batch).await {
                    Ok(0) => return anyhow::Ok(()),
                    Ok(_) => {}
                    // Two drainers can deadlock (InnoDB does): as any
                    // hand-written relay would, take the batch again.
                    Err(e) if lost_race::<D>(&e) => {}
                    Err(e) => return Err(e),
                }
            }
        });
    }
    while let Some(done) = drainers.join_next().await {
        done??;
    }
    Ok(())
}

/// Whether `e` is a race the database lost (a deadlock, a lock wait given up).
fn lost_race<D: BenchDialect>(e: &anyhow::Error) -> bool {
    e.downcast_ref::<sqlx::Error>()
        .and_then(sqlx::Error::as_database_error)
        .is_some_and(D::transient)
}

/// Runs the relay-scaling scenario.
pub(crate) async fn relays(bench: RelayBench) -> anyhow::Result<RelayScaling> {
    on_scratch(&bench.database, &bench).await
}

impl OnDatabase for RelayBench {
    type Figures = RelayScaling;

    async fn run_on<D: BenchDialect>(
        &self,
        store: &SqlStore<D>,
        scratch: &str,
    ) -> anyhow::Result<RelayScaling> {
        relays_in(store, scratch, self).await
    }
}

async fn relays_in<D: BenchDialect>(
    store: &SqlStore<D>,
    scratch: &str,
    bench: &RelayBench,
) -> anyhow::Result<RelayScaling> {
    let system = format!("bench-{}", short_id());
    let transport = Transport::open(store, bench.broker.as_deref(), bench.partitions, &system).await?;
    let mut receiving = Receiving::open(&transport).await?;
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
    receiving.next().await?;
    let started = Instant::now();
    for batch in &batches {
        transport.publisher.publish(batch).await?;
    }
    let publish_only = drain(1, n, started);
    drop(batches);
    let raw_publish = raw::publish(bench.broker.as_deref(), n).await?;

    let mut relays = Vec::new();
    for &instances in &bench.instances {
        fill(store, n).await?;
        receiving.next().await?;
        let stop = CancellationToken::new();
        let started = Instant::now();
        let config = relay_config(bench.partitions)
            .batch_size(bench.batch_size)
            .max_in_flight_batches(bench.window as usize)
            .poll_interval(Duration::from_millis(50));
        let (mut running, stats) = start_relays(store, &transport, instances, config, &stop);
        // Watch the relays' own counters: querying the outbox while it drains
        // would take CPU from the relays and the database.
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
    fill(store, n).await?;
    receiving.next().await?;
    let relay_process = RelayChild {
        database: bench.database.clone(),
        scratch: scratch.to_owned(),
        broker: bench.broker.clone(),
        system,
        events: n,
        partitions: bench.partitions,
        batch_size: bench.batch_size,
        window: bench.window,
    }
    .spawn()
    .await?;
    transport
        .remove(BenchEvent::TOPIC, &[receiving.group.as_str()])
        .await?;
    Ok(RelayScaling {
        database: D::NAME,
        transport: transport.label.clone(),
        events: n,
        partitions: bench.partitions,
        batch_size: bench.batch_size,
        window: bench.window,
        sql_drain: sql,
        publish_only,
        raw_publish,
        relays,
        relay_process,
    })
}

/// The consumer group that takes what a drain publishes: RabbitMQ refuses
/// what no queue takes. Each drain has a group of its own, the previous
/// one removed, so that no drain publishes onto a queue the ones before it
/// filled (moto's SQS slows down with every message a queue holds).
struct Receiving<'a> {
    transport: &'a Transport,
    drains: usize,
    group: String,
}

impl<'a> Receiving<'a> {
    async fn open(transport: &'a Transport) -> anyhow::Result<Self> {
        let group = "bench-0".to_owned();
        transport
            .subscriber
            .ensure_group(&group, BenchEvent::TOPIC)
            .await?;
        Ok(Self {
            transport,
            drains: 0,
            group,
        })
    }

    /// A group for the next drain: made before the last one is removed.
    async fn next(&mut self) -> anyhow::Result<()> {
        self.drains += 1;
        let group = format!("bench-{}", self.drains);
        self.transport
            .subscriber
            .ensure_group(&group, BenchEvent::TOPIC)
            .await?;
        let last = std::mem::replace(&mut self.group, group);
        self.transport.remove_group(BenchEvent::TOPIC, &last).await
    }
}

impl fmt::Display for RelayScaling {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "relay scaling · {} outbox -> {} · {} events per backlog · {} partitions · batches of {}, {} in flight",
            self.database, self.transport, self.events, self.partitions, self.batch_size, self.window
        )?;
        for d in &self.sql_drain {
            writeln!(
                f,
                "  raw limit: SQL claim-and-delete, {} connection(s)   {:>9.0} events/s",
                d.instances, d.per_second
            )?;
        }
        if let Some(raw) = &self.raw_publish {
            writeln!(
                f,
                "  raw limit: the broker's client, 500 in flight       {:>9.0} events/s",
                raw.per_second
            )?;
        }
        writeln!(
            f,
            "  publish only: the adapter, confirmed batches        {:>9.0} events/s",
            self.publish_only.per_second
        )?;
        let best_sql = self.sql_drain.iter().map(|d| d.per_second).fold(0.0, f64::max);
        let one = self.relays.first().map_or(0.0, |d| d.per_second);
        let raw_share = |per_second: f64| {
            self.raw_publish.as_ref().map_or(String::new(), |r| {
                format!(" · {:.2} of the raw publish", per_second / r.per_second.max(1e-9))
            })
        };
        for d in &self.relays {
            let raw = raw_share(d.per_second);
            writeln!(
                f,
                "  {} relay(s)                                        {:>9.0} events/s  ({:.2}x one relay · {:.2} of the SQL drain{raw})",
                d.instances,
                d.per_second,
                d.per_second / one.max(1e-9),
                d.per_second / best_sql.max(1e-9),
            )?;
        }
        let p = &self.relay_process;
        writeln!(
            f,
            "  1 relay in its own process                        {:>9.0} events/s  ({:.2} of the SQL drain{} · peak RSS {:.1} MiB)",
            p.per_second,
            p.per_second / best_sql.max(1e-9),
            raw_share(p.per_second),
            p.peak_rss_mib
        )?;
        writeln!(
            f,
            "  targets: NATS at least 50 000 events/s and 0.8 of the SQL drain; RabbitMQ at least 10 000 events/s and 0.8 of the raw publish; peak RSS under 64 MiB"
        )
    }
}

/// One relay run in a process of its own (`tidings bench relay-process`,
/// hidden): the parent fills the backlog, the child drains it and reports.
#[derive(Debug, Clone, clap::Args)]
pub struct RelayChild {
    /// PostgreSQL or MySQL.
    #[arg(long)]
    pub(crate) database: String,
    /// The bench's schema (PostgreSQL) or database (MySQL), holding the filled outbox.
    #[arg(long)]
    pub(crate) scratch: String,
    /// The transport URL; the database log when left out.
    #[arg(long)]
    pub(crate) broker: Option<String>,
    /// The name the broker resources were opened under.
    #[arg(long)]
    pub(crate) system: String,
    /// Events to publish before stopping.
    #[arg(long)]
    pub(crate) events: usize,
    /// Outbox partitions.
    #[arg(long)]
    pub(crate) partitions: u32,
    /// Records per relay batch.
    #[arg(long)]
    pub(crate) batch_size: usize,
    /// Batches in flight at once.
    #[arg(long)]
    pub(crate) window: u32,
}

/// What the relay process measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct RelayProcessRun {
    /// Wall-clock time of the drain, from the relay's start.
    pub(crate) seconds: f64,
    /// Events published per second.
    pub(crate) per_second: f64,
    /// The process's peak resident memory (`VmHWM`), MiB.
    pub(crate) peak_rss_mib: f64,
}

impl RelayChild {
    /// Runs this command in a child process of the same executable, and reads its figures.
    async fn spawn(self) -> anyhow::Result<RelayProcessRun> {
        let mut command = std::process::Command::new(std::env::current_exe()?);
        command.args(["bench", "relay-process", "--database", &self.database]);
        command.args(["--scratch", &self.scratch, "--system", &self.system]);
        command.args(["--events", &self.events.to_string()]);
        command.args(["--partitions", &self.partitions.to_string()]);
        command.args(["--batch-size", &self.batch_size.to_string()]);
        command.args(["--window", &self.window.to_string()]);
        if let Some(broker) = &self.broker {
            command.args(["--broker", broker]);
        }
        let out = tokio::task::spawn_blocking(move || command.output()).await??;
        anyhow::ensure!(
            out.status.success(),
            "the relay process failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        Ok(serde_json::from_slice(&out.stdout)?)
    }

    /// In the child: one relay drains `events`, then the figures go to stdout.
    pub(crate) async fn run(self) -> anyhow::Result<RelayProcessRun> {
        if opens::<My>(&self.database) {
            self.run_on::<My>().await
        } else {
            self.run_on::<Pg>().await
        }
    }

    async fn run_on<D: BenchDialect>(self) -> anyhow::Result<RelayProcessRun> {
        // A connection per batch in flight (two over the database log,
        // whose publish appends beside the claim), and three for the
        // wake-ups, the leases and the cleanup, as the daemon asks.
        let connections = self.window * 2 + 3;
        let store = Scratch::<D>::open(&self.database, &self.scratch, connections).await?;
        let transport =
            Transport::open(&store, self.broker.as_deref(), self.partitions, &self.system).await?;
        let stop = CancellationToken::new();
        let config = relay_config(self.partitions)
            .batch_size(self.batch_size)
            .max_in_flight_batches(self.window as usize)
            .poll_interval(Duration::from_millis(50));
        let started = Instant::now();
        let (mut running, stats) = start_relays(&store, &transport, 1, config, &stop);
        while (stats[0].published() as usize) < self.events {
            if let Some(done) = running.try_join_next() {
                done??;
                anyhow::bail!("the relay stopped before the backlog was drained");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let seconds = started.elapsed().as_secs_f64();
        stop.cancel();
        while let Some(done) = running.join_next().await {
            done??;
        }
        Ok(RelayProcessRun {
            seconds,
            per_second: self.events as f64 / seconds.max(1e-9),
            peak_rss_mib: status_mib("VmHWM").context("reading VmHWM from /proc/self/status")?,
        })
    }
}
