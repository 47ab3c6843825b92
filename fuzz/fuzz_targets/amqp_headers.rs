//! An AMQP message with any header table (every AMQP value type, nested
//! tables and arrays included) and any content type, read as the RabbitMQ
//! subscriber reads it. Reading and decoding never panic; a CloudEvents
//! attribute with no text form refuses the message naming that header;
//! Tidings' own bookkeeping headers never reach the envelope.
#![no_main]

use arbitrary::Arbitrary;
use lapin::BasicProperties;
use lapin::types::{AMQPValue, ByteArray, DecimalValue, FieldArray, FieldTable, LongString, ShortString};
use libfuzzer_sys::fuzz_target;

#[derive(Debug, Arbitrary)]
enum Value {
    Text(String),
    Bytes(Vec<u8>),
    Short(String),
    Bool(bool),
    I8(i8),
    U8(u8),
    I16(i16),
    U16(u16),
    I32(i32),
    U32(u32),
    I64(i64),
    F32(f32),
    F64(f64),
    Decimal(u8, u32),
    Timestamp(u64),
    Table(Vec<(String, Value)>),
    Array(Vec<Value>),
    Void,
}

/// A short string as the wire carries it: 255 bytes at most.
fn short(mut s: String) -> ShortString {
    while s.len() > 255 {
        s.pop();
    }
    ShortString::from(s)
}

fn amqp(v: Value) -> AMQPValue {
    match v {
        Value::Text(s) => AMQPValue::LongString(LongString::from(s)),
        Value::Bytes(b) => AMQPValue::ByteArray(ByteArray::from(b)),
        Value::Short(s) => AMQPValue::ShortString(short(s)),
        Value::Bool(b) => AMQPValue::Boolean(b),
        Value::I8(n) => AMQPValue::ShortShortInt(n),
        Value::U8(n) => AMQPValue::ShortShortUInt(n),
        Value::I16(n) => AMQPValue::ShortInt(n),
        Value::U16(n) => AMQPValue::ShortUInt(n),
        Value::I32(n) => AMQPValue::LongInt(n),
        Value::U32(n) => AMQPValue::LongUInt(n),
        Value::I64(n) => AMQPValue::LongLongInt(n),
        Value::F32(x) => AMQPValue::Float(x),
        Value::F64(x) => AMQPValue::Double(x),
        Value::Decimal(scale, value) => AMQPValue::DecimalValue(DecimalValue { scale, value }),
        Value::Timestamp(t) => AMQPValue::Timestamp(t),
        Value::Table(entries) => AMQPValue::FieldTable(table(entries)),
        Value::Array(values) => {
            AMQPValue::FieldArray(FieldArray::from(values.into_iter().map(amqp).collect::<Vec<_>>()))
        }
        Value::Void => AMQPValue::Void,
    }
}

fn table(entries: Vec<(String, Value)>) -> FieldTable {
    let mut t = FieldTable::default();
    for (k, v) in entries {
        t.insert(short(k), amqp(v));
    }
    t
}

fuzz_target!(|input: (Vec<(String, Value)>, Option<String>, Vec<u8>)| {
    let (headers, content_type, body) = input;
    let mut properties = BasicProperties::default().with_headers(table(headers));
    if let Some(ct) = content_type {
        properties = properties.with_content_type(short(ct));
    }
    let raw = tidings_broker_rabbitmq::raw_message("fuzz", &properties, &body);
    assert!(
        raw.headers
            .keys()
            .all(|k| !k.starts_with("x-tidings-") && k != "x-death"),
        "bookkeeping headers reached the message: {raw:?}"
    );
    match (&raw.refused, raw.decode()) {
        (Some(reason), Err(e)) => assert!(e.to_string().contains(reason.as_str())),
        (Some(reason), Ok(_)) => panic!("a refused message decoded ({reason})"),
        (None, _) => {}
    }
});
