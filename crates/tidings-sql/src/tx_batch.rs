//! A batch claimed under a transaction: the relay's claim where the
//! database can hold rows locked while they are published (PostgreSQL,
//! MySQL).

use async_trait::async_trait;
use sqlx::Transaction;
use tidings_core::{ClaimedBatch, OutboxPartitions, OutgoingMessage, Result, Settlement, Undecodable};

use crate::claimed::{ClaimedRows, settle};
use crate::errors::db_error;
use crate::{Dialect, SqlStore};

/// A batch claimed by one relay: its rows stay locked (other relays keep
/// off them) until the batch is completed (its transaction commits, with
/// the rows deleted or stamped in it) or released (it rolls back), or the
/// relay dies and the database rolls it back. Settled in part, it rolls
/// back and marks what was sent in a transaction of its own ([`settle`]).
pub struct TxBatch<D: Dialect> {
    tx: Option<Transaction<'static, D::Db>>,
    rows: ClaimedRows,
    claim: Option<(SqlStore<D>, OutboxPartitions)>,
}

impl<D: Dialect> TxBatch<D> {
    /// `rows`, claimed in `tx` on `store` under the leases of `live`.
    pub fn new(
        tx: Transaction<'static, D::Db>,
        rows: ClaimedRows,
        store: &SqlStore<D>,
        live: OutboxPartitions,
    ) -> Self {
        TxBatch {
            tx: Some(tx),
            rows,
            claim: Some((store.clone(), live)),
        }
    }

    /// Nothing claimed, nothing held.
    pub fn empty() -> Self {
        TxBatch {
            tx: None,
            rows: ClaimedRows::default(),
            claim: None,
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
        // The claim's transaction deleted (or stamped) every record it
        // read: undo it all, then mark only what was sent. The leases keep
        // other relays off these partitions in between.
        if let Some(tx) = self.tx.take() {
            tx.rollback()
                .await
                .map_err(db_error::<D>("releasing an outbox batch"))?;
        }
        match &self.claim {
            Some((store, live)) => settle(store, live, settlement).await,
            None => Ok(()),
        }
    }
}
