//! A binary-mode CloudEvent as any transport hands it over: headers and a
//! body, read through `RawMessage::decode`. The input is a header block,
//! `name: value` lines up to a blank line, then the body, so that the
//! committed seeds read as messages. Decoding never panics, and what
//! decodes survives both encodings unchanged.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tidings_core::{Headers, RawMessage};

/// The header block and the body of `data`.
fn split(data: &[u8]) -> (Headers, Vec<u8>) {
    let (block, body) = match data.windows(2).position(|w| w == b"\n\n") {
        Some(end) => (&data[..end], &data[end + 2..]),
        None => (data, &[][..]),
    };
    let headers = String::from_utf8_lossy(block)
        .lines()
        .filter_map(|line| line.split_once(": "))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    (headers, body.to_vec())
}

fuzz_target!(|data: &[u8]| {
    let (headers, body) = split(data);
    let raw = RawMessage {
        topic: "fuzz".to_owned(),
        key: None,
        headers,
        body,
        refused: None,
    };
    if let Ok(envelope) = raw.decode() {
        tidings_fuzz::assert_round_trips(&envelope);
    }
});
