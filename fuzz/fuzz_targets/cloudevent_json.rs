//! A structured-mode CloudEvents JSON document, as any producer may write
//! one: decoding never panics, and what decodes survives both encodings
//! unchanged (structured JSON, and binary mode's headers and body).
#![no_main]

use libfuzzer_sys::fuzz_target;
use tidings_core::cloudevents;

fuzz_target!(|data: &[u8]| {
    if let Ok(envelope) = cloudevents::from_json(data) {
        tidings_fuzz::assert_round_trips(&envelope);
    }
});
