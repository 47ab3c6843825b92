//! The payments system's tables, and the figures read back from them.

use async_trait::async_trait;
use tidings_demo_kit::Work;
use tidings_sql::SqlStore;
use tidings_sql::db::Stmt;

use crate::sql::{PaymentsDialect, shared};

/// Figures read from the database in one snapshot.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tally {
    /// Stripe events the inbox took (each once, however often delivered).
    pub stripe_events: i64,
    /// Payments captured.
    pub captured_payments: i64,
    /// Payments refunded at least in part.
    pub refunded_payments: i64,
    /// Payments whose refund was delivered before their capture (and waited for it).
    pub refunds_waited: i64,
    /// Refunds still waiting for their capture.
    pub refunds_waiting: i64,
    /// Outbox records not yet sent.
    pub outbox_pending: i64,
    /// Events a consumer saw after a later event of the same payment.
    pub violations: i64,
    /// Ledger entries.
    pub ledger_entries: i64,
    /// Per currency: what the intake recorded.
    pub currencies: Vec<CurrencyFigures>,
    /// The ledger's balances: (account, currency, balance).
    pub balances: Vec<(String, String, i64)>,
    /// What each consumer did.
    pub work: Work,
}

/// What the intake recorded in one currency.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CurrencyFigures {
    /// ISO 4217, lower case.
    pub currency: String,
    /// Payments captured.
    pub payments: i64,
    /// Sum captured.
    pub captured: i64,
    /// Sum refunded.
    pub refunded: i64,
    /// Payment events emitted.
    pub events: i64,
}

impl Tally {
    /// Payment events the intake emitted.
    pub fn payment_events(&self) -> i64 {
        self.currencies.iter().map(|c| c.events).sum()
    }

    /// The balance of `account` in `currency`.
    pub fn balance(&self, account: &str, currency: &str) -> i64 {
        self.balances
            .iter()
            .find(|(a, c, _)| a == account && c == currency)
            .map_or(0, |(_, _, b)| *b)
    }
}

/// What the demo needs from a database: Tidings' store abilities and the
/// payments system's own SQL.
#[async_trait]
pub trait PaymentsStore: tidings_core::Store + tidings_core::InboxStore {
    /// Runs Tidings' migrations and creates the payments tables.
    async fn setup(&self) -> anyhow::Result<()>;

    /// Reads the figures.
    async fn tally(&self) -> anyhow::Result<Tally>;

    /// This database's system id, made once: it names the system's
    /// resources on a broker.
    async fn system_id(&self) -> anyhow::Result<String>;
}

#[async_trait]
impl<D: PaymentsDialect> PaymentsStore for SqlStore<D> {
    async fn setup(&self) -> anyhow::Result<()> {
        Ok(tidings_demo_kit::setup_system(self, D::PAYMENTS.schema, "creating the payments tables").await?)
    }

    async fn system_id(&self) -> anyhow::Result<String> {
        let mut conn = self.conn("naming the system").await?;
        Ok(tidings_demo_kit::system_id::<D>(&mut conn, "payments").await?)
    }

    async fn tally(&self) -> anyhow::Result<Tally> {
        // One snapshot for every figure: a handler committing between
        // two reads would make them disagree.
        let mut tx = self.pool().begin().await?;
        Stmt::<D>::new(D::PAYMENTS.snapshot, "starting the tally's snapshot")
            .execute(&mut tx)
            .await?;
        let row = Stmt::<D>::new(shared::TALLY, "reading the figures")
            .fetch_one(&mut tx)
            .await?;
        let figure = |i: usize| row.get::<i64>(i);
        let currencies = Stmt::<D>::new(D::PAYMENTS.per_currency, "reading the payments per currency")
            .fetch_all(&mut tx)
            .await?
            .iter()
            .map(|r| {
                Ok(CurrencyFigures {
                    currency: r.get(0)?,
                    payments: r.get(1)?,
                    captured: r.get(2)?,
                    refunded: r.get(3)?,
                    events: r.get(4)?,
                })
            })
            .collect::<tidings_core::Result<Vec<_>>>()?;
        let balances = Stmt::<D>::new(shared::BALANCES, "reading the ledger's balances")
            .fetch_all(&mut tx)
            .await?
            .iter()
            .map(|r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .collect::<tidings_core::Result<Vec<_>>>()?;
        Ok(Tally {
            stripe_events: figure(0)?,
            captured_payments: figure(1)?,
            refunded_payments: figure(2)?,
            refunds_waited: figure(3)?,
            refunds_waiting: figure(4)?,
            outbox_pending: figure(5)?,
            violations: figure(6)?,
            ledger_entries: figure(7)?,
            currencies,
            balances,
            work: Work::read::<D>(&mut tx).await?.only(&crate::demo::CONSUMERS),
        })
    }
}
