//! Batching ([`ConsumerConfig::batch`]): a lane's queued deliveries in one
//! transaction, or, if that fails, one at a time through the stack.

use tidings_core::Store;
use tidings_core::lease::Lease;
use tidings_core::{AckKind, Envelope};
use uuid::Uuid;

use super::Worker;
use super::attempt::AttemptError;
use super::config::OnDeadLetter;
use super::stats::bump;
use super::work::Work;

#[cfg(doc)]
use super::ConsumerConfig;

impl<S: Store> Worker<S> {
    /// Whether a delivery may join a batch: decoded, not a redelivery
    /// (whose handling is counted, one at a time), its key not held.
    pub(super) fn batchable(&self, work: &Work) -> bool {
        let Ok(envelope) = &work.envelope else {
            return false;
        };
        if self.config.batch == 1 || work.delivery.may_be_redelivered() {
            return false;
        }
        self.config.on_dead_letter == OnDeadLetter::Continue
            || !self.holds.lock().expect("holds lock").contains_key(&(
                work.delivery.message.topic.clone(),
                envelope.aggregate_key.clone(),
            ))
    }

    /// Handles deliveries in one transaction, or, if that fails, one at a time.
    pub(super) async fn handle_batch(&self, works: Vec<Work>) {
        if works.len() <= 1 {
            for work in works {
                self.handle(work).await;
            }
            return;
        }
        if self.stop.is_cancelled() {
            for work in works {
                self.give_back(&work.delivery).await;
            }
            return;
        }
        match self.attempt_batch(&works).await {
            Ok(fresh) => {
                for (work, fresh) in works.iter().zip(fresh) {
                    bump(if fresh {
                        &self.stats.handled
                    } else {
                        &self.stats.duplicates
                    });
                    self.settle(&work.delivery, AckKind::Ack).await;
                }
            }
            Err(e) => {
                let error = match e {
                    AttemptError::Store(e) => e.report().to_string(),
                    AttemptError::Handler(e) => e.to_string(),
                    AttemptError::LeaseLost => "partition lease lost".to_owned(),
                };
                tracing::debug!(consumer = %self.name, messages = works.len(), %error, "batch rolled back; handling its messages one at a time");
                for work in works {
                    self.handle(work).await;
                }
            }
        }
    }

    /// One transaction for a batch: the processed markers, the fence, then
    /// each fresh message's handler. Returns, per delivery, whether it was
    /// handled (false: a duplicate).
    async fn attempt_batch(&self, works: &[Work]) -> Result<Vec<bool>, AttemptError> {
        let envelopes: Vec<&Envelope> = works.iter().filter_map(|w| w.envelope.as_ref().ok()).collect();
        let ids: Vec<Uuid> = envelopes.iter().map(|e| e.id).collect();
        let mut tx = self.store.begin().await.map_err(AttemptError::Store)?;
        let mut fresh = self
            .store
            .mark_processed_all(&mut *tx, &self.name, &ids)
            .await
            .map_err(AttemptError::Store)?;
        let mut fenced: Vec<(&str, Lease)> = Vec::new();
        for claim in works.iter().filter_map(|w| w.claim.as_ref()) {
            if fenced.contains(&(&*claim.scope, claim.lease)) {
                continue;
            }
            let holds = self
                .store
                .holds_lease(&mut *tx, &claim.scope, &self.member, claim.lease)
                .await
                .map_err(AttemptError::Store)?;
            if !holds {
                let _ = tx.rollback().await;
                return Err(AttemptError::LeaseLost);
            }
            fenced.push((&claim.scope, claim.lease));
        }
        let mut handled = Vec::with_capacity(envelopes.len());
        let mut emitted = false;
        for envelope in envelopes {
            // A message twice in one batch runs once: the second copy finds it taken.
            let run = fresh.remove(&envelope.id);
            handled.push(run);
            if !run {
                continue;
            }
            match self.run_handler(&mut tx, envelope, 1).await {
                Ok(emits) => emitted |= emits,
                Err(e) => {
                    self.roll_back(tx).await;
                    return Err(AttemptError::Handler(e));
                }
            }
        }
        self.commit(tx, emitted, "committing a batch of handlers").await?;
        Ok(handled)
    }
}
