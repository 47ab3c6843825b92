//! A batch claimed under a transaction: the relay's claim where the
//! database can hold rows locked while they are published (PostgreSQL,
//! MySQL).

use async_trait::async_trait;
use sqlx::Transaction;
use tidings_core::{ClaimedBatch, OutgoingMessage, Result};

use crate::Dialect;
use crate::errors::db_error;

/// A batch claimed by one relay: its rows stay locked (other relays keep
/// off them) until the batch is completed (its transaction commits, with
/// the rows deleted or stamped in it) or released (it rolls back), or the
/// relay dies and the database rolls it back.
pub struct TxBatch<D: Dialect> {
    tx: Option<Transaction<'static, D::Db>>,
    messages: Vec<OutgoingMessage>,
}

impl<D: Dialect> TxBatch<D> {
    /// `messages`, claimed in `tx`.
    pub fn new(tx: Transaction<'static, D::Db>, messages: Vec<OutgoingMessage>) -> Self {
        TxBatch {
            tx: Some(tx),
            messages,
        }
    }

    /// Nothing claimed, nothing held.
    pub fn empty() -> Self {
        TxBatch {
            tx: None,
            messages: Vec::new(),
        }
    }
}

impl<D: Dialect> std::fmt::Debug for TxBatch<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TxBatch")
            .field("database", &D::NAME)
            .field("messages", &self.messages.len())
            .field("holding", &self.tx.is_some())
            .finish()
    }
}

#[async_trait]
impl<D: Dialect> ClaimedBatch for TxBatch<D> {
    fn messages(&self) -> &[OutgoingMessage] {
        &self.messages
    }

    async fn complete(mut self) -> Result<()> {
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
}
