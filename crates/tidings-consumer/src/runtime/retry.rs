//! Decode, retry and dead letter: a message that cannot be decoded, or
//! whose handling crashed its consumer too often, is dead-lettered at once; a failed attempt is
//! retried after a backoff, and the last of them, or a permanent failure,
//! dead-letters the message. Tidings' own store calls are retried too,
//! without counting as attempts.

use std::time::Duration;

use chrono::Utc;
use tidings_core::Store;
use tidings_core::cloudevents::{self, Binding};
use tidings_core::{AckKind, DeadLetter, Delivery, Envelope, ErrorClass, Failure, Fence};
use tracing::Instrument;
use uuid::Uuid;

use super::Worker;
use super::attempt::{AttemptError, Outcome};
use super::holds::Hold;
use super::stats::bump;
use super::work::Settled;
use super::work::Work;
use crate::membership::Claim;

impl<S: Store> Worker<S> {
    /// decode -> retry -> transaction + idempotency -> timeout -> handler; dead-letter; settle.
    pub(super) async fn process(&self, work: Work) -> Settled {
        let Work {
            delivery,
            envelope,
            claim,
        } = work;
        let envelope = match envelope {
            Ok(e) => e,
            Err(e) => {
                let failure = failure(1, ErrorClass::Permanent, &e.to_string());
                tracing::warn!(consumer = %self.name, topic = %delivery.message.topic, error = %e, "undecodable message; dead-lettering");
                return self
                    .dead_letter(&delivery, None, vec![failure], claim.as_ref())
                    .await;
            }
        };
        let span = handle_span(&self.name, &delivery.message.topic, &envelope);
        self.process_decoded(delivery, envelope, claim)
            .instrument(span)
            .await
    }

    /// [`Worker::process`] once the message decoded, inside its handling
    /// span. A redelivery may follow a handling that killed its member:
    /// its handling is counted in the store from beginning to end, and a
    /// message whose handlings crashed too often is dead-lettered unhandled.
    async fn process_decoded(&self, delivery: Delivery, envelope: Envelope, claim: Option<Claim>) -> Settled {
        if !delivery.may_be_redelivered() {
            return self.retry(delivery, envelope, claim).await;
        }
        let (name, id) = (self.name.as_str(), envelope.id);
        let Some(crashed) = self
            .store_op("counting a handling begun", || {
                self.store.handling_started(name, id)
            })
            .await
        else {
            return self.give_back(&delivery).await;
        };
        let settled = if crashed >= self.config.max_crashes {
            let error = format!(
                "its handling began {crashed} times and never ended (the limit is {}): it may be crashing the consumer",
                self.config.max_crashes
            );
            tracing::error!(consumer = %self.name, message_id = %envelope.id, %error, "dead-lettering unhandled");
            self.dead_letter(
                &delivery,
                Some(&envelope),
                vec![failure(0, ErrorClass::Permanent, &error)],
                claim.as_ref(),
            )
            .await
        } else {
            self.retry(delivery, envelope, claim).await
        };
        // Settled or given back, in order: this handling did not crash.
        self.store_op("forgetting the handlings begun", || {
            self.store.handling_ended(name, id)
        })
        .await;
        settled
    }

