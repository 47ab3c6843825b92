//! Dual publishing through a breaking change.
//!
//! A breaking change to an event gets a new version of its type, on a new
//! topic (`customers.v2`). Until every consumer reads the new version, the
//! producer writes each event twice, in the same transaction: at the new
//! version to the new topic, and converted to the previous version on the
//! previous topic. Consumers of each version read their own topic and
//! handle each event once; the copies share correlation, causation and
//! trace, and the previous-version copy names the new one in its
//! [`DUAL_OF_HEADER`]. When the last old consumer has moved, turn the
//! transition off and retire the old topic.
//!
//! ```
//! # use serde::{Deserialize, Serialize};
//! use tidings_core::transition::{DualPublish, Transition, outgoing};
//! use tidings_core::{Kind, Message};
//!
//! #[derive(Serialize, Deserialize)]
//! struct CustomerRegisteredV1 { customer_id: String, name: String }
//! impl Message for CustomerRegisteredV1 {
//!     const TYPE: &'static str = "CustomerRegistered";
//!     const VERSION: u32 = 1;
//!     const KIND: Kind = Kind::Event;
//!     const AGGREGATE: &'static str = "customer";
//!     const TOPIC: &'static str = "customers";
//!     fn key(&self) -> String { self.customer_id.clone() }
//! }
//!
//! #[derive(Serialize, Deserialize)]
//! struct CustomerRegistered { customer_id: String, first_name: String, last_name: String }
//! impl Message for CustomerRegistered {
//!     const TYPE: &'static str = "CustomerRegistered";
//!     const VERSION: u32 = 2;
//!     const KIND: Kind = Kind::Event;
//!     const AGGREGATE: &'static str = "customer";
//!     const TOPIC: &'static str = "customers.v2";
//!     fn key(&self) -> String { self.customer_id.clone() }
//! }
//!
//! impl Transition for CustomerRegistered {
//!     type Previous = CustomerRegisteredV1;
//!     fn previous(&self) -> CustomerRegisteredV1 {
//!         CustomerRegisteredV1 {
//!             customer_id: self.customer_id.clone(),
//!             name: format!("{} {}", self.first_name, self.last_name),
//!         }
//!     }
//! }
//!
//! let dual = DualPublish::parse("CustomerRegistered")?;
//! let event = CustomerRegistered { customer_id: "c-1".into(), first_name: "Ada".into(), last_name: "Lovelace".into() };
//! let out = outgoing("crm", &event, &dual)?;
//! assert_eq!(out.len(), 2);
//! assert_eq!((out[0].topic.as_str(), out[0].envelope.version), ("customers.v2", 2));
//! assert_eq!((out[1].topic.as_str(), out[1].envelope.version), ("customers", 1));
//! # Ok::<(), tidings_core::Error>(())
//! ```

use std::collections::BTreeSet;

use crate::envelope::Envelope;
use crate::error::{Error, Result};
use crate::message::Message;
use crate::transport::OutgoingMessage;

/// The header of a previous-version copy: the id of the message it copies.
pub const DUAL_OF_HEADER: &str = "tidings-dual-of";

/// A message type whose previous version is still read: it converts itself
/// to that version.
pub trait Transition: Message {
    /// The previous version: the same [`Message::TYPE`], a lower
    /// [`Message::VERSION`], another [`Message::TOPIC`].
    type Previous: Message;

    /// This message at the previous version.
    fn previous(&self) -> Self::Previous;
}

/// Which message types are in a transition: configuration, so that turning
/// dual publishing off needs no code change.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DualPublish {
    types: BTreeSet<String>,
}

impl DualPublish {
    /// No type in transition.
    pub fn new() -> DualPublish {
        DualPublish::default()
    }

    /// Dual-publishes `M`.
    pub fn during<M: Transition>(mut self) -> DualPublish {
        self.types.insert(M::TYPE.to_owned());
        self
    }

