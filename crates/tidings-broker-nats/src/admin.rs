//! Creating streams and durable consumers, listing them, and deleting them.

use async_nats::jetstream::{consumer, stream};
use tidings_core::{Error, Partition, Result};

use crate::topology::durable_name;
use crate::{NatsTransport, TRANSPORT};

impl NatsTransport {
    /// Streams this transport created or checked, by name.
    pub fn streams(&self) -> Vec<String> {
        self.streams
            .lock()
            .expect("streams lock")
            .iter()
            .cloned()
            .collect()
    }

    /// Deletes the stream of `topic` with its messages and consumers.
    pub async fn delete_topic(&self, topic: &str) -> Result<()> {
        self.delete_stream(&self.stream_name(topic)).await
    }

    /// Deletes a stream by name, with its messages and consumers.
    pub async fn delete_stream(&self, name: &str) -> Result<()> {
        self.streams.lock().expect("streams lock").remove(name);
        self.js
            .delete_stream(name)
            .await
            .map_err(|e| Error::transport(TRANSPORT, "deleting a stream", e, true))?;
        Ok(())
    }

    pub(crate) async fn stream(&self, topic: &str) -> Result<stream::Stream> {
        let name = self.stream_name(topic);
        let stream = self
            .js
            .get_or_create_stream(stream::Config {
                name: name.clone(),
                subjects: vec![format!("{}.>", self.subject(topic))],
                storage: stream::StorageType::File,
                duplicate_window: self.options.duplicate_window,
                ..Default::default()
            })
            .await
            .map_err(|e| Error::transport(TRANSPORT, format!("creating stream {name}"), e, true))?;
        self.streams.lock().expect("streams lock").insert(name);
        Ok(stream)
    }

    pub(crate) async fn ensure_stream(&self, topic: &str) -> Result<()> {
        if !self
            .streams
            .lock()
            .expect("streams lock")
            .contains(&self.stream_name(topic))
        {
            self.stream(topic).await?;
        }
        Ok(())
    }

    /// Creates (or finds) the durable consumer of the group's partition.
    pub(crate) async fn durable(
        &self,
        group: &str,
        topic: &str,
        partition: Partition,
    ) -> Result<consumer::PullConsumer> {
        let stream = self.stream(topic).await?;
        let durable = durable_name(group, partition);
        let filter_subject = if partition.is_whole() {
            format!("{}.>", self.subject(topic))
        } else {
            format!("{}.{}.>", self.subject(topic), partition.index)
        };
        let consumer: consumer::PullConsumer = stream
            .get_or_create_consumer(
                &durable,
                consumer::pull::Config {
                    durable_name: Some(durable.clone()),
                    ack_policy: consumer::AckPolicy::Explicit,
                    deliver_policy: consumer::DeliverPolicy::All,
                    ack_wait: self.options.ack_wait,
                    max_ack_pending: self.options.max_ack_pending,
                    max_deliver: -1,
                    filter_subject,
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| Error::transport(TRANSPORT, format!("creating consumer {durable}"), e, true))?;
        Ok(consumer)
    }
}
