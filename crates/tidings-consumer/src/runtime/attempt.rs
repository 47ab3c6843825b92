//! One attempt: a transaction that first inserts the processed marker and
//! checks the partition's lease (the fence), then runs the handler within
//! its timeout and commits the marker with the handler's writes.

use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::time::Instant;

use futures::FutureExt;

use sqlx::Transaction;
use tidings_core::Store;
use tidings_core::{Envelope, Fence, Handling};

use super::Worker;
use super::stats::bump;
use crate::handler::{Context, HandlerError};
use crate::membership::Claim;

#[cfg(doc)]
use super::ConsumerConfig;

pub(super) enum Outcome {
    Handled,
    Duplicate,
}

pub(super) enum AttemptError {
    /// Tidings' own database work failed: retried, not counted as an attempt.
    Store(tidings_core::Error),
    /// The handler failed.
    Handler(HandlerError),
    /// The member no longer holds the partition's lease: nothing was committed.
    LeaseLost,
}

impl<S: Store> Worker<S> {
    /// One attempt: a transaction holding the processed marker and the handler's writes.
    pub(super) async fn attempt(
        &self,
        envelope: &Envelope,
        claim: Option<&Claim>,
        attempt: u32,
    ) -> Result<Outcome, AttemptError> {
        let mut tx = self.store.begin().await.map_err(AttemptError::Store)?;
        // The marker goes first: a concurrent duplicate then waits on it. With
        // it, the fence: only the lease's holder commits work for its partition.
        let fence = claim.map(|c| Fence {
            scope: &c.scope,
            member: &self.member,
            lease: c.lease,
        });
        let handling = self
            .store
            .begin_handling(&mut *tx, &self.name, envelope.id, fence)
            .await
            .map_err(AttemptError::Store)?;
        match handling {
            Handling::Fresh => {}
            Handling::Duplicate => {
                let _ = tx.rollback().await;
                return Ok(Outcome::Duplicate);
            }
            Handling::LeaseLost => {
                let _ = tx.rollback().await;
                return Err(AttemptError::LeaseLost);
            }
        }
        match self.run_handler(&mut tx, envelope, attempt).await {
            Ok(emitted) => self.commit(tx, emitted, "committing a handler").await?,
            Err(e) => {
                self.roll_back(tx).await;
                return Err(AttemptError::Handler(e));
            }
        }
        Ok(Outcome::Handled)
    }

    /// The handler on `tx`, within [`ConsumerConfig::handler_timeout`];
    /// whether it emitted messages through the outbox.
    pub(super) async fn run_handler(
        &self,
        tx: &mut Transaction<'static, S::Database>,
        envelope: &Envelope,
        attempt: u32,
    ) -> Result<bool, HandlerError> {
        let mut ctx = Context {
            envelope,
            tx,
            consumer: &self.name,
            source: &self.source,
            attempt,
            store: &self.store,
            emitted: false,
        };
        let timeout = self.config.handler_timeout;
        let started = Instant::now();
        // A handler that panics fails this attempt, as an error would: its
        // lane, and the keys waiting for it, go on.
        let handling = AssertUnwindSafe(self.handler.handle(&mut ctx)).catch_unwind();
        let ran = tokio::time::timeout(timeout, handling).await;
        self.stats
            .handler_duration
            .record(started.elapsed().as_secs_f64());
        match ran {
            Ok(Ok(result)) => result.map(|()| ctx.emitted),
            Ok(Err(panic)) => Err(HandlerError::transient(format!(
                "the handler panicked: {}",
                panic_message(panic.as_ref())
            ))),
            Err(_) => Err(HandlerError::transient(format!(
                "handler timed out after {timeout:?}"
            ))),
        }
    }

    /// Rolls a failed attempt back now rather than on drop: on SQLite the
    /// open transaction holds the database's only write lock.
    pub(super) async fn roll_back(&self, tx: Transaction<'static, S::Database>) {
        if let Err(e) = tx.rollback().await {
            tracing::debug!(consumer = %self.name, error = %e, "rollback after a failed attempt failed");
        }
    }

    /// Commits handler work, then wakes the relays if it emitted messages.
    pub(super) async fn commit(
        &self,
        tx: Transaction<'static, S::Database>,
        emitted: bool,
        operation: &'static str,
    ) -> Result<(), AttemptError> {
        tx.commit().await.map_err(|e| {
            if violates_a_constraint(&e) {
                // The database refused the handler's writes themselves (a
                // deferred constraint, checked at commit): the message's
                // failure, which trying again would only repeat. Anything
                // else (a lost connection, a full disk) is not its fault.
                return AttemptError::Handler(HandlerError::permanent(format!(
                    "{operation}: the database refused the handler's writes: {e}"
                )));
            }
            AttemptError::Store(tidings_core::Error::database(
                operation,
                self.store.error_class(&e),
                e,
            ))
        })?;
        bump(&self.stats.transactions);
        if emitted {
            self.store.wake();
        }
        Ok(())
    }
}

/// What a panic said, when it said it with a string.
fn panic_message(panic: &(dyn Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)")
}

/// Whether `e` is the database refusing rows for a constraint (unique,
/// foreign key, not null, check).
fn violates_a_constraint(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if !matches!(db.kind(), sqlx::error::ErrorKind::Other))
}
