//! Fault injectors: wrap a real transport and make it misbehave the way
//! brokers do.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use rand::Rng;
use tidings_core::{
    AckKind, Acker, Delivery, Error, OutgoingMessage, Partition, Publisher, Result, Subscriber, Subscription,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

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

/// A publisher that fails while switched off, as a broker does when it is down.
#[derive(Debug, Clone)]
pub struct Switchable<P> {
    inner: Arc<P>,
    up: Arc<AtomicBool>,
    refused: Arc<AtomicU64>,
}

impl<P: Publisher> Switchable<P> {
    /// Wraps `inner`, initially up.
    pub fn new(inner: P) -> Self {
        Switchable {
            inner: Arc::new(inner),
            up: Arc::new(AtomicBool::new(true)),
            refused: Arc::default(),
        }
    }

    /// Takes the "broker" down or brings it back.
    pub fn set_up(&self, up: bool) {
        self.up.store(up, Ordering::SeqCst);
    }

    /// Publishes refused while down.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }
}

#[async_trait]
impl<P: Publisher> Publisher for Switchable<P> {
    async fn publish(&self, batch: &[OutgoingMessage]) -> Result<()> {
        if !self.up.load(Ordering::SeqCst) {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return Err(Error::transport_reason("switchable", "switched off", true));
        }
        self.inner.publish(batch).await
    }
}
