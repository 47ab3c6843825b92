//! The names Tidings gives its Pub/Sub topics and subscriptions, and the
//! ordering key of a message.
//!
//! Pub/Sub takes names of 3 to 255 characters that begin with a letter
//! and do not begin with `goog`. Parts are joined by `-` and made as
//! [`tidings_core::names`] makes them, so that no two Tidings names share
//! a resource.

use sha2::{Digest, Sha256};
use tidings_core::Partition;
use tidings_core::addresses::{Address, Addresses, type_as_is};
use tidings_core::names::{self, part};

use crate::PubSubOptions;

/// Pub/Sub's longest topic or subscription name.
const NAME_MAX: usize = 255;
/// Pub/Sub's longest ordering key, in bytes.
const ORDERING_KEY_MAX: usize = 1024;

impl PubSubOptions {
    /// `<prefix>-<topic>`, made a name Pub/Sub takes (it begins with a
    /// letter, and not with `goog`).
    fn base(&self, topic: &str) -> String {
        let base = if self.prefix.is_empty() {
            part(topic)
        } else {
            format!("{}-{}", names::prefix(&self.prefix), part(topic))
        };
        if base.starts_with(|c: char| c.is_ascii_alphabetic()) && !base.starts_with("goog") {
            base
        } else {
            format!("t-{base}")
        }
    }

    /// The Pub/Sub topic of `topic` with one partition, and the stem of
    /// its partitions' topics with several.
    pub(crate) fn topic_base(&self, topic: &str) -> String {
        names::fit(&self.base(topic), "", NAME_MAX)
    }

    fn partitioned(&self, mut base: String, partition: Partition) -> String {
        if partition.count > 1 {
            base.push_str(&format!("-{}-of-{}", partition.index, partition.count));
        }
        names::fit(&base, "", NAME_MAX)
    }

    /// The project's resource path: `projects/<project>`.
    pub(crate) fn project_path(&self) -> String {
        format!("projects/{}", self.project.as_deref().unwrap_or_default())
    }

    /// The Pub/Sub topic of `partition` of `topic`: `<prefix>-<topic>` for
    /// a topic of one partition, `<prefix>-<topic>-<p>-of-<n>` otherwise.
    pub(crate) fn topic_id(&self, topic: &str, partition: Partition) -> String {
        self.partitioned(self.base(topic), partition)
    }

    /// The subscription of `group` to `partition` of `topic`:
    /// `<prefix>-<topic>-<group>`, and `-<p>-of-<n>` where the topic has
    /// several partitions.
    pub(crate) fn subscription_id(&self, topic: &str, group: &str, partition: Partition) -> String {
        self.partitioned(format!("{}-{}", self.base(topic), part(group)), partition)
    }

    /// The dead-letter topic of `group` on `topic`, for every partition,
    /// and the subscription on it that keeps what reaches it:
    /// `<prefix>-<topic>-<group>-dead`.
    pub(crate) fn dead_id(&self, topic: &str, group: &str) -> String {
        names::fit(
            &format!("{}-{}-dead", self.base(topic), part(group)),
            "",
            NAME_MAX,
        )
    }

    /// `projects/<project>/topics/<id>`.
    pub(crate) fn topic_path(&self, id: &str) -> String {
        format!("{}/topics/{id}", self.project_path())
    }

    /// `projects/<project>/subscriptions/<id>`.
    pub(crate) fn subscription_path(&self, id: &str) -> String {
        format!("{}/subscriptions/{id}", self.project_path())
    }
}

/// The ordering key of a message with aggregate key `key`: the key itself
/// where Pub/Sub takes it (up to 1024 bytes), else `h-` and a hash of it;
/// none for a message without a key, which promises no order.
pub(crate) fn ordering_key(key: &str) -> String {
    if key.len() <= ORDERING_KEY_MAX {
        return key.to_owned();
    }
    format!("h-{}", hex::encode(Sha256::digest(key.as_bytes())))
}

impl Addresses for PubSubOptions {
    fn protocol(&self) -> &'static str {
        "googlepubsub"
    }

    /// The topic, `<prefix>-<topic>`, or with several partitions one topic
    /// each, `<prefix>-<topic>-{partition}-of-<n>`. No `googlepubsub`
    /// channel binding: it requires the topic's Pub/Sub schema settings,
    /// and Tidings' topics have no Pub/Sub schema (the document's messages
    /// carry the events' schemas).
    fn address(&self, topic: &str) -> Address {
        let count = self.partitions_of(topic);
        let whole = self.topic_id(topic, Partition { index: 0, count: 1 });
        Address {
            address: if count > 1 {
                format!("{whole}-{{partition}}-of-{count}")
            } else {
                whole
            },
            partitions: count,
            type_token: type_as_is,
            channel_binding: None,
            message_binding: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_keep_to_what_pubsub_takes() {
        let o = PubSubOptions::default();
        let whole = Partition { index: 0, count: 1 };
        assert_eq!(o.topic_id("orders", whole), "tidings-orders");
        assert_eq!(
            o.topic_id("orders", Partition { index: 2, count: 3 }),
            "tidings-orders-2-of-3"
        );
        assert_eq!(
            o.subscription_id("orders", "email", whole),
            "tidings-orders-email"
        );
        assert_ne!(
            o.subscription_id("orders", "email-dead", whole),
            o.dead_id("orders", "email")
        );
        assert_ne!(
            o.subscription_id("a-b", "c", whole),
            o.subscription_id("a", "b-c", whole)
        );
        let bare = PubSubOptions::default().prefix("");
        assert_eq!(bare.topic_id("1st", whole), "t-1st");
        assert_eq!(bare.topic_id("google", whole), "t-google");
        let long = o.subscription_id("orders", &"g".repeat(300), whole);
        assert_eq!(long.len(), 255);
    }

    #[test]
    fn a_key_pubsub_cannot_take_is_hashed() {
        assert_eq!(ordering_key("o-1"), "o-1");
        assert_eq!(ordering_key(""), "");
        let long = ordering_key(&"k".repeat(2000));
        assert!(long.starts_with("h-") && long.len() == 66, "{long}");
    }
}
