//! Settling a delivery: acknowledge it, hand it back (at once, or after a
//! delay, with `modifyAckDeadline`), or move it to the group's dead-letter
//! topic.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use async_trait::async_trait;
use gcloud_googleapis::pubsub::v1::PubsubMessage;
use tidings_core::{AckKind, Acker, Error, Result};

use crate::PubSubTransport;
use crate::settlements::{Settle, Settlements};

/// The ack deadline a message handed back is given: it comes back when it
/// runs out (see [`PubSubAcker`]'s `Nak`).
pub(crate) const HAND_BACK_SECONDS: i32 = 1;

/// Pub/Sub's longest ack deadline, in seconds: a delayed retry waits at
/// most this long.
pub(crate) const MAX_DEADLINE_SECONDS: u64 = 600;

/// The messages a subscription holds: their deadlines extended while held
/// (up to the longest lease), handed back when it closes.
#[derive(Default)]
pub(crate) struct HeldMessages {
    /// By ack id: when it was pulled.
    pub(crate) ack_ids: Mutex<HashMap<String, Instant>>,
    /// Told each time a message is let go: its ordering key may be free.
    pub(crate) settled: tokio::sync::Notify,
}

pub(crate) type Held = Arc<HeldMessages>;

pub(crate) struct PubSubAcker {
    pub(crate) transport: PubSubTransport,
    /// The subscription's, sent together.
    pub(crate) settlements: Settlements,
    pub(crate) ack_id: String,
    pub(crate) message: PubsubMessage,
    pub(crate) held: Held,
    pub(crate) dead_topic: String,
}

impl PubSubAcker {
    /// Stops holding the message; whether it was still held.
    fn let_go(&self) -> bool {
        let held = self.held.ack_ids.lock().unwrap().remove(&self.ack_id).is_some();
        self.held.settled.notify_one();
        held
    }

    async fn acknowledge(&self) -> Result<()> {
        self.settlements
            .settle(self.ack_id.clone(), Settle::Ack)
            .await
            .map_err(|e| self.failed("acknowledging", e))
    }

    fn failed(&self, what: &str, e: gcloud_gax::grpc::Status) -> Error {
        self.transport
            .error(&format!("{what} message {}", self.message.message_id), e)
    }
}

#[async_trait]
impl Acker for PubSubAcker {
    async fn ack(&self, kind: AckKind) -> Result<()> {
        tracing::debug!(message_id = %self.message.message_id, ?kind, "settling");
        match kind {
            // The subscription extends the deadline of every message it holds.
            AckKind::Progress => Ok(()),
            AckKind::Ack => {
                self.let_go();
                self.acknowledge().await
            }
            AckKind::Nak(delay) => {
                if !self.let_go() {
                    return Ok(());
                }
                // Whole seconds, rounded up: never before the delay. Its
                // ordering key waits behind it. At least a second: a message
                // whose deadline runs out comes back before the key's later
                // ones, and the emulator sends one handed back with a
                // deadline of 0 after them.
                let seconds = delay
                    .map_or(0, |d| d.as_millis().div_ceil(1000) as u64)
                    .max(HAND_BACK_SECONDS as u64);
                let deadline = Settle::Deadline(seconds.min(MAX_DEADLINE_SECONDS) as i32);
                self.settlements
                    .settle(self.ack_id.clone(), deadline)
                    .await
                    .map_err(|e| self.failed("handing back", e))
            }
            AckKind::Term => {
                self.let_go();
                // A copy in the dead-letter topic, confirmed, then the
                // original acknowledged: a crash in between leaves both,
                // never neither. The copy has no ordering key: nothing
                // waits behind it there.
                let copy = PubsubMessage {
                    data: self.message.data.clone(),
                    attributes: self.message.attributes.clone(),
                    ..PubsubMessage::default()
                };
                self.transport
                    .publisher(&self.dead_topic)
                    .publish_immediately(vec![copy], None)
                    .await
                    .map_err(|e| {
                        self.failed(
                            &format!("copying to dead-letter topic {} the", self.dead_topic),
                            e,
                        )
                    })?;
                self.acknowledge().await
            }
        }
    }
}
