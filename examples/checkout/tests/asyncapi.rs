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

/// The checkout system's document with `server`, checked valid AsyncAPI 3.0.
fn described(server: tidings_schema::asyncapi::Server) -> Value {
    let registry = Registry::load(concat!(env!("CARGO_MANIFEST_DIR"), "/schemas")).unwrap();
    let topology = tidings_example_checkout::topology().server(server);
    let doc = tidings_schema::asyncapi::document(&registry, &topology).unwrap();
    let found = errors(&asyncapi_3_validator(), &doc);
    assert!(found.is_empty(), "{found:#?}");
    doc
}

/// With a server, each channel's address is where the broker's transport
/// puts the topic, with its parameters and the protocol's bindings, and
/// the document stays valid AsyncAPI 3.0 on every broker.
#[test]
fn with_a_server_the_channels_are_the_brokers_real_addresses() {
    use std::sync::Arc;
    use tidings_schema::asyncapi::Server;

    let kafka = tidings_broker_kafka::KafkaOptions::default()
        .partitions(4)
        .prefix("shop.");
    let doc = described(Server::new("production", "kafka.internal:9092", Arc::new(kafka)));
    assert_eq!(doc["servers"]["production"]["protocol"], "kafka");
    assert_eq!(doc["servers"]["production"]["host"], "kafka.internal:9092");
    let orders = &doc["channels"]["orders"];
    assert_eq!(orders["address"], "shop.orders");
    assert_eq!(orders["servers"][0]["$ref"], "#/servers/production");
    assert_eq!(orders["bindings"]["kafka"]["partitions"], 4);
    let placed = &doc["components"]["messages"]["OrderPlaced.v1"];
    assert_eq!(
        placed["bindings"]["kafka"]["key"]["type"],
        serde_json::json!(["string", "null"])
    );
    assert_eq!(
        placed["correlationId"]["location"],
        "$message.header#/ce_correlationid"
    );
    assert!(
        placed["headers"]["properties"]["ce_partitionkey"].is_object(),
        "Kafka's binding writes ce_"
    );

    let nats = tidings_broker_nats::NatsOptions::default().partitions(4);
    let doc = described(Server::new("production", "nats.internal:4222", Arc::new(nats)));
    let orders = &doc["channels"]["orders"];
    assert_eq!(orders["address"], "TIDINGS.orders.{partition}.{type}");
    assert_eq!(
        orders["parameters"]["partition"]["enum"],
        serde_json::json!(["0", "1", "2", "3"])
    );
    let types = orders["parameters"]["type"]["enum"].as_array().unwrap();
    assert!(types.contains(&"OrderPlaced".into()), "{types:?}");
    assert!(doc["components"]["messages"]["OrderPlaced.v1"]["headers"]["properties"]["ce-id"].is_object());

    let rabbit = tidings_broker_rabbitmq::RabbitOptions::default().partitions(2);
    let doc = described(Server::new(
        "production",
        "rabbit.internal:5672",
        Arc::new(rabbit),
    ));
    let commands = &doc["channels"]["checkout.commands"];
    assert_eq!(doc["servers"]["production"]["protocol"], "amqp");
    assert_eq!(commands["address"], "{partition}.{type}");
    assert_eq!(
        commands["bindings"]["amqp"]["exchange"]["name"],
        "tidings.checkout.commands"
    );
    assert_eq!(commands["bindings"]["amqp"]["is"], "routingKey");

    // SNS, where messages are published (structured mode: one document).
    let sqs = tidings_broker_sqs::SqsOptions::default().partitions(2);
    let doc = described(Server::new(
        "production",
        "sns.eu-west-1.amazonaws.com",
        Arc::new(sqs),
    ));
    assert_eq!(doc["servers"]["production"]["protocol"], "sns");
    assert_eq!(doc["channels"]["orders"]["address"], "tidings-orders.fifo");
    assert_eq!(
        doc["channels"]["orders"]["bindings"]["sns"],
        serde_json::json!({
            "name": "tidings-orders.fifo",
            "ordering": {"type": "FIFO", "contentBasedDeduplication": false},
            "bindingVersion": "0.1.0",
        })
    );

    // Pub/Sub: a topic per partition.
    let pubsub = tidings_broker_pubsub::PubSubOptions::default().partitions(4);
    let doc = described(Server::new(
        "production",
        "pubsub.googleapis.com",
        Arc::new(pubsub),
    ));
    assert_eq!(doc["servers"]["production"]["protocol"], "googlepubsub");
    let orders = &doc["channels"]["orders"];
    assert_eq!(orders["address"], "tidings-orders-{partition}-of-4");
    assert_eq!(
        orders["parameters"]["partition"]["enum"],
        serde_json::json!(["0", "1", "2", "3"])
    );
    assert!(doc["components"]["messages"]["OrderPlaced.v1"]["headers"]["properties"]["ce-id"].is_object());
}

/// What the broker's URL and options say beyond the names: structured
/// mode (one CloudEvents document, the payload its `data`), TLS
/// (`kafka-secure`, `amqps`), AMQP's version and virtual host, a Kafka
/// cluster of several brokers (a server each), and another team's topic
/// by its real name; valid AsyncAPI 3.0 each time.
#[test]
fn the_servers_say_how_and_where_messages_travel() {
    use std::sync::Arc;
    use tidings_core::cloudevents::ContentMode;
    use tidings_schema::asyncapi::Server;

    let kafka = tidings_broker_kafka::KafkaOptions::default()
        .content_mode(ContentMode::Structured)
        .client_setting("security.protocol", "SASL_SSL")
        .foreign("orders", "sales.orders.v1");
    let doc = described(Server::new(
        "production",
        "k1.internal:9093,k2.internal:9093",
        Arc::new(kafka),
    ));
    assert_eq!(doc["servers"]["production"]["host"], "k1.internal:9093");
    assert_eq!(doc["servers"]["production-2"]["host"], "k2.internal:9093");
    assert_eq!(doc["servers"]["production"]["protocol"], "kafka-secure");
    let orders = &doc["channels"]["orders"];
    assert_eq!(
        orders["address"], "sales.orders.v1",
        "another team's topic, by its name"
    );
    assert_eq!(orders["servers"].as_array().unwrap().len(), 2);
    assert!(
        orders["bindings"]["kafka"].get("partitions").is_none(),
        "its partitions are the broker's"
    );
    let placed = &doc["components"]["messages"]["OrderPlaced.v1"];
    assert_eq!(placed["contentType"], "application/cloudevents+json");
    assert!(placed.get("headers").is_none(), "no attribute travels in headers");
    assert_eq!(
        placed["correlationId"]["location"],
        "$message.payload#/correlationid"
    );
    let payload = &placed["payload"];
    assert_eq!(payload["properties"]["type"]["const"], "OrderPlaced");
    assert_eq!(payload["properties"]["schemaversion"]["type"], "integer");
    assert!(
        payload["properties"]["data"]["properties"]["order_id"].is_object(),
        "the event's own schema is the document's data: {payload:#}"
    );

    let rabbit = tidings_broker_rabbitmq::RabbitOptions::default();
    let doc = described(
        Server::new("production", "rabbit.internal:5671", Arc::new(rabbit))
            .protocol("amqps")
            .pathname("/shop"),
    );
    let server = &doc["servers"]["production"];
    assert_eq!(server["protocol"], "amqps");
    assert_eq!(server["protocolVersion"], "0.9.1");
    assert_eq!(server["pathname"], "/shop");
}
