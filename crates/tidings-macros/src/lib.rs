//! `#[derive(Message)]`: a Tidings message type is a struct with a derive,
//! not five constants written by hand.
//!
//! Use it through `tidings_core::Message` (or `tidings::Message`): the
//! derive and the trait it implements share the name, as serde's do.
//!
//! ```
//! use serde::{Deserialize, Serialize};
//! use tidings_core::{Envelope, Kind, Message};
//!
//! /// An order was placed.
//! #[derive(Debug, PartialEq, Serialize, Deserialize, Message)]
//! #[message(event, topic = "orders", aggregate = "order")]
//! struct OrderPlaced {
//!     #[message(key)]
//!     order_id: String,
//!     total_cents: u64,
//! }
//!
//! /// A customer asks for an order to be placed.
//! #[derive(Serialize, Deserialize, Message)]
//! #[message(command, topic = "checkout.commands", aggregate = "order", version = 2)]
//! struct PlaceOrder {
//!     #[message(key)]
//!     order_id: String,
//!     sku: String,
//! }
//!
//! assert_eq!(OrderPlaced::TYPE, "OrderPlaced");
//! assert_eq!(OrderPlaced::VERSION, 1);
//! assert_eq!(OrderPlaced::KIND, Kind::Event);
//! assert_eq!(PlaceOrder::KIND, Kind::Command);
//! assert_eq!(PlaceOrder::VERSION, 2);
//!
//! let placed = OrderPlaced { order_id: "o-1".into(), total_cents: 4200 };
//! assert_eq!(placed.key(), "o-1");
//! let envelope = Envelope::new("checkout", &placed)?;
//! assert_eq!(envelope.decode::<OrderPlaced>()?, placed);
//! # Ok::<(), tidings_core::DecodeError>(())
//! ```
//!
//! # The type: `#[message(...)]`
//!
//! Settings, separated by commas, in one or more `#[message(...)]`
//! attributes on the type:
//!
//! | setting | meaning | |
//! | --- | --- | --- |
//! | `event` or `command` | `Message::KIND` | required, one of them |
//! | `topic = "orders"` | `Message::TOPIC`: an event's topic, a command's queue | required |
//! | `aggregate = "order"` | `Message::AGGREGATE`: what the key names | required |
//! | `version = 2` | `Message::VERSION`, from 1 | default 1 |
//! | `name = "OrderPlaced"` | `Message::TYPE` | default: the type's name |
//! | `name_check = false` | skips the name check below | default `true` |
//! | `key_fn = path` | the key from `fn(&Self) -> impl Display` instead of a field | |
//! | `upcast = path` | `Message::upcast` from `fn(u32, serde_json::Value) -> Result<Value, String>` | default: reads no older version |
//! | `crate = "path"` | where `Message` and `Kind` are, when not found as said below | |
//!
//! `topic` and `aggregate` take a string literal or the path of a
//! `&'static str` constant (`topic = ORDERS`).
//!
//! # The key: `#[message(key)]`
//!
//! Exactly one field carries `#[message(key)]` (a tuple struct's field too);
//! `Message::key` is its [`ToString::to_string`], so it is a `String` or
//! any [`Display`](std::fmt::Display) type. A key made of several fields, or
//! an enum's key, comes from a function named with `key_fn`:
//!
//! ```
//! # use serde::{Deserialize, Serialize};
//! # use tidings_core::Message;
//! #[derive(Serialize, Deserialize, Message)]
//! #[message(event, topic = "stock", aggregate = "stock-level", key_fn = Self::stock_key)]
//! struct StockAdjusted { warehouse: u32, sku: String, delta: i64 }
//!
//! impl StockAdjusted {
//!     fn stock_key(&self) -> String { format!("{}/{}", self.warehouse, self.sku) }
//! }
//!
//! let adjusted = StockAdjusted { warehouse: 7, sku: "tea".into(), delta: -2 };
//! assert_eq!(adjusted.key(), "7/tea");
//! ```
//!
//! # The name
//!
//! Events are named in the past tense, commands in the imperative, and the
//! derive checks `Message::TYPE` (the type's name, or `name`):
//!
//! - an event's verb, its last word or the word before a preposition
//!   (`ItemAddedToCart`, `UserLoggedIn`), ends in `ed` or is an irregular
//!   past form (`Sent`, `Paid`, `Built`, `Taken`, `Done`, `Reset`, ...);
//! - a command's first word is not a past form: `PlaceOrder`, not
//!   `PlacedOrder`.
//!
//! CamelCase, acronyms (`HTTPRequestSent`) and separators (`order.placed`)
//! split the words; a trailing version (`OrderPlacedV2`) is ignored. The
//! check cannot tell a noun from a verb, so an event-like name declared a
//! `command` (`OrderPlaced`) passes. For a name that is right but fails the
//! check, say `name_check = false`.
//!
//! # Paths
//!
//! The generated impl names `Message` and `Kind` through the crate that the
//! deriving crate depends on: `tidings-core`, else the `tidings` facade,
//! found in its `Cargo.toml` under whatever name it gave them. Where that
//! cannot work (the derive used from a macro of another crate, say),
//! `crate = "path"` says where they are.
//!
//! # Other derives
//!
//! `#[message]` attributes are ignored by serde and by schemars, and this
//! derive ignores theirs, so `#[derive(Serialize, Deserialize, JsonSchema,
//! Message)]` on one struct is what the schema registry expects.
//!
#![warn(missing_docs)]

use proc_macro::TokenStream;
use syn::{DeriveInput, parse_macro_input};

mod attr;
mod expand;
mod naming;

/// Implements `tidings_core::Message` from `#[message(...)]` attributes;
/// see the [crate] documentation.
#[proc_macro_derive(Message, attributes(message))]
pub fn derive_message(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    expand::derive(&input)
        .unwrap_or_else(syn::Error::into_compile_error)
        .into()
}
