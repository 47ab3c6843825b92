//! The relay: moves committed outbox records to a transport.
//!
//! One loop, in this order:
//!
//! 1. claim a bounded batch of the oldest unsent records ([`RelayStore::claim`]);
//! 2. publish it and wait for the transport's confirmation ([`Publisher::publish`]);
//! 3. only then complete the batch (delete or mark the records);
//! 4. on a publish failure, release the batch and retry after a capped,
//!    jittered backoff, forever: the broker's absence only delays delivery;
//! 5. with nothing to do, sleep until a producer's wake-up or the polling interval.
//!
//! Because a batch is completed only after confirmation, a crash anywhere
//! republishes (consumers deduplicate on the message id) and never loses.
//! Because batches are claimed oldest first and published in order, a key's
//! records reach the transport in commit order.
//!
//! ```no_run
//! use tidings_relay::{Relay, RelayConfig};
//! use tidings_store_sqlite::SqliteStore;
//! use tokio_util::sync::CancellationToken;
//! # async fn run() -> tidings_core::Result<()> {
//! let store = SqliteStore::connect("tidings.db").await?;
//! store.migrate().await?;
//! let relay = Relay::new(store.clone(), store.log_publisher()).config(RelayConfig::default().batch_size(200));
//! let shutdown = CancellationToken::new();
//! relay.run(shutdown).await
//! # }
//! ```
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tidings_core::{Backoff, ClaimedBatch, Publisher, RelayStore, Result};
use tokio_util::sync::CancellationToken;

/// Tuning of a [`Relay`].
#[derive(Debug, Clone)]
pub struct RelayConfig {
    batch_size: usize,
    poll_interval: Duration,
    publish_timeout: Duration,
    backoff: Backoff,
    cleanup_interval: Duration,
}

impl Default for RelayConfig {
    /// Batches of 500 records; poll every 500 ms when no wake-up arrives;
    /// give a publish 30 s to be confirmed; back off from 100 ms to 30 s
    /// after failures; run retention cleanup every minute.
    fn default() -> Self {
        RelayConfig {
            batch_size: 500,
            poll_interval: Duration::from_millis(500),
            publish_timeout: Duration::from_secs(30),
            backoff: Backoff::default(),
            cleanup_interval: Duration::from_secs(60),
        }
    }
}

impl RelayConfig {
    /// Records claimed and published at once (bounds memory and the database's work per round).
    ///
    /// ```
    /// let c = tidings_relay::RelayConfig::default().batch_size(100);
    /// ```
    pub fn batch_size(mut self, n: usize) -> Self {
        self.batch_size = n.max(1);
        self
    }

    /// How long to sleep when idle if no wake-up arrives.
    pub fn poll_interval(mut self, d: Duration) -> Self {
        self.poll_interval = d;
        self
    }

    /// How long a publish may wait for the transport's confirmation before it counts as failed.
    pub fn publish_timeout(mut self, d: Duration) -> Self {
        self.publish_timeout = d;
        self
    }

    /// The backoff between retries after a failure.
    pub fn backoff(mut self, b: Backoff) -> Self {
        self.backoff = b;
        self
    }

    /// How often to delete sent records past their retention.
    pub fn cleanup_interval(mut self, d: Duration) -> Self {
        self.cleanup_interval = d;
        self
    }
}

/// Counters of a running relay.
#[derive(Debug, Default)]
pub struct RelayStats {
    published: AtomicU64,
    batches: AtomicU64,
    publish_failures: AtomicU64,
    claim_failures: AtomicU64,
}

impl RelayStats {
    /// Records published and confirmed.
    pub fn published(&self) -> u64 {
        self.published.load(Ordering::Relaxed)
    }

    /// Batches completed.
    pub fn batches(&self) -> u64 {
        self.batches.load(Ordering::Relaxed)
    }

    /// Publishes that failed and were retried.
    pub fn publish_failures(&self) -> u64 {
        self.publish_failures.load(Ordering::Relaxed)
    }

    /// Claims that failed (database errors).
    pub fn claim_failures(&self) -> u64 {
        self.claim_failures.load(Ordering::Relaxed)
    }
}

