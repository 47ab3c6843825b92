//! Envelopes as Pub/Sub messages (data and attributes), after the
//! CloudEvents Pub/Sub binding, and Pub/Sub messages back as raw messages.

use std::collections::HashMap;

use tidings_core::cloudevents::{self, Binding, ContentMode};
use tidings_core::{Envelope, Headers, RawMessage};

/// Pub/Sub's limits on attributes: how many, a name's and a value's bytes.
const MAX_ATTRIBUTES: usize = 100;
const MAX_NAME_BYTES: usize = 256;
const MAX_VALUE_BYTES: usize = 1024;

/// A message as Pub/Sub takes it.
#[derive(Debug)]
pub(crate) struct Encoded {
    pub(crate) data: Vec<u8>,
    pub(crate) attributes: Vec<(String, String)>,
}

impl Encoded {
    /// The size Pub/Sub counts: the data, and each attribute's name and value.
    pub(crate) fn size(&self) -> usize {
        self.data.len()
            + self
                .attributes
                .iter()
                .map(|(k, v)| k.len() + v.len())
                .sum::<usize>()
    }
}

/// Whether Pub/Sub takes `attributes` as they are.
fn attributes_fit(attributes: &[(String, String)]) -> bool {
    attributes.len() <= MAX_ATTRIBUTES
        && attributes.iter().all(|(k, v)| {
            !k.is_empty() && k.len() <= MAX_NAME_BYTES && v.len() <= MAX_VALUE_BYTES && !k.starts_with("goog")
        })
}

/// `envelope` for Pub/Sub, in the binding's binary mode (`ce-` attributes,
/// the payload as data) where its attributes keep within Pub/Sub's limits
/// (100 attributes, names up to 256 bytes, values up to 1024, none named
/// `goog...`), else in structured mode (the event as one
/// `application/cloudevents+json` document): every event travels whole.
pub(crate) fn encode(envelope: &Envelope) -> Encoded {
    let (attributes, data) = cloudevents::encode(envelope, Binding::Standard, ContentMode::Binary);
    if attributes_fit(&attributes) {
        return Encoded { data, attributes };
    }
    let (attributes, data) = cloudevents::encode(envelope, Binding::Standard, ContentMode::Structured);
    Encoded { data, attributes }
}

/// How Tidings reads a Pub/Sub message of `topic`: its attributes as
/// headers, its key from `ce-partitionkey` or `ce-subject`. Public so that
/// tools (and the fuzz targets) read Pub/Sub messages exactly as the
/// subscriber does.
pub fn raw_message(topic: &str, attributes: &HashMap<String, String>, data: &[u8]) -> RawMessage {
    let mut headers = Headers::new();
    for (name, value) in attributes {
        headers.insert(name.clone(), value.clone());
    }
    RawMessage::from_headers(topic, headers, data.to_vec(), None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tidings_core::{Kind, Message};

    #[derive(serde::Serialize, serde::Deserialize)]
    struct Placed {
        order: u32,
    }

    impl Message for Placed {
        const TYPE: &'static str = "Placed";
        const VERSION: u32 = 1;
        const KIND: Kind = Kind::Event;
        const AGGREGATE: &'static str = "order";
        const TOPIC: &'static str = "orders";
        fn key(&self) -> String {
            format!("o-{}", self.order)
        }
    }

    fn back(encoded: &Encoded) -> Envelope {
        let attributes: HashMap<String, String> = encoded.attributes.iter().cloned().collect();
        raw_message("orders", &attributes, &encoded.data)
            .decode()
            .unwrap()
    }

    #[test]
    fn an_event_travels_in_binary_mode() {
        let e = Envelope::new("test", &Placed { order: 7 }).unwrap();
        let encoded = encode(&e);
        assert!(
            encoded
                .attributes
                .iter()
                .any(|(k, v)| k == "ce-type" && v == "Placed")
        );
        assert_eq!(encoded.data, e.payload);
        let back = back(&encoded);
        assert_eq!((back.id, back.aggregate_key.as_str()), (e.id, "o-7"));
    }

    #[test]
    fn attributes_past_pubsubs_limits_travel_in_the_document() {
        let mut e = Envelope::new("test", &Placed { order: 8 }).unwrap();
        e.headers.insert("x-long".into(), "v".repeat(2000));
        for i in 0..120 {
            e.headers.insert(format!("x{i}"), "v".into());
        }
        let encoded = encode(&e);
        assert!(attributes_fit(&encoded.attributes));
        assert!(
            encoded
                .attributes
                .iter()
                .any(|(_, v)| v == "application/cloudevents+json")
        );
        let back = back(&encoded);
        assert_eq!(back.id, e.id);
        assert_eq!(back.headers.get("x-long").map(String::len), Some(2000));
        assert_eq!(back.headers.get("x119").map(String::as_str), Some("v"));
    }
}
