//! The facade's own promise: an envelope round-trips through CloudEvents
//! JSON with its kind. (The store's promises are checked once per dialect by
//! `tidings_testkit::store_conformance!`, in each store crate's tests.)

use tidings::{Envelope, Kind, cloudevents};

#[test]
fn envelope_of_a_command_keeps_its_kind() {
    #[derive(serde::Serialize, serde::Deserialize)]
    struct ShipOrder {
        order_id: String,
    }
    impl tidings::Message for ShipOrder {
        const TYPE: &'static str = "ShipOrder";
        const VERSION: u32 = 1;
        const KIND: Kind = Kind::Command;
        const AGGREGATE: &'static str = "order";
        const TOPIC: &'static str = "shipping.commands";
        fn key(&self) -> String {
            self.order_id.clone()
        }
    }
    let e = Envelope::new(
        "checkout",
        &ShipOrder {
            order_id: "o1".into(),
        },
    )
    .unwrap();
    let back = cloudevents::from_json(&cloudevents::to_json(&e)).unwrap();
    assert_eq!(back.kind, Kind::Command);
    assert_eq!(back, e);
}