/// Moves outbox records from a [`RelayStore`] to a [`Publisher`].
pub struct Relay<S, P> {
    store: S,
    publisher: P,
    config: RelayConfig,
    stats: Arc<RelayStats>,
}

impl<S, P> fmt::Debug for Relay<S, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Relay")
            .field("config", &self.config)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

/// What one round did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Round {
    /// Published and completed this many records.
    Published(usize),
    /// Nothing was waiting.
    Idle,
}

impl<S: RelayStore, P: Publisher> Relay<S, P> {
    /// A relay with the default configuration.
    pub fn new(store: S, publisher: P) -> Self {
        Relay {
            store,
            publisher,
            config: RelayConfig::default(),
            stats: Arc::default(),
        }
    }

    /// Replaces the configuration.
    pub fn config(mut self, config: RelayConfig) -> Self {
        self.config = config;
        self
    }

    /// The relay's counters, shared with the running loop.
    pub fn stats(&self) -> Arc<RelayStats> {
        self.stats.clone()
    }

    /// Claims, publishes and completes one batch. Errors are returned, not retried.
    pub async fn round(&self) -> Result<Round> {
        let batch = self.store.claim(self.config.batch_size).await.inspect_err(|_| {
            self.stats.claim_failures.fetch_add(1, Ordering::Relaxed);
        })?;
        let n = batch.messages().len();
        if n == 0 {
            batch.release().await?;
            return Ok(Round::Idle);
        }
        let started = Instant::now();
        let published = match tokio::time::timeout(
            self.config.publish_timeout,
            self.publisher.publish(batch.messages()),
        )
        .await
        {
            Ok(result) => result,
            Err(_) => Err(tidings_core::Error::Transport {
                transport: "relay",
                reason: format!("no confirmation within {:?}", self.config.publish_timeout),
                retryable: true,
            }),
        };
        if let Err(e) = published {
            self.stats.publish_failures.fetch_add(1, Ordering::Relaxed);
            // Give the records back at once so that another relay (or the
            // next round) can take them; a failed release only delays that
            // until the database notices the transaction is gone.
            if let Err(release) = batch.release().await {
                tracing::debug!(error = %release, "releasing a batch failed");
            }
            return Err(e);
        }
        // If completing fails, the records stay unsent and are published
        // again: a duplicate, which consumers absorb, rather than a loss.
        batch.complete().await?;
        self.stats.published.fetch_add(n as u64, Ordering::Relaxed);
        self.stats.batches.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(
            records = n,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "relay batch published"
        );
        Ok(Round::Published(n))
    }

    /// Runs until `shutdown` is cancelled. A batch being published when
    /// shutdown arrives is finished (confirmed and completed) or released;
    /// it is never abandoned half-marked.
    pub async fn run(self, shutdown: CancellationToken) -> Result<()> {
        let mut failures = 0u32;
        let mut last_cleanup = Instant::now();
        while !shutdown.is_cancelled() {
            if last_cleanup.elapsed() >= self.config.cleanup_interval {
                last_cleanup = Instant::now();
                match self.store.cleanup().await {
                    Ok(0) => {}
                    Ok(n) => tracing::debug!(deleted = n, "deleted sent outbox records past retention"),
                    Err(e) => tracing::warn!(error = %e, "outbox retention cleanup failed"),
                }
            }
            match self.round().await {
                Ok(Round::Published(_)) => failures = 0,
                Ok(Round::Idle) => {
                    failures = 0;
                    tokio::select! {
                        _ = shutdown.cancelled() => break,
                        _ = self.store.wait_for_work(self.config.poll_interval) => {}
                    }
                }
                Err(e) => {
                    failures += 1;
                    let delay = self.config.backoff.delay(failures);
                    tracing::warn!(error = %e, attempt = failures, retry_in_ms = delay.as_millis() as u64, "relay round failed; retrying");
                    tokio::select! {
                        _ = shutdown.cancelled() => break,
                        _ = tokio::time::sleep(delay) => {}
                    }
                }
            }
        }
        tracing::info!(published = self.stats.published(), "relay stopped");
        Ok(())
    }
}
