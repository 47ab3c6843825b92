//! The checkout system's own tables, the front door that accepts commands,
//! and the figures read back from the database.

use std::sync::Arc;

use async_trait::async_trait;
use tidings_core::{Outbox, OutgoingMessage, Publisher};
use tidings_demo_kit::Work;
use tidings_sql::SqlStore;
use tidings_sql::db::Stmt;

use crate::sql::CheckoutDialect;

/// Figures read from the database: the truth, whatever happened to the processes.
#[derive(Debug, Clone, Default)]
pub struct Tally {
    /// Orders in the checkout table.
    pub orders: i64,
    /// Of which poisoned.
    pub poisoned_orders: i64,
    /// Commands accepted by the front door.
    pub commands: i64,
    /// Events committed by the checkout service.
    pub events: i64,
    /// Outbox records not yet sent.
    pub outbox_pending: i64,
    /// Out-of-order events seen by consumers.
    pub violations: i64,
    /// Loyalty points owed for shipped orders.
    pub points_expected: i64,
    /// Loyalty points credited.
    pub points_credited: i64,
    /// Events counted by analytics.
    pub analytics_counted: i64,
    /// Duplicates suppressed, as consumer processes reported them ([`CheckoutStore::record_process`]).
    pub duplicates_reported: i64,
    /// Retries, as consumer processes reported them.
    pub retries_reported: i64,
    /// Processed markers per consumer.
    pub processed: Vec<(String, i64)>,
    /// Dead letters per consumer (redriven ones not counted until they fail again).
    pub dead_letters: Vec<(String, i64)>,
    /// Messages parked behind a dead letter of their key, per consumer (those
    /// being drained after a skip or a handled redrive not counted).
    pub parked: Vec<(String, i64)>,
}

impl Tally {
    /// Processed markers of `consumer`.
    pub fn processed_by(&self, consumer: &str) -> i64 {
        count_of(&self.processed, consumer)
    }

    /// Dead letters of `consumer`.
    pub fn dead_by(&self, consumer: &str) -> i64 {
        count_of(&self.dead_letters, consumer)
    }

    /// Messages `consumer` parked.
    pub fn parked_by(&self, consumer: &str) -> i64 {
        count_of(&self.parked, consumer)
    }
}

fn count_of(counts: &[(String, i64)], consumer: &str) -> i64 {
    counts.iter().find(|(c, _)| c == consumer).map_or(0, |(_, n)| *n)
}

/// What the demo needs from a database: Tidings' store abilities, the
/// handlers implemented for it, and the checkout system's own SQL.
#[async_trait]
pub trait CheckoutStore: tidings_core::Store {
    /// Runs Tidings' migrations and creates the checkout tables.
    async fn setup(&self) -> anyhow::Result<()>;

    /// The front door: records the request and enqueues the command, in one transaction.
    async fn submit(&self, step: i64, command: &OutgoingMessage) -> tidings_core::Result<()>;

    /// Reads the figures.
    async fn tally(&self) -> anyhow::Result<Tally>;

    /// Records the counters of a consumer process (replacing its last report).
    async fn record_process(&self, process: &str, duplicates: i64, retries: i64) -> anyhow::Result<()>;

    /// This database's system id, made once: it names the system's
    /// resources on a broker, so that a database and its broker topology
    /// belong together.
    async fn system_id(&self) -> anyhow::Result<String>;

    /// Makes `submit` refuse what `publisher` would refuse
    /// ([`SqlStore::refuse_what_it_refuses`]).
    fn refuse_what_it_refuses(&self, publisher: Arc<dyn Publisher>) -> tidings_core::Result<()>;
}

#[async_trait]
impl<D: CheckoutDialect> CheckoutStore for SqlStore<D> {
    fn refuse_what_it_refuses(&self, publisher: Arc<dyn Publisher>) -> tidings_core::Result<()> {
        SqlStore::refuse_what_it_refuses(self, publisher)
    }

    async fn setup(&self) -> anyhow::Result<()> {
        Ok(tidings_demo_kit::setup_system(self, D::CHECKOUT.schema, "creating the checkout tables").await?)
    }

    async fn submit(&self, step: i64, command: &OutgoingMessage) -> tidings_core::Result<()> {
        let mut tx = self.begin_tx("recording a checkout request").await?;
        Stmt::<D>::new(D::CHECKOUT.request, "recording a checkout request")
            .bind(command.envelope.aggregate_key.as_str())
            .bind(step)
            .bind(command.envelope.message_type.as_str())
            .execute(&mut tx)
            .await?;
        self.enqueue_outgoing(&mut tx, command).await?;
        self.commit(tx).await?;
        Ok(())
    }

    async fn system_id(&self) -> anyhow::Result<String> {
        let mut conn = self.conn("naming the system").await?;
        Ok(tidings_demo_kit::system_id::<D>(&mut conn, "checkout").await?)
    }

    async fn record_process(&self, process: &str, duplicates: i64, retries: i64) -> anyhow::Result<()> {
        let mut conn = self.conn("recording a process's counters").await?;
        Stmt::<D>::new(D::CHECKOUT.record_process, "recording a process's counters")
            .bind(process)
            .bind(duplicates)
            .bind(retries)
            .execute(&mut conn)
            .await?;
        Ok(())
    }

    async fn tally(&self) -> anyhow::Result<Tally> {
        // One snapshot for every figure: a handler committing between
        // two reads would make them disagree.
        let mut tx = self.pool().begin().await?;
        Stmt::<D>::new(D::CHECKOUT.snapshot, "starting the tally's snapshot")
            .execute(&mut tx)
            .await?;
        let row = Stmt::<D>::new(D::CHECKOUT.tally, "reading the figures")
            .fetch_one(&mut tx)
            .await?;
        let figure = |i: usize| row.get::<i64>(i);
        let consumers = [
            crate::demo::COMMAND_CONSUMER,
            "inventory",
            "email",
            "analytics",
            "loyalty",
        ];
        let work = Work::read::<D>(&mut tx).await?.only(&consumers);
        Ok(Tally {
            orders: figure(0)?,
            poisoned_orders: figure(1)?,
            commands: figure(2)?,
            events: figure(3)?,
            outbox_pending: figure(4)?,
            violations: figure(5)?,
            points_expected: figure(6)?,
            points_credited: figure(7)?,
            analytics_counted: figure(8)?,
            duplicates_reported: figure(9)?,
            retries_reported: figure(10)?,
            processed: work.processed,
            dead_letters: work.dead_letters,
            parked: work.parked,
        })
    }
}
