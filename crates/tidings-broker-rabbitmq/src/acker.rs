//! Settling a delivery: ack, reject, requeue, or a delayed retry through a
//! delay queue.

use async_trait::async_trait;
use lapin::BasicProperties;
use lapin::options::{BasicAckOptions, BasicNackOptions, BasicRejectOptions};
use lapin::types::{AMQPValue, FieldTable};
use tidings_core::{AckKind, Acker, Error, Result};

use crate::marshal::{DELIVERY_COUNT, long};
use crate::publisher::{confirmed, send};
use crate::topology::delay_bucket;
use crate::{RabbitTransport, TRANSPORT};

pub(crate) struct RabbitAcker {
    pub(crate) acker: lapin::Acker,
    pub(crate) transport: RabbitTransport,
    pub(crate) queue: String,
    pub(crate) body: Vec<u8>,
    pub(crate) properties: BasicProperties,
    pub(crate) count: u32,
}

#[async_trait]
impl Acker for RabbitAcker {
    async fn ack(&self, kind: AckKind) -> Result<()> {
        let settle = |e| Error::transport(TRANSPORT, "settling a delivery", e, true);
        match kind {
            AckKind::Ack => self
                .acker
                .ack(BasicAckOptions::default())
                .await
                .map(drop)
                .map_err(settle),
            AckKind::Term => self
                .acker
                .reject(BasicRejectOptions { requeue: false })
                .await
                .map(drop)
                .map_err(settle),
            AckKind::Progress => Ok(()),
            AckKind::Nak(None) => self
                .acker
                .nack(BasicNackOptions {
                    requeue: true,
                    ..Default::default()
                })
                .await
                .map(drop)
                .map_err(settle),
            AckKind::Nak(Some(delay)) => {
                // RabbitMQ cannot requeue with a delay: park a copy in a
                // queue whose messages expire back into this one, then let
                // the original go. A crash in between redelivers the
                // original as well: a duplicate, never a loss.
                let ms = delay_bucket(delay);
                let parking = format!("{}.delay.{ms}", self.queue);
                let mut args = FieldTable::default();
                args.insert("x-message-ttl".into(), AMQPValue::LongLongInt(ms as i64));
                args.insert("x-dead-letter-exchange".into(), long(""));
                args.insert("x-dead-letter-routing-key".into(), long(&self.queue));
                let channel = self.transport.confirms().await?;
                self.transport.declare_queue(&channel, &parking, args).await?;
                let mut headers = self.properties.headers().clone().unwrap_or_default();
                headers.insert(DELIVERY_COUNT.into(), long(&(self.count + 1).to_string()));
                let properties = self.properties.clone().with_headers(headers);
                confirmed(send(&channel, "", &parking, &self.body, properties).await?).await?;
                self.acker
                    .ack(BasicAckOptions::default())
                    .await
                    .map(drop)
                    .map_err(settle)
            }
        }
    }
}
