//! An AsyncAPI 3.0 document from the registry and the declared topology:
//! a channel per topic with every registered version of the messages it
//! carries, a message per type and version (its CloudEvents headers and its
//! payload schema), and an operation per service and message it sends or
//! receives. With a [`Server`] (the broker and its transport's naming,
//! [`Addresses`]), the document names it in `servers`, and each channel's
//! address is where the transport puts the topic (the Kafka topic, the
//! NATS subject, the RabbitMQ routing key on its exchange), with its
//! parameters (`{partition}`, `{type}`) and the protocol's bindings.
//!
//! ```
//! # use schemars::JsonSchema;
//! # use serde::{Deserialize, Serialize};
//! # use tidings_core::{Kind, Message};
//! use tidings_schema::Registry;
//! use tidings_schema::asyncapi::{Service, Topology};
//! # #[derive(Serialize, Deserialize, JsonSchema)]
//! # struct OrderPlaced { order_id: String }
//! # impl Message for OrderPlaced {
//! #     const TYPE: &'static str = "OrderPlaced";
//! #     const VERSION: u32 = 1;
//! #     const KIND: Kind = Kind::Event;
//! #     const AGGREGATE: &'static str = "order";
//! #     const TOPIC: &'static str = "orders";
//! #     fn key(&self) -> String { self.order_id.clone() }
//! # }
//!
//! let registry = Registry::new().register::<OrderPlaced>();
//! let topology = Topology::new("Shop", "1.0.0")
//!     .service(Service::new("checkout").sends::<OrderPlaced>())
//!     .service(Service::new("email").receives::<OrderPlaced>());
//! let doc = tidings_schema::asyncapi::document(&registry, &topology)?;
//! assert_eq!(doc["asyncapi"], "3.0.0");
//! assert_eq!(doc["operations"]["email_receives_OrderPlaced_v1"]["action"], "receive");
//! # Ok::<(), tidings_schema::SchemaError>(())
//! ```

use std::sync::Arc;

use serde_json::{Map, Value, json};
use tidings_core::Message;
use tidings_core::addresses::{Address, Addresses};

use crate::registry::{Registry, SchemaDoc, SchemaError};

/// Which services send and receive which messages.
#[derive(Debug, Clone, Default)]
pub struct Topology {
    title: String,
    version: String,
    description: Option<String>,
    services: Vec<Service>,
    server: Option<Server>,
}

/// The broker the system's messages travel through, as the document's one
/// server: its name, its host (`broker.internal:9092`, no credentials) and
/// the naming of its transport (a broker's options:
/// `tidings::transport_addresses(url, &options)` gives it from a URL).
#[derive(Debug, Clone)]
pub struct Server {
    name: String,
    host: String,
    addresses: Arc<dyn Addresses>,
}

impl Server {
    /// The server `name` at `host`, naming topics as `addresses` does.
    pub fn new(name: impl Into<String>, host: impl Into<String>, addresses: Arc<dyn Addresses>) -> Server {
        Server {
            name: name.into(),
            host: host.into(),
            addresses,
        }
    }
}

impl Topology {
    /// A system named `title`, its API at `version`.
    pub fn new(title: impl Into<String>, version: impl Into<String>) -> Topology {
        Topology {
            title: title.into(),
            version: version.into(),
            ..Topology::default()
        }
    }

    /// What the system is, for the document's `info`.
    pub fn description(mut self, description: impl Into<String>) -> Topology {
        self.description = Some(description.into());
        self
    }

    /// The broker the messages travel through (the document describes one).
    pub fn server(mut self, server: Server) -> Topology {
        self.server = Some(server);
        self
    }

    /// Adds a service.
    pub fn service(mut self, service: Service) -> Topology {
        self.services.push(service);
        self
    }
}

/// One service: the messages it sends (through its outbox) and receives
/// (as a consumer group).
#[derive(Debug, Clone, Default)]
pub struct Service {
    name: String,
    sends: Vec<(String, u32)>,
    receives: Vec<(String, u32)>,
}

impl Service {
    /// A service named `name` (`checkout`, `inventory`).
    pub fn new(name: impl Into<String>) -> Service {
        Service {
            name: name.into(),
            ..Service::default()
        }
    }

