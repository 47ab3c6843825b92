//! Publishing with PubAcks and `Nats-Msg-Id` dedupe.

use async_nats::HeaderMap;
use async_trait::async_trait;
use tidings_core::{Error, OutgoingMessage, Partition, Publisher, Result, cloudevents};

use crate::topology::subject_token;
use crate::{NatsTransport, TRANSPORT};

#[async_trait]
impl Publisher for NatsTransport {
    async fn publish(&self, batch: &[OutgoingMessage]) -> Result<()> {
        // Send the whole batch, then wait for every PubAck: one round trip
        // per batch rather than per message, in order on one connection.
        let mut acks = Vec::with_capacity(batch.len());
        for m in batch {
            self.ensure_stream(&m.topic).await?;
            let (attributes, payload) = cloudevents::to_binary(&m.envelope);
            let mut headers = HeaderMap::new();
            for (k, v) in attributes {
                headers.insert(k.as_str(), v.as_str());
            }
            // A redrive must not be dropped as a duplicate of the first publish.
            let msg_id = match m.envelope.headers.get(tidings_core::REDRIVE_HEADER) {
                Some(n) => format!("{}/redrive/{n}", m.envelope.id),
                None => m.envelope.id.to_string(),
            };
            headers.insert("Nats-Msg-Id", msg_id.as_str());
            let partition = Partition::of(&m.envelope.aggregate_key, self.options.partitions);
            let subject = format!(
                "{}.{}.{}",
                self.subject(&m.topic),
                partition.index,
                subject_token(&m.envelope.message_type)
            );
            let ack = self
                .js
                .publish_with_headers(subject, headers, payload.into())
                .await
                .map_err(|e| Error::transport(TRANSPORT, "publishing", e, true))?;
            acks.push(ack);
        }
        for ack in acks {
            ack.await
                .map_err(|e| Error::transport(TRANSPORT, "waiting for a PubAck", e, true))?;
        }
        Ok(())
    }
}
