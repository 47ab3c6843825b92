//! CloudEvents 1.0, as its protocol bindings define it: structured mode (a
//! JSON document) and binary mode (attributes in headers), lossless both
//! ways for Tidings' envelopes, and reading every spec-valid event other
//! producers write.
//!
//! | Envelope field   | CloudEvents attribute |
//! |------------------|-----------------------|
//! | `id`             | `id`: a UUID as is; any other id is kept as written in the header [`FOREIGN_ID_HEADER`] and the envelope's id is the UUID [`foreign_id`] derives from (`source`, `id`), so that deduplication is on (`source`, `id`) as the spec defines uniqueness |
//! | `source`         | `source`              |
//! | `message_type`   | `type`                |
//! | `aggregate_key`  | `partitionkey` (the Partitioning extension; on Kafka also the record key) and `subject`; read from `partitionkey`, else `subject`, else the record's key; an event with none has the empty key, and consumers handle such events in parallel |
//! | `occurred_at`    | `time` (RFC 3339); an event without one gets the time it was read |
//! | `content_type`   | `datacontenttype` (`content-type` in binary mode); JSON when absent |
//! | `payload`        | `data` (JSON payloads, embedded verbatim when they have no whitespace around them) or `data_base64`; the body in binary mode |
//! | `version`        | `schemaversion` (extension, integer), and `dataschema`: the registry's `$id` of the type's schema at that version (`urn:tidings:schema:OrderPlaced:v1`, [`Envelope::dataschema`]) |
//! | `kind`           | `kind` (extension: `event` or `command`) |
//! | `aggregate_type` | `aggregatetype` (extension) |
//! | `correlation_id` | `correlationid` (extension) |
//! | `causation_id`   | `causationid` (extension, absent when none) |
//! | `headers`        | one extension per header whose name is a valid extension name (`traceparent`, from the Distributed Tracing extension), the others in `tidingsheaders` (a JSON object in a string), or in binary mode as plain headers |
//!
//! Reading is tolerant as the spec asks: an extension Tidings knows whose
//! value it cannot use (a `correlationid` that is not a UUID, a `kind` it
//! does not know) and every unknown extension become headers, and a
//! `subject` or `dataschema` other than Tidings' own is kept in a header of
//! that name, so an event passed on carries everything it came with.
//!
//! Binary mode names attributes `ce-<name>` on HTTP, NATS, RabbitMQ (AMQP
//! 0-9-1) and Pub/Sub, and `ce_<name>` on Kafka ([`Binding`]); reading
//! accepts either on every transport, and on Kafka `ce_` wins where a
//! record carries both.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use chrono::{DateTime, Datelike, SecondsFormat, Utc};
use serde::ser::{SerializeMap, Serializer};
use serde_json::value::RawValue;
use std::collections::BTreeMap;
use uuid::Uuid;

use crate::envelope::{Envelope, Headers, Kind};
use crate::error::DecodeError;

/// The media type of a structured-mode CloudEvents JSON document.
pub const CONTENT_TYPE: &str = "application/cloudevents+json";

/// The media type of a batch of structured-mode events (a JSON array), on HTTP.
pub const BATCH_CONTENT_TYPE: &str = "application/cloudevents-batch+json";

/// The header holding a foreign event's `id` as its producer wrote it, when
/// that id is not a UUID (`evt_01J8K2...`); see [`foreign_id`].
pub const FOREIGN_ID_HEADER: &str = "tidingsforeignid";

/// The namespace of the UUIDs [`foreign_id`] derives.
const FOREIGN_IDS: Uuid = Uuid::from_u128(0x08d1be3f_b350_47d1_970d_a143fb2c0310);

/// The envelope id of a foreign event whose `id` is not a UUID: a UUIDv5 of
/// its `source` and `id`, so the same event read twice has the same id
/// (and is deduplicated), and two producers' equal ids stay apart.
pub fn foreign_id(source: &str, id: &str) -> Uuid {
    let mut name = Vec::with_capacity(source.len() + id.len() + 1);
    name.extend_from_slice(source.as_bytes());
    name.push(0);
    name.extend_from_slice(id.as_bytes());
    Uuid::new_v5(&FOREIGN_IDS, &name)
}

/// The event's `id` as its producer wrote it, when that was not a UUID.
pub(crate) fn written_id(e: &Envelope) -> Option<&str> {
    e.headers
        .get(FOREIGN_ID_HEADER)
        .map(String::as_str)
        .filter(|id| !id.is_empty() && !is_canonical_uuid(id) && foreign_id(&e.source, id) == e.id)
}

/// Whether `s` is a UUID written as Tidings writes them (lower-case, hyphenated).
pub(crate) fn is_canonical_uuid(s: &str) -> bool {
    Uuid::try_parse(s).is_ok_and(|u| u.hyphenated().to_string() == s)
}

/// The header holding a foreign `subject` other than the event's key.
const SUBJECT: &str = "subject";
/// The header holding a foreign `dataschema` other than Tidings' own.
const DATASCHEMA: &str = "dataschema";

