//! One partition count per topic. Each count has Pub/Sub topics of its
//! own (`<base>-<p>-of-<n>`, or `<base>` for one partition), so a
//! publisher and a consumer group configured with two counts never meet:
//! the group waits on topics nobody publishes to, and the publisher keeps
//! its messages in the outbox, or sends them to other groups only. Before
//! a group reads a topic, and before a publisher first publishes to one,
//! the project's topics are listed and any of another count refuses it.

use gcloud_gax::grpc::Code;
use tidings_core::{Error, Result};

use crate::{PubSubTransport, TRANSPORT};

impl PubSubTransport {
    /// The partition counts, other than the configured one, that `topic`
    /// has Pub/Sub topics for, in the order listed; none when Pub/Sub
    /// does not let this transport list the project's topics (a warning
    /// says the count is not checked).
    async fn other_counts(&self, topic: &str) -> Result<Vec<u32>> {
        let configured = self.options.partitions_of(topic);
        let base = self.options.topic_base(topic);
        let listed = match self.client.get_topics(None).await {
            Ok(listed) => listed,
            Err(e) if e.code() == Code::PermissionDenied => {
                tracing::warn!(topic = %topic, "cannot list the project's Pub/Sub topics (grant pubsub.topics.list): the topic's partition count is not checked against other processes'");
                return Ok(Vec::new());
            }
            Err(e) => return Err(self.error("listing the project's Pub/Sub topics", e)),
        };
        let mut others = Vec::new();
        for path in &listed {
            let id = path.rsplit('/').next().unwrap_or(path);
            if let Some(n) = count_of(id, &base)
                && n != configured
                && !others.contains(&n)
            {
                others.push(n);
            }
        }
        Ok(others)
    }

    /// Why `topic` cannot be used with the configured partition count, if
    /// it cannot; remembered once it can.
    async fn partition_mismatch(&self, topic: &str) -> Result<Option<String>> {
        if self.declared.counted.lock().unwrap().contains(topic) {
            return Ok(None);
        }
        let others = self.other_counts(topic).await?;
        if others.is_empty() {
            self.declared.counted.lock().unwrap().insert(topic.to_owned());
            return Ok(None);
        }
        let configured = self.options.partitions_of(topic);
        let found: Vec<String> = others.iter().map(u32::to_string).collect();
        Ok(Some(format!(
            "topic {topic:?} has Pub/Sub topics for {} partitions ({}-...) and this transport is \
             configured for {configured}: a publisher and a consumer group counting differently \
             publish to and read from different Pub/Sub topics. Every publisher and group of a \
             topic uses one count: configure {} (PubSubOptions::partitions, [broker] partitions in \
             tidings.toml, or --partitions), or delete the topics of the count no longer used",
            found.join(" and "),
            self.options.topic_path(&self.options.topic_base(topic)),
            found[0],
        )))
    }

    /// Refuses to read `topic` where it has Pub/Sub topics of another
    /// partition count: a configuration to fix, not to wait out.
    pub(crate) async fn check_topic_partitions(&self, topic: &str) -> Result<()> {
        match self.partition_mismatch(topic).await? {
            Some(reason) => Err(Error::Config {
                key: "partitions".into(),
                reason,
            }),
            None => Ok(()),
        }
    }

    /// Refuses, retryably, to publish to `topic` where it has Pub/Sub
    /// topics of another partition count: the message stays in the outbox
    /// until the configuration is fixed.
    pub(crate) async fn check_publish_partitions(&self, topic: &str) -> Result<()> {
        match self.partition_mismatch(topic).await? {
            Some(reason) => Err(Error::transport_reason(
                TRANSPORT,
                format!("publishing: {reason}; the message stays in the outbox"),
                true,
            )),
            None => Ok(()),
        }
    }
}

/// The partition count topic id `id` belongs to, for the topic whose
/// Pub/Sub name is `base`: 1 for `base` itself, `n` for `base-<p>-of-<n>`
/// (`p < n`); none for any other id.
pub(crate) fn count_of(id: &str, base: &str) -> Option<u32> {
    let rest = id.strip_prefix(base)?;
    if rest.is_empty() {
        return Some(1);
    }
    let (p, n) = rest.strip_prefix('-')?.split_once("-of-")?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(p) || !digits(n) {
        return None;
    }
    let (p, n) = (p.parse::<u32>().ok()?, n.parse::<u32>().ok()?);
    (p < n).then_some(n)
}

#[cfg(test)]
mod tests {
    use super::count_of;

    #[test]
    fn a_topic_id_names_its_partition_count() {
        assert_eq!(count_of("t-orders", "t-orders"), Some(1));
        assert_eq!(count_of("t-orders-3-of-4", "t-orders"), Some(4));
        assert_eq!(count_of("t-orders-0-of-16", "t-orders"), Some(16));
        // Another topic, a group's dead-letter topic, nonsense: none.
        assert_eq!(count_of("t-orders2", "t-orders"), None);
        assert_eq!(count_of("t-orders-email-dead", "t-orders"), None);
        assert_eq!(count_of("t-orders-email-0-of-4", "t-orders"), None);
        assert_eq!(count_of("t-orders-4-of-4", "t-orders"), None);
        assert_eq!(count_of("t-orders--1-of-4", "t-orders"), None);
        assert_eq!(count_of("t-orders-1-of-", "t-orders"), None);
        assert_eq!(count_of("t-order", "t-orders"), None);
    }
}
