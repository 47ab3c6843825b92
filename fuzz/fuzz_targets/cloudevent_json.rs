//! A structured-mode CloudEvents JSON document, as any producer may write
//! one: decoding never panics, and what decodes survives both encodings
//! unchanged (structured JSON, and binary mode's headers and body).
#![no_main]

use libfuzzer_sys::fuzz_target;
use tidings_core::cloudevents;

fuzz_target!(|data: &[u8]| {
    if let Ok(envelope) = cloudevents::from_json(data) {
        let json = cloudevents::to_json(&envelope);
        let again = cloudevents::from_json(&json).expect("Tidings' own JSON decodes");
        assert!(
            again == envelope,
            "structured mode changed {envelope:?} into {again:?}"
        );

        let (headers, body) = cloudevents::to_binary(&envelope);
        let pairs = headers.iter().map(|(k, v)| (k.as_str(), v.as_str()));
        let again = cloudevents::from_binary(pairs, &body).expect("Tidings' own binary mode decodes");
        assert!(
            again == envelope,
            "binary mode changed {envelope:?} into {again:?}"
        );
    }
});
