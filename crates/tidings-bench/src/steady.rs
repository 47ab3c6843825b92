//! Steady state: producers at full speed with a relay running.

use std::fmt;
use std::time::{Duration, Instant};

use serde::Serialize;
use tidings_core::Message;
use tidings_sql::SqlStore;
use tokio_util::sync::CancellationToken;

use super::database::{BenchDialect, OnDatabase, ensure_measured, on_scratch, scalar};
use super::producer::{Write, write_for};
use super::{BenchEvent, create_orders, open_transport, relay_config, start_relays};

/// What the steady-state scenario runs.
#[derive(Debug, Clone, clap::Args)]
pub struct SteadyBench {
    /// PostgreSQL or MySQL (the bench works in a schema or database of its
    /// own, dropped at the end).
    #[arg(long, env = "TIDINGS_DATABASE_URL")]
    pub(crate) database: String,
    /// `nats://...`, `amqp://...`, `kafka://...`, `sqs://...` or `pubsub://PROJECT`; the database log when left out.
    #[arg(long, env = "TIDINGS_BROKER_URL")]
    pub(crate) broker: Option<String>,
    /// Producer connections.
    #[arg(long, default_value_t = 16)]
    pub(crate) connections: usize,
    /// Seconds the producers run with the relays (and half that alone, first).
    #[arg(long, default_value_t = 20.0)]
    pub(crate) seconds: f64,
    /// Relays.
    #[arg(long, default_value_t = 1)]
    pub(crate) relays: usize,
    /// Outbox partitions.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub(crate) partitions: u32,
}

impl SteadyBench {
    /// Refuses what cannot run, with one line.
    pub(crate) fn check(&self) -> anyhow::Result<()> {
        ensure_measured(&self.database, "steady-state")?;
        anyhow::ensure!(
            self.connections > 0 && self.seconds > 0.0 && self.relays > 0,
            "--connections, --seconds and --relays must be positive"
        );
        Ok(())
    }
}

/// Producers at full speed with the relays running: does the relay keep up?
#[derive(Debug, Clone, Serialize)]
pub(crate) struct SteadyState {
    /// The database of the outbox.
    pub(crate) database: &'static str,
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

async fn backlog<D: BenchDialect>(store: &SqlStore<D>) -> anyhow::Result<u64> {
    let n = scalar(
        store,
        "SELECT count(*) FROM tidings_outbox WHERE published_at IS NULL",
    )
    .await?;
    Ok(n.max(0) as u64)
}

/// Runs the steady-state scenario.
pub(crate) async fn steady(bench: SteadyBench) -> anyhow::Result<SteadyState> {
    on_scratch(&bench.database, &bench).await
}

impl OnDatabase for SteadyBench {
    type Figures = SteadyState;

    async fn run_on<D: BenchDialect>(
        &self,
        store: &SqlStore<D>,
        _scratch: &str,
    ) -> anyhow::Result<SteadyState> {
        steady_in(store, self).await
    }
}

async fn steady_in<D: BenchDialect>(store: &SqlStore<D>, bench: &SteadyBench) -> anyhow::Result<SteadyState> {
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
    {
        let mut conn = store.conn("clearing the bench's outbox").await?;
        super::database::run::<D>(&mut conn, "DELETE FROM tidings_outbox", |_| Ok(())).await?;
    }

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
        database: D::NAME,
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
            "steady state · {} outbox -> {} · {} producer connections · {} relay(s)",
            self.database, self.transport, self.connections, self.relays
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
