//! Creating streams and durable consumers, listing them, and deleting them.

use async_nats::jetstream::{consumer, stream};
use tidings_core::{Error, Partition, Result};

use crate::{NatsTransport, TRANSPORT};

/// How the stream set marks a foreign subject whose stream is known.
const FOREIGN: &str = "foreign:";

impl NatsTransport {
    /// Streams this transport created or checked, by name (not the
    /// streams of foreign subjects that other teams made).
    pub fn streams(&self) -> Vec<String> {
        self.streams
            .lock()
            .expect("streams lock")
            .iter()
            .filter(|name| !name.starts_with(FOREIGN))
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

    /// The stream holding `topic`, created where it does not exist: for a
    /// foreign topic, the stream another team made for its subject if any.
    pub(crate) async fn stream(&self, topic: &str) -> Result<stream::Stream> {
        if let Some(subject) = self.options.foreign_subject(topic) {
            return self.foreign_stream(topic, subject).await;
        }
        let name = self.stream_name(topic);
        self.create_stream(&name, format!("{}.>", self.subject(topic)))
            .await
    }

    async fn create_stream(&self, name: &str, subject: String) -> Result<stream::Stream> {
        let stream = self
            .js
            .get_or_create_stream(stream::Config {
                name: name.to_owned(),
                subjects: vec![subject],
                storage: stream::StorageType::File,
                duplicate_window: self.options.duplicate_window,
                ..Default::default()
            })
            .await
            .map_err(|e| Error::transport(TRANSPORT, format!("creating stream {name}"), e, true))?;
        self.streams.lock().expect("streams lock").insert(name.to_owned());
        Ok(stream)
    }

    /// The stream that holds `subject`; where none does, one of Tidings'
    /// own that captures it from now on.
    async fn foreign_stream(&self, topic: &str, subject: &str) -> Result<stream::Stream> {
        use async_nats::jetstream::context::GetStreamByNameErrorKind;
        let found = match self.js.stream_by_subject(subject).await {
            Ok(name) => Some(name),
            Err(e) if e.kind() == GetStreamByNameErrorKind::NotFound => None,
            Err(e) if e.kind() == GetStreamByNameErrorKind::InvalidSubject => {
                return Err(Error::Config {
                    key: format!("NATS foreign topic {topic}"),
                    reason: format!("{subject:?} is not a valid NATS subject"),
                });
            }
            Err(e) => {
                return Err(Error::transport(
                    TRANSPORT,
                    format!("looking up the stream holding {subject}"),
                    e,
                    true,
                ));
            }
        };
        let Some(name) = found else {
            let name = self.stream_name(topic);
            tracing::info!(topic, subject, stream = %name, "no JetStream stream holds the foreign subject; creating one to capture it");
            return self.create_stream(&name, subject.to_owned()).await;
        };
        self.js.get_stream(&name).await.map_err(|e| {
            Error::transport(
                TRANSPORT,
                format!("reading stream {name} (holding {subject})"),
                e,
                true,
            )
        })
    }

    pub(crate) async fn ensure_stream(&self, topic: &str) -> Result<()> {
        let key = match self.options.foreign_subject(topic) {
            Some(subject) => format!("{FOREIGN}{subject}"),
            None => self.stream_name(topic),
        };
        if !self.streams.lock().expect("streams lock").contains(&key) {
            self.stream(topic).await?;
            if key.starts_with(FOREIGN) {
                self.streams.lock().expect("streams lock").insert(key);
            }
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
        self.durable_on(&stream, group, topic, partition).await
    }

    /// [`durable`](Self::durable) on `stream`, the topic's, already found.
    pub(crate) async fn durable_on(
        &self,
        stream: &stream::Stream,
        group: &str,
        topic: &str,
        partition: Partition,
    ) -> Result<consumer::PullConsumer> {
        let config = self.durable_config(group, topic, partition, consumer::DeliverPolicy::All);
        let durable = config.durable_name.clone().unwrap_or_default();
        stream
            .get_or_create_consumer(&durable, config)
            .await
            .map_err(|e| Error::transport(TRANSPORT, format!("creating consumer {durable}"), e, true))
    }

    /// Makes the durable consumer of the group's partition anew, delivering
    /// from stream sequence `from` on: what the one before had delivered
    /// and not seen acknowledged comes again, in order. `stream` is the
    /// topic's.
    pub(crate) async fn recreate_durable(
        &self,
        stream: &stream::Stream,
        group: &str,
        topic: &str,
        partition: Partition,
        from: u64,
    ) -> Result<consumer::PullConsumer> {
        let config = self.durable_config(
            group,
            topic,
            partition,
            consumer::DeliverPolicy::ByStartSequence { start_sequence: from },
        );
        let durable = config.durable_name.clone().unwrap_or_default();
        match stream.delete_consumer(&durable).await {
            Ok(_) => {}
            // Gone already: another member made it anew first, or it never was.
            Err(e)
                if matches!(e.kind(), stream::ConsumerErrorKind::JetStream(j)
                    if j.error_code() == async_nats::jetstream::ErrorCode::CONSUMER_NOT_FOUND) => {}
            Err(e) => {
                return Err(Error::transport(
                    TRANSPORT,
                    format!("deleting consumer {durable}"),
                    e,
                    true,
                ));
            }
        }
        stream
            .create_consumer(config)
            .await
            .map_err(|e| Error::transport(TRANSPORT, format!("creating consumer {durable}"), e, true))
    }

    fn durable_config(
        &self,
        group: &str,
        topic: &str,
        partition: Partition,
        deliver_policy: consumer::DeliverPolicy,
    ) -> consumer::pull::Config {
        let durable = self.options.durable(group, topic, partition);
        consumer::pull::Config {
            durable_name: Some(durable),
            ack_policy: consumer::AckPolicy::Explicit,
            deliver_policy,
            ack_wait: self.options.ack_wait,
            max_ack_pending: self.options.max_ack_pending,
            max_deliver: -1,
            filter_subject: self.options.filter_subject(topic, partition),
            ..Default::default()
        }
    }
}
