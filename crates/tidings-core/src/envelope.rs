//! The one message shape every part of Tidings moves around.

use std::collections::BTreeMap;
use std::fmt;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::error::DecodeError;
use crate::message::Message;

/// Event or command: declared beside [`Message`], and reachable here too.
pub use crate::message::Kind;

/// Free-form string headers carried with a message (tracing context, tenant, ...).
pub type Headers = BTreeMap<String, String>;

/// The URI naming the schema of `message_type` at `version`:
/// `urn:tidings:schema:OrderPlaced:v1`.
pub fn schema_id(message_type: &str, version: u32) -> String {
    format!("urn:tidings:schema:{message_type}:v{version}")
}

/// The content type of JSON payloads, the default.
pub const JSON: &str = "application/json";

/// A message with everything a broker, a consumer or an operator needs to know about it.
///
/// Maps one-to-one onto CloudEvents 1.0 (see [`crate::cloudevents`]):
/// `id`, `type` and `source` are the CloudEvents attributes of the same
/// name, `occurred_at` is `time`, `aggregate_key` is `subject`, and the rest
/// travel as extension attributes.
#[derive(Clone, PartialEq, Eq)]
pub struct Envelope {
    /// Unique id (UUIDv7, so ids sort by creation time). Consumers deduplicate on it.
    pub id: Uuid,
    /// The message type, e.g. `OrderPlaced`.
    pub message_type: String,
    /// Schema version of the payload for this type, starting at 1.
    pub version: u32,
    /// Event or command.
    pub kind: Kind,
    /// The producing service, e.g. `checkout`.
    pub source: String,
    /// The aggregate type, e.g. `order`.
    pub aggregate_type: String,
    /// The aggregate key, e.g. an order id. Order is kept per key.
    pub aggregate_key: String,
    /// When the fact happened (or the command was issued).
    pub occurred_at: DateTime<Utc>,
    /// The id shared by every message of one business flow.
    pub correlation_id: Uuid,
    /// The id of the message that caused this one, if any.
    pub causation_id: Option<Uuid>,
    /// Extra headers.
    pub headers: Headers,
    /// MIME type of `payload`.
    pub content_type: String,
    /// The payload bytes.
    pub payload: Vec<u8>,
}

impl fmt::Debug for Envelope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The payload is left out on purpose: it may hold personal data and is
        // rarely useful in a log line. `payload_len` says how big it is.
        f.debug_struct("Envelope")
            .field("id", &self.id)
            .field("message_type", &self.message_type)
            .field("version", &self.version)
            .field("kind", &self.kind)
            .field("source", &self.source)
            .field("aggregate_type", &self.aggregate_type)
            .field("aggregate_key", &self.aggregate_key)
            .field("occurred_at", &self.occurred_at)
            .field("correlation_id", &self.correlation_id)
            .field("causation_id", &self.causation_id)
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .field("content_type", &self.content_type)
            .field("payload_len", &self.payload.len())
            .finish()
    }
}

impl Envelope {
    /// Wraps a typed message, with a fresh id and correlation id.
    ///
    /// ```
    /// use tidings_core::{Envelope, Kind, Message};
    /// use serde::{Deserialize, Serialize};
    ///
    /// #[derive(Serialize, Deserialize)]
    /// struct OrderPlaced { order_id: String }
    ///
    /// impl Message for OrderPlaced {
    ///     const TYPE: &'static str = "OrderPlaced";
    ///     const VERSION: u32 = 1;
    ///     const KIND: Kind = Kind::Event;
    ///     const AGGREGATE: &'static str = "order";
    ///     const TOPIC: &'static str = "orders";
    ///     fn key(&self) -> String { self.order_id.clone() }
    /// }
    ///
    /// let env = Envelope::new("checkout", &OrderPlaced { order_id: "o-1".into() }).unwrap();
    /// assert_eq!(env.message_type, "OrderPlaced");
    /// assert_eq!(env.aggregate_key, "o-1");
    /// let back: OrderPlaced = env.decode().unwrap();
    /// assert_eq!(back.order_id, "o-1");
    /// ```
    pub fn new<M: Message>(source: impl Into<String>, message: &M) -> Result<Self, DecodeError> {
        let payload = serde_json::to_vec(message).map_err(|e| DecodeError::Payload {
            message_type: M::TYPE.to_owned(),
            version: M::VERSION,
            reason: e.to_string(),
        })?;
        let id = Uuid::now_v7();
        Ok(Envelope {
            id,
            message_type: M::TYPE.to_owned(),
            version: M::VERSION,
            kind: M::KIND,
            source: source.into(),
            aggregate_type: M::AGGREGATE.to_owned(),
            aggregate_key: message.key(),
            occurred_at: Utc::now(),
            correlation_id: id,
            causation_id: None,
            headers: Headers::from([(
                crate::trace::TRACEPARENT.to_owned(),
                crate::trace::current_or_new().to_header(),
            )]),
            content_type: JSON.to_owned(),
            payload,
        })
    }

