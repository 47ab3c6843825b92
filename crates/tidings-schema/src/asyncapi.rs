//! An AsyncAPI 3.0 document from the registry and the declared topology:
//! a channel per topic with every registered version of the messages it
//! carries, a message per type and version (its CloudEvents headers and its
//! payload schema), and an operation per service and message it sends or
//! receives.
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

use serde_json::{Map, Value, json};
use tidings_core::Message;

use crate::registry::{Registry, SchemaDoc, SchemaError};

/// Which services send and receive which messages.
#[derive(Debug, Clone, Default)]
pub struct Topology {
    title: String,
    version: String,
    description: Option<String>,
    services: Vec<Service>,
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

/// The CloudEvents binary-mode headers every message carries, as NATS,
/// RabbitMQ and HTTP name them (`ce-`; Kafka's binding writes `ce_`).
fn headers(doc: &SchemaDoc) -> Value {
    let string = |description: &str| json!({"type": "string", "description": description});
    json!({
        "type": "object",
        "required": ["ce-specversion", "ce-id", "ce-source", "ce-type", "ce-time", "ce-correlationid"],
        "properties": {
            "ce-specversion": {"type": "string", "const": "1.0"},
            "ce-id": string("The message id (UUIDv7); consumers deduplicate on it."),
            "ce-source": string("The producing service."),
            "ce-type": {"type": "string", "const": doc.meta.message_type},
            "ce-subject": string("The aggregate key; order is kept per key."),
            "ce-partitionkey": string("The aggregate key (the CloudEvents Partitioning extension; the record key on Kafka)."),
            "ce-time": string("When it happened (RFC 3339)."),
            "ce-dataschema": {"type": "string", "const": doc.schema["$id"]},
            "ce-schemaversion": {"type": "string", "const": doc.meta.version.to_string()},
            "ce-kind": {"type": "string", "const": doc.meta.kind.as_str()},
            "ce-aggregatetype": {"type": "string", "const": doc.meta.aggregate},
            "ce-correlationid": string("The id shared by every message of one business flow."),
            "ce-causationid": string("The id of the message that caused this one."),
            "ce-traceparent": string("W3C trace context."),
        }
    })
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
    let mut messages = Map::new();
    let mut channels = Map::new();
    for doc in registry.docs() {
        let id = message_id(doc);
        let mut message = json!({
            "name": doc.meta.message_type,
            "title": format!("{} v{}", doc.meta.message_type, doc.meta.version),
            "contentType": "application/json",
            "headers": headers(doc),
            "payload": payload(doc),
            "correlationId": {"location": "$message.header#/ce-correlationid"},
            "tags": [{"name": doc.meta.kind.as_str()}],
        });
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
    Ok(json!({
        "asyncapi": "3.0.0",
        "info": info,
        "defaultContentType": "application/json",
        "channels": channels,
        "operations": operations,
        "components": {"messages": messages},
    }))
}
