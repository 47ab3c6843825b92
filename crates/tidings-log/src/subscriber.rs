//! The subscribing half: one reader task per subscribed partition.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use tidings_core::log::LogBackend;
use tidings_core::{Error, Partition, Result, Subscriber, Subscription};
use tokio::sync::{Notify, mpsc};
use tokio_stream::wrappers::ReceiverStream;

use crate::config::LogReaderConfig;
use crate::reader::Reader;
use crate::window::{Shared, Window};

/// The subscribing half of the database log.
#[derive(Debug, Clone)]
pub struct LogSubscriber<B> {
    backend: Arc<B>,
    config: LogReaderConfig,
}

impl<B: LogBackend> LogSubscriber<B> {
    /// A subscriber reading `backend`.
    pub fn new(backend: Arc<B>, config: LogReaderConfig) -> Self {
        LogSubscriber { backend, config }
    }
}

#[async_trait]
impl<B: LogBackend> Subscriber for LogSubscriber<B> {
    fn partitions(&self, _topic: &str) -> u32 {
        self.config.partitions
    }

    /// Nothing to do: a group without offsets reads the log from its start.
    async fn ensure_group(&self, _group: &str, _topic: &str) -> Result<()> {
        Ok(())
    }

    async fn subscribe_partition(
        &self,
        group: &str,
        topic: &str,
        partition: Partition,
    ) -> Result<Subscription> {
        let start = self.backend.load_offset(group, topic, partition).await?;
        let (sender, receiver) = mpsc::channel(self.config.batch_size);
        let shared = Arc::new(Shared {
            window: Mutex::new(Window {
                entries: VecDeque::new(),
                settled: start,
            }),
            settled_signal: Notify::new(),
        });
        let reader = Reader {
            backend: self.backend.clone(),
            config: self.config.clone(),
            group: group.to_owned(),
            topic: topic.to_owned(),
            partition,
            shared,
            sender,
            cursor: start,
            committed: start,
        };
        let task = tokio::spawn(reader.run());
        // Closing drops the receiver, which stops the reader; it then stores
        // the settled offset one last time before the task ends.
        Ok(
            Subscription::new(ReceiverStream::new(receiver)).on_close(move || async move {
                task.await
                    .map_err(|e| Error::transport("log", "log reader task failed", e, false))
            }),
        )
    }
}
