//! Spans reach an OTLP/HTTP collector, and a message's handling is a child
//! of the span that created the message, through its `traceparent`.

use std::time::{Duration, Instant};

use tidings_core::{Envelope, Kind, Message};
use tracing_subscriber::layer::SubscriberExt;

#[derive(serde::Serialize, serde::Deserialize)]
struct Ping {
    n: u32,
}

impl Message for Ping {
    const TYPE: &'static str = "Ping";
    const VERSION: u32 = 1;
    const KIND: Kind = Kind::Event;
    const AGGREGATE: &'static str = "ping";
    const TOPIC: &'static str = "pings";
    fn key(&self) -> String {
        self.n.to_string()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handling_span_is_a_child_of_the_span_that_wrote_the_message() {
    let collector = tidings_testkit::otlp::Collector::start().await;
    let otel = tidings_otel::install(&collector.endpoint, "tidings-otel-test").unwrap();
    let subscriber = tracing_subscriber::registry().with(otel.layer());
    let envelope = tracing::subscriber::with_default(subscriber, || {
        let place = tracing::info_span!("place-order");
        let envelope = place.in_scope(|| Envelope::new("test", &Ping { n: 1 }).unwrap());
        // Elsewhere (another process, as far as the span knows): handling it.
        let handle = tracing::info_span!("tidings.handle");
        tidings_core::trace::set_parent(&handle, &envelope.trace().unwrap());
        handle.in_scope(|| tracing::info!("handled"));
        envelope
    });
    tokio::task::block_in_place(|| otel.flush());

    let deadline = Instant::now() + Duration::from_secs(20);
    let spans = loop {
        let spans = collector.spans();
        if spans.len() >= 2 || Instant::now() > deadline {
            break spans;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let by_name = |name: &str| {
        spans
            .iter()
            .find(|s| s["name"] == name)
            .unwrap_or_else(|| panic!("no {name} span in {spans:#?}"))
            .clone()
    };
    let (place, handle) = (by_name("place-order"), by_name("tidings.handle"));
    let trace = envelope.trace().unwrap();
    assert_eq!(
        place["traceId"],
        trace.trace_id_hex(),
        "the envelope joins the current trace"
    );
    assert_eq!(
        place["spanId"],
        format!("{:016x}", trace.span_id),
        "its parent is the writing span"
    );
    assert_eq!(
        handle["traceId"], place["traceId"],
        "handling is in the same trace"
    );
    assert_eq!(
        handle["parentSpanId"], place["spanId"],
        "handling is a child of the writing span"
    );
}
