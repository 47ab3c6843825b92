//! Event contracts for Tidings: every event and command type declared in
//! Rust gets a JSON Schema, kept in the repository one file per type and
//! version, checked for breaking changes, enforced at publish, and linted
//! for secrets.
//!
//! - [`Registry`]: the schemas of a set of [`Message`](tidings_core::Message)
//!   types (from the types with [`Registry::register`], or from a committed
//!   directory with [`Registry::load`]); [`Registry::generate`] writes the
//!   directory, [`Registry::check`] compares the types against it.
//! - [`compat`]: what counts as a breaking change within one version.
//! - [`secrets`]: field names and values that look like secrets.
//! - [`asyncapi`]: an AsyncAPI 3.0 document of the registry and who sends
//!   and receives what.
//! - [`SchemaGuard`]: the outbox's check at publish (validation and the
//!   secrets lint), plugged into a store's options.
//!
//! ```
//! use schemars::JsonSchema;
//! use serde::{Deserialize, Serialize};
//! use tidings_core::{Kind, Message};
//! use tidings_schema::Registry;
//!
//! /// An order was placed.
//! #[derive(Serialize, Deserialize, JsonSchema)]
//! struct OrderPlaced {
//!     order_id: String,
//!     total_cents: i64,
//!     /// A copy of the customer's name for display; the customer service owns it.
//!     #[schemars(extend("x-tidings-denormalized" = true))]
//!     customer_name: Option<String>,
//! }
//!
//! impl Message for OrderPlaced {
//!     const TYPE: &'static str = "OrderPlaced";
//!     const VERSION: u32 = 1;
//!     const KIND: Kind = Kind::Event;
//!     const AGGREGATE: &'static str = "order";
//!     const TOPIC: &'static str = "orders";
//!     fn key(&self) -> String { self.order_id.clone() }
//! }
//!
//! let registry = Registry::new().register::<OrderPlaced>();
//! let schema = &registry.get("OrderPlaced", 1).unwrap().schema;
//! assert_eq!(schema["required"], serde_json::json!(["order_id", "total_cents"]));
//! assert_eq!(schema["properties"]["customer_name"]["x-tidings-denormalized"], true);
//! ```
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

pub mod asyncapi;
pub mod command;
pub mod compat;
mod guard;
mod registry;
pub mod secrets;

pub use compat::{Change, Rule};
pub use guard::SchemaGuard;
pub use registry::{Meta, Problem, Registry, Report, SchemaDoc, SchemaError};
/// The `$id` of a schema, also the CloudEvents `dataschema` of its messages.
pub use tidings_core::envelope::schema_id;

/// The schema extension a field carries when it is a convenience copy of
/// data another service owns (denormalised), not needed for correctness.
pub const DENORMALIZED: &str = "x-tidings-denormalized";

/// The schema extension that exempts a field from the secrets lint; its
/// value says why the field is not a secret.
pub const NOT_A_SECRET: &str = "x-tidings-not-a-secret";

/// The schema extension holding a schema's type, version, kind, topic and
/// aggregate, and for a new version the breaking changes it made.
pub const META: &str = "x-tidings";
