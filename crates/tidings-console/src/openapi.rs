//! The API's OpenAPI document (3.1), served at `/api/openapi.json`. It is
//! made from the same list of endpoints as the router ([`crate::api`]),
//! and its schemas from the types the handlers read and answer, so that
//! neither can drift from the code.

use std::collections::BTreeSet;

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

/// The OpenAPI document of `endpoints`; `reads_need_token` says whether
/// reading needs a token (else anyone who reaches the console reads).
pub(crate) fn document(endpoints: &[Endpoint], reads_need_token: bool) -> Value {
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
                                    405 a method the path does not answer, \
                                    409 settled or past the dedupe horizon, 413 a body over 64 KiB (1 MiB for an edit), \
                                    422 an edit its schema refuses, 503 the database",
                    "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } },
                },
            },
            "security": security(e.access, reads_need_token),
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
    paths.insert(
        "/api/openapi.json".to_owned(),
        json!({ "get": {
            "operationId": "get_openapi_json",
            "summary": "This document.",
            "responses": {
                "200": {
                    "description": "the OpenAPI 3.1 document of this API",
                    "content": { "application/json": { "schema": { "type": "object" } } },
                },
                "default": {
                    "description": "refused: 401 no valid token",
                    "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } },
                },
            },
            "security": security(Access::Read, reads_need_token),
        }}),
    );
    let (mut schemas, renamed) = merged(reads.take_definitions(true), writes.take_definitions(true));
    // A request's schemas are read forms: they point at the `…Input` ones.
    for item in paths.values_mut() {
        for operation in item.as_object_mut().into_iter().flat_map(|o| o.values_mut()) {
            for part in ["parameters", "requestBody"] {
                if let Some(v) = operation.get_mut(part) {
                    rename_references(v, &renamed);
                }
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

/// Who may call an endpoint of `access`, as OpenAPI says it: an operator
/// with a token, or signed in with the session's anti-forgery token; a
/// reader the same, or anyone where reading needs no token.
fn security(access: Access, reads_need_token: bool) -> Value {
    match access {
        Access::Read if reads_need_token => json!([{ "bearer": [] }, { "session": [] }]),
        Access::Read => json!([{}, { "bearer": [] }, { "session": [] }]),
        Access::Operate => json!([{ "bearer": [] }, { "session": [], "csrf": [] }]),
    }
}

/// The named schemas of the read forms and of the written forms, in one
/// map. A type whose read form differs from its written one (defaults make
/// its fields optional) keeps its name for the written form, and the read
/// form is named `…Input`; a read form that names such a type then names
/// its `…Input` and may differ in turn, until none does. Returns the
/// schemas and the names given an `…Input`.
fn merged(reads: Map<String, Value>, writes: Map<String, Value>) -> (Map<String, Value>, BTreeSet<String>) {
    let mut renamed = BTreeSet::new();
    loop {
        let before = renamed.len();
        for (name, read) in &reads {
            if renamed.contains(name) {
                continue;
            }
            if let Some(written) = writes.get(name) {
                let mut read = read.clone();
                rename_references(&mut read, &renamed);
                if read != *written {
                    renamed.insert(name.clone());
                }
            }
        }
        if renamed.len() == before {
            break;
        }
    }
    let mut schemas = writes;
    for (name, mut read) in reads {
        rename_references(&mut read, &renamed);
        if renamed.contains(&name) {
            schemas.insert(format!("{name}Input"), read);
        } else {
            schemas.entry(name).or_insert(read);
        }
    }
    (schemas, renamed)
}

/// Points each `$ref` in `value` to a schema of `renamed` at its `…Input`.
fn rename_references(value: &mut Value, renamed: &BTreeSet<String>) {
    const PREFIX: &str = "#/components/schemas/";
    match value {
        Value::Object(map) => {
            for (key, v) in map.iter_mut() {
                match v {
                    Value::String(r) if key == "$ref" => {
                        if let Some(name) = r.strip_prefix(PREFIX).filter(|n| renamed.contains(*n)) {
                            *r = format!("{PREFIX}{name}Input");
                        }
                    }
                    _ => rename_references(v, renamed),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| rename_references(v, renamed)),
        _ => {}
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn map(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn a_read_form_that_differs_is_named_input_and_those_naming_it_follow() {
        let reads = map(json!({
            "Request": { "properties": { "selection": { "$ref": "#/components/schemas/Selection" } } },
            "Selection": { "properties": { "all": { "type": "boolean" } } },
            "Plain": { "type": "string" },
        }));
        let writes = map(json!({
            "Request": { "properties": { "selection": { "$ref": "#/components/schemas/Selection" } } },
            "Selection": { "properties": { "all": { "type": "boolean" } }, "required": ["all"] },
            "Plain": { "type": "string" },
            "Answer": { "$ref": "#/components/schemas/Selection" },
        }));
        let (schemas, renamed) = merged(reads, writes);
        assert_eq!(
            renamed.iter().map(String::as_str).collect::<Vec<_>>(),
            ["Request", "Selection"]
        );
        assert_eq!(
            schemas["RequestInput"]["properties"]["selection"]["$ref"],
            "#/components/schemas/SelectionInput"
        );
        assert_eq!(
            schemas["Request"]["properties"]["selection"]["$ref"],
            "#/components/schemas/Selection"
        );
        assert!(schemas["SelectionInput"].get("required").is_none());
        assert_eq!(schemas["Answer"]["$ref"], "#/components/schemas/Selection");
        assert!(!schemas.contains_key("PlainInput"));

        let mut body = json!({ "schema": { "$ref": "#/components/schemas/Request" } });
        rename_references(&mut body, &renamed);
        assert_eq!(body["schema"]["$ref"], "#/components/schemas/RequestInput");
    }

    #[test]
    fn reads_are_open_only_where_no_token_is_needed() {
        assert_eq!(security(Access::Read, false)[0], json!({}));
        assert!(
            security(Access::Read, true)
                .as_array()
                .unwrap()
                .iter()
                .all(|s| s != &json!({}))
        );
        assert_eq!(
            security(Access::Operate, false),
            json!([{ "bearer": [] }, { "session": [], "csrf": [] }])
        );
    }
}
