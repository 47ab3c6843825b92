//! With OTEL_EXPORTER_OTLP_ENDPOINT set, `tidings demo checkout` exports its
//! spans to the collector: every order is one trace, in which each consumer's
//! handling span is a child of the span that wrote the message it handles;
//! with the producer, the relay and the consumers in processes of their own
//! over a broker, that one trace holds spans of all three.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::time::{Duration, Instant};

use common::{Process, tidings};
use serde_json::Value;
use tidings_example_checkout::demo::lost;
use tidings_example_checkout::system::CheckoutStore;
use tidings_testkit::services::{PgTestDb, TestDb};

/// The value of a span's string attribute `key` ("" when absent).
fn attribute(span: &Value, key: &str) -> String {
    span["attributes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|a| a["key"] == key)
        .map(|a| a["value"]["stringValue"].as_str().unwrap_or_default().to_owned())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_order_is_one_exported_trace_across_its_consumers() {
    let collector = tidings_testkit::otlp::Collector::start().await;
    let endpoint = collector.endpoint.clone();

    let dir = std::env::temp_dir().join(format!("tidings-otel-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let database = format!("sqlite://{}", dir.join("otel.db").display());
    let out = tokio::task::spawn_blocking(move || {
        tidings()
            .args([
                "demo",
                "checkout",
                "--json",
                "--orders",
                "5",
                "--database",
                &database,
            ])
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)
            .env("OTEL_SERVICE_NAME", "checkout-demo")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let _ = std::fs::remove_dir_all(&dir);

    // The process flushed its spans before exiting.
    let spans = collector.spans();
    let handles: Vec<&Value> = spans.iter().filter(|s| s["name"] == "tidings.handle").collect();
    let mut consumers_by_trace: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for h in &handles {
        assert!(
            h["parentSpanId"].as_str().is_some_and(|p| !p.is_empty()),
            "a handling span without a parent: {h:#}"
        );
        assert_eq!(attribute(h, "trace_id"), h["traceId"].as_str().unwrap(), "{h:#}");
        consumers_by_trace
            .entry(h["traceId"].as_str().unwrap().to_owned())
            .or_default()
            .insert(attribute(h, "consumer"));
    }
    assert_eq!(
        consumers_by_trace.len(),
        5,
        "one trace per order: {consumers_by_trace:#?}"
    );
    for (trace, consumers) in &consumers_by_trace {
        let all: BTreeSet<String> = ["checkout", "inventory", "email", "analytics", "loyalty"]
            .map(String::from)
            .into();
        assert_eq!(consumers, &all, "trace {trace}");
    }
    // The events a handler emitted are children of its handling span.
    let ids: BTreeSet<&str> = handles.iter().filter_map(|h| h["spanId"].as_str()).collect();
    assert!(
        handles
            .iter()
            .any(|h| ids.contains(h["parentSpanId"].as_str().unwrap())),
        "no handling span is the child of another"
    );
    for name in ["tidings.enqueue", "tidings.relay.batch", "tidings.publish"] {
        assert!(spans.iter().any(|s| s["name"] == name), "no {name} span exported");
    }
}

/// The producer, a relay and the consumers as three processes over NATS,
/// each exporting under its own service name: every order is one trace
/// holding the producer's `tidings.enqueue`, the relay's `tidings.relay.send`
/// and the consumers' `tidings.handle` spans.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_order_is_one_trace_across_producer_relay_and_consumer_processes() {
    const ORDERS: usize = 3;
    let collector = tidings_testkit::otlp::Collector::start().await;
    let db = PgTestDb::new().await;
    let nats = std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned());
    let role = |role: &str| {
        let mut command = tidings();
        command
            .args(["demo", "checkout", "--role", role, "--partitions", "2"])
            .args(["--orders", &ORDERS.to_string()])
            .args(["--database", &db.url(), "--broker", &nats])
            .env("RUST_LOG", "warn")
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", &collector.endpoint)
            .env("OTEL_SERVICE_NAME", format!("checkout-{role}"));
        command
    };
    let mut consumers = Process::start(role("consumers"), "otel-consumers");
    // The groups exist before anything is published.
    let stdout = consumers.child.stdout.take().unwrap();
    let ready = tokio::task::spawn_blocking(move || BufReader::new(stdout).lines().next())
        .await
        .unwrap();
    assert!(
        matches!(ready, Some(Ok(ref line)) if line == "ready"),
        "the consumers did not get ready: {ready:?}\n{}",
        consumers.stderr()
    );
    let mut relay = Process::start(role("relay"), "otel-relay");
    let mut producer = role("producer");
    let placed = tokio::task::spawn_blocking(move || producer.output().unwrap())
        .await
        .unwrap();
    assert!(
        placed.status.success(),
        "the producer failed: {}",
        String::from_utf8_lossy(&placed.stderr)
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let t = db.store().tally().await.unwrap();
        if lost(&t) == 0 && t.outbox_pending == 0 && t.orders as usize == ORDERS {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not drained in 60 s: {} lost\nrelay:\n{}\nconsumers:\n{}",
            lost(&t),
            relay.stderr(),
            consumers.stderr()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Stopped, each flushes its spans.
    for p in [&mut relay, &mut consumers] {
        let status = tokio::task::block_in_place(|| p.terminate());
        assert!(status.success(), "{status}: {}", p.stderr());
    }
    db.teardown().await;

    let spans = collector.spans();
    let mut by_trace: BTreeMap<String, Vec<&Value>> = BTreeMap::new();
    for span in &spans {
        by_trace
            .entry(span["traceId"].as_str().unwrap_or_default().to_owned())
            .or_default()
            .push(span);
    }
    let orders: Vec<(&String, &Vec<&Value>)> = by_trace
        .iter()
        .filter(|(_, spans)| spans.iter().any(|s| s["name"] == "tidings.handle"))
        .collect();
    assert_eq!(orders.len(), ORDERS, "one trace per order");
    for (trace, spans) in orders {
        let has =
            |service: &str, name: &str| spans.iter().any(|s| s["service"] == service && s["name"] == name);
        assert!(
            has("checkout-producer", "tidings.enqueue"),
            "trace {trace} has the producer's enqueue: {spans:#?}"
        );
        assert!(
            has("checkout-relay", "tidings.relay.send"),
            "trace {trace} has the relay's send: {spans:#?}"
        );
        assert!(
            has("checkout-consumers", "tidings.handle"),
            "trace {trace} has the consumers' handling: {spans:#?}"
        );
        // The relay sent each of the order's messages in it: its three
        // commands and the events the checkout consumer wrote.
        let sends: Vec<&&Value> = spans
            .iter()
            .filter(|s| s["name"] == "tidings.relay.send")
            .collect();
        assert!(sends.len() >= 3, "trace {trace}: {sends:#?}");
        for send in sends {
            assert!(
                send["parentSpanId"].as_str().is_some_and(|p| !p.is_empty()),
                "a send span without its message's parent: {send:#}"
            );
            assert!(!attribute(send, "message_id").is_empty(), "{send:#}");
        }
    }
}
