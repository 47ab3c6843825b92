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
            self.ensure_topic(&name).await?;
            let (attributes, payload) = cloudevents::to_binary(&m.envelope);
            let key = &m.envelope.aggregate_key;
            let partition = Partition::of(key, self.inner.options.partitions);
            let mut record = FutureRecord::to(&name)
                .key(key.as_bytes())
                .payload(&payload)
                .partition(partition.index as i32)
                .headers(record_headers(&attributes));
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
                    Err((e, _)) => return Err(Error::transport(TRANSPORT, "queueing a record", e, true)),
                }
            }
        }
        for report in reports {
            report
                .await
                .map_err(|e| Error::transport(TRANSPORT, "waiting for a delivery report", e, true))?
                .map_err(|(e, _)| Error::transport(TRANSPORT, "delivering a record", e, true))?;
        }
        Ok(())
    }
}