    /// Marks this message as caused by `cause`: same correlation id, causation
    /// id = `cause.id`, and in the cause's trace (a child of its `traceparent`).
    pub fn caused_by(mut self, cause: &Envelope) -> Self {
        self.correlation_id = cause.correlation_id;
        self.causation_id = Some(cause.id);
        if let Some(trace) = cause.trace() {
            self.headers.insert(
                crate::trace::TRACEPARENT.to_owned(),
                crate::trace::caused_by(&trace).to_header(),
            );
        }
        self
    }

    /// The trace this message is part of (its `traceparent` header), if it carries a valid one.
    pub fn trace(&self) -> Option<crate::trace::TraceContext> {
        self.headers
            .get(crate::trace::TRACEPARENT)
            .and_then(|h| crate::trace::TraceContext::parse(h))
    }

    /// The bytes of its payload and its own headers (names and values):
    /// what a transport carries of it at the least, before the CloudEvents
    /// attributes. A transport whose broker has a size limit refuses a
    /// message by it ([`Publisher::refuses`](crate::Publisher::refuses)).
    pub fn own_bytes(&self) -> usize {
        let headers: usize = self.headers.iter().map(|(k, v)| k.len() + v.len()).sum();
        self.payload.len() + headers
    }

    /// Adds a header.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.insert(name.into(), value.into());
        self
    }

    /// Its CloudEvents `id` as its producer wrote it: the UUID for Tidings'
    /// own messages, a foreign event's own id otherwise (`evt_01J8K2...`,
    /// see [`cloudevents::foreign_id`](crate::cloudevents::foreign_id)).
    pub fn event_id(&self) -> String {
        crate::cloudevents::written_id(self).map_or_else(|| self.id.to_string(), str::to_owned)
    }

    /// The URI of this message's schema, its CloudEvents `dataschema`: the
    /// `$id` of the type's schema at this version in the schema registry
    /// (`urn:tidings:schema:OrderPlaced:v1`, the file `OrderPlaced.v1.json`).
    pub fn dataschema(&self) -> String {
        schema_id(&self.message_type, self.version)
    }

    /// Whether this envelope carries a message of type `M` (type name only; see [`Envelope::decode`]).
    pub fn is<M: Message>(&self) -> bool {
        self.message_type == M::TYPE
    }

    /// Decodes the payload as `M`, checking its type name and version.
    ///
    /// An older version is brought up to `M::VERSION` by [`Message::upcast`]
    /// first; fields `M` does not know are ignored (unless `M` denies them).
    /// An envelope of another type, of a newer version than this code reads,
    /// of an older one without an upcaster, or whose payload does not parse
    /// returns an error naming which; it never panics.
    pub fn decode<M: Message>(&self) -> Result<M, DecodeError> {
        if self.message_type != M::TYPE {
            return Err(DecodeError::UnexpectedType {
                expected: M::TYPE.to_owned(),
                found: self.message_type.clone(),
            });
        }
        let invalid = |e: serde_json::Error| DecodeError::Payload {
            message_type: self.message_type.clone(),
            version: self.version,
            reason: e.to_string(),
        };
        if self.version > M::VERSION || self.version == 0 {
            return Err(DecodeError::UnsupportedVersion {
                message_type: self.message_type.clone(),
                version: self.version,
                supported: M::VERSION,
            });
        }
        if self.version < M::VERSION {
            let old = serde_json::from_slice(&self.payload).map_err(invalid)?;
            let upcast = M::upcast(self.version, old).map_err(|reason| DecodeError::Upcast {
                message_type: self.message_type.clone(),
                version: self.version,
                supported: M::VERSION,
                reason,
            })?;
            return serde_json::from_value(upcast).map_err(invalid);
        }
        serde_json::from_slice(&self.payload).map_err(invalid)
    }
}
