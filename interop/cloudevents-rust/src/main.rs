//! Another team's Rust service reading a Kafka topic with the official
//! CloudEvents SDK for Rust and its rdkafka binding, knowing nothing of
//! Tidings.
//!
//!     tidings-interop-cloudevents-rust BROKERS TOPIC COUNT
//!
//! reads TOPIC from its beginning: prints `ready` once every partition is
//! assigned, then one JSON line per record as the SDK understood it,
//! `{"mode", "key", "attributes", "data"}`, every attribute and extension
//! as text. Exits non-zero, naming what is missing, when fewer than COUNT
//! records arrive within 30 seconds, or when the SDK cannot read one.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use base64::Engine as _;
use cloudevents::binding::rdkafka::MessageExt;
use cloudevents::Data;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(30);

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, brokers, topic, count] = &args[..] else {
        fail("usage: tidings-interop-cloudevents-rust BROKERS TOPIC COUNT");
    };
    let count: usize = count.parse().unwrap_or_else(|_| fail("COUNT is a number"));
    let brokers = brokers.strip_prefix("kafka://").unwrap_or(brokers);
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", "foreign-cloudevents-rust-reader")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap_or_else(|e| fail(&format!("creating a Kafka consumer: {e}")));
    let metadata = consumer
        .fetch_metadata(Some(topic), WAIT)
        .unwrap_or_else(|e| fail(&format!("reading the metadata of {topic}: {e}")));
    let mut assignment = TopicPartitionList::new();
    for t in metadata.topics().iter().filter(|t| t.name() == topic) {
        for p in t.partitions() {
            assignment
                .add_partition_offset(topic, p.id(), Offset::Beginning)
                .unwrap_or_else(|e| fail(&format!("assigning partition {}: {e}", p.id())));
        }
    }
    if assignment.count() == 0 {
        fail(&format!("topic {topic} has no partition"));
    }
    consumer
        .assign(&assignment)
        .unwrap_or_else(|e| fail(&format!("assigning {topic}: {e}")));
    println!("ready");
    let deadline = Instant::now() + WAIT;
    let mut got = 0;
    while got < count {
        if Instant::now() > deadline {
            fail(&format!("only {got} of {count} records arrived within {WAIT:?}"));
        }
        let Some(polled) = consumer.poll(Duration::from_millis(500)) else {
            continue;
        };
        let record = match polled {
            Ok(record) => record,
            Err(e) => {
                eprintln!("Kafka: {e}");
                continue;
            }
        };
        let binary = record
            .headers()
            .is_some_and(|h| h.iter().any(|h| h.key.starts_with("ce_")));
        let event = record.to_event().unwrap_or_else(|e| {
            fail(&format!(
                "the SDK cannot read the record at offset {}: {e}",
                record.offset()
            ))
        });
        let attributes: BTreeMap<&str, String> = event
            .iter()
            .map(|(name, value)| (name, value.to_string()))
            .collect();
        let data = match event.data() {
            None => Value::Null,
            Some(Data::Json(v)) => v.clone(),
            Some(Data::String(s)) => serde_json::from_str(s).unwrap_or_else(|_| Value::from(s.as_str())),
            Some(Data::Binary(b)) => serde_json::from_slice(b)
                .unwrap_or_else(|_| json!({"base64": base64::engine::general_purpose::STANDARD.encode(b)})),
        };
        let line = json!({
            "mode": if binary { "binary" } else { "structured" },
            "key": record.key().map(|k| String::from_utf8_lossy(k).into_owned()),
            "attributes": attributes,
            "data": data,
        });
        println!("{line}");
        got += 1;
    }
}

fn fail(why: &str) -> ! {
    eprintln!("{why}");
    std::process::exit(1)
}
