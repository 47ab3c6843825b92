//! [`PubSubOptions`]: names, partitions, leases, the dead-letter policy,
//! the broker's largest message, and where the service is, from a
//! `pubsub://PROJECT` URL.

use std::time::Duration;

use tidings_core::Topology;

/// Pub/Sub's largest message: 10 MB, the data and every attribute's name
/// and value counted together.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 10_000_000;

/// Options of a [`PubSubTransport`](crate::PubSubTransport).
#[derive(Debug, Clone)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Deserialize),
    serde(default, deny_unknown_fields)
)]
pub struct PubSubOptions {
    pub(crate) prefix: String,
    #[cfg_attr(
        feature = "serde",
        serde(deserialize_with = "tidings_core::clamp::at_least_one")
    )]
    pub(crate) partitions: u32,
    #[cfg_attr(feature = "serde", serde(with = "tidings_core::duration"))]
    pub(crate) ack_deadline: Duration,
    #[cfg_attr(feature = "serde", serde(with = "tidings_core::duration"))]
    pub(crate) max_lease: Duration,
    #[cfg_attr(
        feature = "serde",
        serde(deserialize_with = "tidings_core::clamp::at_least_one")
    )]
    pub(crate) max_delivery_attempts: u32,
    #[cfg_attr(
        feature = "serde",
        serde(deserialize_with = "tidings_core::clamp::at_least_one")
    )]
    pub(crate) prefetch: u16,
    #[cfg_attr(
        feature = "serde",
        serde(deserialize_with = "tidings_core::clamp::at_least_one")
    )]
    pub(crate) max_message_bytes: usize,
    pub(crate) project: Option<String>,
    pub(crate) endpoint: Option<String>,
}

impl Default for PubSubOptions {
    /// Names prefixed `tidings`, one partition per topic, an ack deadline
    /// of 30 s, a message held by a live member for at most an hour, a
    /// message moved to the group's dead-letter topic after 50 delivery
    /// attempts, up to 64 unsettled messages per member and partition,
    /// messages up to [`DEFAULT_MAX_MESSAGE_BYTES`].
    fn default() -> Self {
        PubSubOptions {
            prefix: "tidings".into(),
            partitions: 1,
            ack_deadline: Duration::from_secs(30),
            max_lease: Duration::from_secs(3600),
            max_delivery_attempts: 50,
            prefetch: 64,
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            project: None,
            endpoint: None,
        }
    }
}

impl PubSubOptions {
    /// The prefix of topic and subscription names (`tidings` makes topic
    /// `orders` the Pub/Sub topic `tidings-orders`), so that systems
    /// sharing a project stay apart.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Partitions of every topic: up to this many members of one group
    /// share a topic's work. Publishers and subscribers must use the same
    /// count.
    pub fn partitions(mut self, n: u32) -> Self {
        self.partitions = n.max(1);
        self
    }

    /// The partitions and prefix every publisher and subscriber of the
    /// system shares ([`Topology`]), set at once.
    pub fn topology(mut self, topology: &Topology) -> Self {
        self.partitions = topology.partition_count();
        if let Some(prefix) = topology.resource_prefix() {
            self.prefix = prefix.to_owned();
        }
        self
    }

    /// The subscriptions' ack deadline (10 s to 600 s): how long a message
    /// handed to a member that crashed stays with it before Pub/Sub hands
    /// it out again. A live member extends it for as long as it holds the
    /// message, up to [`max_lease`](Self::max_lease).
    pub fn ack_deadline(mut self, d: Duration) -> Self {
        self.ack_deadline = d.clamp(Duration::from_secs(10), Duration::from_secs(600));
        self
    }

    /// How long a live member holds one message at most (its handler's
    /// time), extending its ack deadline, before letting Pub/Sub hand it
    /// out again.
    pub fn max_lease(mut self, d: Duration) -> Self {
        self.max_lease = d.max(Duration::from_secs(10));
        self
    }

