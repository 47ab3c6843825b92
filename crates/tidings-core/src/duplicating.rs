//! A subscriber that redelivers a fraction of messages a second time, as a
//! broker does after a lost acknowledgement: consumers must handle each
//! message once all the same. The checkout demo's `--duplicate-rate` runs
//! through it, and tests use it (`tidings_testkit::faults` re-exports it).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use rand::Rng;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::error::{Error, Result};
use crate::partition::Partition;
use crate::transport::{AckKind, Acker, Delivery, Subscriber, Subscription};

/// Redelivers a fraction of messages a second time, a little later, as a
/// broker does after a lost acknowledgement.
#[derive(Debug, Clone)]
pub struct Duplicating<S> {
    inner: Arc<S>,
    rate: f64,
    injected: Arc<AtomicU64>,
}

impl<S: Subscriber> Duplicating<S> {
    /// Wraps `inner`, duplicating each delivery with probability `rate`.
    pub fn new(inner: S, rate: f64) -> Self {
        Duplicating {
            inner: Arc::new(inner),
            rate: rate.clamp(0.0, 1.0),
            injected: Arc::default(),
        }
    }

    /// How many duplicates were injected so far.
    pub fn injected(&self) -> Arc<AtomicU64> {
        self.injected.clone()
    }
}

#[derive(Debug)]
struct NoopAcker;

#[async_trait]
impl Acker for NoopAcker {
    async fn ack(&self, _: AckKind) -> Result<()> {
        Ok(())
    }
}

#[async_trait]
impl<S: Subscriber> Subscriber for Duplicating<S> {
    fn partitions(&self, topic: &str) -> u32 {
        self.inner.partitions(topic)
    }

    async fn check_partitions(&self, topic: &str) -> Result<()> {
        self.inner.check_partitions(topic).await
    }

    fn places_keys(&self, topic: &str) -> bool {
        self.inner.places_keys(topic)
    }

    async fn ensure_group(&self, group: &str, topic: &str) -> Result<()> {
        self.inner.ensure_group(group, topic).await
    }

    async fn subscribe_partition(
        &self,
        group: &str,
        topic: &str,
        partition: Partition,
    ) -> Result<Subscription> {
        let mut inner = self.inner.subscribe_partition(group, topic, partition).await?;
        let (tx, rx) = mpsc::channel(64);
        let rate = self.rate;
        let injected = self.injected.clone();
        let task = tokio::spawn(async move {
            loop {
                let item = tokio::select! {
                    _ = tx.closed() => break,
                    item = inner.next() => match item { Some(item) => item, None => break },
                };
                let copy = match &item {
                    Ok(d) if rand::rng().random_bool(rate) => Some(d.message.clone()),
                    _ => None,
                };
                if tx.send(item).await.is_err() {
                    break;
                }
                if let Some(message) = copy {
                    injected.fetch_add(1, Ordering::Relaxed);
                    let tx = tx.clone();
                    let delay = Duration::from_millis(rand::rng().random_range(0..20));
                    tokio::spawn(async move {
                        tokio::time::sleep(delay).await;
                        let _ = tx.send(Ok(Delivery::new(message, 2, NoopAcker))).await;
                    });
                }
            }
            inner
        });
        Ok(
            Subscription::new(ReceiverStream::new(rx)).on_close(move || async move {
                match task.await {
                    Ok(inner) => inner.close().await,
                    Err(e) => Err(Error::transport("duplicating", "task failed", e, false)),
                }
            }),
        )
    }
}
