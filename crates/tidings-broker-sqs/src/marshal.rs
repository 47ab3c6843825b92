//! Envelopes as SNS messages (a body and message attributes), and SQS
//! messages back as raw messages.

use std::collections::HashMap;

use aws_sdk_sqs::types::MessageAttributeValue;
use tidings_core::cloudevents::{self, Binding, ContentMode};
use tidings_core::{Envelope, Headers, RawMessage};

/// The message attribute naming a message's partition, which the group's
/// per-partition subscriptions filter on.
pub(crate) const PARTITION_ATTRIBUTE: &str = "tidings-partition";

/// A message as SNS takes it.
#[derive(Debug)]
pub(crate) struct Encoded {
    pub(crate) body: String,
    /// Every message attribute, strings, the partition's included.
    pub(crate) attributes: Vec<(String, String)>,
}

impl Encoded {
    /// The size SNS and SQS count: the body, and each attribute's name,
    /// type (`String`) and value.
    pub(crate) fn size(&self) -> usize {
        self.body.len()
            + self
                .attributes
                .iter()
                .map(|(k, v)| k.len() + "String".len() + v.len())
                .sum::<usize>()
    }

    /// Whether SNS takes the body and every value as text.
    pub(crate) fn text_fits(&self) -> bool {
        text_fits(&self.body) && self.attributes.iter().all(|(_, v)| text_fits(v))
    }
}

/// The CloudEvents attributes repeated as message attributes, where
/// subscription filter policies and consoles can see them.
const SHOWN: &[&str] = &["ce-id", "ce-type", "ce-source", "ce-subject", "ce-partitionkey"];

/// Whether SQS takes `text` as a body or value: its characters are those
/// XML allows.
fn text_fits(text: &str) -> bool {
    text.chars().all(
        |c| matches!(c, '\t' | '\n' | '\r' | '\u{20}'..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}' | '\u{10000}'..),
    )
}

/// `envelope` for SNS: the whole event as a CloudEvents JSON document
/// (structured mode: a Tidings event has more attributes than the ten
/// message attributes SNS delivers to SQS), its id, type, source, subject
/// and key repeated as message attributes (the key read even when the
/// document cannot be), and its partition where the
/// topic has several.
pub(crate) fn encode(envelope: &Envelope, partition: Option<u32>) -> Encoded {
    let (attributes, _) = cloudevents::encode(envelope, Binding::Standard, ContentMode::Binary);
    let (content_type, document) = cloudevents::encode(envelope, Binding::Standard, ContentMode::Structured);
    let shown = attributes
        .into_iter()
        .filter(|(k, v)| SHOWN.contains(&k.as_str()) && !v.is_empty() && text_fits(v));
    Encoded {
        // A JSON document is UTF-8, its control characters escaped.
        body: String::from_utf8_lossy(&document).into_owned(),
        attributes: content_type
            .into_iter()
            .chain(shown)
            .chain(partition.map(|p| (PARTITION_ATTRIBUTE.to_owned(), p.to_string())))
            .collect(),
    }
}

/// How Tidings reads an SQS message of `topic`: its message attributes as
/// headers (Tidings' partition attribute left out; a binary one read as
/// UTF-8, or the message refused naming it if it is a CloudEvents
/// attribute), its key from `ce-partitionkey` or `ce-subject`. Public so
/// that tools (and the fuzz targets) read SQS messages exactly as the
/// subscriber does.
pub fn raw_message(
    topic: &str,
    attributes: &HashMap<String, MessageAttributeValue>,
    body: &str,
) -> RawMessage {
    let mut headers = Headers::new();
    let mut refused = None;
    let mut names: Vec<&String> = attributes.keys().collect();
    names.sort();
    for name in names {
        if name == PARTITION_ATTRIBUTE {
            continue;
        }
        let value = &attributes[name];
        let text = match (value.string_value(), value.binary_value()) {
            (Some(s), _) => Some(s.to_owned()),
            (None, Some(b)) => match std::str::from_utf8(b.as_ref()) {
                Ok(s) => Some(s.to_owned()),
                Err(_) => None,
            },
            (None, None) => None,
        };
        match text {
            Some(text) => {
                headers.insert(name.clone(), text);
            }
            None if cloudevents::is_attribute_header(name) && refused.is_none() => {
                refused = Some(format!(
                    "message attribute {name} is binary and not UTF-8: a CloudEvents attribute must be text"
                ));
            }
            None => {}
        }
    }
    RawMessage::from_headers(topic, headers, body.as_bytes().to_vec(), refused)
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

    fn sqs(encoded: &Encoded) -> HashMap<String, MessageAttributeValue> {
        encoded
            .attributes
            .iter()
            .map(|(k, v)| {
                let value = MessageAttributeValue::builder()
                    .data_type("String")
                    .string_value(v)
                    .build()
                    .unwrap();
                (k.clone(), value)
            })
            .collect()
    }

    #[test]
    fn an_event_round_trips_with_its_partition_left_out() {
        let mut e = Envelope::new("test", &Placed { order: 7 }).unwrap();
        for i in 0..12 {
            e.headers.insert(format!("x{i}"), "v".into());
        }
        let encoded = encode(&e, Some(2));
        assert!(
            encoded
                .attributes
                .iter()
                .any(|(k, v)| k == PARTITION_ATTRIBUTE && v == "2")
        );
        assert!(
            encoded
                .attributes
                .iter()
                .any(|(k, v)| k == "ce-type" && v == "Placed")
        );
        assert!(encoded.attributes.len() <= 10);
        let raw = raw_message("orders", &sqs(&encoded), &encoded.body);
        assert!(!raw.headers.contains_key(PARTITION_ATTRIBUTE));
        let back = raw.decode().unwrap();
        assert_eq!((back.id, back.aggregate_key.as_str()), (e.id, "o-7"));
        assert_eq!(back.payload, e.payload);
        assert_eq!(back.headers.get("x11").map(String::as_str), Some("v"));
    }

    #[test]
    fn a_payload_that_is_not_text_travels_in_the_document() {
        let mut e = Envelope::new("test", &Placed { order: 9 }).unwrap();
        e.content_type = "application/octet-stream".into();
        e.payload = vec![0, 159, 146, 150];
        let encoded = encode(&e, None);
        assert!(text_fits(&encoded.body));
        let back = raw_message("orders", &sqs(&encoded), &encoded.body)
            .decode()
            .unwrap();
        assert_eq!(back.payload, e.payload);
    }
}
