//! CloudEvents 1.0 JSON (structured mode), lossless both ways.
//!
//! | Envelope field   | CloudEvents attribute |
//! |------------------|-----------------------|
//! | `id`             | `id`                  |
//! | `source`         | `source`              |
//! | `message_type`   | `type`                |
//! | `aggregate_key`  | `subject`             |
//! | `occurred_at`    | `time` (RFC 3339)     |
//! | `content_type`   | `datacontenttype`     |
//! | `payload`        | `data` (JSON payloads, embedded verbatim when they have no whitespace around them) or `data_base64` |
//! | `version`        | `schemaversion` (extension, integer), and `dataschema`: the registry's `$id` of the type's schema at that version (`urn:tidings:schema:OrderPlaced:v1`, [`Envelope::dataschema`]) |
//! | `kind`           | `kind` (extension: `event` or `command`) |
//! | `aggregate_type` | `aggregatetype` (extension) |
//! | `correlation_id` | `correlationid` (extension) |
//! | `causation_id`   | `causationid` (extension, absent when none) |
//! | `headers`        | one extension per header whose name is a valid extension name (`traceparent`), the others in `tidingsheaders` (a JSON object in a string) |
//!
//! On decode, extensions Tidings does not know become headers, so messages
//! from other CloudEvents producers keep everything they carried.

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
    map.serialize_entry("specversion", "1.0")?;
    map.serialize_entry("id", &e.id.to_string())?;
    map.serialize_entry("source", &e.source)?;
    map.serialize_entry("type", &e.message_type)?;
    map.serialize_entry("subject", &e.aggregate_key)?;
    map.serialize_entry(
        "time",
        &e.occurred_at.to_rfc3339_opts(SecondsFormat::AutoSi, true),
    )?;
    map.serialize_entry("datacontenttype", &e.content_type)?;
    map.serialize_entry("dataschema", &e.dataschema())?;
    map.serialize_entry("schemaversion", &e.version)?;
    map.serialize_entry("kind", e.kind.as_str())?;
    map.serialize_entry("aggregatetype", &e.aggregate_type)?;
    map.serialize_entry("correlationid", &e.correlation_id.to_string())?;
    if let Some(c) = e.causation_id {
        map.serialize_entry("causationid", &c.to_string())?;
    }
    let mut other = BTreeMap::new();
    for (k, v) in &e.headers {
        if is_extension_name(k) {
            map.serialize_entry(k, v)?;
        } else {
            other.insert(k, v);
        }
    }
    if !other.is_empty() {
        let packed = serde_json::to_string(&other).map_err(serde::ser::Error::custom)?;
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
/// Every missing or ill-typed attribute is reported by name.
pub fn from_json(bytes: &[u8]) -> Result<Envelope, DecodeError> {
    let attrs: BTreeMap<String, Box<RawValue>> = serde_json::from_slice(bytes)
        .map_err(|e| malformed(format!("not a CloudEvents JSON object: {e}")))?;
    from_attributes(attrs, None)
}

/// The header that carries `datacontenttype` in binary mode.
pub const CONTENT_TYPE_HEADER: &str = "content-type";
const BINARY_PREFIX: &str = "ce-";

/// Encodes an envelope in binary mode: every attribute a `ce-` header, the
/// content type in `content-type`, the payload as the body. Envelope headers
/// that are valid extension names travel as `ce-<name>`; those that would
/// read back as an attribute (`ce-...`, `content-type`, in any case) packed
/// in `ce-tidingsheaders`; the others as plain headers of the same name.
pub fn to_binary(e: &Envelope) -> (Vec<(String, String)>, Vec<u8>) {
    let mut h = vec![
        ("ce-specversion".to_owned(), "1.0".to_owned()),
        ("ce-id".to_owned(), e.id.to_string()),
        ("ce-source".to_owned(), e.source.clone()),
        ("ce-type".to_owned(), e.message_type.clone()),
        ("ce-subject".to_owned(), e.aggregate_key.clone()),
        (
            "ce-time".to_owned(),
            e.occurred_at.to_rfc3339_opts(SecondsFormat::AutoSi, true),
        ),
        (CONTENT_TYPE_HEADER.to_owned(), e.content_type.clone()),
        ("ce-dataschema".to_owned(), e.dataschema()),
        ("ce-schemaversion".to_owned(), e.version.to_string()),
        ("ce-kind".to_owned(), e.kind.as_str().to_owned()),
        ("ce-aggregatetype".to_owned(), e.aggregate_type.clone()),
        ("ce-correlationid".to_owned(), e.correlation_id.to_string()),
    ];
    if let Some(c) = e.causation_id {
        h.push(("ce-causationid".to_owned(), c.to_string()));
    }
    let mut packed = BTreeMap::new();
    for (k, v) in &e.headers {
        if is_extension_name(k) {
            h.push((format!("{BINARY_PREFIX}{k}"), v.clone()));
        } else if reads_as_attribute(k) {
            // `ce-id` or `Content-Type` as a plain header would be read
            // back as an attribute: it travels packed, as in structured mode.
            packed.insert(k, v);
        } else {
            h.push((k.clone(), v.clone()));
        }
    }
    if !packed.is_empty() {
        let packed = serde_json::to_string(&packed).expect("a map of strings serializes");
        h.push(("ce-tidingsheaders".to_owned(), packed));
    }
    (h, e.payload.clone())
}

/// Whether a plain header of this name would be read as an attribute in
/// binary mode (`ce-` anything, or the content type, in any case).
fn reads_as_attribute(name: &str) -> bool {
    name.get(..BINARY_PREFIX.len())
        .is_some_and(|p| p.eq_ignore_ascii_case(BINARY_PREFIX))
        || name.eq_ignore_ascii_case(CONTENT_TYPE_HEADER)
}

/// Whether transport headers carry a binary-mode CloudEvent.
pub fn is_binary<'a>(mut header_names: impl Iterator<Item = &'a str>) -> bool {
    header_names.any(|n| n.eq_ignore_ascii_case("ce-specversion"))
}

