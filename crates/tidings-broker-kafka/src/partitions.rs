//! How many partitions each topic has: the configured count for Tidings'
//! own topics (created with it, refused when the broker's differs), the
//! broker's for another team's (discovered, never created).

use tidings_core::{Error, Result};

use crate::{KafkaTransport, TRANSPORT};

impl KafkaTransport {
    /// The partitions of `topic` as known without creating anything: the
    /// configured count, or for a foreign topic the broker's (it must exist).
    pub(crate) async fn partitions_of(&self, topic: &str) -> Result<u32> {
        if !self.inner.options.is_foreign(topic) {
            return Ok(self.inner.options.partitions);
        }
        if let Some(n) = self.known_partitions(&self.kafka_topic(topic)) {
            return Ok(n);
        }
        self.discover_partitions(topic).await
    }

    /// Another team's topic's partitions, asked of the broker now (a
    /// consumer starting again in the same process sees partitions added
    /// meanwhile), and remembered.
    pub(crate) async fn discover_partitions(&self, topic: &str) -> Result<u32> {
        let name = self.kafka_topic(topic);
        match self.broker_partitions(&name).await? {
            Some(n) => {
                self.inner.topics.lock().expect("topics lock").insert(name, n);
                Ok(n)
            }
            None => Err(Error::transport_reason(
                TRANSPORT,
                format!(
                    "the Kafka topic {name} (topic {topic}, another team's) does not exist yet: its \
                     producer creates it, Tidings does not; waiting for it"
                ),
                true,
            )),
        }
    }

    /// The partitions of `topic`, ready to write and read: a foreign topic's
    /// as found, Tidings' own created with the configured count where
    /// missing. Own topics whose count on the broker differs are refused
    /// (transient: the relay keeps every record and says why at each try).
    pub(crate) async fn ensure_partitions(&self, topic: &str) -> Result<u32> {
        if self.inner.options.is_foreign(topic) {
            return self.partitions_of(topic).await;
        }
        let configured = self.inner.options.partitions;
        let name = self.kafka_topic(topic);
        let found = self.ensure_topic(&name, configured).await?;
        if found != configured {
            // Asked again next time: the operator may fix the topic.
            self.inner.topics.lock().expect("topics lock").remove(&name);
            return Err(Error::transport_reason(
                TRANSPORT,
                mismatch(&name, found, configured),
                true,
            ));
        }
        Ok(found)
    }

    /// The partitions of a Kafka topic this transport has seen, if it has.
    pub(crate) fn known_partitions(&self, kafka_topic: &str) -> Option<u32> {
        self.inner
            .topics
            .lock()
            .expect("topics lock")
            .get(kafka_topic)
            .copied()
    }
}

/// Why a topic with `found` partitions on the broker cannot be used as one
/// with `configured`, and what to do.
pub(crate) fn mismatch(kafka_topic: &str, found: u32, configured: u32) -> String {
    format!(
        "Kafka topic {kafka_topic} has {found} partitions on the broker and this transport is configured \
         for {configured}: {}. Configure {found} partitions (KafkaOptions::partitions, or [broker] \
         partitions in tidings.toml), or read it as another team's topic (KafkaOptions::foreign), \
         whose partitions are discovered",
        if found > configured {
            "its consumers would never read the partitions past those"
        } else {
            "the relay would write to partitions that do not exist"
        }
    )
}
