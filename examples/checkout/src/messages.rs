//! The checkout system's commands and events.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tidings_core::{Kind, Message};

/// Where checkout's commands go.
pub const COMMANDS: &str = "checkout.commands";
/// Where order events go.
pub const ORDERS: &str = "orders";

macro_rules! message {
    ($ty:ident, $kind:ident, $topic:expr) => {
        impl Message for $ty {
            const TYPE: &'static str = stringify!($ty);
            const VERSION: u32 = 1;
            const KIND: Kind = Kind::$kind;
            const AGGREGATE: &'static str = "order";
            const TOPIC: &'static str = $topic;
            fn key(&self) -> String {
                self.order_id.clone()
            }
        }
    };
}

/// A customer asks for an order.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct PlaceOrder {
    /// The new order's id.
    pub order_id: String,
    /// Who orders.
    pub customer_id: String,
    /// What.
    pub sku: String,
    /// How many.
    pub quantity: u32,
    /// The price, in cents.
    pub total_cents: i64,
}
message!(PlaceOrder, Command, COMMANDS);

/// The payment provider confirmed the charge.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct CapturePayment {
    /// The order.
    pub order_id: String,
}
message!(CapturePayment, Command, COMMANDS);

/// The warehouse should ship the order.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ShipOrder {
    /// The order.
    pub order_id: String,
}
message!(ShipOrder, Command, COMMANDS);

/// The customer cancelled.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct CancelOrder {
    /// The order.
    pub order_id: String,
}
message!(CancelOrder, Command, COMMANDS);

/// An order was placed. `step` counts the order's events from 1.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct OrderPlaced {
    /// The order.
    pub order_id: String,
    /// Who ordered.
    pub customer_id: String,
    /// What.
    pub sku: String,
    /// How many.
    pub quantity: u32,
    /// The price, in cents.
    pub total_cents: i64,
    /// The order's event number.
    pub step: i64,
    /// A copy of the customer's e-mail address, so that the email service
    /// needs no lookup; the customer service owns it. Not needed for
    /// correctness (denormalised), hence optional.
    #[serde(default)]
    #[schemars(extend("x-tidings-denormalized" = true))]
    pub customer_email: Option<String>,
}
message!(OrderPlaced, Event, ORDERS);

/// The order's payment was captured.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct PaymentCaptured {
    /// The order.
    pub order_id: String,
    /// The amount, in cents.
    pub amount_cents: i64,
    /// The order's event number.
    pub step: i64,
}
message!(PaymentCaptured, Event, ORDERS);

/// The order left the warehouse.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct OrderShipped {
    /// The order.
    pub order_id: String,
    /// The order's event number.
    pub step: i64,
}
message!(OrderShipped, Event, ORDERS);

/// The order was cancelled.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct OrderCancelled {
    /// The order.
    pub order_id: String,
    /// The order's event number.
    pub step: i64,
}
message!(OrderCancelled, Event, ORDERS);

/// The step of any order event, read without knowing its type.
#[derive(Debug, Deserialize)]
pub(crate) struct AnyOrderEvent {
    pub(crate) order_id: String,
    pub(crate) step: i64,
}