    /// The service sends `M` (at `M::VERSION`).
    pub fn sends<M: Message>(mut self) -> Service {
        self.sends.push((M::TYPE.to_owned(), M::VERSION));
        self
    }

    /// The service consumes `M` (written against `M::VERSION`).
    pub fn receives<M: Message>(mut self) -> Service {
        self.receives.push((M::TYPE.to_owned(), M::VERSION));
        self
    }
}

fn message_id(doc: &SchemaDoc) -> String {
    format!("{}.v{}", doc.meta.message_type, doc.meta.version)
}

/// Channel ids and operation ids allow letters, digits, `.`, `-` and `_`.
fn id_safe(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The CloudEvents binary-mode headers every message carries, their names
/// starting with `prefix`: `ce-` as NATS, RabbitMQ and HTTP name them,
/// `ce_` as Kafka's binding does.
fn headers(doc: &SchemaDoc, prefix: &str) -> Value {
    let string = |description: &str| json!({"type": "string", "description": description});
    let attributes = [
        ("specversion", json!({"type": "string", "const": "1.0"})),
        (
            "id",
            string("The message id (UUIDv7); consumers deduplicate on it."),
        ),
        ("source", string("The producing service.")),
        ("type", json!({"type": "string", "const": doc.meta.message_type})),
        ("subject", string("The aggregate key; order is kept per key.")),
        (
            "partitionkey",
            string("The aggregate key (the CloudEvents Partitioning extension; the record key on Kafka)."),
        ),
        ("time", string("When it happened (RFC 3339).")),
        (
            "dataschema",
            json!({"type": "string", "const": doc.schema["$id"]}),
        ),
        (
            "schemaversion",
            json!({"type": "string", "const": doc.meta.version.to_string()}),
        ),
        ("kind", json!({"type": "string", "const": doc.meta.kind.as_str()})),
        (
            "aggregatetype",
            json!({"type": "string", "const": doc.meta.aggregate}),
        ),
        (
            "correlationid",
            string("The id shared by every message of one business flow."),
        ),
        (
            "causationid",
            string("The id of the message that caused this one."),
        ),
        ("traceparent", string("W3C trace context.")),
    ];
    let required: Vec<String> = ["specversion", "id", "source", "type", "time", "correlationid"]
        .iter()
        .map(|a| format!("{prefix}{a}"))
        .collect();
    let properties: Map<String, Value> = attributes
        .into_iter()
        .map(|(name, schema)| (format!("{prefix}{name}"), schema))
        .collect();
    json!({"type": "object", "required": required, "properties": properties})
}

/// The header prefix of CloudEvents attributes on `protocol`.
fn header_prefix(protocol: Option<&str>) -> &'static str {
    match protocol {
        Some("kafka") => "ce_",
        _ => "ce-",
    }
}

/// A channel of `topic` on `server`: its address, its parameters and its
/// binding. `tokens` are its message types as the address writes them.
fn channel(topic: &str, address: &Address, server: &str, tokens: &[String]) -> Value {
    let mut channel = json!({
        "address": address.address,
        "servers": [{"$ref": format!("#/servers/{server}")}],
        "messages": {},
    });
    let mut parameters = Map::new();
    if address.address.contains("{partition}") {
        let partitions: Vec<String> = (0..address.partitions).map(|p| p.to_string()).collect();
        parameters.insert(
            "partition".into(),
            json!({
                "enum": partitions,
                "description": format!("The partition of {topic} a message's key falls in (its key hash modulo {}).", address.partitions),
            }),
        );
    }
    if address.address.contains("{type}") {
        parameters.insert(
            "type".into(),
            json!({"enum": tokens, "description": "The message type."}),
        );
    }
    if !parameters.is_empty() {
        channel["parameters"] = Value::Object(parameters);
    }
    if let Some(binding) = &address.channel_binding {
        channel["bindings"] = binding.clone();
    }
    channel
}

/// The payload schema as AsyncAPI's Schema Object (a JSON Schema draft 07
/// superset): the registry's schema without its `$schema`.
fn payload(doc: &SchemaDoc) -> Value {
    let mut schema = doc.schema.clone();
    if let Some(map) = schema.as_object_mut() {
        map.remove("$schema");
    }
    schema
}

