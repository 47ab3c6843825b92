//! Reading plain JSON: records another team's producer writes without
//! CloudEvents, read as events of a type the consumer declares.
//!
//! A consumer given a [`PlainJson`] for a topic
//! (`Consumer::json_topic`) reads each record of it that is not a
//! binary-mode CloudEvent as one envelope: the declared type, the body as
//! the payload (it must be JSON), the id read from a header or a member of
//! the body, and the key from the record's key unless a field names it.
//! The envelope's id is derived from (source, id) as for foreign
//! CloudEvents ([`cloudevents::foreign_id`]), so a record written twice is
//! handled once. A record that is not JSON, or has no id, is dead-lettered
//! with the reason and its bytes.

use chrono::Utc;
use serde_json::Value;

use crate::cloudevents::{self, FOREIGN_ID_HEADER};
use crate::envelope::{Envelope, JSON};
use crate::field::Field;
use crate::{DecodeError, Kind, RawMessage};

/// How to read a topic's plain JSON records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlainJson {
    message_type: String,
    version: u32,
    source: Option<String>,
    id: Field,
    key: Option<Field>,
}

impl PlainJson {
    /// Records read as events of type `message_type` (the `Message::TYPE`
    /// of the handler's type), version 1, their id the body's `/id`.
    pub fn new(message_type: impl Into<String>) -> PlainJson {
        PlainJson {
            message_type: message_type.into(),
            version: 1,
            source: None,
            id: Field::json("/id"),
            key: None,
        }
    }

    /// The schema version the records are written in.
    pub fn version(mut self, version: u32) -> PlainJson {
        self.version = version;
        self
    }

    /// Where each record's id is: what makes a record written twice one
    /// event. A header (`Field::header("x-event-id")`) or a member of the
    /// body (`Field::json("/payment_id")`).
    pub fn id(mut self, field: Field) -> PlainJson {
        self.id = field;
        self
    }

    /// Where each record's key is, when not the record's own key.
    pub fn key(mut self, field: Field) -> PlainJson {
        self.key = Some(field);
        self
    }

    /// The `source` of the events (the topic unless set): ids are unique
    /// within it.
    pub fn source(mut self, source: impl Into<String>) -> PlainJson {
        self.source = Some(source.into());
        self
    }

