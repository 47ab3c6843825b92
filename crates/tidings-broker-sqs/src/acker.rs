//! Settling a delivery: delete it, make it visible again (at once or after
//! a delay), or move it to the group's dead-letter queue.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use async_trait::async_trait;
use aws_sdk_sqs::types::MessageAttributeValue;
use tidings_core::{AckKind, Acker, Result};

use crate::SqsTransport;
use crate::names::is_fifo;

/// SQS's longest visibility timeout: twelve hours.
pub(crate) const MAX_VISIBILITY_SECONDS: u64 = 12 * 3600;

/// The messages a subscription holds: kept hidden while held, made
/// visible again when it closes.
///
/// A message is held only until its visibility timeout would run out
/// without a renewal (a renewal late or failed, the service slow): from
/// then on another member may have received it, and this one never
/// changes its visibility again (it would hide, or show, another member's
/// message; SQS refuses such a stale receipt, moto does not). Deleting it
/// once handled stays harmless.
#[derive(Default)]
pub(crate) struct HeldMessages {
    /// By message id: its receipt handle, and until when it is hidden for sure.
    pub(crate) receipts: Mutex<HashMap<String, Holding>>,
    /// Taken for the whole of a visibility change, so that a renewal of
    /// what is held never lands after a settlement that showed a message
    /// again (it would hide it, and its key, for another timeout).
    pub(crate) changing: tokio::sync::Mutex<()>,
    /// Told each time a message is let go: its message group may be free.
    pub(crate) settled: tokio::sync::Notify,
}

pub(crate) type Held = Arc<HeldMessages>;

/// A message held: its receipt, and when its hiding runs out (counted from
/// the request that hid it, so never later than SQS counts it).
#[derive(Debug, Clone)]
pub(crate) struct Holding {
    pub(crate) receipt: String,
    pub(crate) hidden_until: Instant,
    /// When it was asked for: SQS hides a message at most 12 hours from
    /// then ([`MAX_HIDDEN`]).
    pub(crate) received: Instant,
}

/// How long SQS hides a received message at most, renewals included.
pub(crate) const MAX_HIDDEN: std::time::Duration = std::time::Duration::from_secs(12 * 3600);

impl HeldMessages {
    /// Stops holding `message_id` under `receipt`; whether it was still
    /// held for sure. A message SQS delivered again meanwhile (its hiding
    /// ran out) is held under its newer receipt, for its newer delivery:
    /// settling the older one leaves that holding alone.
    pub(crate) fn let_go(&self, message_id: &str, receipt: &str) -> bool {
        let held = {
            let mut receipts = self.receipts.lock().unwrap();
            match receipts.get(message_id) {
                Some(h) if h.receipt == receipt => receipts.remove(message_id),
                _ => None,
            }
        };
        self.settled.notify_one();
        held.is_some_and(|h| h.hidden_until > Instant::now())
    }
}

pub(crate) struct SqsAcker {
    pub(crate) transport: SqsTransport,
    pub(crate) queue_url: String,
    pub(crate) dead_queue: String,
    pub(crate) held: Held,
    pub(crate) message_id: String,
    pub(crate) receipt: String,
    pub(crate) group_id: Option<String>,
    /// The deduplication id it was sent with (the envelope id, when Tidings
    /// published it): its dead-letter copy carries it, so that the same
    /// event received twice (published again, or in two messages) leaves
    /// one copy there within SQS's five-minute deduplication window.
    pub(crate) deduplication_id: Option<String>,
    pub(crate) body: String,
    pub(crate) attributes: HashMap<String, MessageAttributeValue>,
}

impl SqsAcker {
    async fn show_again_in(&self, seconds: u64) -> Result<()> {
        let seconds = seconds.min(MAX_VISIBILITY_SECONDS) as i32;
        self.transport
            .sqs
            .change_message_visibility()
            .queue_url(&self.queue_url)
            .receipt_handle(&self.receipt)
            .visibility_timeout(seconds)
            .send()
            .await
            .map(drop)
            .map_err(|e| self.transport.error("making a message visible again", e))
    }

    async fn delete(&self) -> Result<()> {
        self.transport
            .sqs
            .delete_message()
            .queue_url(&self.queue_url)
            .receipt_handle(&self.receipt)
            .send()
            .await
            .map(drop)
            .map_err(|e| self.transport.error("deleting a settled message", e))
    }
}

#[async_trait]
impl Acker for SqsAcker {
    async fn ack(&self, kind: AckKind) -> Result<()> {
        tracing::debug!(queue = %self.queue_url, message_id = %self.message_id, ?kind, "settling");
        match kind {
            // The subscription keeps every message it holds hidden.
            AckKind::Progress => Ok(()),
            AckKind::Ack => {
                self.held.let_go(&self.message_id, &self.receipt);
                self.delete().await
            }
            AckKind::Nak(delay) => {
                let _changing = self.held.changing.lock().await;
                if !self.held.let_go(&self.message_id, &self.receipt) {
                    // Its hiding ran out: it is visible already, or another
                    // member's now.
                    tracing::debug!(queue = %self.queue_url, message_id = %self.message_id, "not held any more: left as it is");
                    return Ok(());
                }
                // Whole seconds, rounded up: never before the delay.
                self.show_again_in(delay.map_or(0, |d| d.as_millis().div_ceil(1000) as u64))
                    .await
            }
            AckKind::Term => {
                self.held.let_go(&self.message_id, &self.receipt);
                let dead = self.transport.queue(&self.dead_queue, &[]).await?;
                // A copy in the dead-letter queue, then the original goes:
                // a crash in between leaves both, never neither.
                let fifo = is_fifo(&self.dead_queue);
                self.transport
                    .sqs
                    .send_message()
                    .queue_url(&dead)
                    .message_body(&self.body)
                    .set_message_attributes((!self.attributes.is_empty()).then(|| self.attributes.clone()))
                    .set_message_group_id(
                        fifo.then(|| self.group_id.clone().unwrap_or_else(|| self.message_id.clone())),
                    )
                    .set_message_deduplication_id(fifo.then(|| {
                        self.deduplication_id
                            .clone()
                            .unwrap_or_else(|| self.message_id.clone())
                    }))
                    .send()
                    .await
                    .map_err(|e| {
                        self.transport
                            .error("moving a message to its dead-letter queue", e)
                    })?;
                self.delete().await
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn holding(receipt: &str) -> Holding {
        Holding {
            receipt: receipt.to_owned(),
            hidden_until: Instant::now() + Duration::from_secs(30),
            received: Instant::now(),
        }
    }

    #[test]
    fn settling_an_older_delivery_leaves_the_newer_holding() {
        let held = HeldMessages::default();
        // Delivered under r1, then again under r2 once r1's hiding ran out.
        held.receipts.lock().unwrap().insert("m".into(), holding("r1"));
        held.receipts.lock().unwrap().insert("m".into(), holding("r2"));
        assert!(!held.let_go("m", "r1"), "r1 is not held any more");
        assert_eq!(held.receipts.lock().unwrap()["m"].receipt, "r2");
        assert!(held.let_go("m", "r2"));
        assert!(held.receipts.lock().unwrap().is_empty());
    }
}