    /// Attempts the handler until it succeeds, fails permanently or runs
    /// out of attempts, then settles the delivery.
    async fn retry(&self, delivery: Delivery, envelope: Envelope, claim: Option<Claim>) -> Settled {
        let mut failures = Vec::new();
        let mut attempt = 0u32;
        let mut store_failures = 0u32;
        loop {
            attempt += 1;
            let attempted = self.attempt(&envelope, claim.as_ref(), attempt);
            let error = match self.in_progress(&delivery, attempted).await {
                Ok(outcome) => {
                    let settled = match outcome {
                        Outcome::Handled => {
                            bump(&self.stats.handled);
                            Settled::Handled
                        }
                        Outcome::Duplicate => {
                            bump(&self.stats.duplicates);
                            Settled::Duplicate
                        }
                    };
                    self.settle(&delivery, AckKind::Ack).await;
                    return settled;
                }
                Err(AttemptError::LeaseLost) => {
                    // Another member reads the partition now: stop, and let it have the message.
                    tracing::info!(consumer = %self.name, "partition lease lost; handing over");
                    self.stop.cancel();
                    return self.give_back(&delivery).await;
                }
                Err(AttemptError::Store(e)) => {
                    // Our own database is unavailable: not the message's fault.
                    attempt -= 1;
                    store_failures += 1;
                    bump(&self.stats.store_errors);
                    let delay = self.config.backoff.delay(store_failures);
                    tracing::warn!(consumer = %self.name, error = %e.report(), retry_in_ms = delay.as_millis() as u64, "store unavailable; retrying");
                    if !self.in_progress(&delivery, self.pause(delay)).await {
                        return self.give_back(&delivery).await;
                    }
                    continue;
                }
                Err(AttemptError::Handler(e)) => {
                    bump(&self.stats.failed);
                    (e.class_with(|db| self.store.error_class(db)), e.to_string())
                }
            };
            let (class, message) = error;
            failures.push(failure(attempt, class, &message));
            if class == ErrorClass::Permanent || attempt >= self.config.max_attempts {
                tracing::warn!(consumer = %self.name, message_id = %envelope.id, message_type = %envelope.message_type, attempts = attempt, error = %message, "dead-lettering");
                return self
                    .dead_letter(&delivery, Some(&envelope), failures, claim.as_ref())
                    .await;
            }
            bump(&self.stats.retries);
            let delay = match class {
                ErrorClass::RetryAfter(d) => d.max(self.config.backoff.delay(attempt)),
                _ => self.config.backoff.delay(attempt),
            };
            tracing::debug!(consumer = %self.name, message_id = %envelope.id, attempt, error = %message, retry_in_ms = delay.as_millis() as u64, "handler failed; retrying");
            if !self.in_progress(&delivery, self.pause(delay)).await {
                return self.give_back(&delivery).await;
            }
        }
    }

    /// Stores the dead letter (holding its key, unless the policy is
    /// [`OnDeadLetter::Continue`]), then settles the delivery.
    pub(super) async fn dead_letter(
        &self,
        delivery: &Delivery,
        envelope: Option<&Envelope>,
        errors: Vec<Failure>,
        claim: Option<&Claim>,
    ) -> Settled {
        // A plain JSON record is kept as the CloudEvent it was read as (its
        // body unchanged), so that a redrive decodes it.
        let (headers, body) = match envelope {
            Some(e) if self.plain.contains_key(&delivery.message.topic) => {
                let (headers, body) = cloudevents::to_binary(e, Binding::Standard);
                (headers.into_iter().collect(), body)
            }
            _ => (delivery.message.headers.clone(), delivery.message.body.clone()),
        };
        let letter = DeadLetter {
            id: Uuid::now_v7(),
            consumer: self.name.clone(),
            topic: delivery.message.topic.clone(),
            message_id: envelope.map(|e| e.id),
            message_type: envelope.map(|e| e.message_type.clone()),
            aggregate_key: envelope.map(|e| e.aggregate_key.clone()),
            headers,
            body,
            attempts: errors.len() as u32,
            errors,
            created_at: Utc::now(),
            redrives: 0,
            redriven_at: None,
            skipped_at: None,
        };
        let hold = match (&letter.aggregate_key, letter.message_id) {
            (Some(key), Some(id)) if self.holds_keys_of(&letter.topic) && !key.is_empty() => {
                Some(((letter.topic.clone(), key.clone()), id))
            }
            _ => None,
        };
        // Retried until the store takes it: a message is never dropped.
        let fence = claim.map(|c| Fence {
            scope: &c.scope,
            member: &self.member,
            lease: c.lease,
        });
        let stored = self
            .store_op("storing a dead letter", || async {
                match hold {
                    Some(_) => self.store.dead_letter_holding_key(&letter, fence).await,
                    None => self.store.dead_letter(&letter).await.map(|()| true),
                }
            })
            .await;
        match stored {
            None => return self.give_back(delivery).await,
            Some(false) => {
                // Its successor reads the partition now: it handles the
                // message again and holds the key itself.
                tracing::info!(consumer = %self.name, "partition lease lost before dead-lettering; handing over");
                self.stop.cancel();
                return self.give_back(delivery).await;
            }
            Some(true) => {}
        }
        if let Some((key, message_id)) = hold {
            let hold = Hold {
                message_id,
                released: false,
            };
            self.holds.lock().expect("holds lock").insert(key, hold);
        }
        bump(&self.stats.dead_lettered);
        self.settle(delivery, AckKind::Term).await;
        Settled::DeadLettered
    }