    /// The envelope of `raw`: a CloudEvent (binary mode, or a structured
    /// document: its content type says so, or it is an object with a
    /// string `specversion`) as such, anything else as plain JSON of the
    /// declared type.
    pub fn decode(&self, raw: &RawMessage) -> Result<Envelope, DecodeError> {
        let structured = raw.headers.iter().any(|(k, v)| {
            k.eq_ignore_ascii_case(cloudevents::CONTENT_TYPE_HEADER)
                && v.starts_with(cloudevents::CONTENT_TYPE)
        });
        if raw.refused.is_some()
            || structured
            || cloudevents::is_binary(raw.headers.keys().map(String::as_str))
        {
            return raw.decode();
        }
        let malformed = |reason: String| DecodeError::Malformed { reason };
        let body: Value = serde_json::from_slice(&raw.body)
            .map_err(|e| malformed(format!("the record is not JSON ({e}) and not a CloudEvent")))?;
        if body.get("specversion").is_some_and(Value::is_string) {
            return raw.decode();
        }
        let header = |name: &str| {
            raw.headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.as_str())
        };
        let id = self
            .id
            .read(header, &body)
            .ok_or_else(|| malformed(format!("the record has no id ({})", self.id)))?;
        // The record's own key where the field names none.
        let key = self
            .key
            .as_ref()
            .and_then(|field| field.read(header, &body))
            .or_else(|| raw.key.clone())
            .unwrap_or_default();
        let source = self.source.clone().unwrap_or_else(|| raw.topic.clone());
        // A UUID id is the envelope's, as a CloudEvent's would be.
        let envelope_id = match cloudevents::is_canonical_uuid(&id) {
            true => id
                .parse()
                .map_err(|_| malformed(format!("the id {id:?} is not a UUID")))?,
            false => cloudevents::foreign_id(&source, &id),
        };
        let mut headers = raw.headers.clone();
        headers.insert(FOREIGN_ID_HEADER.to_owned(), id);
        Ok(Envelope {
            id: envelope_id,
            message_type: self.message_type.clone(),
            version: self.version,
            kind: Kind::Event,
            source,
            aggregate_type: String::new(),
            aggregate_key: key,
            occurred_at: Utc::now(),
            correlation_id: envelope_id,
            causation_id: None,
            headers,
            content_type: JSON.to_owned(),
            payload: raw.body.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(headers: &[(&str, &str)], key: Option<&str>, body: &str) -> RawMessage {
        RawMessage {
            topic: "payments".into(),
            key: key.map(str::to_owned),
            headers: headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            body: body.as_bytes().to_vec(),
            refused: None,
        }
    }

    #[test]
    fn a_plain_record_becomes_an_event_of_the_declared_type() {
        let plain = PlainJson::new("PaymentSettled").id(Field::header("X-Event-Id"));
        let raw = record(&[("x-event-id", "pay-1")], Some("acct-7"), r#"{"amount":12}"#);
        let e = plain.decode(&raw).unwrap();
        assert_eq!(e.message_type, "PaymentSettled");
        assert_eq!(e.aggregate_key, "acct-7");
        assert_eq!(e.event_id(), "pay-1");
        assert_eq!(e.id, cloudevents::foreign_id("payments", "pay-1"));
        assert_eq!(e.payload, br#"{"amount":12}"#);
        assert_eq!(
            plain.decode(&raw).unwrap().id,
            e.id,
            "the same record, the same id"
        );

        let keyed = PlainJson::new("T").key(Field::json("/account")).source("ledger");
        let e = keyed
            .decode(&record(&[], None, r#"{"id":5,"account":"a-1"}"#))
            .unwrap();
        assert_eq!((e.aggregate_key.as_str(), e.source.as_str()), ("a-1", "ledger"));
        assert_eq!(e.id, cloudevents::foreign_id("ledger", "5"));
    }

    #[test]
    fn garbage_and_records_without_an_id_are_refused_with_the_reason() {
        let plain = PlainJson::new("T");
        let err = plain
            .decode(&record(&[], None, "not json {"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("not JSON"), "{err}");
        let err = plain
            .decode(&record(&[], None, r#"{"amount":1}"#))
            .unwrap_err()
            .to_string();
        assert!(err.contains("no id (the body's /id)"), "{err}");
    }

    #[test]
    fn a_structured_cloudevent_on_a_plain_topic_is_read_as_one() {
        let e = PlainJson::new("Other")
            .decode(&record(&[], None, r#"{"id":"x"}"#))
            .unwrap();
        let document = cloudevents::to_json(&e);
        let plain = PlainJson::new("T").id(Field::header("x-event-id"));
        let bare = String::from_utf8(document.clone()).unwrap();
        assert_eq!(
            plain.decode(&record(&[], None, &bare)).unwrap().id,
            e.id,
            "by its specversion"
        );
        let typed = record(&[("content-type", cloudevents::CONTENT_TYPE)], None, &bare);
        assert_eq!(
            plain.decode(&typed).unwrap().message_type,
            "Other",
            "by its content type"
        );
    }

    #[test]
    fn a_uuid_id_is_the_envelope_id_and_a_missing_key_field_falls_back_to_the_record_key() {
        let id = uuid::Uuid::now_v7();
        let plain = PlainJson::new("T").key(Field::json("/account"));
        let e = plain
            .decode(&record(&[], Some("rk"), &format!(r#"{{"id":"{id}"}}"#)))
            .unwrap();
        assert_eq!(e.id, id);
        assert_eq!(e.aggregate_key, "rk");
    }

    #[test]
    fn a_cloudevent_on_a_plain_topic_is_read_as_one() {
        let plain = PlainJson::new("T");
        let raw = record(
            &[
                ("ce-specversion", "1.0"),
                ("ce-id", "evt_9"),
                ("ce-source", "/s"),
                ("ce-type", "Other"),
            ],
            None,
            "{}",
        );
        assert_eq!(plain.decode(&raw).unwrap().message_type, "Other");
    }
}

#[cfg(test)]
mod redrive {
    use super::*;
    use crate::cloudevents::{Binding, to_binary};

    /// A plain record dead-lettered after it was read is kept as the
    /// binary CloudEvent of its envelope: a redrive decodes it to the same
    /// event, its body byte for byte.
    #[test]
    fn a_plain_record_kept_as_its_cloudevent_decodes_to_the_same_event() {
        let raw = RawMessage {
            topic: "payments".into(),
            key: Some("acct-1".into()),
            headers: [("x-event-id".to_owned(), "pay-1".to_owned())].into(),
            body: br#"{"amount": 12}"#.to_vec(),
            refused: None,
        };
        let read = PlainJson::new("PaymentSettled")
            .id(Field::header("x-event-id"))
            .decode(&raw)
            .unwrap();
        let (headers, body) = to_binary(&read, Binding::Standard);
        assert_eq!(body, raw.body);
        let kept = RawMessage {
            headers: headers.into_iter().collect(),
            body,
            ..raw
        };
        let again = kept.decode().unwrap();
        assert_eq!(
            (
                again.id,
                again.message_type.as_str(),
                again.aggregate_key.as_str(),
                again.event_id()
            ),
            (read.id, "PaymentSettled", "acct-1", "pay-1".to_owned())
        );
    }
}
