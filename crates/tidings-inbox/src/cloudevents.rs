//! CloudEvents over HTTP, as the HTTP protocol binding writes them: binary
//! mode (`ce-` headers, their values percent-encoded), structured mode
//! (`application/cloudevents+json`) and batches
//! (`application/cloudevents-batch+json`, a JSON array of structured
//! events).

use axum::http::{HeaderMap, StatusCode, header};
use serde_json::value::RawValue;
use tidings_core::Envelope;
use tidings_core::cloudevents::{self, BATCH_CONTENT_TYPE, CONTENT_TYPE, CONTENT_TYPE_HEADER};

use crate::deliver::Outcome;

/// The events of one request, and whether it was a batch.
#[derive(Debug)]
pub(crate) struct Events {
    pub(crate) envelopes: Vec<Envelope>,
    pub(crate) batch: bool,
}

/// Reads the CloudEvents a request carries, or why it carries none.
pub(crate) fn read(headers: &HeaderMap, body: &[u8]) -> Result<Events, Outcome> {
    let malformed = |reason: String| Outcome::refused(StatusCode::BAD_REQUEST, "malformed", reason);
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let one = |envelope| Events {
        envelopes: vec![envelope],
        batch: false,
    };
    if headers.contains_key("ce-specversion") {
        // Only the attributes and the content type: the request's other
        // headers (its Authorization among them) are not the event's.
        let mut attributes = Vec::new();
        for (name, value) in headers {
            let name = name.as_str();
            if !(name.starts_with("ce-") || name == CONTENT_TYPE_HEADER) {
                continue;
            }
            let decoded = value
                .to_str()
                .ok()
                .and_then(|v| percent_encoding::percent_decode_str(v).decode_utf8().ok())
                .ok_or_else(|| malformed(format!("the header {name} is not percent-encoded UTF-8")))?;
            attributes.push((name.to_owned(), decoded.into_owned()));
        }
        let envelope =
            cloudevents::from_binary(attributes.iter().map(|(k, v)| (k.as_str(), v.as_str())), body)
                .map_err(|e| malformed(format!("not a CloudEvent in binary mode: {e}")))?;
        return Ok(one(envelope));
    }
    if essence == CONTENT_TYPE {
        let envelope = cloudevents::from_json(body)
            .map_err(|e| malformed(format!("not a structured CloudEvent: {e}")))?;
        return Ok(one(envelope));
    }
    if essence == BATCH_CONTENT_TYPE {
        let events: Vec<Box<RawValue>> = serde_json::from_slice(body)
            .map_err(|e| malformed(format!("a batch is a JSON array of CloudEvents: {e}")))?;
        if events.is_empty() {
            return Err(malformed("the batch is empty".into()));
        }
        if events.len() > crate::MAX_BATCH_EVENTS {
            return Err(Outcome::refused(
                StatusCode::PAYLOAD_TOO_LARGE,
                "too_large",
                format!(
                    "the batch holds {} events, more than this inbox's {}: send smaller batches",
                    events.len(),
                    crate::MAX_BATCH_EVENTS
                ),
            ));
        }
        let envelopes = events
            .iter()
            .enumerate()
            .map(|(i, raw)| {
                cloudevents::from_json(raw.get().as_bytes())
                    .map_err(|e| malformed(format!("event {} of the batch: {e}", i + 1)))
            })
            .collect::<Result<Vec<_>, _>>()?;
        return Ok(Events {
            envelopes,
            batch: true,
        });
    }
    Err(Outcome::refused(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "unsupported",
        format!(
            "not a CloudEvent: send binary mode (ce- headers), {CONTENT_TYPE} or {BATCH_CONTENT_TYPE}, \
             not {content_type:?}"
        ),
    ))
}