    /// Gives the delivery back unhandled, to be delivered again.
    pub(super) async fn give_back(&self, delivery: &Delivery) -> Settled {
        self.settle(delivery, AckKind::Nak(None)).await;
        Settled::GivenBack
    }

    pub(super) async fn settle(&self, delivery: &Delivery, kind: AckKind) {
        if let Err(e) = delivery.ack(kind).await {
            // The transport will deliver it again; the marker makes that harmless.
            tracing::warn!(consumer = %self.name, error = %e.report(), ?kind, "settling a delivery failed");
        }
    }

    /// Runs `work` on `delivery`, telling the transport every
    /// [`ConsumerConfig::progress_every`] that the message is still at work.
    /// The signal is sent beside `work`, never instead of it: a transport
    /// slow to take it (a client buffer full during an outage) does not
    /// stall the handler and the locks its transaction holds.
    async fn in_progress<T>(&self, delivery: &Delivery, work: impl std::future::Future<Output = T>) -> T {
        let every = self.config.progress_every;
        let keep_alive = async {
            loop {
                tokio::time::sleep(every).await;
                if let Err(e) = delivery.ack(AckKind::Progress).await {
                    tracing::debug!(consumer = %self.name, error = %e.report(), "telling the transport a message is still at work failed");
                }
            }
        };
        tokio::select! {
            done = work => done,
            _ = keep_alive => unreachable!("keeping a message alive never ends"),
        }
    }

    /// Sleeps for `delay`; false if shutdown came first.
    pub(super) async fn pause(&self, delay: Duration) -> bool {
        tokio::select! {
            _ = self.stop.cancelled() => false,
            _ = tokio::time::sleep(delay) => true,
        }
    }

    /// Runs one of Tidings' own store calls, retrying with backoff while it
    /// fails; `None` if the session stopped first.
    pub(super) async fn store_op<T, F, Fut>(&self, what: &str, op: F) -> Option<T>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = tidings_core::Result<T>>,
    {
        let mut failures = 0u32;
        loop {
            match op().await {
                Ok(value) => return Some(value),
                Err(e) => {
                    failures += 1;
                    bump(&self.stats.store_errors);
                    tracing::warn!(consumer = %self.name, error = %e.report(), "{what} failed; retrying");
                    if !self.pause(self.config.backoff.delay(failures)).await {
                        return None;
                    }
                }
            }
        }
    }
}

fn failure(attempt: u32, class: ErrorClass, error: &str) -> Failure {
    Failure {
        attempt,
        at: Utc::now(),
        class: match class {
            ErrorClass::Permanent => "permanent",
            ErrorClass::Transient | ErrorClass::RetryAfter(_) => "transient",
        }
        .to_owned(),
        error: error.to_owned(),
    }
}

/// The span of handling one message: a child of its `traceparent` where a
/// tracing backend can link it ([`tidings_core::trace`]).
fn handle_span(consumer: &str, topic: &str, envelope: &Envelope) -> tracing::Span {
    let trace = envelope.trace();
    let span = tracing::info_span!(
        "tidings.handle",
        consumer = %consumer,
        topic = %topic,
        message_id = %envelope.id,
        message_type = %envelope.message_type,
        correlation_id = %envelope.correlation_id,
        causation_id = %envelope.causation_id.map(|c| c.to_string()).unwrap_or_default(),
        trace_id = %trace.map(|t| t.trace_id_hex()).unwrap_or_default(),
    );
    if let Some(parent) = trace {
        tidings_core::trace::set_parent(&span, &parent);
    }
    span
}
