//! Envelopes as AMQP properties and headers, and back.

use lapin::BasicProperties;
use lapin::types::{AMQPValue, LongString};
use tidings_core::{Headers, RawMessage, cloudevents};

pub(crate) const DELIVERY_COUNT: &str = "x-tidings-delivery-count";

pub(crate) fn long(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s))
}

/// A header's value as text: strings as they are, numbers, booleans and
/// decimals as written, timestamps (seconds) in RFC 3339; `Err` with the
/// value's AMQP type when it has no text form (a table, an array, void,
/// bytes that are not UTF-8).
fn value_text(v: &AMQPValue) -> Result<String, &'static str> {
    let utf8 = |bytes: &[u8], kind| String::from_utf8(bytes.to_vec()).map_err(|_| kind);
    Ok(match v {
        AMQPValue::LongString(s) => utf8(s.as_bytes(), "a long string that is not UTF-8")?,
        AMQPValue::ShortString(s) => s.as_str().to_owned(),
        AMQPValue::ByteArray(b) => utf8(b.as_slice(), "a byte array that is not UTF-8")?,
        AMQPValue::Boolean(b) => b.to_string(),
        AMQPValue::ShortShortInt(n) => n.to_string(),
        AMQPValue::ShortShortUInt(n) => n.to_string(),
        AMQPValue::ShortInt(n) => n.to_string(),
        AMQPValue::ShortUInt(n) => n.to_string(),
        AMQPValue::LongInt(n) => n.to_string(),
        AMQPValue::LongUInt(n) => n.to_string(),
        AMQPValue::LongLongInt(n) => n.to_string(),
        AMQPValue::Float(x) => x.to_string(),
        AMQPValue::Double(x) => x.to_string(),
        AMQPValue::DecimalValue(d) => decimal(d.value, d.scale),
        AMQPValue::Timestamp(secs) => i64::try_from(*secs)
            .ok()
            .and_then(|s| chrono::DateTime::from_timestamp(s, 0))
            .ok_or("a timestamp out of range")?
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        AMQPValue::FieldTable(_) => return Err("a table"),
        AMQPValue::FieldArray(_) => return Err("an array"),
        AMQPValue::Void => return Err("void"),
    })
}

/// An AMQP decimal (`value` / 10^`scale`) as written.
fn decimal(value: u32, scale: u8) -> String {
    let digits = format!("{value:0>width$}", width = usize::from(scale) + 1);
    let (whole, fraction) = digits.split_at(digits.len() - usize::from(scale));
    if fraction.is_empty() {
        whole.to_owned()
    } else {
        format!("{whole}.{fraction}")
    }
}

/// The message's headers, without RabbitMQ's and Tidings' own bookkeeping,
/// and why the message cannot be read, if a CloudEvents attribute has a
/// value with no text form (other such headers are left out).
fn headers_of(properties: &BasicProperties) -> (Headers, Option<String>) {
    let mut out = Headers::new();
    let mut refused = None;
    if let Some(table) = properties.headers() {
        for (k, v) in table.inner() {
            let k = k.as_str();
            if k == "x-death"
                || k.starts_with("x-first-death")
                || k.starts_with("x-last-death")
                || k.starts_with("x-tidings-")
            {
                continue;
            }
            match value_text(v) {
                Ok(v) => {
                    out.insert(k.to_owned(), v);
                }
                Err(kind) if cloudevents::is_attribute_header(k) && refused.is_none() => {
                    refused = Some(format!(
                        "header {k} is {kind}: a CloudEvents attribute must be a string, a number, a boolean or a timestamp"
                    ));
                }
                Err(_) => {}
            }
        }
    }
    if let Some(ct) = properties.content_type() {
        out.insert(
            cloudevents::CONTENT_TYPE_HEADER.to_owned(),
            ct.as_str().to_owned(),
        );
    }
    (out, refused)
}

/// How Tidings reads an AMQP message taken from `topic`'s queue: its
/// headers as text (the broker's and Tidings' bookkeeping left out), its
/// key from `ce-partitionkey` or `ce-subject`, and why it cannot be decoded when a CloudEvents
/// attribute has no text form. Every delivery goes through here; it is
/// public so that tools (and the fuzz targets) read AMQP messages exactly
/// as the subscriber does.
pub fn raw_message(topic: &str, properties: &BasicProperties, body: &[u8]) -> RawMessage {
    let (headers, refused) = headers_of(properties);
    RawMessage::from_headers(topic, headers, body.to_vec(), refused)
}

pub(crate) fn delivery_count(d: &lapin::message::Delivery) -> u32 {
    let carried = d
        .properties
        .headers()
        .as_ref()
        .and_then(|t| t.inner().get(DELIVERY_COUNT))
        .and_then(|v| value_text(v).ok())
        .and_then(|s| s.parse::<u32>().ok());
    // Only a hint of what to watch (the crash-loop guard counts in the
    // store): a redelivery the broker flags is never taken for a first.
    match carried {
        Some(n) => n.max(1) + u32::from(d.redelivered),
        None if d.redelivered => 2,
        None => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimals_read_as_written() {
        assert_eq!(decimal(12345, 2), "123.45");
        assert_eq!(decimal(5, 3), "0.005");
        assert_eq!(decimal(7, 0), "7");
    }

    #[test]
    fn scalar_values_read_as_text_and_containers_name_their_type() {
        assert_eq!(value_text(&AMQPValue::LongLongInt(-3)).unwrap(), "-3");
        assert_eq!(value_text(&AMQPValue::Boolean(true)).unwrap(), "true");
        assert_eq!(
            value_text(&AMQPValue::Timestamp(1_700_000_000)).unwrap(),
            "2023-11-14T22:13:20Z"
        );
        assert_eq!(
            value_text(&AMQPValue::FieldArray(Default::default())),
            Err("an array")
        );
        assert_eq!(
            value_text(&AMQPValue::LongString(LongString::from(vec![0xff, 0xfe]))),
            Err("a long string that is not UTF-8")
        );
    }
}