/// The AsyncAPI 3.0 document of `topology` over `registry`. Every message
/// a service sends or receives must be registered at that version.
pub fn document(registry: &Registry, topology: &Topology) -> Result<Value, SchemaError> {
    let server = topology.server.as_ref();
    let prefix = header_prefix(server.map(|s| s.addresses.protocol()));
    let message_binding = server.and_then(|s| s.addresses.address("").message_binding);
    let mut messages = Map::new();
    let mut channels = Map::new();
    // Each topic's message types, as its address writes them.
    let mut tokens: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for doc in registry.docs() {
        let id = message_id(doc);
        let mut message = json!({
            "name": doc.meta.message_type,
            "title": format!("{} v{}", doc.meta.message_type, doc.meta.version),
            "contentType": "application/json",
            "headers": headers(doc, prefix),
            "payload": payload(doc),
            "correlationId": {"location": format!("$message.header#/{prefix}correlationid")},
            "tags": [{"name": doc.meta.kind.as_str()}],
        });
        if let Some(binding) = &message_binding {
            message["bindings"] = binding.clone();
        }
        if let Some(summary) = doc.schema.get("description").and_then(Value::as_str) {
            message["summary"] = json!(summary);
        }
        if !doc.meta.breaks.is_empty() {
            message["description"] = json!(format!(
                "Breaks version {}: {}",
                doc.meta.version - 1,
                doc.meta.breaks.join("; ")
            ));
        }
        messages.insert(id.clone(), message);
        let channel = channels
            .entry(id_safe(&doc.meta.topic))
            .or_insert_with(|| json!({"address": doc.meta.topic, "messages": {}}));
        channel["messages"][&id] = json!({"$ref": format!("#/components/messages/{id}")});
        let types = tokens.entry(doc.meta.topic.clone()).or_default();
        if !types.contains(&doc.meta.message_type) {
            types.push(doc.meta.message_type.clone());
        }
    }
    if let Some(server) = server {
        for (topic, types) in &tokens {
            let address = server.addresses.address(topic);
            let mut written: Vec<String> = Vec::with_capacity(types.len());
            for token in types.iter().map(|t| (address.type_token)(t)) {
                if !written.contains(&token) {
                    written.push(token);
                }
            }
            let id = id_safe(topic);
            let messages = channels[&id]["messages"].clone();
            let mut described = channel(topic, &address, &server.name, &written);
            described["messages"] = messages;
            channels.insert(id, described);
        }
    }
    let mut operations = Map::new();
    for service in &topology.services {
        for (action, verb, list) in [
            ("send", "sends", &service.sends),
            ("receive", "receives", &service.receives),
        ] {
            for (message_type, version) in list {
                let doc = registry
                    .get(message_type, *version)
                    .ok_or_else(|| SchemaError::Invalid {
                        path: format!("{message_type}.v{version}.json").into(),
                        reason: format!(
                            "{} {verb} {message_type} v{version}, which is not in the registry",
                            service.name
                        ),
                    })?;
                let channel = id_safe(&doc.meta.topic);
                let id = message_id(doc);
                operations.insert(
                    id_safe(&format!("{}_{verb}_{message_type}_v{version}", service.name)),
                    json!({
                        "action": action,
                        "title": format!("{} {verb} {message_type} v{version}", service.name),
                        "channel": {"$ref": format!("#/channels/{channel}")},
                        "messages": [{"$ref": format!("#/channels/{channel}/messages/{id}")}],
                        "tags": [{"name": service.name}],
                    }),
                );
            }
        }
    }
    let mut info = json!({"title": topology.title, "version": topology.version});
    if let Some(description) = &topology.description {
        info["description"] = json!(description);
    }
    let mut document = json!({
        "asyncapi": "3.0.0",
        "info": info,
        "defaultContentType": "application/json",
        "channels": channels,
        "operations": operations,
        "components": {"messages": messages},
    });
    if let Some(server) = server {
        document["servers"] = json!({server.name.clone(): {
            "host": server.host,
            "protocol": server.addresses.protocol(),
        }});
    }
    Ok(document)
}
