//! A backlog larger than the broker confirms within the publish timeout
//! still drains: the relay claims fewer records per round after a batch
//! timed out, and more again once batches go through.

use std::time::Duration;

use async_trait::async_trait;
use tidings_core::{OutgoingMessage, Publisher};
use tidings_relay::{Relay, RelayConfig};
use tidings_testkit::services::{SqliteTestDb, TestDb};
use tidings_testkit::store_conformance::fixtures::{StoreExt, message};

/// The database log, confirming 10 ms per record: 100 records take a
/// second, ten times the relay's publish timeout below.
struct Slow<P>(P);

#[async_trait]
impl<P: Publisher> Publisher for Slow<P> {
    async fn publish(&self, batch: &[OutgoingMessage]) -> tidings_core::Result<()> {
        tokio::time::sleep(Duration::from_millis(10) * batch.len() as u32).await;
        self.0.publish(batch).await
    }
}

#[tokio::test]
async fn a_backlog_the_broker_cannot_confirm_in_one_timeout_drains_in_smaller_rounds() {
    let db = SqliteTestDb::create().await;
    let store = db.store().clone();
    let backlog: Vec<_> = (0..100).map(|i| message(&format!("k{}", i % 7), i)).collect();
    store.enqueue_all(&backlog).await;
    let relay = Relay::new(store.clone(), Slow(store.log_publisher())).config(
        RelayConfig::default()
            .batch_size(100)
            .publish_timeout(Duration::from_millis(100)),
    );
    let mut limits = vec![relay.claim_limit()];
    let mut timeouts = 0;
    for _ in 0..60 {
        if relay.stats().published() == 100 {
            break;
        }
        if let Err(e) = relay.round().await {
            assert!(e.to_string().contains("no confirmation within"), "{e}");
            timeouts += 1;
        }
        limits.push(relay.claim_limit());
    }
    assert_eq!(relay.stats().published(), 100, "claim limits {limits:?}");
    assert_eq!(
        store
            .count("SELECT count(*) FROM tidings_outbox WHERE published_at IS NULL")
            .await,
        0
    );
    // Halved after each timeout down to what goes through in time (fewer
    // than 10 records), then doubled back after each batch sent.
    assert!(timeouts >= 3, "claim limits {limits:?}");
    assert!(limits.iter().any(|&l| l < 10), "claim limits {limits:?}");
    assert!(
        limits.windows(2).any(|w| w[1] == w[0] * 2),
        "the limit grows back after batches went through: {limits:?}"
    );
    db.teardown().await;
}
