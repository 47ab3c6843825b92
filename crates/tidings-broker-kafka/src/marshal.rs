//! Records and Tidings' messages: headers out, raw messages in.

use rdkafka::Message as _;
use rdkafka::message::{BorrowedMessage, Header, Headers as _, OwnedHeaders};
use tidings_core::{Headers, RawMessage};

/// The record headers of an envelope's binary-mode attributes.
pub(crate) fn record_headers(headers: &[(String, String)]) -> OwnedHeaders {
    headers.iter().fold(OwnedHeaders::new(), |h, (k, v)| {
        h.insert(Header {
            key: k.as_str(),
            value: Some(v.as_bytes()),
        })
    })
}

/// The raw message of a record read from `topic`.
pub(crate) fn raw_message(topic: &str, m: &BorrowedMessage<'_>) -> RawMessage {
    let mut headers = Headers::new();
    if let Some(h) = m.headers() {
        for header in h.iter() {
            if let Some(value) = header.value {
                headers.insert(header.key.to_owned(), String::from_utf8_lossy(value).into_owned());
            }
        }
    }
    RawMessage {
        topic: topic.to_owned(),
        key: m.key().map(|k| String::from_utf8_lossy(k).into_owned()),
        headers,
        body: m.payload().unwrap_or_default().to_vec(),
        refused: None,
    }
}
