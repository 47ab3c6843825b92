//! Fault injectors: wrap a real transport and make it misbehave the way
//! brokers do.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use async_trait::async_trait;
use tidings_core::{Error, OutgoingMessage, Publisher, Result};

pub use tidings_core::duplicating::Duplicating;

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

    fn refuses(&self, message: &OutgoingMessage) -> Option<String> {
        self.inner.refuses(message)
    }
}