/// Whether a binary-mode header carries a CloudEvents attribute: `ce-…` or
/// `content-type`, in any case.
pub fn is_attribute_header(name: &str) -> bool {
    name.get(..BINARY_PREFIX.len())
        .is_some_and(|prefix| prefix.eq_ignore_ascii_case(BINARY_PREFIX))
        || name.eq_ignore_ascii_case(CONTENT_TYPE_HEADER)
}

/// Decodes a binary-mode message (see [`to_binary`]). Header names are
/// matched without regard to case, as transports may change it. Headers
/// that are neither `ce-` attributes nor `content-type` become envelope headers.
pub fn from_binary<'a>(
    headers: impl IntoIterator<Item = (&'a str, &'a str)>,
    body: &[u8],
) -> Result<Envelope, DecodeError> {
    let mut attrs: BTreeMap<String, Box<RawValue>> = BTreeMap::new();
    let mut plain = Headers::new();
    for (name, value) in headers {
        let lower = name.to_ascii_lowercase();
        let json =
            || RawValue::from_string(serde_json::Value::from(value).to_string()).expect("a JSON string");
        if let Some(attr) = lower.strip_prefix(BINARY_PREFIX) {
            attrs.insert(attr.to_owned(), json());
        } else if lower == CONTENT_TYPE_HEADER {
            attrs.insert("datacontenttype".to_owned(), json());
        } else {
            plain.insert(name.to_owned(), value.to_owned());
        }
    }
    let mut envelope = from_attributes(attrs, Some(body.to_vec()))?;
    envelope.headers.extend(plain);
    Ok(envelope)
}

