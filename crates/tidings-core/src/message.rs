//! Typed events and commands.

use std::fmt;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// Whether a message states a fact or asks for something to be done.
///
/// Events are named in the past tense (`OrderPlaced`) and fan out to every
/// consumer group of their topic. Commands are named in the imperative
/// (`PlaceOrder`) and go to exactly one handler's queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// A fact that already happened.
    Event,
    /// A request addressed to one handler.
    Command,
}

impl Kind {
    /// The lower-case name used on the wire (`event` or `command`).
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Event => "event",
            Kind::Command => "command",
        }
    }

    /// Parses the wire name.
    pub fn parse(s: &str) -> Option<Kind> {
        match s {
            "event" => Some(Kind::Event),
            "command" => Some(Kind::Command),
            _ => None,
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A typed event or command, declared once in Rust.
///
/// The constants say what the message is on the wire; [`Message::key`] says
/// which aggregate it belongs to, and so which messages it is ordered with.
///
/// ```
/// use tidings_core::{Kind, Message};
/// use serde::{Deserialize, Serialize};
///
/// /// A customer asked for an order to be placed.
/// #[derive(Serialize, Deserialize)]
/// struct PlaceOrder { order_id: String, sku: String, quantity: u32 }
///
/// impl Message for PlaceOrder {
///     const TYPE: &'static str = "PlaceOrder";
///     const VERSION: u32 = 1;
///     const KIND: Kind = Kind::Command;
///     const AGGREGATE: &'static str = "order";
///     // Commands go to the queue of the one service that handles them.
///     const TOPIC: &'static str = "checkout.commands";
///     fn key(&self) -> String { self.order_id.clone() }
/// }
/// ```
pub trait Message: Serialize + DeserializeOwned + Send + Sync + 'static {
    /// The type name: past tense for events (`OrderPlaced`), imperative for commands (`PlaceOrder`).
    const TYPE: &'static str;
    /// The schema version of this Rust type's payload.
    const VERSION: u32;
    /// Event or command.
    const KIND: Kind;
    /// The aggregate type the key belongs to (`order`).
    const AGGREGATE: &'static str;
    /// Where the message goes: the topic of an event, the queue of a command.
    const TOPIC: &'static str;
    /// The aggregate key: messages with the same key are published and
    /// handled in order. The empty key means no order to keep: such
    /// messages are handled in parallel, and one that is dead-lettered
    /// holds nothing back.
    fn key(&self) -> String;

    /// Brings the payload of an older `version` of this type up to
    /// [`Message::VERSION`], so that a consumer written against this version
    /// reads events written before it (an upcaster). Return an error to
    /// refuse a version; the message is then dead-lettered with it.
    ///
    /// The default reads no older version. Chain steps by matching on
    /// `version`:
    ///
    /// ```
    /// # use tidings_core::{Kind, Message};
    /// # use serde::{Deserialize, Serialize};
    /// # use serde_json::{Value, json};
    /// /// Version 2 split `name` into `first_name` and `last_name`.
    /// #[derive(Serialize, Deserialize)]
    /// struct CustomerRegistered { customer_id: String, first_name: String, last_name: String }
    ///
    /// impl Message for CustomerRegistered {
    ///     const TYPE: &'static str = "CustomerRegistered";
    ///     const VERSION: u32 = 2;
    ///     const KIND: Kind = Kind::Event;
    ///     const AGGREGATE: &'static str = "customer";
    ///     const TOPIC: &'static str = "customers";
    ///     fn key(&self) -> String { self.customer_id.clone() }
    ///
    ///     fn upcast(version: u32, mut payload: Value) -> Result<Value, String> {
    ///         match version {
    ///             1 => {
    ///                 let name = payload["name"].as_str().ok_or("v1 without a name")?.to_owned();
    ///                 let (first, last) = name.split_once(' ').unwrap_or((&name, ""));
    ///                 payload["first_name"] = json!(first);
    ///                 payload["last_name"] = json!(last);
    ///                 Ok(payload)
    ///             }
    ///             _ => Err(format!("no upcaster from version {version}")),
    ///         }
    ///     }
    /// }
    /// ```
    fn upcast(version: u32, payload: serde_json::Value) -> Result<serde_json::Value, String> {
        let _ = payload;
        Err(format!("no upcaster from version {version}"))
    }
}