/// The `subject` to write: the key, or the foreign subject kept beside it.
fn subject(e: &Envelope) -> Option<&str> {
    if e.aggregate_key.is_empty() {
        return None;
    }
    Some(kept_subject(e).unwrap_or(&e.aggregate_key))
}

/// A foreign subject other than the key, written as `subject` (rather than
/// packed among the headers) when there is a key.
fn kept_subject(e: &Envelope) -> Option<&str> {
    e.headers
        .get(SUBJECT)
        .map(String::as_str)
        .filter(|s| !e.aggregate_key.is_empty() && !s.is_empty() && *s != e.aggregate_key)
}

/// A foreign `dataschema` other than Tidings' own.
fn kept_dataschema(e: &Envelope) -> Option<&str> {
    e.headers
        .get(DATASCHEMA)
        .map(String::as_str)
        .filter(|s| !s.is_empty() && *s != e.dataschema())
}

/// How a transport's binary mode names the attribute headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Binding {
    /// `ce-<name>`: the HTTP binding, and NATS, RabbitMQ (AMQP 0-9-1, as
    /// the official SDKs write it) and Pub/Sub, which follow it.
    Standard,
    /// `ce_<name>`: the Kafka binding.
    Kafka,
}

impl Binding {
    fn prefix(self) -> &'static str {
        match self {
            Binding::Standard => "ce-",
            Binding::Kafka => "ce_",
        }
    }
}

/// How a publisher writes events: binary mode (attributes as headers, the
/// payload as the body; the default) or structured mode (the whole event
/// as one `application/cloudevents+json` document). Consumers read both.
///
/// Deserialized from `"binary"` or `"structured"`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ContentMode {
    /// Attributes as headers, the payload as the body.
    #[default]
    Binary,
    /// The whole event as one JSON document.
    Structured,
}

/// Encodes an envelope for a transport: its headers and its body, in `mode`.
pub fn encode(e: &Envelope, binding: Binding, mode: ContentMode) -> (Vec<(String, String)>, Vec<u8>) {
    match mode {
        ContentMode::Binary => to_binary(e, binding),
        ContentMode::Structured => (
            vec![(CONTENT_TYPE_HEADER.to_owned(), CONTENT_TYPE.to_owned())],
            to_json(e),
        ),
    }
}

const RESERVED: &[&str] = &[
    "specversion",
    "id",
    "source",
    "type",
    "subject",
    "time",
    "datacontenttype",
    "dataschema",
    "data",
    "data_base64",
    "schemaversion",
    "kind",
    "aggregatetype",
    "correlationid",
    "causationid",
    "partitionkey",
    "tidingsheaders",
];

/// Whether `name` can travel as a CloudEvents extension attribute of its own.
fn is_extension_name(name: &str) -> bool {
    (1..=20).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        && !RESERVED.contains(&name)
}

/// Whether a content type's payload is JSON (`application/json`, `text/json`, `...+json`).
pub fn is_json(content_type: &str) -> bool {
    let essence = content_type.split(';').next().unwrap_or("").trim();
    essence == "application/json" || essence == "text/json" || essence.ends_with("+json")
}

/// Where each of an envelope's headers travels.
struct Placed<'a> {
    /// As extension attributes of their own name.
    extensions: Vec<(&'a str, &'a str)>,
    /// Packed in `tidingsheaders`.
    packed: BTreeMap<&'a str, &'a str>,
    /// As plain transport headers (binary mode only).
    plain: Vec<(&'a str, &'a str)>,
}

fn place_headers(e: &Envelope, binary: bool) -> Placed<'_> {
    let mut placed = Placed {
        extensions: Vec::new(),
        packed: BTreeMap::new(),
        plain: Vec::new(),
    };
    let written = written_id(e).is_some();
    let subject = kept_subject(e).is_some();
    let dataschema = kept_dataschema(e).is_some();
    for (k, v) in &e.headers {
        let (k, v) = (k.as_str(), v.as_str());
        let carried = match k {
            FOREIGN_ID_HEADER => written,
            SUBJECT => subject,
            DATASCHEMA => dataschema,
            _ => false,
        };
        if carried {
            // Written as the attribute itself.
        } else if is_extension_name(k) {
            placed.extensions.push((k, v));
        } else if !binary || is_attribute_header(k) {
            // `ce-id` or `Content-Type` as a plain header would be read
            // back as an attribute: it travels packed, as in structured mode.
            placed.packed.insert(k, v);
        } else {
            placed.plain.push((k, v));
        }
    }
    placed
}

