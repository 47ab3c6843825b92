//! The click stream's one message: a click, keyed by its browsing
//! session, written by the web tier (through the outbox, or straight to
//! Kafka by a plain producer).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tidings_core::{Kind, Message};

/// The click stream.
pub const CLICKS: &str = "clicks";

/// A visitor clicked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Click {
    /// The click, unique (also the CloudEvent's `id` when written straight to Kafka).
    pub click_id: String,
    /// The browsing session: the key, clicks of a session are scored in order.
    pub session_id: String,
    /// Its place in the session's clicks, from 1.
    pub seq: i64,
    /// The page clicked, a path (`/products/42`).
    pub page: String,
    /// When, in milliseconds since the Unix epoch (the visitor's clock).
    pub at_ms: i64,
}

impl Message for Click {
    const TYPE: &'static str = "Click";
    const VERSION: u32 = 1;
    const KIND: Kind = Kind::Event;
    const AGGREGATE: &'static str = "session";
    const TOPIC: &'static str = CLICKS;
    fn key(&self) -> String {
        self.session_id.clone()
    }
}
