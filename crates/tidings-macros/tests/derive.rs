//! What `#[derive(Message)]` generates: every constant, the key, the upcaster,
//! a round trip through an envelope, and the schema derive beside it.

use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tidings_core::{Envelope, Kind, Message};

/// Where order events go, as a constant.
const ORDERS: &str = "orders";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Message)]
#[message(event, topic = "orders", aggregate = "order")]
struct OrderPlaced {
    #[message(key)]
    order_id: String,
    total_cents: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Message)]
#[message(command, topic = "checkout.commands", aggregate = "order", version = 3)]
struct PlaceOrder {
    sku: String,
    #[message(key)]
    order_id: String,
}

#[test]
fn event_constants_and_key() {
    assert_eq!(OrderPlaced::TYPE, "OrderPlaced");
    assert_eq!(OrderPlaced::VERSION, 1);
    assert_eq!(OrderPlaced::KIND, Kind::Event);
    assert_eq!(OrderPlaced::AGGREGATE, "order");
    assert_eq!(OrderPlaced::TOPIC, "orders");
    let placed = OrderPlaced {
        order_id: "o-1".into(),
        total_cents: 4200,
    };
    assert_eq!(placed.key(), "o-1");
}

#[test]
fn command_constants_and_key() {
    assert_eq!(PlaceOrder::TYPE, "PlaceOrder");
    assert_eq!(PlaceOrder::VERSION, 3);
    assert_eq!(PlaceOrder::KIND, Kind::Command);
    assert_eq!(PlaceOrder::AGGREGATE, "order");
    assert_eq!(PlaceOrder::TOPIC, "checkout.commands");
    let place = PlaceOrder {
        sku: "tea".into(),
        order_id: "o-2".into(),
    };
    assert_eq!(place.key(), "o-2");
}

#[test]
fn round_trip_through_an_envelope() {
    let placed = OrderPlaced {
        order_id: "o-1".into(),
        total_cents: 4200,
    };
    let env = Envelope::new("checkout", &placed).unwrap();
    assert_eq!(env.message_type, "OrderPlaced");
    assert_eq!(env.version, 1);
    assert_eq!(env.kind, Kind::Event);
    assert_eq!(env.aggregate_type, "order");
    assert_eq!(env.aggregate_key, "o-1");
    assert!(env.is::<OrderPlaced>());
    assert_eq!(env.decode::<OrderPlaced>().unwrap(), placed);

    let place = PlaceOrder {
        sku: "tea".into(),
        order_id: "o-2".into(),
    };
    let env = Envelope::new("web", &place).unwrap();
    assert_eq!((env.version, env.kind), (3, Kind::Command));
    assert_eq!(env.decode::<PlaceOrder>().unwrap(), place);
    assert!(env.decode::<OrderPlaced>().is_err());
}

/// A key that is not a `String`, only `Display`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
struct CustomerNo(u32);

impl fmt::Display for CustomerNo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "C{:05}", self.0)
    }
}

#[derive(Debug, PartialEq, Serialize, Deserialize, Message)]
#[message(event, topic = ORDERS, aggregate = "customer")]
struct CustomerRenamed {
    #[message(key)]
    customer: CustomerNo,
    name: String,
}