/// The string attributes of an envelope, in the order they are written
/// (`schemaversion` among them, as binary mode carries it).
fn string_attributes(e: &Envelope) -> Vec<(&'static str, String)> {
    let mut a = vec![
        ("specversion", "1.0".to_owned()),
        (
            "id",
            written_id(e).map_or_else(|| e.id.to_string(), str::to_owned),
        ),
        ("source", e.source.clone()),
        ("type", e.message_type.clone()),
    ];
    if let Some(subject) = subject(e) {
        a.push(("subject", subject.to_owned()));
        a.push(("partitionkey", e.aggregate_key.clone()));
    }
    a.push(("time", e.occurred_at.to_rfc3339_opts(SecondsFormat::AutoSi, true)));
    a.push(("datacontenttype", e.content_type.clone()));
    a.push((
        "dataschema",
        kept_dataschema(e).map_or_else(|| e.dataschema(), str::to_owned),
    ));
    a.push(("schemaversion", e.version.to_string()));
    a.push(("kind", e.kind.as_str().to_owned()));
    a.push(("aggregatetype", e.aggregate_type.clone()));
    a.push(("correlationid", e.correlation_id.to_string()));
    if let Some(c) = e.causation_id {
        a.push(("causationid", c.to_string()));
    }
    a
}

/// Encodes an envelope as a CloudEvents 1.0 JSON document.
pub fn to_json(envelope: &Envelope) -> Vec<u8> {
    let mut out = Vec::with_capacity(envelope.payload.len() + 384);
    let mut ser = serde_json::Serializer::new(&mut out);
    // Serializing into a Vec with string keys cannot fail.
    write_map(envelope, &mut ser).expect("serializing an envelope to memory cannot fail");
    out
}

fn write_map<S: Serializer>(e: &Envelope, ser: S) -> Result<S::Ok, S::Error> {
    let mut map = ser.serialize_map(None)?;
    for (name, value) in string_attributes(e) {
        if name == "schemaversion" {
            map.serialize_entry(name, &e.version)?;
        } else {
            map.serialize_entry(name, &value)?;
        }
    }
    let placed = place_headers(e, false);
    for (k, v) in placed.extensions {
        map.serialize_entry(k, v)?;
    }
    if !placed.packed.is_empty() {
        let packed = serde_json::to_string(&placed.packed).map_err(serde::ser::Error::custom)?;
        map.serialize_entry("tidingsheaders", &packed)?;
    }
    // Embedded only when it reads back byte for byte: JSON around a value
    // loses its whitespace, so such a payload travels as base64.
    let raw = if is_json(&e.content_type) {
        std::str::from_utf8(&e.payload)
            .ok()
            .filter(|s| s.trim_matches(['\t', '\n', '\r', ' ']).len() == s.len())
            .and_then(|s| RawValue::from_string(s.to_owned()).ok())
    } else {
        None
    };
    match raw {
        Some(raw) => map.serialize_entry("data", &raw)?,
        None => map.serialize_entry("data_base64", &BASE64.encode(&e.payload))?,
    }
    map.end()
}

fn malformed(reason: impl Into<String>) -> DecodeError {
    DecodeError::Malformed {
        reason: reason.into(),
    }
}

/// Decodes a CloudEvents 1.0 JSON document into an envelope.
///
/// Every missing or ill-typed required attribute is reported by name.
pub fn from_json(bytes: &[u8]) -> Result<Envelope, DecodeError> {
    decode_json(bytes, None)
}

/// [`from_json`], with the transport's record key for an event that names none.
pub(crate) fn decode_json(bytes: &[u8], record_key: Option<&str>) -> Result<Envelope, DecodeError> {
    let attrs: BTreeMap<String, Box<RawValue>> = serde_json::from_slice(bytes)
        .map_err(|e| malformed(format!("not a CloudEvents JSON object: {e}")))?;
    from_attributes(attrs, None, record_key)
}

/// The header that carries `datacontenttype` in binary mode.
pub const CONTENT_TYPE_HEADER: &str = "content-type";

/// Encodes an envelope in binary mode: every attribute a `ce-` header
/// (`ce_` on Kafka), the content type in `content-type`, the payload as the
/// body. Envelope headers that are valid extension names travel as
/// extension attributes; those that would read back as an attribute
/// (`ce-…`, `ce_…`, `content-type`, in any case) packed in
/// `tidingsheaders`; the others as plain headers of the same name.
pub fn to_binary(e: &Envelope, binding: Binding) -> (Vec<(String, String)>, Vec<u8>) {
    let prefix = binding.prefix();
    let mut h: Vec<(String, String)> = string_attributes(e)
        .into_iter()
        .map(|(name, value)| match name {
            "datacontenttype" => (CONTENT_TYPE_HEADER.to_owned(), value),
            _ => (format!("{prefix}{name}"), value),
        })
        .collect();
    let placed = place_headers(e, true);
    for (k, v) in placed.extensions {
        h.push((format!("{prefix}{k}"), v.to_owned()));
    }
    for (k, v) in placed.plain {
        h.push((k.to_owned(), v.to_owned()));
    }
    if !placed.packed.is_empty() {
        let packed = serde_json::to_string(&placed.packed).expect("a map of strings serializes");
        h.push((format!("{prefix}tidingsheaders"), packed));
    }
    (h, e.payload.clone())
}

