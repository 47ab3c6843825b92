//! The API's OpenAPI document (3.1), served at `/api/openapi.json`. It is
//! made from the same list of endpoints as the router ([`crate::api`]),
//! and its schemas from the types the handlers read and answer, so that
//! neither can drift from the code.

use schemars::generate::{Contract, SchemaGenerator, SchemaSettings};
use schemars::{JsonSchema, Schema};
use serde_json::{Map, Value, json};

/// Makes the schema of one type, registering the types it names.
pub(crate) type SchemaFn = fn(&mut SchemaGenerator) -> Schema;

/// The schema of `T`, a reference when `T` has a name.
pub(crate) fn schema_of<T: JsonSchema>(generator: &mut SchemaGenerator) -> Schema {
    generator.subschema_for::<T>()
}

/// Who may call an endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    /// Anyone who may read: a reader's or an operator's token (or none,
    /// where reading needs none).
    Read,
    /// An operator's token, or an operator's session with its
    /// anti-forgery token.
    Operate,
}

/// One endpoint of the API, as the document describes it.
pub(crate) struct Endpoint {
    /// `get` or `post`.
    pub(crate) method: &'static str,
    /// Under `/api`, with `{name}` for a path parameter.
    pub(crate) path: &'static str,
    /// What it does, in one line.
    pub(crate) summary: &'static str,
    /// Who may call it.
    pub(crate) access: Access,
    /// Its query string's fields, if it reads one.
    pub(crate) query: Option<SchemaFn>,
    /// Its JSON body, if it reads one.
    pub(crate) body: Option<SchemaFn>,
    /// Its answer.
    pub(crate) answer: SchemaFn,
}

/// A generator writing its named schemas where OpenAPI 3.1 keeps them.
fn generator(contract: Contract) -> SchemaGenerator {
    SchemaSettings::draft2020_12()
        .with(|s| {
            s.definitions_path = "/components/schemas".into();
            s.meta_schema = None;
            s.contract = contract;
        })
        .into_generator()
}

/// The OpenAPI document of `endpoints`.
pub(crate) fn document(endpoints: &[Endpoint]) -> Value {
    // What callers send is described as it is read (defaults make fields
    // optional), what they get as it is written.
    let mut reads = generator(Contract::Deserialize);
    let mut writes = generator(Contract::Serialize);
    let mut paths = Map::new();
    for e in endpoints {
        let mut parameters: Vec<Value> = path_parameters(e.path);
        if let Some(query) = e.query {
            parameters.extend(query_parameters(&query(&mut reads), &reads));
        }
        let mut operation = json!({
            "operationId": operation_id(e.method, e.path),
            "summary": e.summary,
            "parameters": parameters,
            "responses": {
                "200": {
                    "description": "done",
                    "content": { "application/json": { "schema": (e.answer)(&mut writes) } },
                },
                "default": {
                    "description": "refused or failed: 400 a request that does not parse, 401 no valid token, \
                                    403 a reader's token where an operator's is needed, 404 nothing there, \
                                    409 settled or past the dedupe horizon, 413 a body over 64 KiB, \
                                    422 an edit its schema refuses, 503 the database",
                    "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } },
                },
            },
            "security": match e.access {
                Access::Read => json!([{}, { "bearer": [] }]),
                Access::Operate => json!([{ "bearer": [] }, { "session": [], "csrf": [] }]),
            },
        });
        if let Some(body) = e.body {
            operation["requestBody"] = json!({
                "required": true,
                "content": { "application/json": { "schema": body(&mut reads) } },
            });
        }
        let item = paths
            .entry(format!("/api{}", e.path))
            .or_insert_with(|| json!({}));
        item[e.method] = operation;
    }
    let mut schemas = reads.take_definitions(true);
    for (name, schema) in writes.take_definitions(true) {
        match schemas.get(&name) {
            // A type both read and written whose two readings differ is
            // kept under the name of its written form, the read one as `…Input`.
            Some(read) if *read != schema => {
                let read = schemas.remove(&name).expect("present");
                schemas.insert(format!("{name}Input"), read);
                schemas.insert(name, schema);
            }
            _ => {
                schemas.insert(name, schema);
            }
        }
    }
    schemas.insert(
        "Error".to_owned(),
        json!({
            "type": "object",
            "properties": { "error": { "type": "string", "description": "what was wrong, and what to do" } },
            "required": ["error"],
        }),
    );
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "Tidings console API",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "The figures and dead-letter actions of a Tidings deployment, as its console's pages use them. \
                            Every write action is written to the audit trail with who took it.",
        },
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "A console token (`role:name:token` in TIDINGS_CONSOLE_TOKENS or the tokens file): a reader's reads, an operator's also acts.",
                },
                "session": {
                    "type": "apiKey",
                    "in": "cookie",
                    "name": crate::session::COOKIE_NAME,
                    "description": "The session of an operator signed in at /login.",
                },
                "csrf": {
                    "type": "apiKey",
                    "in": "header",
                    "name": "X-CSRF-Token",
                    "description": "The session's anti-forgery token, sent with the session cookie.",
                },
            },
        },
    })
}

/// `get /dead-letters/{id}/skip` → `get_dead_letters_id_skip`.
fn operation_id(method: &str, path: &str) -> String {
    let words: Vec<String> = path
        .split('/')
        .filter(|w| !w.is_empty())
        .map(|w| w.trim_matches(|c| c == '{' || c == '}').replace('-', "_"))
        .collect();
    format!("{method}_{}", words.join("_"))
}

/// The `{name}` parameters of `path`: a dead letter's or message's `id`
/// is a UUID, anything else a string.
fn path_parameters(path: &str) -> Vec<Value> {
    path.split('/')
        .filter_map(|w| w.strip_prefix('{').and_then(|w| w.strip_suffix('}')))
        .map(|name| {
            let schema = if name == "id" {
                json!({ "type": "string", "format": "uuid" })
            } else {
                json!({ "type": "string" })
            };
            json!({ "name": name, "in": "path", "required": true, "schema": schema })
        })
        .collect()
}

/// One query parameter per property of the object schema `schema` (a
/// reference into `generator`'s schemas, or the object itself).
fn query_parameters(schema: &Schema, generator: &SchemaGenerator) -> Vec<Value> {
    let object = schema
        .get("$ref")
        .and_then(Value::as_str)
        .and_then(|r| r.rsplit('/').next())
        .and_then(|name| generator.definitions().get(name))
        .unwrap_or(schema.as_value());
    let required: Vec<&str> = object["required"]
        .as_array()
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    object["properties"]
        .as_object()
        .map(|properties| {
            properties
                .iter()
                .map(|(name, property)| {
                    let mut p = json!({
                        "name": name,
                        "in": "query",
                        "required": required.contains(&name.as_str()),
                        "schema": property,
                    });
                    if let Some(d) = property.get("description") {
                        p["description"] = d.clone();
                    }
                    p
                })
                .collect()
        })
        .unwrap_or_default()
}
