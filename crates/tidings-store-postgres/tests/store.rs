//! The PostgreSQL store passes the store conformance suite, and wakes
//! relays in other processes.

use std::time::Duration;

use tidings_relay::{Relay, RelayConfig};
use tidings_testkit::services::PgTestDb;
use tidings_testkit::store_conformance::fixtures::{StoreExt, eventually, message};
use tokio_util::sync::CancellationToken;

tidings_testkit::store_conformance!(tidings_testkit::services::PgTestDb);

/// A producer in one process wakes a relay in another through NOTIFY,
/// sent after commit: the relay publishes long before its polling interval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_wakes_relays_in_other_processes_after_commit() {
    let db = PgTestDb::new().await;
    // A second pool on the same schema stands for the producing process.
    let producer = tidings_store_postgres::PgStore::connect(&db.url).await.unwrap();
    let relay = Relay::new(db.store.clone(), db.store.log_publisher())
        .config(RelayConfig::default().poll_interval(Duration::from_secs(60)));
    let stats = relay.stats();
    let stop = CancellationToken::new();
    let task = tokio::spawn(relay.run(stop.clone()));
    // Let the relay go idle (and start listening).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = tokio::time::Instant::now();
    producer.enqueue_in_tx(&message("w", 1), true).await;
    eventually(Duration::from_secs(5), "the woken relay to publish", || async {
        stats.published() == 1
    })
    .await;
    assert!(started.elapsed() < Duration::from_secs(5));
    stop.cancel();
    task.await.unwrap().unwrap();
    producer.pool().close().await;
    db.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_refused_for_the_handlers_writes_is_dead_lettered() {
    let db = PgTestDb::new().await;
    tidings_testkit::store_conformance::dead_letters::a_commit_refused_for_the_handlers_writes_is_dead_lettered(&db)
        .await;
    db.drop_schema().await;
}
