//! The payments system's own events, in its own words: the intake turns
//! Stripe's deliveries into these, in each payment's order.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tidings_core::{Kind, Message};

/// Where payment events go.
pub const PAYMENTS: &str = "payments";

/// A payment's steps, in order: its events carry theirs.
pub mod step {
    /// [`PaymentCaptured`](super::PaymentCaptured).
    pub const CAPTURED: i64 = 1;
    /// [`PaymentRefunded`](super::PaymentRefunded): the first refund's step; each further refund one more.
    pub const REFUNDED: i64 = 2;
}

/// Money came in.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PaymentCaptured {
    /// The provider's payment id (`pi_...`).
    pub payment_id: String,
    /// The amount, in the currency's minor unit.
    pub amount_cents: i64,
    /// ISO 4217, lower case.
    pub currency: String,
    /// Who paid, if known.
    pub customer_id: Option<String>,
    /// The provider's event that said so (`evt_...`): what the ledger's entries are keyed by.
    pub provider_event_id: String,
    /// The payment's step ([`step::CAPTURED`]).
    pub step: i64,
}

/// Money went back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PaymentRefunded {
    /// The payment (`pi_...`).
    pub payment_id: String,
    /// This refund's amount (not the total refunded), in the minor unit.
    pub amount_cents: i64,
    /// ISO 4217, lower case.
    pub currency: String,
    /// The provider's event that said so.
    pub provider_event_id: String,
    /// The payment's step ([`step::REFUNDED`] for the first refund).
    pub step: i64,
}

macro_rules! payment_event {
    ($ty:ident) => {
        impl Message for $ty {
            const TYPE: &'static str = stringify!($ty);
            const VERSION: u32 = 1;
            const KIND: Kind = Kind::Event;
            const AGGREGATE: &'static str = "payment";
            const TOPIC: &'static str = PAYMENTS;
            fn key(&self) -> String {
                self.payment_id.clone()
            }
        }
    };
}

payment_event!(PaymentCaptured);
payment_event!(PaymentRefunded);
