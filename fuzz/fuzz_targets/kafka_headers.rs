//! A Kafka record with any headers (names repeated, values missing or not
//! UTF-8), any key and any body, read as the Kafka subscriber reads it.
//! Reading and decoding never panic; a CloudEvents attribute is never
//! patched into other text: it arrives byte for byte, or the message is
//! refused naming it; a `ce-` attribute the record also carries as Kafka's
//! `ce_` is left out.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tidings_core::RawMessage;
use tidings_core::cloudevents::is_attribute_header;

/// A record header: a name and a value, or none.
type Header = (String, Option<Vec<u8>>);

fuzz_target!(|input: (Option<Vec<u8>>, Vec<Header>, Vec<u8>)| {
    let (key, headers, body) = input;
    let raw = RawMessage::from_record(
        "fuzz",
        key.as_deref(),
        headers.iter().map(|(k, v)| (k.as_str(), v.as_deref())),
        &body,
    );
    // The first value of each name, as the record carries it.
    // An attribute is one whatever the case of its name.
    for (i, (name, value)) in headers.iter().enumerate() {
        let Some(value) = value else { continue };
        let first = headers
            .iter()
            .position(|(k, v)| v.is_some() && k.eq_ignore_ascii_case(name));
        if first != Some(i) || !is_attribute_header(name) {
            continue;
        }
        let attribute = |k: &str, prefix: &str| {
            k.get(..3)
                .filter(|p| p.eq_ignore_ascii_case(prefix))
                .map(|_| k[3..].to_ascii_lowercase())
        };
        let shadowed = attribute(name, "ce-").is_some_and(|a| {
            headers
                .iter()
                .any(|(k, v)| v.is_some() && attribute(k, "ce_").as_deref() == Some(a.as_str()))
        });
        if shadowed {
            assert!(
                !raw.headers.contains_key(name),
                "{name} is shadowed by Kafka's ce_"
            );
            continue;
        }
        match std::str::from_utf8(value) {
            Ok(text) => assert_eq!(raw.headers.get(name).map(String::as_str), Some(text)),
            Err(_) => {
                let reason = raw
                    .refused
                    .as_deref()
                    .expect("a non-text attribute refuses the message");
                assert!(!raw.headers.contains_key(name), "{name} was patched into text");
                assert!(reason.starts_with("header "), "{reason}");
            }
        }
    }
    match (&raw.refused, raw.decode()) {
        (Some(reason), Err(e)) => assert!(e.to_string().contains(reason.as_str())),
        (Some(reason), Ok(_)) => panic!("a refused message decoded ({reason})"),
        (None, _) => {}
    }
});
