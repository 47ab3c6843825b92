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
pub mod sql;
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

/// Who sends and receives what in the checkout system, for its AsyncAPI
/// document (`tidings schema asyncapi`).
pub fn topology() -> tidings_schema::asyncapi::Topology {
    use messages::*;
    use tidings_schema::asyncapi::{Service, Topology};
    Topology::new("Checkout", "1.0.0")
        .description(
            "The checkout reference system: a storefront sends order commands, checkout turns them \
             into order events, and inventory, email, analytics and loyalty react.",
        )
        .service(
            Service::new("storefront")
                .sends::<PlaceOrder>()
                .sends::<CapturePayment>()
                .sends::<ShipOrder>()
                .sends::<CancelOrder>(),
        )
        .service(
            Service::new("checkout")
                .receives::<PlaceOrder>()
                .receives::<CapturePayment>()
                .receives::<ShipOrder>()
                .receives::<CancelOrder>()
                .sends::<OrderPlaced>()
                .sends::<PaymentCaptured>()
                .sends::<OrderShipped>()
                .sends::<OrderCancelled>(),
        )
        .service(
            Service::new("inventory")
                .receives::<OrderPlaced>()
                .receives::<OrderShipped>()
                .receives::<OrderCancelled>(),
        )
        .service(
            Service::new("email")
                .receives::<OrderPlaced>()
                .receives::<OrderShipped>(),
        )
        .service(
            Service::new("analytics")
                .receives::<OrderPlaced>()
                .receives::<PaymentCaptured>()
                .receives::<OrderShipped>()
                .receives::<OrderCancelled>(),
        )
        .service(
            Service::new("loyalty")
                .receives::<OrderPlaced>()
                .receives::<OrderShipped>()
                .receives::<OrderCancelled>(),
        )
}
