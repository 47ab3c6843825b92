//! Where a transport puts each topic, from its options alone (no
//! connection): what a document describing the system names, the AsyncAPI
//! document's servers, channel addresses and bindings among them.

use std::fmt;

use serde_json::Value;

/// Where one topic's messages are on a transport.
#[derive(Debug, Clone)]
pub struct Address {
    /// The channel's address: the Kafka topic, the NATS subject, the
    /// RabbitMQ routing key. `{partition}` and `{type}` stand for the
    /// parameters it carries, where it carries them.
    pub address: String,
    /// The partitions of the topic: the values of `{partition}`.
    pub partitions: u32,
    /// How a message type is written in `{type}`.
    pub type_token: fn(&str) -> String,
    /// The protocol's AsyncAPI channel binding (`{"kafka": {...}}`), if any.
    pub channel_binding: Option<Value>,
    /// The protocol's AsyncAPI message binding, if any.
    pub message_binding: Option<Value>,
}

/// A transport's naming, implemented by each broker's options.
pub trait Addresses: fmt::Debug + Send + Sync {
    /// The protocol as AsyncAPI names it: `kafka` (`kafka-secure` over
    /// TLS), `nats`, `amqp`.
    fn protocol(&self) -> &'static str;

    /// The protocol's version, where the protocol has several (`0.9.1` for
    /// AMQP, as RabbitMQ speaks it).
    fn protocol_version(&self) -> Option<&'static str> {
        None
    }

    /// How messages are written: binary mode (attributes as headers) or
    /// structured mode (one `application/cloudevents+json` document).
    fn content_mode(&self) -> crate::cloudevents::ContentMode {
        crate::cloudevents::ContentMode::Binary
    }

    /// Where `topic`'s messages are.
    fn address(&self, topic: &str) -> Address;
}

/// A message type as it is: for addresses that carry it unchanged.
pub fn type_as_is(message_type: &str) -> String {
    message_type.to_owned()
}
