//! [`SqsOptions`]: names, partitions, visibility timeout, receive wait,
//! the broker's largest message, and where the service is, from an
//! `sqs://` URL.

use std::time::Duration;

use tidings_core::Topology;

/// SNS's and SQS's largest message: 256 KiB, the body and every message
/// attribute's name, type and value counted together.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 256 * 1024;

/// Options of an [`SqsTransport`](crate::SqsTransport).
#[derive(Debug, Clone)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Deserialize),
    serde(default, deny_unknown_fields)
)]
pub struct SqsOptions {
    pub(crate) prefix: String,
    #[cfg_attr(
        feature = "serde",
        serde(deserialize_with = "tidings_core::clamp::at_least_one")
    )]
    pub(crate) partitions: u32,
    #[cfg_attr(feature = "serde", serde(with = "tidings_core::duration"))]
    pub(crate) visibility_timeout: Duration,
    #[cfg_attr(feature = "serde", serde(with = "tidings_core::duration"))]
    pub(crate) receive_wait: Duration,
    #[cfg_attr(
        feature = "serde",
        serde(deserialize_with = "tidings_core::clamp::at_least_one")
    )]
    pub(crate) max_receive_count: u32,
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
    pub(crate) unordered_groups: Vec<String>,
    pub(crate) region: Option<String>,
    pub(crate) endpoint: Option<String>,
    #[cfg_attr(feature = "serde", serde(skip))]
    pub(crate) credentials: Option<StaticCredentials>,
}

/// An access key given in code ([`SqsOptions::static_credentials`]); its
/// secret is never printed.
#[derive(Clone)]
pub(crate) struct StaticCredentials {
    pub(crate) access_key_id: String,
    pub(crate) secret_access_key: String,
}

impl std::fmt::Debug for StaticCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StaticCredentials")
            .field("access_key_id", &self.access_key_id)
            .finish_non_exhaustive()
    }
}

impl Default for SqsOptions {
    /// Names prefixed `tidings`, one partition per topic, a visibility
    /// timeout of 30 s, receives that wait up to 5 s for a message, a
    /// message moved to the group's dead-letter queue after 50 receives,
    /// up to 64 unsettled messages per member and partition, messages up to
    /// [`DEFAULT_MAX_MESSAGE_BYTES`].
    fn default() -> Self {
        SqsOptions {
            prefix: "tidings".into(),
            partitions: 1,
            visibility_timeout: Duration::from_secs(30),
            receive_wait: Duration::from_secs(5),
            max_receive_count: 50,
            prefetch: 64,
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            unordered_groups: Vec::new(),
            region: None,
            endpoint: None,
            credentials: None,
        }
    }
}

impl SqsOptions {
    /// The prefix of topic and queue names (`tidings` makes topic `orders`
    /// the SNS topic `tidings-orders.fifo`), so that systems sharing an
    /// account stay apart.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Partitions of every topic: up to this many members of one group share
    /// a topic's work. Publishers and subscribers must use the same count.
    pub fn partitions(mut self, n: u32) -> Self {
        self.partitions = n.max(1);
        self
    }

    /// The partitions and prefix every publisher and subscriber of the
    /// system shares ([`Topology`]), set at once. (Events always travel in
    /// structured mode here: the topology's content mode does not apply.)
    pub fn topology(mut self, topology: &Topology) -> Self {
        self.partitions = topology.partition_count();
        if let Some(prefix) = topology.resource_prefix() {
            self.prefix = prefix.to_owned();
        }
        self
    }

    /// How long a received message stays hidden from other members (whole
    /// seconds, 1 s to 12 h) before SQS hands it out again: the time a
    /// member that crashed holds its messages. A live subscription keeps
    /// the messages it holds hidden for as long as it holds them.
    pub fn visibility_timeout(mut self, d: Duration) -> Self {
        self.visibility_timeout = d.clamp(Duration::from_secs(1), Duration::from_secs(12 * 3600));
        self
    }

    /// How long one receive waits for a message (long polling, at most
    /// 20 s): longer costs fewer requests, and makes closing a
    /// subscription wait as long for the receive under way.
    pub fn receive_wait(mut self, d: Duration) -> Self {
        self.receive_wait = d.min(Duration::from_secs(20));
        self
    }

    /// Receives of one message after which SQS moves it to the group's
    /// dead-letter queue (the queue's redrive policy). Keep it above the
    /// consumer's `max_crashes`, so that Tidings' own guard, which keeps
    /// the error history, decides first. SQS counts every receive: a
    /// message a member had received but not begun, made visible again
    /// when the member closed its subscription (a rebalance, a shutdown),
    /// counts too, which Tidings' guard does not (it counts handlings that
    /// began). Hence the high default, 50.
    pub fn max_receive_count(mut self, n: u32) -> Self {
        self.max_receive_count = n.clamp(1, 1000);
        self
    }

