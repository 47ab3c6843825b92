//! Publishing with publisher confirms, mandatory.

use async_trait::async_trait;
use lapin::options::BasicPublishOptions;
use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
use lapin::types::{FieldTable, ShortString};
use lapin::{BasicProperties, Channel};
use tidings_core::{Error, OutgoingMessage, Partition, Publisher, Result, cloudevents};

use crate::marshal::long;
use crate::{RabbitTransport, TRANSPORT};

/// Publishes one message on `channel` (in confirm mode), returning the
/// confirmation to await.
pub(crate) async fn send(
    channel: &Channel,
    exchange: &str,
    routing_key: &str,
    body: &[u8],
    properties: BasicProperties,
) -> Result<lapin::PublisherConfirm> {
    channel
        .basic_publish(
            exchange.into(),
            routing_key.into(),
            // Mandatory: a message no queue takes comes back, instead of
            // being dropped while the relay believes it delivered.
            BasicPublishOptions {
                mandatory: true,
                ..Default::default()
            },
            body,
            properties,
        )
        .await
        .map_err(|e| publish_error("publishing", e))
}

/// Why a publish failed. The broker refusing the message itself (larger
/// than its `max_message_size`: it closes the channel) is permanent, and
/// names the limit; anything else may pass on a new channel.
fn publish_error(what: &str, e: lapin::Error) -> Error {
    if let lapin::ErrorKind::ProtocolError(amqp) = e.kind() {
        let message = amqp.get_message().as_str();
        let too_large = match amqp.kind() {
            AMQPErrorKind::Soft(AMQPSoftError::CONTENTTOOLARGE) => true,
            AMQPErrorKind::Soft(AMQPSoftError::PRECONDITIONFAILED) => message.contains("max size"),
            _ => false,
        };
        if too_large {
            return Error::transport_reason(
                TRANSPORT,
                format!(
                    "publishing: the broker refused the message ({message}): raise RabbitMQ's \
                     max_message_size, and max_message_bytes here, or make the event smaller"
                ),
                false,
            );
        }
    }
    Error::transport(TRANSPORT, what, e, true)
}

pub(crate) async fn confirmed(confirm: lapin::PublisherConfirm) -> Result<()> {
    match confirm
        .await
        .map_err(|e| publish_error("waiting for a publisher confirm", e))?
    {
        lapin::Confirmation::Ack(None) => Ok(()),
        lapin::Confirmation::Ack(Some(returned)) => Err(Error::transport_reason(
            TRANSPORT,
            format!(
                "publishing: no queue is bound to exchange {:?} (routing key {:?}): subscribe the consumer \
                 groups (which declares their queues) before publishing; the message stays in the outbox",
                returned.delivery.exchange.as_str(),
                returned.delivery.routing_key.as_str()
            ),
            true,
        )),
        lapin::Confirmation::Nack(_) => Err(Error::transport_reason(
            TRANSPORT,
            "publishing: the broker refused the message (nack)",
            true,
        )),
        lapin::Confirmation::NotRequested => Err(Error::transport_reason(
            TRANSPORT,
            "publishing: publisher confirms are off",
            false,
        )),
    }
}

impl RabbitTransport {
    /// Declares `m`'s exchange if need be and publishes `m` on `channel`.
    async fn send_one(&self, channel: &Channel, m: &OutgoingMessage) -> Result<lapin::PublisherConfirm> {
        let exchange = self.declare_exchange(channel, &m.topic).await?;
        let (attributes, payload) = cloudevents::encode(
            &m.envelope,
            cloudevents::Binding::Standard,
            self.options.content_mode,
        );
        let mut headers = FieldTable::default();
        let mut content_type = None;
        for (k, v) in &attributes {
            if k == cloudevents::CONTENT_TYPE_HEADER {
                content_type = Some(v.clone());
            } else {
                headers.insert(ShortString::from(k.as_str()), long(v));
            }
        }
        let mut properties = BasicProperties::default()
            .with_headers(headers)
            .with_delivery_mode(2)
            .with_message_id(m.envelope.id.to_string().as_str().into());
        if let Some(ct) = content_type {
            properties = properties.with_content_type(ct.as_str().into());
        }
        let partition = Partition::of(&m.envelope.aggregate_key, self.options.partitions_of(&m.topic));
        let routing_key =
            self.options
                .routing_key(&m.topic, &partition.index.to_string(), &m.envelope.message_type);
        send(channel, &exchange, &routing_key, &payload, properties).await
    }
}

#[async_trait]
impl Publisher for RabbitTransport {
    async fn publish(&self, batch: &[OutgoingMessage]) -> Result<()> {
        // Publish the whole batch on one channel, then wait for every
        // confirm. One channel, never a fresh one midway: once it breaks,
        // everything after fails too, so a key's earlier message can never
        // be lost while its later one goes out on the next channel.
        let channel = self.confirms().await?;
        let mut confirms = Vec::with_capacity(batch.len());
        for m in batch {
            match self.send_one(&channel, m).await {
                Ok(confirm) => confirms.push(confirm),
                Err(e) => {
                    // The broker may have closed the channel over a message
                    // sent before (a later declare or publish then fails):
                    // its refusal is the cause to report.
                    for c in confirms {
                        confirmed(c).await?;
                    }
                    return Err(e);
                }
            }
        }
        for c in confirms {
            confirmed(c).await?;
        }
        Ok(())
    }

    /// A record whose payload (the message body, what RabbitMQ measures)
    /// exceeds the broker's `max_message_size`
    /// ([`RabbitOptions::max_message_bytes`](crate::RabbitOptions::max_message_bytes)).
    fn refuses(&self, m: &OutgoingMessage) -> Option<String> {
        let max = self.options.max_message_bytes;
        let size = m.envelope.payload.len();
        (size > max).then(|| {
            format!(
                "its {size} bytes are more than RabbitMQ's max_message_size of {max}: raise it (on the broker, \
                 and max_message_bytes here), or make the event smaller"
            )
        })
    }
}
