//! The payments reference system, the seed's integration shape: a payment
//! provider's webhooks arrive at their own pace, signed, retried, out of
//! order; the webhook inbox takes each event once, the intake turns them
//! into the system's own events in each payment's order, a double-entry
//! ledger books them and the customer is notified once.
//!
//! Run it with `tidings demo payments` (see docs/SHAPES.md); [`demo::run`] is the same from code.
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

pub mod demo;
pub mod handlers;
pub mod messages;
pub mod provider;
pub mod sql;
pub mod stripe;
pub mod system;

pub use demo::{PaymentsOptions, Summary};

/// The schema registry of what the payments system takes and sends: the
/// Stripe events its endpoint subscribes to, and its own events
/// (committed in `examples/payments/schemas`).
pub fn schemas() -> tidings_schema::Registry {
    tidings_schema::Registry::new()
        .register::<stripe::PaymentIntentSucceeded>()
        .register::<stripe::ChargeRefunded>()
        .register::<messages::PaymentCaptured>()
        .register::<messages::PaymentRefunded>()
}

/// Who sends and receives what in the payments system, for its AsyncAPI
/// document (`tidings schema asyncapi --system payments`).
pub fn topology() -> tidings_schema::asyncapi::Topology {
    use messages::*;
    use stripe::*;
    use tidings_schema::asyncapi::{Service, Topology};
    Topology::new("Payments", "1.0.0")
        .description(
            "The payments reference system: Stripe's webhooks reach the inbox, the intake turns them into \
             payment events in each payment's order, and the ledger and the notifications react.",
        )
        .service(
            Service::new("stripe")
                .sends::<PaymentIntentSucceeded>()
                .sends::<ChargeRefunded>(),
        )
        .service(
            Service::new("intake")
                .receives::<PaymentIntentSucceeded>()
                .receives::<ChargeRefunded>()
                .sends::<PaymentCaptured>()
                .sends::<PaymentRefunded>(),
        )
        .service(
            Service::new("ledger")
                .receives::<PaymentCaptured>()
                .receives::<PaymentRefunded>(),
        )
        .service(
            Service::new("notify")
                .receives::<PaymentCaptured>()
                .receives::<PaymentRefunded>(),
        )
}
