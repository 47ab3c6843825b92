//! What Stripe sends: the webhook events the payments system subscribes
//! to, as they arrive on the wire. They are registered contracts like the
//! system's own events: the inbox takes a delivery only if it matches
//! ([`SchemaGuard`](tidings_schema::SchemaGuard) on the outbox), and fields
//! Stripe adds later are kept and ignored.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tidings_core::{Kind, Message};

/// Where the inbox puts Stripe's deliveries.
pub const STRIPE: &str = "stripe";

/// A payment intent, as `payment_intent.*` events carry it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PaymentIntent {
    /// `pi_...`.
    pub id: String,
    /// The amount received, in the currency's minor unit.
    pub amount: i64,
    /// ISO 4217, lower case (`eur`).
    pub currency: String,
    /// `cus_...`, if the payment has a customer.
    pub customer: Option<String>,
    /// The charge that captured it (`ch_...`).
    pub latest_charge: Option<String>,
    /// `succeeded`, `processing`, ...
    pub status: String,
}

/// A charge, as `charge.*` events carry it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Charge {
    /// `ch_...`.
    pub id: String,
    /// The payment intent the charge belongs to (`pi_...`).
    pub payment_intent: String,
    /// The amount charged, in the currency's minor unit.
    pub amount: i64,
    /// How much of it is refunded so far (all refunds together).
    pub amount_refunded: i64,
    /// ISO 4217, lower case.
    pub currency: String,
}

/// The object an event is about.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Data<T> {
    /// The object as it is after the event.
    pub object: T,
}

macro_rules! stripe_event {
    ($ty:ident, $object:ty, $name:literal, $doc:literal) => {
        #[doc = $doc]
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
        pub struct $ty {
            /// Stripe's event id (`evt_...`): one per event, the same on every retry of its delivery.
            pub id: String,
            /// Always `event`.
            pub object: String,
            /// When the event happened, in seconds since the epoch.
            pub created: i64,
            /// The event's type.
            #[serde(rename = "type")]
            pub event_type: String,
            /// Whether it is a live-mode event.
            pub livemode: bool,
            /// The object.
            pub data: Data<$object>,
        }

        impl Message for $ty {
            const TYPE: &'static str = $name;
            const VERSION: u32 = 1;
            const KIND: Kind = Kind::Event;
            const AGGREGATE: &'static str = "stripe_object";
            const TOPIC: &'static str = STRIPE;
            fn key(&self) -> String {
                self.data.object.id.clone()
            }
        }
    };
}

stripe_event!(
    PaymentIntentSucceeded,
    PaymentIntent,
    "payment_intent.succeeded",
    "`payment_intent.succeeded`: the customer paid."
);
stripe_event!(
    ChargeRefunded,
    Charge,
    "charge.refunded",
    "`charge.refunded`: some or all of a charge went back to the customer."
);
