//! Publishing through the idempotent `acks=all` producer.

use std::time::Duration;

use async_trait::async_trait;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::FutureRecord;
use tidings_core::{Error, OutgoingMessage, Partition, Publisher, Result, cloudevents};

use crate::marshal::record_headers;
use crate::{KafkaTransport, TRANSPORT};

#[async_trait]
impl Publisher for KafkaTransport {
    async fn publish(&self, batch: &[OutgoingMessage]) -> Result<()> {
        // Queue the whole batch, then wait for every delivery report: the
        // idempotent producer keeps each partition's order across its own
        // retries, and a failed report fails the batch (the relay publishes
        // it again; consumers deduplicate on the envelope id).
        let mut reports = Vec::with_capacity(batch.len());
        for m in batch {
            let name = self.kafka_topic(&m.topic);
            let partitions = self.ensure_partitions(&m.topic).await?;
            let (attributes, payload) = cloudevents::encode(
                &m.envelope,
                cloudevents::Binding::Kafka,
                self.inner.options.content_mode,
            );
            let key = &m.envelope.aggregate_key;
            let partition = Partition::of(key, partitions);
            let mut record = FutureRecord::<[u8], [u8]>::to(&name)
                .payload(&payload)
                .partition(partition.index as i32)
                .headers(record_headers(&attributes));
            // No key is a null key, not an empty one (the Partitioning
            // extension's `partitionkey` is never empty).
            if !key.is_empty() {
                record = record.key(key.as_bytes());
            }
            loop {
                match self.inner.producer.send_result(record) {
                    Ok(report) => {
                        reports.push(report);
                        break;
                    }
                    Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                        record = back;
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    Err((e, _)) => {
                        let transient = !too_large(&e);
                        return Err(Error::transport(TRANSPORT, "queueing a record", e, transient));
                    }
                }
            }
        }
        for report in reports {
            report
                .await
                .map_err(|e| Error::transport(TRANSPORT, "waiting for a delivery report", e, true))?
                .map_err(|(e, _)| {
                    let transient = !too_large(&e);
                    Error::transport(TRANSPORT, "delivering a record", e, transient)
                })?;
        }
        Ok(())
    }

    /// A record whose payload and own headers alone exceed the producer's
    /// `message.max.bytes` ([`KafkaOptions::message_max_bytes`](crate::KafkaOptions::message_max_bytes)):
    /// it would be refused whole at queueing.
    fn refuses(&self, m: &OutgoingMessage) -> Option<String> {
        let max = self.inner.options.message_max_bytes();
        let size = m.envelope.own_bytes() + m.envelope.aggregate_key.len();
        (size > max).then(|| {
            format!(
                "its {size} bytes are more than Kafka's message.max.bytes of {max}: raise it (the producer's and the topic's), or make the event smaller"
            )
        })
    }
}

/// Whether the producer or the broker refused a record for its size: it
/// will never fit, and the relay sets it aside.
fn too_large(e: &KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(RDKafkaErrorCode::MessageSizeTooLarge | RDKafkaErrorCode::InvalidMessageSize)
    )
}
