//! Records and Tidings' messages: headers out, raw messages in.

use rdkafka::Message as _;
use rdkafka::message::{BorrowedMessage, Header, Headers as _, OwnedHeaders};
use tidings_core::RawMessage;

/// The record headers of an envelope's binary-mode attributes.
pub(crate) fn record_headers(headers: &[(String, String)]) -> OwnedHeaders {
    headers.iter().fold(OwnedHeaders::new(), |h, (k, v)| {
        h.insert(Header {
            key: k.as_str(),
            value: Some(v.as_bytes()),
        })
    })
}

/// The raw message of a record read from `topic`, its headers read as
/// [`RawMessage::from_record`] reads them.
pub(crate) fn raw_message(topic: &str, m: &BorrowedMessage<'_>) -> RawMessage {
    let headers = m.headers();
    RawMessage::from_record(
        topic,
        m.key(),
        headers.iter().flat_map(|h| h.iter()).map(|h| (h.key, h.value)),
        m.payload().unwrap_or_default(),
    )
}