#[derive(Debug, PartialEq, Serialize, Deserialize, Message)]
#[message(event, topic = "invoices", aggregate = "invoice")]
struct InvoiceSent(#[message(key)] u64, String);

#[test]
fn display_keys_and_tuple_structs() {
    let renamed = CustomerRenamed {
        customer: CustomerNo(42),
        name: "Ada".into(),
    };
    assert_eq!(renamed.key(), "C00042");
    assert_eq!(CustomerRenamed::TOPIC, "orders");
    let sent = InvoiceSent(7, "ada@example.com".into());
    assert_eq!(sent.key(), "7");
    let env = Envelope::new("billing", &sent).unwrap();
    assert_eq!(env.aggregate_key, "7");
    assert_eq!(env.decode::<InvoiceSent>().unwrap(), sent);
}

#[derive(Debug, PartialEq, Serialize, Deserialize, Message)]
#[message(event, topic = "stock", aggregate = "stock-level", key_fn = Self::stock_key)]
struct StockAdjusted {
    warehouse: u32,
    sku: String,
    delta: i64,
}

impl StockAdjusted {
    fn stock_key(&self) -> String {
        format!("{}/{}", self.warehouse, self.sku)
    }
}

fn shipment_key(shipment: &Shipment) -> &str {
    match shipment {
        Shipment::Packed { parcel } | Shipment::Dispatched { parcel, .. } => parcel,
    }
}

/// An enum message: its key comes from a function returning any `Display`.
#[derive(Debug, PartialEq, Serialize, Deserialize, Message)]
#[message(event, name = "ShipmentUpdated", topic = "shipping")]
#[message(aggregate = "parcel", key_fn = shipment_key)]
enum Shipment {
    Packed { parcel: String },
    Dispatched { parcel: String, carrier: String },
}

#[test]
fn key_functions_and_enums() {
    let adjusted = StockAdjusted {
        warehouse: 7,
        sku: "tea".into(),
        delta: -2,
    };
    assert_eq!(adjusted.key(), "7/tea");
    let shipped = Shipment::Dispatched {
        parcel: "p-9".into(),
        carrier: "post".into(),
    };
    assert_eq!(shipped.key(), "p-9");
    assert_eq!(Shipment::TYPE, "ShipmentUpdated");
    assert_eq!(Shipment::AGGREGATE, "parcel");
    let env = Envelope::new("warehouse", &shipped).unwrap();
    assert_eq!(env.decode::<Shipment>().unwrap(), shipped);
}

/// Version 1, as written by an older service.
#[derive(Debug, Serialize, Deserialize, Message)]
#[message(
    event,
    name = "CustomerRegistered",
    topic = "customers",
    aggregate = "customer"
)]
struct CustomerRegisteredV1 {
    #[message(key)]
    customer_id: String,
    name: String,
}

/// Version 2 split `name` into `first_name` and `last_name`.
#[derive(Debug, PartialEq, Serialize, Deserialize, Message)]
#[message(event, topic = "customers", aggregate = "customer", version = 2, upcast = upcast_customer)]
struct CustomerRegistered {
    #[message(key)]
    customer_id: String,
    first_name: String,
    last_name: String,
}

fn upcast_customer(version: u32, mut payload: Value) -> Result<Value, String> {
    match version {
        1 => {
            let name = payload["name"].as_str().ok_or("v1 without a name")?.to_owned();
            let (first, last) = name.split_once(' ').unwrap_or((&name, ""));
            payload["first_name"] = json!(first);
            payload["last_name"] = json!(last);
            Ok(payload)
        }
        _ => Err(format!("no upcaster from version {version}")),
    }
}

#[test]
fn upcast_reads_an_older_version() {
    assert_eq!(CustomerRegisteredV1::TYPE, CustomerRegistered::TYPE);
    let old = CustomerRegisteredV1 {
        customer_id: "c-1".into(),
        name: "Ada Lovelace".into(),
    };
    let env = Envelope::new("crm", &old).unwrap();
    assert_eq!(env.version, 1);
    let new: CustomerRegistered = env.decode().unwrap();
    assert_eq!(
        new,
        CustomerRegistered {
            customer_id: "c-1".into(),
            first_name: "Ada".into(),
            last_name: "Lovelace".into(),
        }
    );
    // Without `upcast`, the trait's default refuses older versions.
    assert!(OrderPlaced::upcast(0, json!({})).is_err());
}

/// A name the check would refuse, kept on purpose.
#[derive(Serialize, Deserialize, Message)]
#[message(event, topic = "audit", aggregate = "session", name_check = false)]
struct SessionTimeout {
    #[message(key)]
    session_id: String,
}

