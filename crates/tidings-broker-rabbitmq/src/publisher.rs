//! Publishing with publisher confirms, mandatory.

use async_trait::async_trait;
use lapin::options::BasicPublishOptions;
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
        .map_err(|e| Error::transport(TRANSPORT, "publishing", e, true))
}

pub(crate) async fn confirmed(confirm: lapin::PublisherConfirm) -> Result<()> {
    match confirm
        .await
        .map_err(|e| Error::transport(TRANSPORT, "waiting for a publisher confirm", e, true))?
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
            let exchange = self.declare_exchange(&channel, &m.topic).await?;
            let (attributes, payload) = cloudevents::to_binary(&m.envelope);
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
            let partition = Partition::of(&m.envelope.aggregate_key, self.options.partitions);
            let routing_key = format!("{}.{}", partition.index, m.envelope.message_type);
            confirms.push(send(&channel, &exchange, &routing_key, &payload, properties).await?);
        }
        for c in confirms {
            confirmed(c).await?;
        }
        Ok(())
    }
}
