//! With OTEL_EXPORTER_OTLP_ENDPOINT set, `tidings demo checkout` exports its
//! spans to the collector: every order is one trace, in which each consumer's
//! handling span is a child of the span that wrote the message it handles.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::tidings;
use serde_json::Value;

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
    let attribute = |span: &Value, key: &str| -> String {
        span["attributes"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|a| a["key"] == key)
            .map(|a| a["value"]["stringValue"].as_str().unwrap_or_default().to_owned())
            .unwrap_or_default()
    };
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
