//! Relay throughput by number of instances, beside the SQL-only drain and publish-only limits.

use std::fmt;
use std::time::{Duration, Instant};

use serde::Serialize;
use tidings_core::{LagSource, Message, OutgoingMessage};
use tidings_store_postgres::PgStore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::{BenchEvent, Drain, Schema, drain, event, fill, open_transport, relay_config, start_relays};

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
