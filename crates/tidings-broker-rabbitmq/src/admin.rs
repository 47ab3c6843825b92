//! Declaring exchanges, queues and bindings, listing what was declared,
//! and deleting it.

use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, ExchangeKind};
use tidings_core::{Error, Partition, Result};

use crate::connection::open_channel;
use crate::marshal::long;
use crate::{RabbitTransport, TRANSPORT};

impl RabbitTransport {
    /// Queues this transport declared, by name.
    pub fn queues(&self) -> Vec<String> {
        self.declared_with("q:")
    }

    /// Exchanges this transport declared, by name.
    pub fn exchanges(&self) -> Vec<String> {
        self.declared_with("x:")
    }

    fn declared_with(&self, kind: &str) -> Vec<String> {
        let declared = self.declared.lock().expect("declared lock");
        declared
            .iter()
            .filter_map(|n| n.strip_prefix(kind))
            .map(str::to_owned)
            .collect()
    }

    /// Deletes a queue (and its messages).
    pub async fn delete_queue(&self, name: &str) -> Result<()> {
        self.confirms()
            .await?
            .queue_delete(name.into(), QueueDeleteOptions::default())
            .await
            .map_err(|e| Error::transport(TRANSPORT, "deleting a queue", e, true))?;
        Ok(())
    }

    /// Deletes everything Tidings declares for `group` on `topic`, messages
    /// included: the queue of each partition and its delay queues, and the
    /// group's dead-letter exchange and queue. Names that do not exist are skipped.
    pub async fn delete_group(&self, topic: &str, group: &str) -> Result<()> {
        let stem = self.queue(topic, group);
        let mut names = vec![format!("{stem}.dead")];
        for partition in Partition::all(self.options.partitions_of(topic)) {
            let queue = self.partition_queue(topic, group, partition);
            names.extend((0..=32).map(|e| format!("{queue}.delay.{}", 1u64 << e)));
            names.push(queue);
        }
        let connection = self.connection().await?;
        let mut channel = None;
        for name in names {
            let c = match channel.take() {
                Some(c) => c,
                None => open_channel(&connection).await?,
            };
            // A name that does not exist closes the channel: the next one opens another.
            if c.queue_delete(name.as_str().into(), QueueDeleteOptions::default())
                .await
                .is_ok()
            {
                channel = Some(c);
            }
        }
        self.delete_exchange(&format!("{stem}.dlx")).await
    }

    /// Deletes an exchange.
    pub async fn delete_exchange(&self, name: &str) -> Result<()> {
        self.confirms()
            .await?
            .exchange_delete(name.into(), Default::default())
            .await
            .map_err(|e| Error::transport(TRANSPORT, "deleting an exchange", e, true))?;
        Ok(())
    }

    pub(crate) async fn declare_exchange(&self, channel: &Channel, topic: &str) -> Result<String> {
        let name = self.exchange(topic);
        if self.options.foreign_exchange(topic).is_some() {
            self.check_foreign_exchange(topic, &name).await?;
        } else {
            self.declare_named_exchange(channel, &name, ExchangeKind::Topic)
                .await?;
        }
        Ok(name)
    }

    /// Checks that another team's exchange exists, declaring nothing (a
    /// declaration with other arguments than theirs would be refused, and
    /// one of a missing exchange would hide a wrong name).
    async fn check_foreign_exchange(&self, topic: &str, name: &str) -> Result<()> {
        let key = format!("f:{name}");
        if self.declared.lock().expect("declared lock").contains(&key) {
            return Ok(());
        }
        // A passive declare of a missing exchange closes its channel: its own.
        let channel = self.channel().await?;
        let checked = channel
            .exchange_declare(
                name.into(),
                ExchangeKind::Topic,
                ExchangeDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await;
        match checked {
            Ok(()) => {
                let _ = channel.close(200, "exchange checked".into()).await;
                self.declared.lock().expect("declared lock").insert(key);
                Ok(())
            }
            // Transient: the producer may not be deployed yet (a consumer
            // waits, as on Kafka), and a wrong name says so at each try.
            Err(e) if is_not_found(&e) => Err(Error::transport_reason(
                TRANSPORT,
                format!(
                    "the exchange {name:?} of topic {topic} does not exist on the broker: its producer \
                     declares it (Tidings does not declare another team's exchange); check the name and \
                     the vhost"
                ),
                true,
            )),
            Err(e) => Err(Error::transport(
                TRANSPORT,
                format!("checking exchange {name}"),
                e,
                true,
            )),
        }
    }

    async fn declare_named_exchange(&self, channel: &Channel, name: &str, kind: ExchangeKind) -> Result<()> {
        let key = format!("x:{name}");
        if !self.declared.lock().expect("declared lock").contains(&key) {
            channel
                .exchange_declare(
                    name.into(),
                    kind,
                    ExchangeDeclareOptions {
                        durable: true,
                        ..Default::default()
                    },
                    FieldTable::default(),
                )
                .await
                .map_err(|e| Error::transport(TRANSPORT, format!("declaring exchange {name}"), e, true))?;
            self.declared.lock().expect("declared lock").insert(key);
        }
        Ok(())
    }

    /// Declares the queues of every partition of the group, with the
    /// group's dead-letter exchange and queue.
    pub(crate) async fn declare_group(&self, channel: &Channel, topic: &str, group: &str) -> Result<()> {
        let exchange = self.declare_exchange(channel, topic).await?;
        let stem = self.queue(topic, group);
        let dlx = format!("{stem}.dlx");
        let dead = format!("{stem}.dead");
        self.declare_named_exchange(channel, &dlx, ExchangeKind::Fanout)
            .await?;
        self.declare_queue(channel, &dead, FieldTable::default()).await?;
        self.bind(channel, &dead, &dlx, "#").await?;
        for partition in Partition::all(self.options.partitions_of(topic)) {
            let queue = self.partition_queue(topic, group, partition);
            let mut args = FieldTable::default();
            args.insert("x-dead-letter-exchange".into(), long(&dlx));
            args.insert("x-single-active-consumer".into(), AMQPValue::Boolean(true));
            self.declare_queue(channel, &queue, args).await?;
            let pattern = self.options.binding_key(topic, partition);
            self.bind(channel, &queue, &exchange, &pattern).await?;
        }
        Ok(())
    }

    async fn bind(&self, channel: &Channel, queue: &str, exchange: &str, pattern: &str) -> Result<()> {
        channel
            .queue_bind(
                queue.into(),
                exchange.into(),
                pattern.into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| Error::transport(TRANSPORT, format!("binding {queue} to {exchange}"), e, true))
    }

    pub(crate) async fn declare_queue(
        &self,
        channel: &Channel,
        name: &str,
        arguments: FieldTable,
    ) -> Result<()> {
        channel
            .queue_declare(
                name.into(),
                QueueDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                arguments,
            )
            .await
            .map_err(|e| Error::transport(TRANSPORT, format!("declaring queue {name}"), e, true))?;
        self.declared
            .lock()
            .expect("declared lock")
            .insert(format!("q:{name}"));
        Ok(())
    }
}

/// Whether the broker answered 404 (no such exchange or queue).
fn is_not_found(e: &lapin::Error) -> bool {
    use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
    matches!(e.kind(), lapin::ErrorKind::ProtocolError(amqp)
        if matches!(amqp.kind(), AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND)))
}
