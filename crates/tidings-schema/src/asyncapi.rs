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
///
/// A host naming several brokers (`a:9092,b:9092`, a Kafka cluster's
/// bootstrap list) is written as one server per broker: `<name>`,
/// `<name>-2`, ..., every channel on each.
#[derive(Debug, Clone)]
pub struct Server {
    name: String,
    host: String,
    addresses: Arc<dyn Addresses>,
    protocol: Option<String>,
    pathname: Option<String>,
}

impl Server {
    /// The server `name` at `host`, naming topics as `addresses` does.
    pub fn new(name: impl Into<String>, host: impl Into<String>, addresses: Arc<dyn Addresses>) -> Server {
        Server {
            name: name.into(),
            host: host.into(),
            addresses,
            protocol: None,
            pathname: None,
        }
    }

    /// The protocol, where the URL says more than the transport's options
    /// (`amqps` for RabbitMQ over TLS).
    pub fn protocol(mut self, protocol: impl Into<String>) -> Server {
        self.protocol = Some(protocol.into());
        self
    }

    /// The path after the host (a RabbitMQ virtual host: `/%2f`, `/shop`).
    pub fn pathname(mut self, pathname: impl Into<String>) -> Server {
        self.pathname = Some(pathname.into());
        self
    }

    /// The protocol as the document names it.
    fn protocol_name(&self) -> String {
        self.protocol
            .clone()
            .unwrap_or_else(|| self.addresses.protocol().to_owned())
    }

    /// The servers of the document: (key, host), one per broker.
    fn entries(&self) -> Vec<(String, String)> {
        self.host
            .split(',')
            .map(str::trim)
            .filter(|h| !h.is_empty())
            .enumerate()
            .map(|(i, host)| {
                let key = match i {
                    0 => self.name.clone(),
                    n => format!("{}-{}", self.name, n + 1),
                };
                (key, host.to_owned())
            })
            .collect()
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

/// The CloudEvents attributes every message carries, as (name, schema),
/// and the required ones.
fn attributes(doc: &SchemaDoc) -> (Vec<(&'static str, Value)>, [&'static str; 6]) {
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
    (
        attributes.to_vec(),
        ["specversion", "id", "source", "type", "time", "correlationid"],
    )
}

/// The CloudEvents binary-mode headers every message carries, their names
/// starting with `prefix`: `ce-` as NATS, RabbitMQ and HTTP name them,
/// `ce_` as Kafka's binding does.
fn headers(doc: &SchemaDoc, prefix: &str) -> Value {
    let (attributes, required) = attributes(doc);
    let required: Vec<String> = required.iter().map(|a| format!("{prefix}{a}")).collect();
    let properties: Map<String, Value> = attributes
        .into_iter()
        .map(|(name, schema)| (format!("{prefix}{name}"), schema))
        .collect();
    json!({"type": "object", "required": required, "properties": properties})
}

/// The header prefix of CloudEvents attributes on `protocol`.
fn header_prefix(protocol: Option<&str>) -> &'static str {
    match protocol {
        Some("kafka" | "kafka-secure") => "ce_",
        _ => "ce-",
    }
}

/// A channel of `topic` on `server`: its address, its parameters and its
/// binding. `tokens` are its message types as the address writes them.
fn channel(topic: &str, address: &Address, servers: &[String], tokens: &[String]) -> Value {
    let servers: Vec<Value> = servers
        .iter()
        .map(|s| json!({"$ref": format!("#/servers/{s}")}))
        .collect();
    let mut channel = json!({
        "address": address.address,
        "servers": servers,
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

/// A structured-mode message: one `application/cloudevents+json` document,
/// its attributes members, the payload its `data`.
fn structured(doc: &SchemaDoc) -> Value {
    let (attributes, required) = attributes(doc);
    let mut properties: Map<String, Value> = attributes
        .into_iter()
        .map(|(name, schema)| (name.to_owned(), schema))
        .collect();
    // Carried as a JSON number in a document, a string in headers.
    properties.insert(
        "schemaversion".into(),
        json!({"type": "integer", "const": doc.meta.version}),
    );
    properties.insert(
        "datacontenttype".into(),
        json!({"type": "string", "const": "application/json"}),
    );
    properties.insert("data".into(), payload(doc));
    // A payload JSON cannot embed byte for byte travels as base64.
    properties.insert(
        "data_base64".into(),
        json!({"type": "string", "contentEncoding": "base64", "description": "The payload, when it cannot be embedded as `data` byte for byte."}),
    );
    json!({
        "type": "object",
        "required": required,
        "properties": properties,
        "oneOf": [{"required": ["data"]}, {"required": ["data_base64"]}],
    })
}

/// The AsyncAPI 3.0 document of `topology` over `registry`. Every message
/// a service sends or receives must be registered at that version.
pub fn document(registry: &Registry, topology: &Topology) -> Result<Value, SchemaError> {
    let server = topology.server.as_ref();
    let protocol = server.map(Server::protocol_name);
    let prefix = header_prefix(protocol.as_deref());
    let message_binding = server.and_then(|s| s.addresses.address("").message_binding);
    let structured_mode = server
        .is_some_and(|s| s.addresses.content_mode() == tidings_core::cloudevents::ContentMode::Structured);
    let mut messages = Map::new();
    let mut channels = Map::new();
    // Each topic's message types, as its address writes them.
    let mut tokens: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for doc in registry.docs() {
        let id = message_id(doc);
        let mut message = if structured_mode {
            json!({
                "name": doc.meta.message_type,
                "title": format!("{} v{}", doc.meta.message_type, doc.meta.version),
                "contentType": tidings_core::cloudevents::CONTENT_TYPE,
                "payload": structured(doc),
                "correlationId": {"location": "$message.payload#/correlationid"},
                "tags": [{"name": doc.meta.kind.as_str()}],
            })
        } else {
            json!({
                "name": doc.meta.message_type,
                "title": format!("{} v{}", doc.meta.message_type, doc.meta.version),
                "contentType": "application/json",
                "headers": headers(doc, prefix),
                "payload": payload(doc),
                "correlationId": {"location": format!("$message.header#/{prefix}correlationid")},
                "tags": [{"name": doc.meta.kind.as_str()}],
            })
        };
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
            let keys: Vec<String> = server.entries().into_iter().map(|(key, _)| key).collect();
            let mut described = channel(topic, &address, &keys, &written);
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
        let mut servers = Map::new();
        for (key, host) in server.entries() {
            let mut entry = json!({"host": host, "protocol": server.protocol_name()});
            if let Some(version) = server.addresses.protocol_version() {
                entry["protocolVersion"] = json!(version);
            }
            if let Some(pathname) = &server.pathname {
                entry["pathname"] = json!(pathname);
            }
            servers.insert(key, entry);
        }
        document["servers"] = Value::Object(servers);
    }
    Ok(document)
}