/// The attribute a binary-mode header names (`ce-id`, `CE_ID` -> `id`),
/// if it names one (not `content-type`).
fn attribute_name(header: &str) -> Option<&str> {
    let prefix = header.get(..3)?;
    (prefix.eq_ignore_ascii_case("ce-") || prefix.eq_ignore_ascii_case("ce_")).then(|| &header[3..])
}

/// Whether transport headers carry a binary-mode CloudEvent
/// (`ce-specversion` or `ce_specversion`, in any case).
pub fn is_binary<'a>(mut header_names: impl Iterator<Item = &'a str>) -> bool {
    header_names.any(|n| attribute_name(n).is_some_and(|a| a.eq_ignore_ascii_case("specversion")))
}

/// Whether a binary-mode header carries a CloudEvents attribute: `ce-…`,
/// `ce_…` or `content-type`, in any case.
pub fn is_attribute_header(name: &str) -> bool {
    attribute_name(name).is_some() || name.eq_ignore_ascii_case(CONTENT_TYPE_HEADER)
}

/// Decodes a binary-mode message (see [`to_binary`]), with `ce-` or `ce_`
/// headers. Header names are matched without regard to case, as transports
/// may change it; an attribute given under both prefixes is read from
/// `ce-` (a Kafka record keeps only its `ce_` one, see
/// [`RawMessage::from_record`](crate::RawMessage::from_record)). Headers that are neither attributes nor `content-type` become
/// envelope headers.
pub fn from_binary<'a>(
    headers: impl IntoIterator<Item = (&'a str, &'a str)>,
    body: &[u8],
) -> Result<Envelope, DecodeError> {
    decode_binary(headers, body, None)
}

/// [`from_binary`], with the transport's record key for an event that names none.
pub(crate) fn decode_binary<'a>(
    headers: impl IntoIterator<Item = (&'a str, &'a str)>,
    body: &[u8],
    record_key: Option<&str>,
) -> Result<Envelope, DecodeError> {
    let mut dash: BTreeMap<String, Box<RawValue>> = BTreeMap::new();
    let mut underscore: BTreeMap<String, Box<RawValue>> = BTreeMap::new();
    let mut plain = Headers::new();
    for (name, value) in headers {
        let json =
            || RawValue::from_string(serde_json::Value::from(value).to_string()).expect("a JSON string");
        if let Some(attr) = attribute_name(name) {
            let side = if name.as_bytes()[2] == b'-' {
                &mut dash
            } else {
                &mut underscore
            };
            side.insert(attr.to_ascii_lowercase(), json());
        } else if name.eq_ignore_ascii_case(CONTENT_TYPE_HEADER) {
            dash.insert("datacontenttype".to_owned(), json());
        } else {
            plain.insert(name.to_owned(), value.to_owned());
        }
    }
    for (attr, value) in underscore {
        dash.entry(attr).or_insert(value);
    }
    let mut envelope = from_attributes(dash, Some(body.to_vec()), record_key)?;
    envelope.headers.extend(plain);
    Ok(envelope)
}

