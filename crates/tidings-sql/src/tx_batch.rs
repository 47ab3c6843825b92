//! A batch claimed under a transaction: the relay's claim where the
//! database can hold rows locked while they are published (PostgreSQL,
//! MySQL).

use async_trait::async_trait;
use sqlx::Transaction;
use tidings_core::{ClaimedBatch, OutgoingMessage, Result, Settlement, Undecodable};

use crate::claimed::{ClaimedRows, write_settlement};
use crate::db::SqlDb;
use crate::errors::db_error;
use crate::{Dialect, SqlStore};

/// The savepoint a claim sets between locking its leases and changing its
/// rows (`SAVEPOINT tidings_claim`), for [`TxBatch`].
pub const CLAIM_SAVEPOINT: &str = "SAVEPOINT tidings_claim";
const BACK_TO_CLAIM: &str = "ROLLBACK TO SAVEPOINT tidings_claim";

/// A batch claimed by one relay: its rows stay locked (other relays keep
/// off them) until the batch is completed (its transaction commits, with
/// the rows deleted or stamped in it) or released (it rolls back), or the
/// relay dies and the database rolls it back. Settled in part, it rolls
/// back to [`CLAIM_SAVEPOINT`], taken after the lease locks and before the
/// rows changed, and marks what was sent in the same transaction: the lease
/// locks, held from the claim to the commit, are the fence, however long
/// the search for the records at fault took.
pub struct TxBatch<D: Dialect> {
    tx: Option<Transaction<'static, D::Db>>,
    rows: ClaimedRows,
    store: Option<SqlStore<D>>,
}

impl<D: Dialect> TxBatch<D> {
    /// `rows`, claimed in `tx` on `store`. The claim must have locked its
    /// leases, then set [`CLAIM_SAVEPOINT`],
    /// then changed the rows.
    pub fn new(tx: Transaction<'static, D::Db>, rows: ClaimedRows, store: &SqlStore<D>) -> Self {
        TxBatch {
            tx: Some(tx),
            rows,
            store: Some(store.clone()),
        }
    }

    /// Nothing claimed, nothing held.
    pub fn empty() -> Self {
        TxBatch {
            tx: None,
            rows: ClaimedRows::default(),
            store: None,
        }
    }
}

impl<D: Dialect> std::fmt::Debug for TxBatch<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TxBatch")
            .field("database", &D::NAME)
            .field("messages", &self.rows.messages.len())
            .field("undecodable", &self.rows.undecodable.len())
            .field("holding", &self.tx.is_some())
            .finish()
    }
}

#[async_trait]
impl<D: Dialect> ClaimedBatch for TxBatch<D> {
    fn messages(&self) -> &[OutgoingMessage] {
        &self.rows.messages
    }

    fn seqs(&self) -> &[i64] {
        &self.rows.seqs
    }

    fn undecodable(&self) -> &[Undecodable] {
        &self.rows.undecodable
    }

    async fn complete(mut self) -> Result<()> {
        // Never delete what was not sent: the undecodable stay unsent.
        if let Some(decoded) = self.rows.decoded_only() {
            return self.settle(decoded).await;
        }
        match self.tx.take() {
            Some(tx) => tx
                .commit()
                .await
                .map_err(db_error::<D>("completing an outbox batch")),
            None => Ok(()),
        }
    }

    async fn release(mut self) -> Result<()> {
        match self.tx.take() {
            Some(tx) => tx
                .rollback()
                .await
                .map_err(db_error::<D>("releasing an outbox batch")),
            None => Ok(()),
        }
    }

    async fn settle(mut self, settlement: Settlement) -> Result<()> {
        let (Some(mut tx), Some(store)) = (self.tx.take(), &self.store) else {
            return Ok(());
        };
        if settlement.is_empty() {
            return tx
                .rollback()
                .await
                .map_err(db_error::<D>("releasing an outbox batch"));
        }
        // The claim deleted (or stamped) every record it read: undo that,
        // keep the lease locks taken before it, and mark only what was sent.
        // No other relay can have taken these partitions meanwhile, so
        // there is nothing to check: a search that outlasted the leases'
        // time still settles (their renewal waits on these locks).
        <D::Db as SqlDb>::script(&mut tx, sqlx::SqlSafeStr::into_sql_str(BACK_TO_CLAIM))
            .await
            .map_err(db_error::<D>("settling an outbox batch"))?;
        write_settlement(store, &mut tx, &settlement).await?;
        tx.commit()
            .await
            .map_err(db_error::<D>("committing an outbox batch"))
    }
}
