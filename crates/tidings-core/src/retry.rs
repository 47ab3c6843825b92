//! A producer's transaction, tried again on transient errors.
//!
//! ```no_run
//! # async fn place(store: &impl tidings_core::Outbox) -> tidings_core::Result<()> { Ok(()) }
//! # async fn run(store: impl tidings_core::Outbox) -> tidings_core::Result<()> {
//! use tidings_core::retry::{Retry, transaction};
//! // Begin, write, enqueue and commit inside: each try is the whole transaction.
//! transaction(&Retry::default(), || place(&store)).await?;
//! # Ok(()) }
//! ```

use std::future::Future;
use std::time::Duration;

use crate::{Backoff, ErrorClass, Result};

/// How often, and after what waits, [`transaction`] tries again.
#[derive(Debug, Clone)]
pub struct Retry {
    /// Tries in all, the first included (at least 1).
    pub attempts: u32,
    /// The wait before each try again.
    pub backoff: Backoff,
}

impl Default for Retry {
    /// Eight tries, 100 ms doubling: about 25 s in all, enough for a
    /// database to restart or fail over.
    fn default() -> Self {
        Retry {
            attempts: 8,
            backoff: Backoff::default(),
        }
    }
}

/// Runs `op`, one whole transaction (begin, the business writes, the
/// outbox's enqueue, commit), again while it fails with a transient error
/// ([`Error::class`](crate::Error::class): a lost connection, a database
/// restarting, a deadlock, a serialization failure), at most
/// `retry.attempts` times; a permanent error, or the last transient one,
/// is returned.
///
/// A failed try rolled back, so trying again never commits half of it. One
/// case is ambiguous: a connection lost while the commit was on its way
/// may have committed. Keep such a transaction safe to repeat (a unique
/// business key, or the envelope's id chosen before the first try, which
/// the outbox refuses twice).
pub async fn transaction<T, F, Fut>(retry: &Retry, op: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    transient(retry, "transaction", op).await
}

/// Runs `op` again while it fails with a transient error, as
/// [`transaction`] does, saying each time that `what` failed: a broker's
/// set-up at a service's start, while the broker is briefly away.
pub async fn transient<T, F, Fut>(retry: &Retry, what: &str, mut op: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let mut failures = 0u32;
    loop {
        let error = match op().await {
            Ok(value) => return Ok(value),
            Err(e) => e,
        };
        failures += 1;
        let class = error.class();
        if !class.is_retryable() || failures >= retry.attempts.max(1) {
            return Err(error);
        }
        let delay = match class {
            ErrorClass::RetryAfter(d) => d.max(retry.backoff.delay(failures)),
            _ => retry.backoff.delay(failures),
        };
        tracing::warn!(error = %error.report(), attempt = failures, retry_in_ms = delay.as_millis() as u64, "{what} failed; trying again");
        tokio::time::sleep(delay.min(Duration::from_secs(60))).await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;
    use crate::Error;

    fn quick(attempts: u32) -> Retry {
        Retry {
            attempts,
            backoff: Backoff::new(Duration::from_millis(1), Duration::from_millis(2)),
        }
    }

    fn lost() -> Error {
        Error::transport_reason("test", "connection lost", true)
    }

    #[tokio::test]
    async fn transient_failures_are_tried_again_until_one_succeeds() {
        let tries = AtomicU32::new(0);
        let value = transaction(&quick(5), || async {
            match tries.fetch_add(1, Ordering::SeqCst) {
                0 | 1 => Err(lost()),
                _ => Ok(42),
            }
        })
        .await
        .unwrap();
        assert_eq!((value, tries.load(Ordering::SeqCst)), (42, 3));
    }

    #[tokio::test]
    async fn a_permanent_failure_and_the_last_transient_one_are_returned() {
        let tries = AtomicU32::new(0);
        let permanent = transaction(&quick(5), || async {
            tries.fetch_add(1, Ordering::SeqCst);
            Err::<(), _>(Error::transport_reason("test", "refused", false))
        })
        .await;
        assert!(permanent.is_err());
        assert_eq!(tries.swap(0, Ordering::SeqCst), 1);
        let exhausted = transaction(&quick(3), || async {
            tries.fetch_add(1, Ordering::SeqCst);
            Err::<(), _>(lost())
        })
        .await;
        assert_eq!(exhausted.unwrap_err().class(), ErrorClass::Transient);
        assert_eq!(tries.load(Ordering::SeqCst), 3);
    }
}
