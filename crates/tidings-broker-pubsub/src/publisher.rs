//! Publishing to Pub/Sub: a batch's messages in as few `Publish` requests
//! as Pub/Sub takes, one topic's requests one after another (a key's
//! messages stay in order), each confirmed before the next.

use std::collections::BTreeMap;

use async_trait::async_trait;
use futures::future::BoxFuture;
use futures::{StreamExt, TryStreamExt};
use gcloud_googleapis::pubsub::v1::PubsubMessage;
use tidings_core::{Error, OutgoingMessage, Partition, Publisher, Result};

use crate::marshal::encode;
use crate::names::ordering_key;
use crate::{PubSubTransport, TRANSPORT};

/// Pub/Sub's most messages in one request.
const REQUEST_MESSAGES: usize = 1000;
/// Pub/Sub's largest request is 10 MB; this leaves room for the framing.
const REQUEST_BYTES: usize = 9_000_000;
/// Topics published to at once.
const IN_FLIGHT: usize = 8;

impl PubSubTransport {
    /// The topic id of `m`'s partition.
    fn topic_of(&self, m: &OutgoingMessage) -> String {
        let count = self.options.partitions_of(&m.topic);
        self.options
            .topic_id(&m.topic, Partition::of(&m.envelope.aggregate_key, count))
    }

    /// Publishes `messages` (in batch order, each with the size Pub/Sub
    /// counts) to topic `id`, in requests Pub/Sub takes, each confirmed
    /// before the next leaves.
    async fn publish_to(
        &self,
        id: &str,
        messages: Vec<(&OutgoingMessage, PubsubMessage, usize)>,
    ) -> Result<()> {
        let publisher = self.publisher(id);
        let mut request: Vec<PubsubMessage> = Vec::new();
        let mut bytes = 0;
        let mut first_id = None;
        let mut rest = messages.into_iter().peekable();
        while let Some((m, message, size)) = rest.next() {
            first_id.get_or_insert(m.envelope.id);
            bytes += size;
            request.push(message);
            let full = match rest.peek() {
                None => true,
                Some((_, _, next)) => request.len() == REQUEST_MESSAGES || bytes + next > REQUEST_BYTES,
            };
            if !full {
                continue;
            }
            let count = request.len();
            let ids = publisher
                .publish_immediately(std::mem::take(&mut request), None)
                .await
                .map_err(|e| {
                    if e.code() == gcloud_gax::grpc::Code::NotFound {
                        // Deleted while in use: made again on the next try,
                        // which waits for the groups to subscribe again.
                        self.declared.forget_topic(id);
                    }
                    self.error(
                        &format!(
                            "publishing {count} messages from {} to Pub/Sub topic {}",
                            first_id.unwrap_or_default(),
                            self.options.topic_path(id)
                        ),
                        e,
                    )
                })?;
            if ids.len() != count {
                return Err(Error::transport_reason(
                    TRANSPORT,
                    format!(
                        "publishing to Pub/Sub topic {}: {} of {count} messages confirmed",
                        self.options.topic_path(id),
                        ids.len()
                    ),
                    true,
                ));
            }
            bytes = 0;
            first_id = None;
        }
        Ok(())
    }
}

#[async_trait]
impl Publisher for PubSubTransport {
    /// Publishes each topic's messages in batch order, in requests of up to
    /// 1000 messages, each confirmed before the next: Pub/Sub keeps the
    /// order of a key's messages within a request and between requests
    /// sent one after another, and a refused request is never followed by a
    /// later one of its topic. Several topics (partitions) go out at once.
    async fn publish(&self, batch: &[OutgoingMessage]) -> Result<()> {
        let mut by_topic: BTreeMap<String, Vec<(&OutgoingMessage, PubsubMessage, usize)>> = BTreeMap::new();
        for m in batch {
            let encoded = encode(&m.envelope);
            let size = encoded.size();
            let message = PubsubMessage {
                data: encoded.data,
                attributes: encoded.attributes.into_iter().collect(),
                ordering_key: ordering_key(&m.envelope.aggregate_key),
                ..PubsubMessage::default()
            };
            by_topic
                .entry(self.topic_of(m))
                .or_default()
                .push((m, message, size));
        }
        for (id, messages) in &by_topic {
            self.check_publish_partitions(&messages[0].0.topic).await?;
            self.topic(id).await?;
            self.check_subscribed(&messages[0].0.topic, id).await?;
        }
        let mut sends: Vec<BoxFuture<'_, Result<()>>> = Vec::new();
        for (id, messages) in by_topic {
            sends.push(Box::pin(async move { self.publish_to(&id, messages).await }));
        }
        futures::stream::iter(sends)
            .buffer_unordered(IN_FLIGHT)
            .try_collect::<Vec<()>>()
            .await?;
        Ok(())
    }

    /// A record larger, data and attributes together, than Pub/Sub takes
    /// ([`PubSubOptions::max_message_bytes`](crate::PubSubOptions::max_message_bytes)).
    fn refuses(&self, m: &OutgoingMessage) -> Option<String> {
        let max = self.options.max_message_bytes;
        let size = encode(&m.envelope).size();
        (size > max).then(|| {
            format!(
                "too large for Pub/Sub: its {size} bytes (data and attributes) are more than the limit of \
                 {max}: make the event smaller (or keep its payload elsewhere and send a reference)"
            )
        })
    }
}
