//! The clicks reference system, the seed's stream-processing shape: a
//! high-volume click stream, a little work per click, scored for fraud
//! by a consumer that batches its transactions, each session's features
//! upserted into a feature store.
//!
//! Run it with `tidings demo clicks` (see docs/SHAPES.md); [`demo::run`] is the same from code.
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

pub mod demo;
pub mod handlers;
pub mod messages;
pub mod score;
pub mod sql;
pub mod stream;
pub mod system;

pub use demo::{ClicksOptions, Summary};

/// The schema registry of the clicks system's messages (committed in `examples/clicks/schemas`).
pub fn schemas() -> tidings_schema::Registry {
    tidings_schema::Registry::new().register::<messages::Click>()
}

/// Who sends and receives what, for its AsyncAPI document.
pub fn topology() -> tidings_schema::asyncapi::Topology {
    use messages::Click;
    use tidings_schema::asyncapi::{Service, Topology};
    Topology::new("Clicks", "1.0.0")
        .description(
            "The clicks reference system: the web tier writes each click (through the outbox, or straight to \
             Kafka); the fraud scorer scores it in its session's order and upserts the session's features.",
        )
        .service(Service::new("web").sends::<Click>())
        .service(Service::new("fraud").receives::<Click>())
}
