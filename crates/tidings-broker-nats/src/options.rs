//! [`NatsOptions`], and the credentials a NATS URL may carry.

use std::collections::BTreeMap;
use std::time::Duration;

use tidings_core::Topology;

/// Options of a [`NatsTransport`](crate::NatsTransport).
#[derive(Debug, Clone)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Deserialize),
    serde(default, deny_unknown_fields)
)]
pub struct NatsOptions {
    pub(crate) stream_prefix: String,
    #[cfg_attr(feature = "serde", serde(with = "tidings_core::duration"))]
    pub(crate) ack_wait: Duration,
    #[cfg_attr(
        feature = "serde",
        serde(deserialize_with = "tidings_core::clamp::at_least_one")
    )]
    pub(crate) max_ack_pending: i64,
    #[cfg_attr(feature = "serde", serde(with = "tidings_core::duration"))]
    pub(crate) duplicate_window: Duration,
    #[cfg_attr(
        feature = "serde",
        serde(deserialize_with = "tidings_core::clamp::at_least_one")
    )]
    pub(crate) prefetch: usize,
    #[cfg_attr(
        feature = "serde",
        serde(deserialize_with = "tidings_core::clamp::at_least_one")
    )]
    pub(crate) partitions: u32,
    pub(crate) content_mode: tidings_core::cloudevents::ContentMode,
    pub(crate) foreign: BTreeMap<String, String>,
}

impl Default for NatsOptions {
    /// Streams named `TIDINGS_<TOPIC>`, a 30 s ack wait, at most 1000
    /// unacknowledged messages per consumer group (backpressure), a
    /// 2-minute duplicate window, pulls of 64 messages, one partition per topic.
    fn default() -> Self {
        NatsOptions {
            stream_prefix: "TIDINGS".into(),
            ack_wait: Duration::from_secs(30),
            max_ack_pending: 1000,
            duplicate_window: Duration::from_secs(120),
            prefetch: 64,
            partitions: 1,
            content_mode: tidings_core::cloudevents::ContentMode::Binary,
            foreign: BTreeMap::new(),
        }
    }
}

impl NatsOptions {
    /// The prefix of stream names and subjects.
    pub fn stream_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.stream_prefix = prefix.into();
        self
    }

    /// How long JetStream waits for an acknowledgement before redelivering.
    /// The consumer runtime sends `Progress` while a handler runs or waits
    /// to retry (every `ConsumerConfig::progress_every`, 2 s by default):
    /// keep this well above that.
    pub fn ack_wait(mut self, d: Duration) -> Self {
        self.ack_wait = d;
        self
    }

    /// Unacknowledged messages allowed per consumer group before JetStream stops delivering.
    pub fn max_ack_pending(mut self, n: i64) -> Self {
        self.max_ack_pending = n.max(1);
        self
    }

    /// Messages one member pulls at a time. Smaller spreads work more evenly
    /// across the members of a group; larger saves round trips.
    pub fn prefetch(mut self, n: usize) -> Self {
        self.prefetch = n.max(1);
        self
    }

    /// Partitions of every topic: up to this many members of one group share
    /// a topic's work. Publishers and subscribers must use the same count.
    pub fn partitions(mut self, n: u32) -> Self {
        self.partitions = n.max(1);
        self
    }

    /// The partitions, prefix and content mode every publisher and
    /// subscriber of the system shares ([`Topology`]), set at once.
    pub fn topology(mut self, topology: &Topology) -> Self {
        self.partitions = topology.partition_count();
        if let Some(mode) = topology.events_content_mode() {
            self.content_mode = mode;
        }
        if let Some(prefix) = topology.resource_prefix() {
            self.stream_prefix = prefix.to_owned();
        }
        self
    }

    /// How the publisher writes events: CloudEvents binary mode (the
    /// default) or structured mode. Subscribers read both.
    pub fn content_mode(mut self, mode: tidings_core::cloudevents::ContentMode) -> Self {
        self.content_mode = mode;
        self
    }

    /// Reads `topic` from `subject`, a subject another team's producer
    /// writes (`payments.>`, `payments.*.captured`, `billing.invoice`),
    /// instead of Tidings' own `<prefix>.<topic>.<partition>.<type>`.
    ///
    /// The group's durable consumer is created, filtered on `subject`, on
    /// the stream that holds it (the producer's own); where no stream
    /// holds it (a producer publishing plain NATS), the stream
    /// `<PREFIX>_<TOPIC>` is created to capture it, keeping what is
    /// published from then on. Such a topic has one partition: the
    /// consumer runtime handles its keys in parallel, each in order.
    /// Publishing to it (a redrive) writes on `subject`, each wildcard
    /// token replaced by the message type.
    ///
    /// In a configuration file (`TransportOptions`), under `[nats]`:
    /// `foreign = { payments = "payments.>" }`.
    pub fn foreign(mut self, topic: impl Into<String>, subject: impl Into<String>) -> Self {
        self.foreign.insert(topic.into(), subject.into());
        self
    }

    /// The subject another team writes `topic` on, if it was declared
    /// [`foreign`](NatsOptions::foreign).
    pub fn foreign_subject(&self, topic: &str) -> Option<&str> {
        self.foreign.get(topic).map(String::as_str)
    }

    /// The partitions of `topic`: one for a foreign subject.
    pub(crate) fn partitions_of(&self, topic: &str) -> u32 {
        if self.foreign.contains_key(topic) {
            1
        } else {
            self.partitions
        }
    }

    /// The window in which JetStream drops a message whose `Nats-Msg-Id` it has seen.
    pub fn duplicate_window(mut self, d: Duration) -> Self {
        self.duplicate_window = d;
        self
    }
}

pub(crate) enum Credentials {
    UserPassword(String, String),
    Token(String),
}

/// `nats://user:pw@host:4222` -> (`nats://host:4222`, user and password);
/// `nats://token@host` -> (`nats://host`, the token).
pub(crate) fn split_credentials(url: &str) -> (String, Option<Credentials>) {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return (url.to_owned(), None);
    };
    let rest = &url[scheme_end..];
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else {
        return (url.to_owned(), None);
    };
    let userinfo = &rest[..at];
    let address = format!("{}{}", &url[..scheme_end], &rest[at + 1..]);
    let credentials = match userinfo.split_once(':') {
        Some((user, password)) => Credentials::UserPassword(user.to_owned(), password.to_owned()),
        None => Credentials::Token(userinfo.to_owned()),
    };
    (address, Some(credentials))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_are_taken_out_of_the_url() {
        let (address, c) = split_credentials("nats://me:pw@127.0.0.1:4222");
        assert_eq!(address, "nats://127.0.0.1:4222");
        assert!(matches!(c, Some(Credentials::UserPassword(u, p)) if u == "me" && p == "pw"));
        let (address, c) = split_credentials("tls://tok@nats.example:4222");
        assert_eq!(address, "tls://nats.example:4222");
        assert!(matches!(c, Some(Credentials::Token(t)) if t == "tok"));
        let (address, c) = split_credentials("nats://127.0.0.1:4222");
        assert_eq!(address, "nats://127.0.0.1:4222");
        assert!(c.is_none());
    }
}
