//! Typed events and commands.

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::envelope::Kind;

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
    /// The aggregate key: messages with the same key are published and handled in order.
    fn key(&self) -> String;
}
