//! The inbox: what arrives from outside (a payment provider's webhook) is
//! recorded once per provider event, in the transaction that enqueues it as
//! a Tidings event.
//!
//! The HTTP side (signatures, limits, answers) is the `tidings-inbox`
//! crate; this is what it asks of a store.

use std::time::Duration;

use async_trait::async_trait;
use sqlx::Database;
use uuid::Uuid;

use crate::{ConsumerStore, Result};

/// The deliveries an inbox has accepted, keyed by (provider, the provider's
/// event id). An inbox is a consumer of the outside world: it opens its
/// transaction with [`ConsumerStore::begin`] and enqueues with
/// [`Outbox::enqueue_outgoing`](crate::Outbox::enqueue_outgoing) on it.
#[async_trait]
pub trait InboxStore: ConsumerStore {
    /// Records the delivery of `event_id` from `provider` on `conn` (the
    /// transaction that enqueues it), as the envelope `message_id`.
    /// Returns `false` when it is recorded already: a retried delivery, to
    /// be acknowledged without doing anything. A concurrent duplicate waits
    /// for the first one's transaction, then sees it (or takes over if it
    /// rolled back).
    async fn record_delivery(
        &self,
        conn: &mut <Self::Database as Database>::Connection,
        provider: &str,
        event_id: &str,
        message_id: Uuid,
    ) -> Result<bool>;

    /// Deletes up to `limit` deliveries recorded longer ago than
    /// `retention`, in its own transaction. Returns how many.
    async fn forget_deliveries(&self, retention: Duration, limit: usize) -> Result<u64>;
}