    /// Reads a comma-separated list of type names (`OrderPlaced,CustomerRegistered`),
    /// as a configuration value or environment variable holds it.
    pub fn parse(list: &str) -> Result<DualPublish> {
        let mut types = BTreeSet::new();
        for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            if !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
            {
                return Err(Error::Config {
                    key: "dual_publish".into(),
                    reason: format!("{name:?} is not a message type name"),
                });
            }
            types.insert(name.to_owned());
        }
        Ok(DualPublish { types })
    }

    /// Whether `message_type` is dual-published.
    pub fn is_on(&self, message_type: &str) -> bool {
        self.types.contains(message_type)
    }
}

/// What to write to the outbox for `message`: itself, and while its type is
/// in `dual`, its previous version after it (write both in one transaction).
pub fn outgoing<M: Transition>(
    source: &str,
    message: &M,
    dual: &DualPublish,
) -> Result<Vec<OutgoingMessage>> {
    let current = OutgoingMessage::new(source, message)?;
    if !dual.is_on(M::TYPE) {
        return Ok(vec![current]);
    }
    let previous = Transition::previous(message);
    let refuse = |reason: String| Error::Config {
        key: format!("dual_publish.{}", M::TYPE),
        reason,
    };
    if M::Previous::TYPE != M::TYPE || M::Previous::VERSION >= M::VERSION {
        return Err(refuse(format!(
            "the previous version of {} v{} must be an earlier version of the same type, not {} v{}",
            M::TYPE,
            M::VERSION,
            M::Previous::TYPE,
            M::Previous::VERSION
        )));
    }
    if M::Previous::TOPIC == M::TOPIC {
        return Err(refuse(format!(
            "{} v{} and v{} share the topic {}: consumers of each version would see both copies; \
             give the new version a topic of its own",
            M::TYPE,
            M::VERSION,
            M::Previous::VERSION,
            M::TOPIC
        )));
    }
    let e = &current.envelope;
    let mut copy = Envelope::new(e.source.clone(), &previous)?;
    copy.correlation_id = e.correlation_id;
    copy.causation_id = e.causation_id;
    copy.occurred_at = e.occurred_at;
    copy.headers = e.headers.clone();
    copy.headers.insert(DUAL_OF_HEADER.to_owned(), e.id.to_string());
    let copy = OutgoingMessage {
        topic: M::Previous::TOPIC.to_owned(),
        envelope: copy,
    };
    Ok(vec![current, copy])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Kind;
    use serde::{Deserialize, Serialize};

    macro_rules! version {
        ($ty:ident, $version:literal, $topic:literal) => {
            #[derive(Serialize, Deserialize)]
            struct $ty {
                id: String,
            }
            impl Message for $ty {
                const TYPE: &'static str = "Thing";
                const VERSION: u32 = $version;
                const KIND: Kind = Kind::Event;
                const AGGREGATE: &'static str = "thing";
                const TOPIC: &'static str = $topic;
                fn key(&self) -> String {
                    self.id.clone()
                }
            }
        };
    }
    version!(ThingV1, 1, "things");
    version!(ThingV2, 2, "things");

    impl Transition for ThingV2 {
        type Previous = ThingV1;
        fn previous(&self) -> ThingV1 {
            ThingV1 { id: self.id.clone() }
        }
    }

    #[test]
    fn versions_sharing_a_topic_are_refused() {
        let dual = DualPublish::new().during::<ThingV2>();
        let err = outgoing("s", &ThingV2 { id: "t".into() }, &dual).unwrap_err();
        assert!(err.to_string().contains("share the topic things"), "{err}");
        let off = outgoing("s", &ThingV2 { id: "t".into() }, &DualPublish::new()).unwrap();
        assert_eq!(off.len(), 1, "off, the new version only");
    }

    #[test]
    fn the_list_is_checked() {
        assert!(DualPublish::parse("A, B").unwrap().is_on("B"));
        assert!(DualPublish::parse("A; drop table").is_err());
    }
}
