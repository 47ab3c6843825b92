//! [`CdcBatch`]: a batch of the CDC relay, and what its end tells the stream.

use async_trait::async_trait;
use tidings_core::{ClaimedBatch, OutgoingMessage, Result, Settlement, Undecodable};
use tidings_store_postgres::PgBatch;

use crate::store::{CatchUp, CdcStore};
use crate::stream::Committed;

/// Where a batch's records came from.
enum Origin {
    /// Found by sweeping the outbox: its end moves no stream position,
    /// unless it took every record unsent (then, sent whole, the outbox
    /// has caught up with the stream).
    Swept(Option<CatchUp>),
    /// The records of these streamed transactions still unsent.
    Streamed {
        taken: Vec<Committed>,
        store: CdcStore,
        session: u64,
    },
}

/// A batch claimed by the CDC relay: the records locked in the outbox as
/// the polling relay's are ([`PgBatch`]). Completed, its transactions'
/// position is confirmed to the server; released, they are taken again
/// next; settled in part, the records left wait in the outbox, where the
/// relay sweeps them up before it follows the stream again.
pub struct CdcBatch {
    inner: PgBatch,
    origin: Origin,
}

impl std::fmt::Debug for CdcBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CdcBatch")
            .field("inner", &self.inner)
            .field("streamed", &matches!(self.origin, Origin::Streamed { .. }))
            .finish()
    }
}

impl CdcBatch {
    pub(crate) fn empty() -> CdcBatch {
        CdcBatch::swept(PgBatch::empty())
    }

    pub(crate) fn swept(inner: PgBatch) -> CdcBatch {
        CdcBatch {
            inner,
            origin: Origin::Swept(None),
        }
    }

    pub(crate) fn swept_catching_up(inner: PgBatch, catch_up: CatchUp) -> CdcBatch {
        CdcBatch {
            inner,
            origin: Origin::Swept(Some(catch_up)),
        }
    }

    pub(crate) fn streamed(inner: PgBatch, taken: Vec<Committed>, store: CdcStore, session: u64) -> CdcBatch {
        CdcBatch {
            inner,
            origin: Origin::Streamed {
                taken,
                store,
                session,
            },
        }
    }
}

#[async_trait]
impl ClaimedBatch for CdcBatch {
    fn messages(&self) -> &[OutgoingMessage] {
        self.inner.messages()
    }

    fn seqs(&self) -> &[i64] {
        self.inner.seqs()
    }

    fn undecodable(&self) -> &[Undecodable] {
        self.inner.undecodable()
    }

    async fn complete(self) -> Result<()> {
        let done = self.inner.complete().await;
        match self.origin {
            Origin::Streamed {
                taken,
                store,
                session,
            } => match (&done, taken.last()) {
                (Ok(()), Some(last)) => store.sent(session, last.end).await,
                // Not marked: the records are unsent in the outbox, and
                // the stream has moved past them.
                _ => store.unsettled().await,
            },
            Origin::Swept(Some(catch_up)) if done.is_ok() => catch_up.sent_whole().await,
            Origin::Swept(_) => {}
        }
        done
    }

    async fn release(self) -> Result<()> {
        let done = self.inner.release().await;
        if let Origin::Streamed {
            taken,
            store,
            session,
        } = self.origin
        {
            store.unsent(session, taken).await;
        }
        done
    }

    async fn settle(self, settlement: Settlement) -> Result<()> {
        let done = self.inner.settle(settlement).await;
        if let Origin::Streamed { store, .. } = self.origin {
            store.unsettled().await;
        }
        done
    }
}