/// Builds an envelope from CloudEvents attributes; `payload` is the body in
/// binary mode, or `None` to read `data`/`data_base64` from the attributes.
fn from_attributes(
    mut attrs: BTreeMap<String, Box<RawValue>>,
    payload: Option<Vec<u8>>,
    record_key: Option<&str>,
) -> Result<Envelope, DecodeError> {
    fn string(
        attrs: &mut BTreeMap<String, Box<RawValue>>,
        name: &str,
    ) -> Result<Option<String>, DecodeError> {
        match attrs.remove(name) {
            None => Ok(None),
            Some(raw) => serde_json::from_str::<String>(raw.get())
                .map(Some)
                .map_err(|_| malformed(format!("attribute `{name}` must be a string"))),
        }
    }
    fn required(attrs: &mut BTreeMap<String, Box<RawValue>>, name: &str) -> Result<String, DecodeError> {
        string(attrs, name)?.ok_or_else(|| malformed(format!("missing attribute `{name}`")))
    }
    /// An extension's value as text: strings as they are, other JSON as written.
    fn text(raw: &RawValue) -> String {
        serde_json::from_str::<String>(raw.get()).unwrap_or_else(|_| raw.get().to_owned())
    }

    // The JSON format: an attribute whose value is `null` is not set
    // (`data` is no attribute: `null` is its value).
    attrs.retain(|name, raw| name == "data" || raw.get() != "null");
    let spec = required(&mut attrs, "specversion")?;
    if spec != "1.0" {
        return Err(malformed(format!(
            "unsupported specversion {spec:?} (expected \"1.0\")"
        )));
    }
    let written_id = required(&mut attrs, "id")?;
    if written_id.is_empty() {
        return Err(malformed("attribute `id` is empty"));
    }
    let source = required(&mut attrs, "source")?;
    let message_type = required(&mut attrs, "type")?;
    if message_type.is_empty() {
        return Err(malformed("attribute `type` is empty"));
    }
    let mut headers = Headers::new();
    if let Some(packed) = string(&mut attrs, "tidingsheaders")? {
        let map: BTreeMap<String, String> = serde_json::from_str(&packed)
            .map_err(|_| malformed("attribute `tidingsheaders` must be a JSON object of strings"))?;
        headers.extend(map);
    }
    // A foreign id is kept as written, over any header of that name.
    let (id, foreign) = if is_canonical_uuid(&written_id) {
        (written_id.parse().expect("a canonical UUID parses"), None)
    } else {
        (foreign_id(&source, &written_id), Some(written_id))
    };
    let subject = string(&mut attrs, "subject")?.filter(|s| !s.is_empty());
    let aggregate_key = string(&mut attrs, "partitionkey")?
        .filter(|k| !k.is_empty())
        .or_else(|| subject.clone())
        .or_else(|| record_key.filter(|k| !k.is_empty()).map(str::to_owned))
        .unwrap_or_default();
    if let Some(subject) = subject.filter(|s| *s != aggregate_key) {
        headers.insert(SUBJECT.to_owned(), subject);
    }
    let occurred_at = match string(&mut attrs, "time")? {
        Some(t) => DateTime::parse_from_rfc3339(&t)
            .map(|time| time.with_timezone(&Utc))
            .ok()
            // `0000-01-01T00:00:00+01:00` is year -1 in UTC, which RFC 3339
            // cannot write: it could never be sent or stored again.
            .filter(|time| (0..=9999).contains(&time.year()))
            .ok_or_else(|| {
                malformed(format!(
                    "attribute `time` must be RFC 3339 between years 0000 and 9999 in UTC, got {t:?}"
                ))
            })?,
        // Optional in the spec: the time it was read is the best known.
        None => Utc::now(),
    };
    let content_type =
        string(&mut attrs, "datacontenttype")?.unwrap_or_else(|| crate::envelope::JSON.to_owned());
    // Tidings' own extensions, each kept as a header when its value is not
    // one Tidings can use: another producer may use the name its own way.
    let mut version = 1;
    if let Some(raw) = attrs.remove("schemaversion") {
        let v: serde_json::Value = serde_json::from_str(raw.get()).unwrap_or(serde_json::Value::Null);
        // Binary-mode transports carry every attribute as a string.
        match v
            .as_u64()
            .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
            .and_then(|n| u32::try_from(n).ok())
            .filter(|n| *n > 0)
        {
            Some(n) => version = n,
            None => {
                headers.insert("schemaversion".to_owned(), text(&raw));
            }
        }
    }
    let mut kind = Kind::Event;
    if let Some(raw) = attrs.remove("kind") {
        match Kind::parse(&text(&raw)) {
            Some(k) => kind = k,
            None => {
                headers.insert("kind".to_owned(), text(&raw));
            }
        }
    }
    let aggregate_type = attrs
        .remove("aggregatetype")
        .map(|raw| text(&raw))
        .unwrap_or_default();
    let mut correlation_id = id;
    if let Some(raw) = attrs.remove("correlationid") {
        match Uuid::try_parse(&text(&raw)) {
            Ok(c) => correlation_id = c,
            Err(_) => {
                headers.insert("correlationid".to_owned(), text(&raw));
            }
        }
    }
    let mut causation_id = None;
    if let Some(raw) = attrs.remove("causationid") {
        match Uuid::try_parse(&text(&raw)) {
            Ok(c) => causation_id = Some(c),
            Err(_) => {
                headers.insert("causationid".to_owned(), text(&raw));
            }
        }
    }
    let payload = match (payload, attrs.remove("data"), attrs.remove("data_base64")) {
        (Some(body), _, _) => body,
        (None, Some(_), Some(_)) => return Err(malformed("both `data` and `data_base64` are present")),
        (None, Some(raw), None) => {
            if is_json(&content_type) {
                raw.get().as_bytes().to_vec()
            } else {
                serde_json::from_str::<String>(raw.get())
                    .map_err(|_| malformed("`data` of a non-JSON content type must be a string"))?
                    .into_bytes()
            }
        }
        (None, None, Some(raw)) => {
            let s: String =
                serde_json::from_str(raw.get()).map_err(|_| malformed("`data_base64` must be a string"))?;
            BASE64
                .decode(s.as_bytes())
                .map_err(|_| malformed("`data_base64` is not valid base64"))?
        }
        (None, None, None) => Vec::new(),
    };
    let dataschema = attrs.remove("dataschema").map(|raw| text(&raw));
    for (name, raw) in attrs {
        headers.insert(name, text(&raw));
    }
    if let Some(written) = foreign {
        headers.insert(FOREIGN_ID_HEADER.to_owned(), written);
    }
    let mut envelope = Envelope {
        id,
        message_type,
        version,
        kind,
        source,
        aggregate_type,
        aggregate_key,
        occurred_at,
        correlation_id,
        causation_id,
        headers,
        content_type,
        payload,
    };
    if let Some(schema) = dataschema.filter(|s| !s.is_empty() && *s != envelope.dataschema()) {
        envelope.headers.insert(DATASCHEMA.to_owned(), schema);
    }
    Ok(envelope)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Envelope {
        let id = Uuid::now_v7();
        Envelope {
            id,
            message_type: "OrderPlaced".into(),
            version: 3,
            kind: Kind::Event,
            source: "checkout".into(),
            aggregate_type: "order".into(),
            aggregate_key: "ord-9f3a".into(),
            occurred_at: Utc::now(),
            correlation_id: Uuid::now_v7(),
            causation_id: Some(Uuid::now_v7()),
            headers: [
                ("traceparent".to_string(), "00-abc-def-01".to_string()),
                ("X-Tenant".to_string(), "acme".to_string()),
                ("kind".to_string(), "shadowed".to_string()),
            ]
            .into_iter()
            .collect(),
            content_type: "application/json".into(),
            payload: br#"{"z":1,"a":[true,null],"s":"\u00e9"}"#.to_vec(),
        }
    }

    #[test]
    fn a_redrive_reaches_back_to_when_its_message_occurred() {
        let mut e = sample();
        e.occurred_at = Utc::now() - chrono::Duration::days(2);
        let now = Utc::now();
        let mut letter = crate::DeadLetter {
            id: Uuid::now_v7(),
            consumer: "inventory".into(),
            topic: "orders".into(),
            message_id: Some(e.id),
            message_type: Some(e.message_type.clone()),
            aggregate_key: Some(e.aggregate_key.clone()),
            headers: Default::default(),
            body: to_json(&e),
            attempts: 1,
            errors: Vec::new(),
            created_at: now,
            redrives: 0,
            redriven_at: None,
            skipped_at: None,
        };
        assert_eq!(
            letter.reaches_back_to(),
            Some(e.occurred_at),
            "the other groups handled it then"
        );
        e.occurred_at = now + chrono::Duration::hours(1);
        letter.body = to_json(&e);
        assert_eq!(letter.reaches_back_to(), Some(now), "a clock ahead: the failure");
        letter.body = b"{not an envelope".to_vec();
        assert_eq!(letter.reaches_back_to(), Some(now));
        letter.consumer = crate::RELAY_LETTERS.into();
        assert_eq!(
            letter.reaches_back_to(),
            None,
            "the relay's never reached a consumer"
        );
    }

    #[test]
    fn json_round_trip_is_lossless() {
        let e = sample();
        let bytes = to_json(&e);
        let back = from_json(&bytes).unwrap();
        assert_eq!(back, e);
        let doc: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(doc["specversion"], "1.0");
        assert_eq!(doc["type"], "OrderPlaced");
        assert_eq!(doc["subject"], "ord-9f3a");
        assert_eq!(doc["dataschema"], "urn:tidings:schema:OrderPlaced:v3");
        assert_eq!(doc["traceparent"], "00-abc-def-01");
        assert_eq!(doc["data"]["z"], 1);
    }

    #[test]
    fn binary_payload_round_trips_through_base64() {
        let mut e = sample();
        e.content_type = "application/octet-stream".into();
        e.payload = vec![0, 159, 146, 150, 255];
        e.causation_id = None;
        e.headers.clear();
        let bytes = to_json(&e);
        let doc: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert!(doc.get("data").is_none());
        assert!(doc.get("causationid").is_none());
        assert_eq!(from_json(&bytes).unwrap(), e);
    }

    #[test]
    fn invalid_json_payload_falls_back_to_base64() {
        let mut e = sample();
        e.payload = b"{not json".to_vec();
        assert_eq!(from_json(&to_json(&e)).unwrap(), e);
    }

    #[test]
    fn binary_round_trip_is_lossless() {
        let e = sample();
        let (headers, body) = to_binary(&e, Binding::Standard);
        assert_eq!(body, e.payload);
        assert!(is_binary(headers.iter().map(|(k, _)| k.as_str())));
        assert!(headers.contains(&("ce-traceparent".to_owned(), "00-abc-def-01".to_owned())));
        assert!(headers.contains(&("X-Tenant".to_owned(), "acme".to_owned())));
        let back = from_binary(headers.iter().map(|(k, v)| (k.as_str(), v.as_str())), &body).unwrap();
        assert_eq!(back, e);
        // Transports may change the case of header names.
        let upper: Vec<(String, String)> = headers
            .iter()
            .map(|(k, v)| (k.to_uppercase(), v.clone()))
            .collect();
        let back = from_binary(upper.iter().map(|(k, v)| (k.as_str(), v.as_str())), &body).unwrap();
        assert_eq!(
            (back.id, back.version, back.causation_id),
            (e.id, e.version, e.causation_id)
        );
    }

    #[test]
    fn headers_named_like_attributes_keep_their_place_in_binary_mode() {
        // Found by the cloudevent_binary fuzz target: a header `ce-specversion`
        // (a foreign producer's `ce-ce-specversion`) was read back as the
        // attribute, and `Content-Type` would have replaced the content type.
        let mut e = sample();
        for name in ["ce-specversion", "CE-Type", "Content-Type", "ce-"] {
            e.headers.insert(name.to_owned(), "forged".to_owned());
        }
        let (headers, body) = to_binary(&e, Binding::Standard);
        let back = from_binary(headers.iter().map(|(k, v)| (k.as_str(), v.as_str())), &body).unwrap();
        assert_eq!(back, e);
        assert_eq!(from_json(&to_json(&e)).unwrap(), e);
    }

    #[test]
    fn a_json_payload_with_whitespace_around_it_keeps_every_byte() {
        // Found by the cloudevent_binary fuzz target: `data` embedded the
        // payload verbatim, and reading it back dropped the whitespace.
        let mut e = sample();
        e.payload = b"\n{\"total\": 1}\t\t".to_vec();
        let doc = to_json(&e);
        assert!(String::from_utf8_lossy(&doc).contains("data_base64"));
        assert_eq!(from_json(&doc).unwrap(), e);
    }

    #[test]
    fn a_time_that_cannot_be_written_back_is_refused() {
        // Found in review: these parse, but in UTC they fall outside the
        // years RFC 3339 can write, so the envelope could not be stored.
        for time in ["0000-01-01T00:00:00+01:00", "9999-12-31T23:59:59-00:01"] {
            let err = from_binary(
                [
                    ("ce-specversion", "1.0"),
                    ("ce-id", "0190aaaa-0000-7000-8000-000000000001"),
                    ("ce-source", "s"),
                    ("ce-type", "T"),
                    ("ce-time", time),
                ],
                b"{}",
            )
            .unwrap_err();
            assert!(err.to_string().contains("attribute `time`"), "{err}");
        }
    }

    #[test]
    fn binary_mode_names_a_missing_attribute() {
        let err = from_binary([("ce-specversion", "1.0"), ("ce-source", "s")], b"{}").unwrap_err();
        assert!(err.to_string().contains("`id`"), "{err}");
    }

    #[test]
    fn foreign_extensions_become_headers() {
        let doc = br#"{"specversion":"1.0","id":"0190f0a0-0000-7000-8000-000000000001","source":"x","type":"T","time":"2026-02-04T10:15:30Z","tenant":"k","data":{"a":1}}"#;
        let e = from_json(doc).unwrap();
        assert_eq!(e.headers.get("tenant").map(String::as_str), Some("k"));
        assert_eq!(e.version, 1);
        assert_eq!(e.kind, Kind::Event);
        assert_eq!(e.payload, br#"{"a":1}"#);
    }

    #[test]
    fn any_spec_valid_event_reads_and_passes_on_what_it_carried() {
        // The seed's own example id, no `time`, an unknown extension, a
        // `correlationid` of another scheme and a foreign `dataschema`.
        let doc = br#"{"specversion":"1.0","id":"evt_01J8K2","source":"https://pay.example/hooks","type":"payment.succeeded","subject":"inv-7","tenant":"acme","correlationid":"flow-12","dataschema":"https://pay.example/schemas/payment.json","data":{"amount":1200}}"#;
        let before = Utc::now();
        let e = from_json(doc).unwrap();
        assert_eq!(e.id, foreign_id("https://pay.example/hooks", "evt_01J8K2"));
        assert_eq!(e.event_id(), "evt_01J8K2");
        assert!(e.occurred_at >= before, "no `time`: the time it was read");
        assert_eq!(e.aggregate_key, "inv-7");
        assert_eq!(e.correlation_id, e.id);
        for (name, value) in [
            ("tenant", "acme"),
            ("correlationid", "flow-12"),
            ("dataschema", "https://pay.example/schemas/payment.json"),
        ] {
            assert_eq!(e.headers.get(name).map(String::as_str), Some(value), "{name}");
        }
        // Passed on, it is the same event: same id, same attributes.
        for wire in [to_json(&e), {
            let (h, b) = to_binary(&e, Binding::Kafka);
            assert!(h.contains(&("ce_id".to_owned(), "evt_01J8K2".to_owned())));
            assert!(h.contains(&("ce_tenant".to_owned(), "acme".to_owned())));
            from_binary(h.iter().map(|(k, v)| (k.as_str(), v.as_str())), &b)
                .map(|e| to_json(&e))
                .unwrap()
        }] {
            let doc: serde_json::Value = serde_json::from_slice(&wire).unwrap();
            assert_eq!(doc["id"], "evt_01J8K2");
            assert_eq!(doc["tenant"], "acme");
            assert_eq!(doc["dataschema"], "https://pay.example/schemas/payment.json");
            assert!(doc.get(FOREIGN_ID_HEADER).is_none());
            assert_eq!(from_json(&wire).unwrap(), e);
        }
        // The same id from another source is another event.
        assert_ne!(foreign_id("https://other.example", "evt_01J8K2"), e.id);
    }

    #[test]
    fn an_attribute_set_to_null_is_not_set() {
        let doc = br#"{"specversion":"1.0","id":"a1","source":"s","type":"T","subject":null,"time":null,"datacontenttype":null,"dataschema":null,"tenant":null,"data":{"a":1}}"#;
        let e = from_json(doc).unwrap();
        assert_eq!(e.aggregate_key, "");
        assert_eq!(e.content_type, "application/json");
        assert!(
            !e.headers.contains_key("tenant") && !e.headers.contains_key("dataschema"),
            "{:?}",
            e.headers
        );
    }

    #[test]
    fn the_key_is_the_partition_key_then_the_subject_then_the_record_key() {
        let base = r#""specversion":"1.0","id":"a1","source":"s","type":"T""#;
        let doc = format!(r#"{{{base},"partitionkey":"cust-1","subject":"file.pdf"}}"#);
        let e = decode_json(doc.as_bytes(), Some("rec")).unwrap();
        assert_eq!(e.aggregate_key, "cust-1");
        assert_eq!(e.headers.get("subject").map(String::as_str), Some("file.pdf"));
        let doc: serde_json::Value = serde_json::from_slice(&to_json(&e)).unwrap();
        assert_eq!(
            (doc["partitionkey"].as_str(), doc["subject"].as_str()),
            (Some("cust-1"), Some("file.pdf"))
        );
        let e = decode_json(
            format!(r#"{{{base},"subject":"file.pdf"}}"#).as_bytes(),
            Some("rec"),
        )
        .unwrap();
        assert_eq!(e.aggregate_key, "file.pdf");
        let e = decode_json(format!("{{{base}}}").as_bytes(), Some("rec")).unwrap();
        assert_eq!(e.aggregate_key, "rec");
        let e = decode_json(format!("{{{base}}}").as_bytes(), None).unwrap();
        assert_eq!(e.aggregate_key, "");
        // No key: neither `subject` nor `partitionkey` (a subject is never empty).
        let doc: serde_json::Value = serde_json::from_slice(&to_json(&e)).unwrap();
        assert!(doc.get("subject").is_none() && doc.get("partitionkey").is_none());
    }

    #[test]
    fn kafka_writes_ce_underscore_and_every_transport_reads_both() {
        let e = sample();
        let (kafka, body) = to_binary(&e, Binding::Kafka);
        assert!(kafka.iter().all(|(k, _)| !k.starts_with("ce-")), "{kafka:?}");
        for attribute in [
            "ce_specversion",
            "ce_id",
            "ce_type",
            "ce_time",
            "ce_traceparent",
            "content-type",
        ] {
            assert!(
                kafka.iter().any(|(k, _)| k == attribute),
                "{attribute}: {kafka:?}"
            );
        }
        assert!(kafka.contains(&("ce_partitionkey".to_owned(), "ord-9f3a".to_owned())));
        let back = from_binary(kafka.iter().map(|(k, v)| (k.as_str(), v.as_str())), &body).unwrap();
        assert_eq!(back, e);
        assert!(is_binary(kafka.iter().map(|(k, _)| k.as_str())));
        // An attribute under both prefixes is read from `ce-`.
        let e2 = from_binary(
            [
                ("ce_specversion", "1.0"),
                ("ce_id", "x"),
                ("ce-id", "y"),
                ("ce_source", "s"),
                ("ce_type", "T"),
            ],
            b"{}",
        )
        .unwrap();
        assert_eq!(e2.event_id(), "y");
    }

    #[test]
    fn structured_mode_is_one_document_with_its_media_type() {
        let e = sample();
        let (headers, body) = encode(&e, Binding::Kafka, ContentMode::Structured);
        assert_eq!(
            headers,
            vec![("content-type".to_owned(), CONTENT_TYPE.to_owned())]
        );
        assert_eq!(from_json(&body).unwrap(), e);
    }

    #[test]
    fn malformed_documents_name_the_attribute() {
        let cases: &[(&[u8], &str)] = &[
            (b"not json", "not a CloudEvents JSON object"),
            (br#"{"id":"x"}"#, "specversion"),
            (br#"{"specversion":"0.3"}"#, "specversion"),
            (br#"{"specversion":"1.0","id":""}"#, "`id` is empty"),
            (br#"{"specversion":"1.0","id":7}"#, "`id` must be a string"),
            (br#"{"specversion":"1.0","id":"a","type":"T"}"#, "`source`"),
            (
                br#"{"specversion":"1.0","id":"a","source":"s","type":"T","time":"yesterday"}"#,
                "`time`",
            ),
        ];
        for (doc, needle) in cases {
            let err = from_json(doc).unwrap_err();
            assert!(matches!(err, DecodeError::Malformed { .. }), "{err:?}");
            assert!(err.to_string().contains(needle), "{err} should mention {needle}");
        }
    }
}
