//! Publishing to SNS: batches of up to ten, each message confirmed.

use std::collections::BTreeMap;

use async_trait::async_trait;
use aws_sdk_sns::types::{MessageAttributeValue, PublishBatchRequestEntry};
use futures::future::BoxFuture;
use futures::{StreamExt, TryStreamExt};
use tidings_core::waves::key_waves;
use tidings_core::{Error, OutgoingMessage, Partition, Publisher, Result};

use crate::marshal::{Encoded, encode};
use crate::names::message_group;
use crate::{SqsTransport, TRANSPORT};

/// SNS's largest batch (which, in all, may be no larger than one message).
const BATCH: usize = 10;
/// Batches of one wave in flight at once.
const IN_FLIGHT: usize = 8;

impl SqsTransport {
    fn encoded(&self, m: &OutgoingMessage) -> Encoded {
        let count = self.options.partitions_of(&m.topic);
        let partition = (count > 1).then(|| Partition::of(&m.envelope.aggregate_key, count).index);
        encode(&m.envelope, partition)
    }

    /// `messages` in requests SNS takes: at most ten, and at most its
    /// largest message's size (256 KiB) in all.
    fn chunks<'a>(&self, messages: &[&'a OutgoingMessage]) -> Vec<Vec<&'a OutgoingMessage>> {
        let max = self.options.max_message_bytes;
        let mut chunks: Vec<Vec<&OutgoingMessage>> = Vec::new();
        let mut bytes = 0;
        for &m in messages {
            let size = self.encoded(m).size();
            match chunks.last_mut() {
                Some(chunk) if chunk.len() < BATCH && bytes + size <= max => {
                    chunk.push(m);
                    bytes += size;
                }
                _ => {
                    chunks.push(vec![m]);
                    bytes = size;
                }
            }
        }
        chunks
    }

    /// Fails, retryably, while no queue subscribes to `topic`: SNS would
    /// take the message and drop it.
    async fn check_subscribed(&self, topic: &str, arn: &str) -> Result<()> {
        if self.declared.subscribed.lock().unwrap().contains(arn) {
            return Ok(());
        }
        let listed = self
            .sns
            .list_subscriptions_by_topic()
            .topic_arn(arn)
            .send()
            .await
            .map_err(|e| self.error(&format!("listing the subscriptions of SNS topic {arn}"), e))?;
        if listed.subscriptions().is_empty() {
            return Err(Error::transport_reason(
                TRANSPORT,
                format!(
                    "publishing: no SQS queue subscribes to SNS topic {arn} (topic {topic:?}): start or \
                     ensure the consumer groups (which makes their queues) before publishing; the \
                     message stays in the outbox"
                ),
                true,
            ));
        }
        self.declared.subscribed.lock().unwrap().insert(arn.to_owned());
        Ok(())
    }

    /// Publishes `chunk` (at most ten messages, of distinct keys) to `arn`
    /// in one request; fails if SNS refused any of them.
    async fn publish_chunk(&self, arn: &str, chunk: &[&OutgoingMessage]) -> Result<()> {
        let mut entries = Vec::with_capacity(chunk.len());
        for (i, m) in chunk.iter().enumerate() {
            let encoded = self.encoded(m);
            let id = m.envelope.id.to_string();
            let mut entry = PublishBatchRequestEntry::builder()
                .id(i.to_string())
                .message(encoded.body)
                .message_group_id(message_group(&m.envelope.aggregate_key, &id))
                .message_deduplication_id(id);
            for (k, v) in encoded.attributes {
                let value = MessageAttributeValue::builder()
                    .data_type("String")
                    .string_value(v)
                    .build()
                    .map_err(|e| Error::transport(TRANSPORT, "building a message attribute", e, false))?;
                entry = entry.message_attributes(k, value);
            }
            entries.push(
                entry
                    .build()
                    .map_err(|e| Error::transport(TRANSPORT, "building a publish request", e, false))?,
            );
        }
        let out = self
            .sns
            .publish_batch()
            .topic_arn(arn)
            .set_publish_batch_request_entries(Some(entries))
            .send()
            .await
            .map_err(|e| {
                if e.as_service_error().is_some_and(|s| s.is_not_found_exception()) {
                    // Deleted while in use: made again on the next try,
                    // which waits for the groups to subscribe again.
                    self.declared
                        .forget_topic(&self.options.topic_name(&chunk[0].topic));
                }
                self.error(&format!("publishing to SNS topic {arn}"), e)
            })?;
        if let Some(failed) = out.failed().first() {
            let which = failed.id().parse::<usize>().ok().and_then(|i| chunk.get(i));
            return Err(Error::transport_reason(
                TRANSPORT,
                format!(
                    "publishing to SNS topic {arn}: message {} refused ({}: {}){}",
                    which.map_or_else(|| failed.id().to_owned(), |m| m.envelope.id.to_string()),
                    failed.code(),
                    failed.message().unwrap_or("no reason given"),
                    if out.failed().len() > 1 {
                        format!(", and {} more", out.failed().len() - 1)
                    } else {
                        String::new()
                    }
                ),
                // SNS names the sender at fault for a message it will
                // never take; anything else may pass next time.
                !failed.sender_fault(),
            ));
        }
        if out.successful().len() != chunk.len() {
            return Err(Error::transport_reason(
                TRANSPORT,
                format!(
                    "publishing to SNS topic {arn}: {} of {} messages confirmed",
                    out.successful().len(),
                    chunk.len()
                ),
                true,
            ));
        }
        Ok(())
    }
}

#[async_trait]
impl Publisher for SqsTransport {
    /// Publishes in waves ([`key_waves`]): a key's next message leaves
    /// only once SNS confirmed the one before, so a refused message is
    /// never followed by a later one of its key (SNS deduplicates the
    /// earlier ones the relay sends again, by message id, for five
    /// minutes). Within a wave, batches of ten go out several at a time.
    async fn publish(&self, batch: &[OutgoingMessage]) -> Result<()> {
        for wave in key_waves(batch) {
            let mut by_topic: BTreeMap<&str, Vec<&OutgoingMessage>> = BTreeMap::new();
            for m in wave {
                by_topic.entry(m.topic.as_str()).or_default().push(m);
            }
            let mut sends: Vec<BoxFuture<'_, Result<()>>> = Vec::new();
            for (topic, messages) in by_topic {
                let arn = self.topic_arn(topic).await?;
                self.check_subscribed(topic, &arn).await?;
                for chunk in self.chunks(&messages) {
                    let arn = arn.clone();
                    sends.push(Box::pin(async move { self.publish_chunk(&arn, &chunk).await }));
                }
            }
            futures::stream::iter(sends)
                .buffer_unordered(IN_FLIGHT)
                .try_collect::<Vec<()>>()
                .await?;
        }
        Ok(())
    }

    /// A record larger, body and message attributes together, than SNS
    /// takes ([`SqsOptions::max_message_bytes`](crate::SqsOptions::max_message_bytes)).
    fn refuses(&self, m: &OutgoingMessage) -> Option<String> {
        let max = self.options.max_message_bytes;
        let encoded = self.encoded(m);
        if !encoded.text_fits() {
            return Some(
                "its CloudEvents document holds characters SNS refuses (U+FFFE, U+FFFF or a lone \
                 surrogate): remove them from the event"
                    .to_owned(),
            );
        }
        let size = encoded.size();
        (size > max).then(|| {
            format!(
                "too large for SNS: its {size} bytes (body and message attributes) are more than the \
                 limit of {max}: make the event smaller (or keep its payload elsewhere and send a reference)"
            )
        })
    }
}
