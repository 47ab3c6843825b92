//! The checkout system's AsyncAPI document, generated from its committed
//! registry and topology, validates against the AsyncAPI 3.0 JSON Schema
//! published in npm's `@asyncapi/specs` (installed by `scripts/test`).

use std::path::PathBuf;

use serde_json::Value;
use tidings_schema::Registry;

/// The `@asyncapi/specs` package: `ASYNCAPI_SPECS`, or where the test
/// script installs it.
fn specs_dir() -> PathBuf {
    std::env::var_os("ASYNCAPI_SPECS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../../target/asyncapi-specs/node_modules/@asyncapi/specs")
        })
}

fn asyncapi_3_validator() -> jsonschema::Validator {
    let path = specs_dir().join("schemas/3.0.0-without-$id.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "the AsyncAPI 3.0 JSON Schema is not at {} ({e}): scripts/test installs npm's @asyncapi/specs \
             there, or set ASYNCAPI_SPECS to the package's directory",
            path.display()
        )
    });
    let schema: Value = serde_json::from_str(&text).expect("the AsyncAPI schema is JSON");
    jsonschema::validator_for(&schema).expect("the AsyncAPI schema compiles")
}

fn errors(validator: &jsonschema::Validator, doc: &Value) -> Vec<String> {
    validator
        .iter_errors(doc)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect()
}

#[test]
fn the_asyncapi_document_is_valid_asyncapi_3() {
    let registry = Registry::load(concat!(env!("CARGO_MANIFEST_DIR"), "/schemas")).unwrap();
    let doc = tidings_schema::asyncapi::document(&registry, &tidings_example_checkout::topology()).unwrap();
    let validator = asyncapi_3_validator();
    let found = errors(&validator, &doc);
    assert!(found.is_empty(), "{found:#?}");

    // What it describes: both channels, every message with its schema, and
    // who sends and receives.
    assert_eq!(doc["channels"]["orders"]["address"], "orders");
    assert_eq!(
        doc["channels"]["checkout.commands"]["address"],
        "checkout.commands"
    );
    let placed = &doc["components"]["messages"]["OrderPlaced.v1"];
    assert_eq!(placed["payload"]["required"][0], "order_id");
    // Required for correctness versus a convenience copy, visible to readers.
    assert_eq!(
        placed["payload"]["properties"]["customer_email"]["x-tidings-denormalized"],
        true
    );
    let required = placed["payload"]["required"].as_array().unwrap();
    assert!(!required.contains(&"customer_email".into()), "{required:?}");
    assert_eq!(
        placed["headers"]["properties"]["ce-dataschema"]["const"],
        "urn:tidings:schema:OrderPlaced:v1"
    );
    assert_eq!(doc["components"]["messages"].as_object().unwrap().len(), 8);
    let operations = doc["operations"].as_object().unwrap();
    assert_eq!(operations["checkout_sends_OrderPlaced_v1"]["action"], "send");
    assert_eq!(
        operations["loyalty_receives_OrderPlaced_v1"]["messages"][0]["$ref"],
        "#/channels/orders/messages/OrderPlaced.v1"
    );
    assert_eq!(operations.len(), 4 + 8 + 3 + 2 + 4 + 3);

    // The validator is not vacuous: an AsyncAPI 2 action is refused.
    let mut broken = doc.clone();
    broken["operations"]["checkout_sends_OrderPlaced_v1"]["action"] = "publish".into();
    assert!(
        !errors(&validator, &broken).is_empty(),
        "an invalid document must fail"
    );
}
