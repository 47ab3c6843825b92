//! One order followed from its `PlaceOrder` command to the last consumer:
//! every command and event of an order carries the order's trace
//! (`traceparent`) and correlation id, each caused by the one before, and
//! every consumer's handling span names that trace.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use sqlx::Row;
use tidings_core::Envelope;
use tidings_example_checkout::DemoOptions;
use tidings_example_checkout::demo::{self, EVENT_CONSUMERS};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::{Context, SubscriberExt};

/// A span's name and its fields.
type Recorded = (String, BTreeMap<String, String>);

/// Records the fields of every `tidings.*` span opened.
#[derive(Clone, Default)]
struct Spans(Arc<Mutex<Vec<Recorded>>>);

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}

impl<S: tracing::Subscriber> Layer<S> for Spans {
    fn on_new_span(&self, attrs: &Attributes<'_>, _: &Id, _: Context<'_, S>) {
        let name = attrs.metadata().name();
        if name.starts_with("tidings.") {
            let mut fields = BTreeMap::new();
            attrs.record(&mut Fields(&mut fields));
            self.0.lock().unwrap().push((name.to_owned(), fields));
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_order_is_one_trace_from_its_command_to_every_consumer() {
    let spans = Spans::default();
    let subscriber = tracing_subscriber::registry().with(spans.clone());
    let _guard = tracing::subscriber::set_default(subscriber);
    // Spans are recorded on this thread's subscriber only: run the demo here.
    let dir = std::env::temp_dir().join(format!("tidings-trace-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("sqlite://{}", dir.join("trace.db").display());
    let summary = tokio::task::block_in_place(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(demo::run(DemoOptions {
                orders: 20,
                database: Some(url.clone()),
                ..DemoOptions::default()
            }))
    })
    .unwrap();
    assert!(summary.ok(), "{summary}");

    // Every message of the run, from the log.
    let store = tidings_store_sqlite::SqliteStore::connect(&url).await.unwrap();
    let bodies: Vec<Vec<u8>> = sqlx::query("SELECT body FROM tidings_log")
        .fetch_all(store.pool())
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let envelopes: Vec<Envelope> = bodies
        .iter()
        .map(|b| tidings_core::cloudevents::from_json(b).unwrap())
        .collect();
    let by_id: HashMap<_, _> = envelopes.iter().map(|e| (e.id, e)).collect();
    let mut orders: BTreeMap<uuid::Uuid, Vec<&Envelope>> = BTreeMap::new();
    for e in &envelopes {
        orders.entry(e.correlation_id).or_default().push(e);
    }
    assert_eq!(orders.len(), 20, "one conversation per order");
    let mut traces = BTreeSet::new();
    for (correlation, messages) in &orders {
        // One trace per order, one order per trace.
        let trace: BTreeSet<_> = messages
            .iter()
            .map(|e| e.trace().expect("a traceparent").trace_id)
            .collect();
        assert_eq!(trace.len(), 1, "order {correlation} spans traces {trace:?}");
        assert!(traces.insert(*trace.first().unwrap()), "two orders share a trace");
        // Each event caused by a message of the same order.
        for e in messages.iter().filter(|e| e.causation_id.is_some()) {
            let cause = by_id[&e.causation_id.unwrap()];
            assert_eq!(cause.correlation_id, *correlation);
        }
        assert!(messages.iter().any(|e| e.message_type == "PlaceOrder"));
        assert!(messages.iter().any(|e| e.message_type == "OrderPlaced"));
    }

    // The handling spans: each consumer handled each order under the order's trace.
    let spans = spans.0.lock().unwrap();
    let handled: BTreeSet<(String, String)> = spans
        .iter()
        .filter(|(name, _)| name == "tidings.handle")
        .map(|(_, f)| (f["consumer"].clone(), f["trace_id"].clone()))
        .collect();
    for trace in &traces {
        let hex = format!("{trace:032x}");
        for consumer in EVENT_CONSUMERS.iter().chain([&demo::COMMAND_CONSUMER]) {
            assert!(
                handled.contains(&(consumer.to_string(), hex.clone())),
                "{consumer} has no handling span in trace {hex}"
            );
        }
    }
    for name in ["tidings.enqueue", "tidings.relay.batch", "tidings.publish"] {
        assert!(spans.iter().any(|(n, _)| n == name), "no {name} span");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
