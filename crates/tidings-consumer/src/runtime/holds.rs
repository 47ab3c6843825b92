//! Key holds and parking ([`OnDeadLetter::HoldKey`]): a dead letter holds
//! its key; the key's later messages are parked, unhandled, until it is
//! released, then handled in the order they came.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tidings_core::Store;
use tidings_core::{AckKind, Delivery, ParkedMessage};
use uuid::Uuid;

use super::Worker;
use super::config::OnDeadLetter;
use super::stats::bump;
use super::work::Partitions;
use super::work::Work;
use super::work::{Settled, Unsettled};
use crate::membership::Claim;

/// A key as a consumer holds it: (topic, aggregate key).
pub(super) type HoldKey = (String, String);

/// What this member knows of a held key.
#[derive(Debug, Clone, Copy)]
pub(super) struct Hold {
    /// The dead-lettered message holding the key.
    pub(super) message_id: Uuid,
    /// Skipped, or its message handled: what is parked may go.
    pub(super) released: bool,
}

/// The keys this member holds, shared by its lanes. The store is the truth;
/// a member loads it when a session starts, and only the lane holding a key
/// changes the key's hold (a skip only releases, and is picked up by the
/// session's refresh).
pub(super) type Holds = Arc<Mutex<HashMap<HoldKey, Hold>>>;

/// How often a session looks for held keys released from outside (a skip).
pub(super) const HOLDS_REFRESH: Duration = Duration::from_secs(1);

impl<S: Store> Worker<S> {
    /// Applies the key's hold, if any ([`OnDeadLetter::HoldKey`]), then the stack.
    ///
    /// Once the session stops, nothing more is begun: every message is
    /// given back. A message given back because the stop cut its retries
    /// short must not be overtaken by the next message of its key, which
    /// this member may hold too (an SQS message group, a batch that rolled
    /// back), while its lease still lets it commit.
    pub(super) async fn handle(&self, work: Work) -> Settled {
        if self.stop.is_cancelled() {
            return self.give_back(&work.delivery).await;
        }
        let key = match &work.envelope {
            // A message without a key holds back nothing when it fails.
            Ok(e) if self.holds_keys_of(&work.delivery.message.topic) && !e.aggregate_key.is_empty() => {
                (work.delivery.message.topic.clone(), e.aggregate_key.clone())
            }
            _ => return self.process(work).await,
        };
        let id = work.envelope.as_ref().map(|e| e.id).ok();
        let hold = self.holds.lock().expect("holds lock").get(&key).copied();
        match hold {
            None => self.process(work).await,
            // The message holding the key, back (redriven, or redelivered).
            Some(hold) if Some(hold.message_id) == id => {
                let claim = work.claim.clone();
                let settled = self.process(work).await;
                if matches!(settled, Settled::Handled | Settled::Duplicate) {
                    self.drain(&key, claim.as_ref()).await;
                }
                settled
            }
            Some(hold) if hold.released => {
                if self.drain(&key, work.claim.as_ref()).await {
                    self.process(work).await
                } else {
                    self.park(work).await
                }
            }
            Some(_) => self.park(work).await,
        }
    }

    /// Handles the messages parked behind a released key, oldest first, then
    /// lets the key go. False if the key is held again (a parked message
    /// was dead-lettered: the rest wait behind it) or the session stopped.
    pub(super) async fn drain(&self, key: &HoldKey, claim: Option<&Claim>) -> bool {
        let (topic, aggregate_key) = (key.0.as_str(), key.1.as_str());
        loop {
            let next = self
                .store_op("reading parked messages", || {
                    self.store.next_parked(&self.name, topic, aggregate_key)
                })
                .await;
            let parked = match next {
                None => return false,
                Some(None) => {
                    // Only the lane holding this key parks behind it, so nothing can arrive meanwhile.
                    if self
                        .store_op("releasing a key", || {
                            self.store.release_key(&self.name, topic, aggregate_key)
                        })
                        .await
                        .is_none()
                    {
                        return false;
                    }
                    self.holds.lock().expect("holds lock").remove(key);
                    tracing::info!(consumer = %self.name, topic, key = aggregate_key, "held key released");
                    return true;
                }
                Some(Some(parked)) => parked,
            };
            let raw = parked.raw();
            let work = Work {
                envelope: self.decode(&raw),
                delivery: Delivery::new(raw, 1, Unsettled),
                claim: claim.cloned(),
            };
            let settled = self.process(work).await;
            if !matches!(
                settled,
                Settled::Handled | Settled::Duplicate | Settled::DeadLettered
            ) {
                return false;
            }
            let id = parked.message_id;
            if self
                .store_op("removing a parked message", || self.store.unpark(&self.name, id))
                .await
                .is_none()
                || settled == Settled::DeadLettered
            {
                return false;
            }
        }
    }

    /// Sets the message aside behind its held key, and settles the delivery.
    async fn park(&self, work: Work) -> Settled {
        let Ok(envelope) = &work.envelope else {
            return self.process(work).await;
        };
        let message = &work.delivery.message;
        let parked = ParkedMessage {
            topic: message.topic.clone(),
            aggregate_key: envelope.aggregate_key.clone(),
            message_id: envelope.id,
            headers: message.headers.clone(),
            body: message.body.clone(),
        };
        if self
            .store_op("parking a message", || self.store.park(&self.name, &parked))
            .await
            .is_none()
        {
            return self.give_back(&work.delivery).await;
        }
        tracing::debug!(consumer = %self.name, message_id = %envelope.id, key = %envelope.aggregate_key, "parked behind the key's dead letter");
        bump(&self.stats.parked);
        self.settle(&work.delivery, AckKind::Ack).await;
        Settled::Parked
    }

    /// Loads the held keys from the store. A session loads them unreleased
    /// and lets its first refresh release and drain them, in the key's lane.
    pub(super) async fn load_holds(&self, with_released: bool) -> tidings_core::Result<()> {
        if self.config.on_dead_letter != OnDeadLetter::HoldKey {
            return Ok(());
        }
        let stored = self.store.held_keys(&self.name).await?;
        let mut holds = self.holds.lock().expect("holds lock");
        holds.clear();
        for h in stored {
            let hold = Hold {
                message_id: h.message_id,
                released: with_released && h.released,
            };
            holds.insert((h.topic, h.aggregate_key), hold);
        }
        Ok(())
    }

    /// Held keys the store says are released (skipped, or their message
    /// handled) that this session reads and has not released yet: marked
    /// released, to be drained by their lanes.
    pub(super) async fn released_holds(&self, partitions: &Partitions) -> Vec<(HoldKey, Claim)> {
        let stored = match self.store.held_keys(&self.name).await {
            Ok(stored) => stored,
            Err(e) => {
                tracing::warn!(consumer = %self.name, error = %e.report(), "reading held keys failed");
                return Vec::new();
            }
        };
        let mut holds = self.holds.lock().expect("holds lock");
        stored
            .into_iter()
            .filter(|h| h.released)
            .filter_map(|h| {
                let claim = partitions.claim(&h.topic, &h.aggregate_key)?;
                let key = (h.topic, h.aggregate_key);
                let hold = holds
                    .get_mut(&key)
                    .filter(|c| c.message_id == h.message_id && !c.released)?;
                hold.released = true;
                Some((key, claim))
            })
            .collect()
    }
}
