//! Settling a delivery: in the window, redelivered from memory, or copied
//! to the dead-letter topic.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rdkafka::producer::FutureRecord;
use tidings_core::{AckKind, Acker, Error, RawMessage, Result};
use tokio::sync::mpsc;

use crate::marshal::record_headers;
use crate::window::{Redelivery, Shared};
use crate::{KafkaTransport, TRANSPORT};

pub(crate) struct KafkaAcker {
    pub(crate) shared: Arc<Shared>,
    pub(crate) offset: i64,
    pub(crate) message: RawMessage,
    pub(crate) delivery_count: u32,
    pub(crate) redeliver: mpsc::UnboundedSender<Redelivery>,
    pub(crate) transport: KafkaTransport,
}

#[async_trait]
impl Acker for KafkaAcker {
    async fn ack(&self, kind: AckKind) -> Result<()> {
        match kind {
            AckKind::Ack => self.shared.settle(self.offset),
            AckKind::Progress => {}
            AckKind::Nak(delay) => {
                let again = (self.message.clone(), self.offset, self.delivery_count.max(1) + 1);
                let redeliver = self.redeliver.clone();
                let delay = delay.unwrap_or_default();
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    // A closed subscription drops it: the uncommitted
                    // offset brings it back from Kafka.
                    let _ = redeliver.send(again);
                });
            }
            AckKind::Term => {
                self.dead_letter().await?;
                self.shared.settle(self.offset);
            }
        }
        Ok(())
    }
}

impl KafkaAcker {
    /// Copies the record to the dead-letter topic, same key and partition
    /// (a dead-letter topic made earlier with fewer partitions: the
    /// producer's choice, by key).
    async fn dead_letter(&self) -> Result<()> {
        let topic = self.transport.dead_letter_topic(&self.shared.topic);
        let source = self.transport.partitions_of(&self.shared.topic).await?;
        let partitions = self.transport.ensure_topic(&topic, source).await?;
        let mut headers: Vec<(String, String)> = self
            .message
            .headers
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        headers.push((
            "tidings-dead-letter-of".to_owned(),
            format!(
                "{}/{}/{}",
                self.shared.kafka_topic, self.shared.partition, self.offset
            ),
        ));
        let mut record = FutureRecord::to(&topic)
            .payload(&self.message.body)
            .headers(record_headers(&headers));
        if (self.shared.partition as u32) < partitions {
            record = record.partition(self.shared.partition);
        }
        if let Some(key) = &self.message.key {
            record = record.key(key.as_bytes());
        }
        self.transport
            .inner
            .producer
            .send(record, Duration::from_secs(30))
            .await
            .map_err(|(e, _)| Error::transport(TRANSPORT, "copying a dead letter to its topic", e, true))?;
        Ok(())
    }
}