/// Builds an envelope from CloudEvents attributes; `payload` is the body in
/// binary mode, or `None` to read `data`/`data_base64` from the attributes.
fn from_attributes(
    mut attrs: BTreeMap<String, Box<RawValue>>,
    payload: Option<Vec<u8>>,
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
    fn uuid(name: &str, s: &str) -> Result<Uuid, DecodeError> {
        Uuid::parse_str(s).map_err(|_| malformed(format!("attribute `{name}` must be a UUID, got {s:?}")))
    }

    let spec = required(&mut attrs, "specversion")?;
    if spec != "1.0" {
        return Err(malformed(format!(
            "unsupported specversion {spec:?} (expected \"1.0\")"
        )));
    }
    let id = uuid("id", &required(&mut attrs, "id")?)?;
    let source = required(&mut attrs, "source")?;
    let message_type = required(&mut attrs, "type")?;
    if message_type.is_empty() {
        return Err(malformed("attribute `type` is empty"));
    }
    let aggregate_key = string(&mut attrs, "subject")?.unwrap_or_default();
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
        None => return Err(malformed("missing attribute `time`")),
    };
    let content_type =
        string(&mut attrs, "datacontenttype")?.unwrap_or_else(|| crate::envelope::JSON.to_owned());
    let version = match attrs.remove("schemaversion") {
        None => 1,
        Some(raw) => {
            let v: serde_json::Value = serde_json::from_str(raw.get()).unwrap_or(serde_json::Value::Null);
            // Binary-mode transports carry every attribute as a string.
            v.as_u64()
                .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| malformed("attribute `schemaversion` must be a positive integer"))?
        }
    };
    let kind = match string(&mut attrs, "kind")? {
        None => Kind::Event,
        Some(k) => Kind::parse(&k)
            .ok_or_else(|| malformed(format!("attribute `kind` must be event or command, got {k:?}")))?,
    };
    let aggregate_type = string(&mut attrs, "aggregatetype")?.unwrap_or_default();
    let correlation_id = match string(&mut attrs, "correlationid")? {
        Some(s) => uuid("correlationid", &s)?,
        None => id,
    };
    let causation_id = string(&mut attrs, "causationid")?
        .map(|s| uuid("causationid", &s))
        .transpose()?;
    let mut headers = Headers::new();
    if let Some(packed) = string(&mut attrs, "tidingsheaders")? {
        let map: BTreeMap<String, String> = serde_json::from_str(&packed)
            .map_err(|_| malformed("attribute `tidingsheaders` must be a JSON object of strings"))?;
        headers.extend(map);
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
    attrs.remove("dataschema");
    for (name, raw) in attrs {
        let value = serde_json::from_str::<String>(raw.get()).unwrap_or_else(|_| raw.get().to_owned());
        headers.insert(name, value);
    }
    Ok(Envelope {
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
    })
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
        let (headers, body) = to_binary(&e);
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
        let (headers, body) = to_binary(&e);
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
        let doc = br#"{"specversion":"1.0","id":"0190f0a0-0000-7000-8000-000000000001","source":"x","type":"T","time":"2026-02-04T10:15:30Z","partitionkey":"k","data":{"a":1}}"#;
        let e = from_json(doc).unwrap();
        assert_eq!(e.headers.get("partitionkey").map(String::as_str), Some("k"));
        assert_eq!(e.version, 1);
        assert_eq!(e.kind, Kind::Event);
        assert_eq!(e.payload, br#"{"a":1}"#);
    }

    #[test]
    fn malformed_documents_name_the_attribute() {
        let cases: &[(&[u8], &str)] = &[
            (b"not json", "not a CloudEvents JSON object"),
            (br#"{"id":"x"}"#, "specversion"),
            (br#"{"specversion":"0.3"}"#, "specversion"),
            (br#"{"specversion":"1.0","id":"nope"}"#, "`id`"),
            (
                br#"{"specversion":"1.0","id":"0190f0a0-0000-7000-8000-000000000001","source":"s","type":"T"}"#,
                "`time`",
            ),
            (
                br#"{"specversion":"1.0","id":"0190f0a0-0000-7000-8000-000000000001","source":"s","type":"T","time":"2026-01-01T00:00:00Z","kind":"query"}"#,
                "`kind`",
            ),
        ];
        for (doc, needle) in cases {
            let err = from_json(doc).unwrap_err();
            assert!(matches!(err, DecodeError::Malformed { .. }), "{err:?}");
            assert!(err.to_string().contains(needle), "{err} should mention {needle}");
        }
    }
}
