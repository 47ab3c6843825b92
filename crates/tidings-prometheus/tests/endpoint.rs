//! The endpoint serves what the relay, a consumer and the lag sampler record.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use sqlx::Sqlite;
use tidings_consumer::{Consumer, ConsumerConfig, Context, Handler, HandlerError, Settled};
use tidings_core::metrics::{self, CATALOG, MetricKind};
use tidings_core::{Backoff, Envelope, Kind, LagSource, Message, Outbox};
use tidings_relay::{Relay, Round};
use tidings_testkit::services::SqliteTestDb;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

#[derive(Serialize, Deserialize)]
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
        format!("k{}", self.n % 3)
    }
}

/// Fails each message's first attempt.
#[derive(Default)]
struct FlakyOnce(AtomicU32);

#[async_trait]
impl Handler<Sqlite> for FlakyOnce {
    async fn handle(&self, _ctx: &mut Context<'_, Sqlite>) -> Result<(), HandlerError> {
        if self.0.fetch_add(1, Ordering::SeqCst) == 0 {
            return Err(HandlerError::transient("first attempt fails"));
        }
        Ok(())
    }
}

async fn scrape(addr: std::net::SocketAddr) -> String {
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("the endpoint accepts");
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    response
}

/// The value of the sample `series` (name and labels exactly as rendered).
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

#[tokio::test]
async fn relay_consumer_and_lag_figures_reach_the_endpoint() {
    let handle = tidings_prometheus::install().expect("the first recorder of this process");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    tokio::spawn(tidings_prometheus::serve(listener, handle, shutdown.clone()));

    let db = SqliteTestDb::new().await;
    let store = db.store.clone();
    let mut tx = store.pool().begin().await.unwrap();
    for n in 0..25 {
        store.enqueue(&mut tx, &Ping { n }).await.unwrap();
    }
    tx.commit().await.unwrap();
    metrics::record_lag(&store.lag().await.unwrap());
    let before = scrape(addr).await;
    assert_eq!(sample(&before, "tidings_outbox_pending"), Some(25.0));
    assert!(sample(&before, "tidings_outbox_oldest_unsent_age_seconds").unwrap() >= 0.0);
    for m in CATALOG {
        assert!(
            before.contains(&format!("# HELP {} ", m.name)) || !before.contains(m.name),
            "{}",
            m.name
        );
    }

    let relay = Relay::new(store.clone(), store.log_publisher())
        .config(tidings_relay::RelayConfig::default().batch_size(10));
    while relay.round().await.unwrap() != Round::Idle {}
    let consumer = Consumer::new("metrics-probe", store.clone(), FlakyOnce::default()).config(
        ConsumerConfig::default().backoff(Backoff::new(Duration::from_millis(1), Duration::from_millis(2))),
    );
    let envelope = Envelope::new("metrics-test", &Ping { n: 99 }).unwrap();
    assert_eq!(consumer.deliver(Ping::TOPIC, &envelope).await, Settled::Handled);
    assert_eq!(consumer.deliver(Ping::TOPIC, &envelope).await, Settled::Duplicate);
    metrics::record_lag(&store.lag().await.unwrap());

    let after = scrape(addr).await;
    assert_eq!(sample(&after, "tidings_outbox_pending"), Some(0.0));
    assert_eq!(
        sample(&after, "tidings_outbox_oldest_unsent_age_seconds"),
        Some(0.0)
    );
    assert_eq!(sample(&after, "tidings_relay_published_total"), Some(25.0));
    assert_eq!(sample(&after, "tidings_relay_batches_total"), Some(3.0));
    assert_eq!(sample(&after, "tidings_relay_batch_size_count"), Some(3.0));
    assert_eq!(sample(&after, "tidings_relay_batch_size_sum"), Some(25.0));
    assert_eq!(
        sample(&after, "tidings_relay_batch_size_bucket{le=\"10\"}"),
        Some(3.0)
    );
    assert_eq!(
        sample(&after, "tidings_relay_publish_duration_seconds_count"),
        Some(3.0)
    );
    let probe = |name: &str| sample(&after, &format!("{name}{{consumer=\"metrics-probe\"}}"));
    assert_eq!(probe("tidings_consumer_handled_total"), Some(1.0));
    assert_eq!(probe("tidings_consumer_failed_total"), Some(1.0));
    assert_eq!(probe("tidings_consumer_retried_total"), Some(1.0));
    assert_eq!(probe("tidings_consumer_duplicates_total"), Some(1.0));
    assert_eq!(
        probe("tidings_consumer_handler_duration_seconds_count"),
        Some(2.0)
    );
    // Every counter and histogram recorded here is described, typed as the catalog says.
    for m in CATALOG
        .iter()
        .filter(|m| after.contains(&format!("\n{}", m.name)))
    {
        let kind = match m.kind {
            MetricKind::Counter => "counter",
            MetricKind::Gauge => "gauge",
            MetricKind::Histogram => "histogram",
        };
        assert!(
            after.contains(&format!("# TYPE {} {kind}", m.name)),
            "{} is not a {kind}",
            m.name
        );
        assert!(
            after.contains(&format!("# HELP {} {}", m.name, m.help)),
            "{} has no help",
            m.name
        );
    }
    shutdown.cancel();
}