    /// Unsettled messages one member may hold per partition (backpressure).
    pub fn prefetch(mut self, n: u16) -> Self {
        self.prefetch = n.max(1);
        self
    }

    /// The largest message the service takes, body and attributes counted
    /// together. The relay sets a larger record aside before sending it.
    pub fn max_message_bytes(mut self, n: usize) -> Self {
        self.max_message_bytes = n.max(1);
        self
    }

    /// Consumer group `group` needs no order: it reads standard SQS queues
    /// instead of FIFO ones (SNS FIFO topics deliver to both). A standard
    /// queue hands out a key's messages in any order, and now and then one
    /// twice (the consumer's deduplication absorbs that), and never holds
    /// a key's later messages behind one in flight: for consumers that
    /// count, index or notify, where throughput matters more than order.
    /// Every member of the group must say the same: the queues' type is
    /// in their names (`.fifo` or not).
    pub fn unordered(mut self, group: impl Into<String>) -> Self {
        let group = group.into();
        if !self.unordered_groups.contains(&group) {
            self.unordered_groups.push(group);
        }
        self
    }

    /// Whether `group` reads standard queues ([`SqsOptions::unordered`]).
    pub(crate) fn is_unordered(&self, group: &str) -> bool {
        self.unordered_groups.iter().any(|g| g == group)
    }

    /// The AWS region, instead of the standard configuration's (`AWS_REGION`).
    pub fn region(mut self, region: impl Into<String>) -> Self {
        self.region = Some(region.into());
        self
    }

    /// The endpoint of both services, instead of the standard
    /// configuration's (`AWS_ENDPOINT_URL`): moto, LocalStack, a VPC endpoint.
    pub fn endpoint(mut self, url: impl Into<String>) -> Self {
        self.endpoint = Some(url.into());
        self
    }

    /// An access key to use instead of the standard credential chain:
    /// for moto, LocalStack and tests. In production leave it unset and let
    /// the chain find the service's role or profile.
    pub fn static_credentials(
        mut self,
        access_key_id: impl Into<String>,
        secret_access_key: impl Into<String>,
    ) -> Self {
        self.credentials = Some(StaticCredentials {
            access_key_id: access_key_id.into(),
            secret_access_key: secret_access_key.into(),
        });
        self
    }

    /// The partitions of `topic`.
    pub(crate) fn partitions_of(&self, _topic: &str) -> u32 {
        self.partitions
    }

    /// These options with what `url` says: `sqs://` alone takes everything
    /// from the standard AWS configuration; `sqs://REGION` names the region;
    /// `?endpoint=URL` the endpoint.
    pub(crate) fn with_url(mut self, url: &str) -> tidings_core::Result<Self> {
        let bad = |reason: String| tidings_core::Error::Config {
            key: "transport URL".into(),
            reason,
        };
        let parsed = url::Url::parse(url).map_err(|e| bad(format!("{url:?} is not a URL: {e}")))?;
        if parsed.scheme() != "sqs" {
            return Err(bad(format!("{url:?} is not an sqs:// URL")));
        }
        if let Some(host) = parsed.host_str().filter(|h| !h.is_empty()) {
            self.region = Some(host.to_owned());
        }
        for (k, v) in parsed.query_pairs() {
            match k.as_ref() {
                "endpoint" => self.endpoint = Some(v.into_owned()),
                "region" => self.region = Some(v.into_owned()),
                other => {
                    return Err(bad(format!(
                        "sqs:// URL option {other:?} is unknown: it takes region and endpoint \
                         (the rest goes in the [sqs] options)"
                    )));
                }
            }
        }
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_url_names_the_region_and_the_endpoint() {
        let o = SqsOptions::default().with_url("sqs://").unwrap();
        assert_eq!((o.region, o.endpoint), (None, None));
        let o = SqsOptions::default()
            .with_url("sqs://eu-west-1?endpoint=http://127.0.0.1:5000")
            .unwrap();
        assert_eq!(o.region.as_deref(), Some("eu-west-1"));
        assert_eq!(o.endpoint.as_deref(), Some("http://127.0.0.1:5000"));
        let e = SqsOptions::default().with_url("sqs://?wait=3").unwrap_err();
        assert!(e.to_string().contains("\"wait\" is unknown"), "{e}");
    }
}
