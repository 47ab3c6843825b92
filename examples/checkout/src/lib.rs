//! The checkout reference system, the seed's first shape: a `PlaceOrder`
//! command becomes an order and an `OrderPlaced` event, later commands of
//! the same order emit `PaymentCaptured` and `OrderShipped` or
//! `OrderCancelled`, and four services react: inventory, email (through the
//! effects ledger), analytics and loyalty.
//!
//! Run it with `tidings demo checkout` (see the README); [`demo::run`] is the same from code.
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

pub mod demo;
pub mod handlers;
pub mod messages;
pub mod system;

pub use demo::{DemoOptions, Progress, Role, Summary};

/// The schema registry of the checkout system's commands and events
/// (committed in `examples/checkout/schemas`, checked by `tidings schema check`).
pub fn schemas() -> tidings_schema::Registry {
    use messages::*;
    tidings_schema::Registry::new()
        .register::<PlaceOrder>()
        .register::<CapturePayment>()
        .register::<ShipOrder>()
        .register::<CancelOrder>()
        .register::<OrderPlaced>()
        .register::<PaymentCaptured>()
        .register::<OrderShipped>()
        .register::<OrderCancelled>()
}