    /// Delivery attempts after which Pub/Sub moves a message to the
    /// group's dead-letter topic (the subscription's dead-letter policy;
    /// 5 to 100). Keep it above the consumer's `max_crashes`, so that
    /// Tidings' own guard, which keeps the error history, decides first.
    pub fn max_delivery_attempts(mut self, n: u32) -> Self {
        self.max_delivery_attempts = n.clamp(5, 100);
        self
    }

    /// Unsettled messages one member may hold per partition (backpressure).
    pub fn prefetch(mut self, n: u16) -> Self {
        self.prefetch = n.max(1);
        self
    }

    /// The largest message the service takes, data and attributes counted
    /// together. The relay sets a larger record aside before sending it.
    pub fn max_message_bytes(mut self, n: usize) -> Self {
        self.max_message_bytes = n.max(1);
        self
    }

    /// The Google Cloud project, instead of the URL's.
    pub fn project(mut self, project: impl Into<String>) -> Self {
        self.project = Some(project.into());
        self
    }

    /// The service's endpoint, instead of Google's (or
    /// `PUBSUB_EMULATOR_HOST`'s): `http://127.0.0.1:8085` for the
    /// emulator, which is reached without credentials.
    pub fn endpoint(mut self, url: impl Into<String>) -> Self {
        self.endpoint = Some(url.into());
        self
    }

    /// The partitions of `topic`.
    pub(crate) fn partitions_of(&self, _topic: &str) -> u32 {
        self.partitions
    }

    /// These options with what `url` says: `pubsub://PROJECT`, and
    /// `?endpoint=URL` for an emulator or a private endpoint. Without an
    /// endpoint, `PUBSUB_EMULATOR_HOST` names the emulator's, as Google's
    /// client libraries read it.
    pub(crate) fn with_url(mut self, url: &str) -> tidings_core::Result<Self> {
        let bad = |reason: String| tidings_core::Error::Config {
            key: "transport URL".into(),
            reason,
        };
        let parsed = url::Url::parse(url).map_err(|e| bad(format!("{url:?} is not a URL: {e}")))?;
        if parsed.scheme() != "pubsub" {
            return Err(bad(format!("{url:?} is not a pubsub:// URL")));
        }
        if let Some(host) = parsed.host_str().filter(|h| !h.is_empty()) {
            self.project = Some(host.to_owned());
        }
        for (k, v) in parsed.query_pairs() {
            match k.as_ref() {
                "endpoint" => self.endpoint = Some(v.into_owned()),
                other => {
                    return Err(bad(format!(
                        "pubsub:// URL option {other:?} is unknown: it takes endpoint (the rest goes \
                         in the [pubsub] options)"
                    )));
                }
            }
        }
        if self.project.is_none() {
            return Err(bad(format!(
                "{url:?} names no Google Cloud project: write pubsub://PROJECT"
            )));
        }
        if self.endpoint.is_none()
            && let Ok(host) = std::env::var("PUBSUB_EMULATOR_HOST")
            && !host.is_empty()
        {
            self.endpoint = Some(format!("http://{host}"));
        }
        Ok(self)
    }

    /// Whether the endpoint is an emulator's (plain `http://`), which takes
    /// no credentials.
    pub(crate) fn emulated(&self) -> bool {
        self.endpoint.as_deref().is_some_and(|e| e.starts_with("http://"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_url_names_the_project_and_the_endpoint() {
        let o = PubSubOptions::default()
            .with_url("pubsub://shop?endpoint=http://127.0.0.1:8085")
            .unwrap();
        assert_eq!(o.project.as_deref(), Some("shop"));
        assert_eq!(o.endpoint.as_deref(), Some("http://127.0.0.1:8085"));
        assert!(o.emulated());
        let e = PubSubOptions::default().with_url("pubsub://").unwrap_err();
        assert!(e.to_string().contains("names no Google Cloud project"), "{e}");
        let e = PubSubOptions::default()
            .with_url("pubsub://shop?wait=3")
            .unwrap_err();
        assert!(e.to_string().contains("\"wait\" is unknown"), "{e}");
    }
}
