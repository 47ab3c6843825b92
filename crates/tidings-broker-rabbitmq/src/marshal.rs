//! Envelopes as AMQP properties and headers, and back.

use lapin::BasicProperties;
use lapin::types::{AMQPValue, LongString};
use tidings_core::{Headers, cloudevents};

pub(crate) const DELIVERY_COUNT: &str = "x-tidings-delivery-count";

pub(crate) fn long(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s))
}

fn value_str(v: &AMQPValue) -> Option<String> {
    match v {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.as_str().to_owned()),
        _ => None,
    }
}

/// The message's headers, without RabbitMQ's and Tidings' own bookkeeping.
pub(crate) fn headers_of(properties: &BasicProperties) -> Headers {
    let mut out = Headers::new();
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
            if let Some(v) = value_str(v) {
                out.insert(k.to_owned(), v);
            }
        }
    }
    if let Some(ct) = properties.content_type() {
        out.insert(
            cloudevents::CONTENT_TYPE_HEADER.to_owned(),
            ct.as_str().to_owned(),
        );
    }
    out
}

pub(crate) fn delivery_count(d: &lapin::message::Delivery) -> u32 {
    let carried = d
        .properties
        .headers()
        .as_ref()
        .and_then(|t| t.inner().get(DELIVERY_COUNT))
        .and_then(value_str)
        .and_then(|s| s.parse::<u32>().ok());
    match carried {
        Some(n) => n + u32::from(d.redelivered),
        None if d.redelivered => 2,
        None => 1,
    }
}
