//! A JetStream message with any headers (repeated names, JetStream's own
//! `Nats-` headers among them) and any payload, read as the NATS subscriber
//! reads it. Reading and decoding never panic, and JetStream's headers
//! never reach the message.
#![no_main]

use std::str::FromStr;

use async_nats::{HeaderMap, HeaderName, HeaderValue};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: (Vec<(String, String)>, Vec<u8>)| {
    let (pairs, payload) = input;
    let mut headers = HeaderMap::new();
    for (name, value) in &pairs {
        // The wire cannot carry what these refuse; the client never hands it over.
        if let (Ok(name), Ok(value)) = (HeaderName::from_str(name), HeaderValue::from_str(value)) {
            headers.append(name, value);
        }
    }
    let raw = tidings_broker_nats::raw_message("fuzz", Some(&headers), &payload);
    assert!(
        raw.headers.keys().all(|k| !k.starts_with("Nats-")),
        "JetStream's headers reached the message: {raw:?}"
    );
    // A structured body may name any attribute, `Nats-` ones included: only
    // the transport's own headers are checked above.
    let _ = raw.decode();
});
