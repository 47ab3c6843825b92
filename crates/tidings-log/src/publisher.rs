//! The publishing half: appends each batch to the log.

use std::sync::Arc;

use async_trait::async_trait;
use tidings_core::log::LogBackend;
use tidings_core::{OutgoingMessage, Publisher, Result};

/// The publishing half of the database log.
#[derive(Debug, Clone)]
pub struct LogPublisher<B> {
    backend: Arc<B>,
}

impl<B: LogBackend> LogPublisher<B> {
    /// A publisher appending to `backend`.
    pub fn new(backend: Arc<B>) -> Self {
        LogPublisher { backend }
    }
}

#[async_trait]
impl<B: LogBackend> Publisher for LogPublisher<B> {
    async fn publish(&self, batch: &[OutgoingMessage]) -> Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        self.backend.append(batch).await
    }
}