/// The name on the wire is checked, not the Rust name.
#[derive(Serialize, Deserialize, Message)]
#[message(
    event,
    name = "order.placed.v2",
    topic = "orders",
    aggregate = "order",
    version = 2
)]
struct LegacyOrderEvent {
    #[message(key)]
    order_id: String,
}

#[test]
fn name_overrides_and_the_escape_hatch() {
    assert_eq!(SessionTimeout::TYPE, "SessionTimeout");
    assert_eq!(LegacyOrderEvent::TYPE, "order.placed.v2");
    assert_eq!(LegacyOrderEvent::VERSION, 2);
    let event = LegacyOrderEvent {
        order_id: "o-3".into(),
    };
    assert_eq!(event.key(), "o-3");
    let timeout = SessionTimeout {
        session_id: "s-1".into(),
    };
    assert_eq!(timeout.key(), "s-1");
}

/// A generic message is one for every parameter that serde can read and write.
#[derive(Debug, PartialEq, Serialize, Deserialize, Message)]
#[message(event, topic = "metrics", aggregate = "gauge")]
struct GaugeRecorded<T> {
    #[message(key)]
    gauge: String,
    value: T,
}

#[test]
fn generics() {
    let recorded = GaugeRecorded {
        gauge: "queue-depth".into(),
        value: 3.5_f64,
    };
    assert_eq!(recorded.key(), "queue-depth");
    assert_eq!(GaugeRecorded::<f64>::TYPE, "GaugeRecorded");
    let env = Envelope::new("relay", &recorded).unwrap();
    assert_eq!(env.decode::<GaugeRecorded<f64>>().unwrap(), recorded);
}

/// The schema registry derives both on one struct, each with its attributes.
#[derive(Debug, PartialEq, Serialize, Deserialize, JsonSchema, Message)]
#[serde(rename_all = "camelCase")]
#[message(event, topic = "orders", aggregate = "order", version = 2)]
#[schemars(title = "An order was shipped")]
struct OrderShipped {
    /// The order.
    #[message(key)]
    #[serde(rename = "order")]
    order_id: String,
    /// The carrier's tracking number.
    tracking_number: String,
    /// A copy of the customer's e-mail address.
    #[serde(default)]
    #[schemars(extend("x-tidings-denormalized" = true))]
    customer_email: Option<String>,
}

/// What the registry asks of a type: both traits.
fn schema_of<M: Message + JsonSchema>() -> (&'static str, u32, Value) {
    (
        M::TYPE,
        M::VERSION,
        serde_json::to_value(schemars::schema_for!(M)).unwrap(),
    )
}

#[test]
fn works_with_json_schema() {
    let (name, version, schema) = schema_of::<OrderShipped>();
    assert_eq!((name, version), ("OrderShipped", 2));
    assert_eq!(schema["title"], "An order was shipped");
    assert_eq!(schema["required"], json!(["order", "trackingNumber"]));
    assert_eq!(
        schema["properties"]["customerEmail"]["x-tidings-denormalized"],
        true
    );

    let shipped = OrderShipped {
        order_id: "o-4".into(),
        tracking_number: "T-1".into(),
        customer_email: None,
    };
    assert_eq!(shipped.key(), "o-4");
    let env = Envelope::new("warehouse", &shipped).unwrap();
    let wire: Value = serde_json::from_slice(&env.payload).unwrap();
    assert_eq!(wire["order"], "o-4");
    assert_eq!(env.decode::<OrderShipped>().unwrap(), shipped);
}

/// A crate that re-exports tidings-core, as the `tidings` facade does.
mod reexport {
    pub(crate) use tidings_core::*;
}

#[derive(Serialize, Deserialize, Message)]
#[message(event, topic = "orders", aggregate = "order", crate = "crate::reexport")]
struct OrderRefunded {
    #[message(key)]
    order_id: String,
}

#[test]
fn crate_path_override() {
    assert_eq!(<OrderRefunded as reexport::Message>::KIND, reexport::Kind::Event);
    assert_eq!(
        OrderRefunded {
            order_id: "o-5".into()
        }
        .key(),
        "o-5"
    );
}
