//! Several relays on one database: the outbox's partitions are leased
//! among them, each key's records go out in commit order while relays come
//! and go, and a relay whose lease was taken over publishes nothing more.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tidings_core::log::LogBackend;
use tidings_core::{LagSource, OutgoingMessage, Publisher};
use tidings_log::LogPublisher;
use tidings_relay::{Relay, RelayConfig, Round};
use tidings_sql::{Dialect, SqlStore};
use tokio_util::sync::CancellationToken;

use super::fixtures::{StoreExt, TestEvent, eventually, produce, setup};
use crate::services::TestDb;

const WAIT: Duration = Duration::from_secs(60);
const PARTITIONS: u32 = 4;

/// (relay, key, seq) in the order the transport confirmed them.
type PublishLog = Arc<Mutex<Vec<(&'static str, String, i64)>>>;

/// The database log, recording which relay published what, in the order
/// the transport confirmed it.
#[derive(Clone)]
struct Recorded<S> {
    relay: &'static str,
    inner: LogPublisher<S>,
    log: PublishLog,
}

#[async_trait]
impl<B: LogBackend> Publisher for Recorded<B> {
    async fn publish(&self, batch: &[OutgoingMessage]) -> tidings_core::Result<()> {
        // Slow enough that batches of different relays overlap.
        tokio::time::sleep(Duration::from_millis(5)).await;
        self.inner.publish(batch).await?;
        let mut log = self.log.lock().unwrap();
        for m in batch {
            let event: TestEvent = m.envelope.decode().unwrap();
            log.push((self.relay, event.key, event.seq));
        }
        Ok(())
    }
}

fn config(id: &str) -> RelayConfig {
    RelayConfig::default()
        .partitions(PARTITIONS)
        .member(id)
        .batch_size(20)
        .lease_ttl(Duration::from_millis(900))
        .poll_interval(Duration::from_millis(20))
}

struct Running {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<tidings_core::Result<()>>,
}

fn start<D: Dialect>(store: &SqlStore<D>, id: &'static str, log: &PublishLog) -> Running {
    let publisher = Recorded {
        relay: id,
        inner: LogPublisher::new(Arc::new(store.clone())),
        log: log.clone(),
    };
    let relay = Relay::new(store.clone(), publisher).config(config(id));
    let stop = CancellationToken::new();
    let task = tokio::spawn(relay.run(stop.clone()));
    Running { stop, task }
}

/// Whether relay `id` has taken a partition (lease rows keep their last owner).
async fn holds<D: Dialect>(store: &SqlStore<D>, id: &str) -> bool {
    let sql = match id {
        "r1" => "SELECT count(*) FROM tidings_leases WHERE owner = 'r1'",
        "r2" => "SELECT count(*) FROM tidings_leases WHERE owner = 'r2'",
        _ => "SELECT count(*) FROM tidings_leases WHERE owner = 'r3'",
    };
    store.count(sql).await > 0
}

/// Three relays, coming and going, share the outbox's partitions: every record
/// is published, each key's first publishes in commit order.
pub async fn relays_share_the_partitions_and_keep_each_key_in_order<T: TestDb>(db: &T) {
    let store = setup(db).await;
    const KEYS: usize = 16;
    let log: PublishLog = Arc::default();
    let r1 = start(&store, "r1", &log);
    let r2 = start(&store, "r2", &log);
    eventually(WAIT, "the first two relays share the partitions", || async {
        holds(&store, "r1").await && holds(&store, "r2").await
    })
    .await;
    produce(&store, KEYS, 1..=15).await;
    // A third relay joins mid-stream, then the first one leaves.
    let r3 = start(&store, "r3", &log);
    eventually(WAIT, "the third relay takes a share", || holds(&store, "r3")).await;
    produce(&store, KEYS, 16..=30).await;
    r1.stop.cancel();
    r1.task.await.unwrap().unwrap();
    produce(&store, KEYS, 31..=45).await;
    let total = KEYS * 45;
    eventually(WAIT, "every record published", || async {
        let published: std::collections::HashSet<(String, i64)> = log
            .lock()
            .unwrap()
            .iter()
            .map(|(_, k, s)| (k.clone(), *s))
            .collect();
        published.len() == total
    })
    .await;
    for r in [r2, r3] {
        r.stop.cancel();
        r.task.await.unwrap().unwrap();
    }
    assert_eq!(
        store.lag().await.unwrap().outbox_pending,
        0,
        "every record marked sent"
    );

    let log = log.lock().unwrap().clone();
    let mut by_relay: BTreeMap<&str, usize> = BTreeMap::new();
    let mut per_key: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for (relay, key, seq) in &log {
        *by_relay.entry(relay).or_default() += 1;
        per_key.entry(key.clone()).or_default().push(*seq);
    }
    assert!(by_relay.len() == 3, "every relay published a share: {by_relay:?}");
    for (key, seqs) in per_key {
        // A record may go out twice (a batch published, then not completed
        // in time); what counts is that each first publish keeps commit order.
        let mut firsts = Vec::new();
        for s in seqs {
            if !firsts.contains(&s) {
                firsts.push(s);
            }
        }
        assert_eq!(
            firsts,
            (1..=45).collect::<Vec<_>>(),
            "key {key} published out of order"
        );
    }
}

/// A relay whose leases lapsed and were taken over claims and publishes nothing.
pub async fn a_relay_whose_lease_was_taken_publishes_nothing<T: TestDb>(db: &T) {
    let store = setup(db).await;
    let log: PublishLog = Arc::default();
    let relay = |id: &'static str| {
        let publisher = Recorded {
            relay: id,
            inner: LogPublisher::new(Arc::new(store.clone())),
            log: log.clone(),
        };
        Relay::new(store.clone(), publisher).config(config(id).lease_ttl(Duration::from_millis(300)))
    };
    // The first relay takes every partition, then stalls: it renews nothing.
    let stalled = relay("stalled");
    assert_eq!(stalled.join().await.unwrap().len(), PARTITIONS as usize);
    produce(&store, 8, 1..=5).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Its leases lapsed: another relay takes them over, with new fences.
    let successor = relay("successor");
    assert_eq!(successor.join().await.unwrap().len(), PARTITIONS as usize);
    // The stalled relay wakes up: its fences are stale, so it claims nothing.
    assert_eq!(stalled.round().await.unwrap(), Round::Idle);
    assert!(log.lock().unwrap().is_empty(), "the stalled relay published");
    while successor.round().await.unwrap() != Round::Idle {}
    let log = log.lock().unwrap();
    assert_eq!(log.len(), 40);
    assert!(log.iter().all(|(relay, _, _)| *relay == "successor"));
}

/// The database log, holding the first batch until the gate opens.
struct Gated<S> {
    inner: Recorded<S>,
    gate: Arc<tokio::sync::Semaphore>,
}

#[async_trait]
impl<B: LogBackend> Publisher for Gated<B> {
    async fn publish(&self, batch: &[OutgoingMessage]) -> tidings_core::Result<()> {
        let _pass = self.gate.acquire().await.unwrap();
        self.inner.publish(batch).await
    }
}

/// A relay stalled in the middle of a batch while its leases lapse either
/// finishes before they change hands or marks nothing; every record goes out.
pub async fn a_relay_stalled_mid_batch_marks_nothing_it_no_longer_holds<T: TestDb>(db: &T) {
    let store = setup(db).await;
    let log: PublishLog = Arc::default();
    let recorded = |id: &'static str| Recorded {
        relay: id,
        inner: LogPublisher::new(Arc::new(store.clone())),
        log: log.clone(),
    };
    let short = |id| config(id).lease_ttl(Duration::from_millis(300));
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let stalled = Relay::new(
        store.clone(),
        Gated {
            inner: recorded("stalled"),
            gate: gate.clone(),
        },
    )
    .config(short("stalled"));
    assert_eq!(stalled.join().await.unwrap().len(), PARTITIONS as usize);
    produce(&store, 8, 1..=5).await;
    // It claims a batch and stalls in the middle of publishing it, long
    // enough for its leases to lapse.
    let stalled = Arc::new(stalled);
    let round = tokio::spawn({
        let stalled = stalled.clone();
        async move { stalled.round().await }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    // A successor joins and drains the outbox. On PostgreSQL the stalled
    // batch's share locks keep the partitions from changing hands until it
    // ends; on SQLite the successor takes them over at once.
    let successor = Relay::new(store.clone(), recorded("successor")).config(config("successor"));
    let drain = tokio::spawn(async move {
        successor.join().await.unwrap();
        while successor.round().await.unwrap() != Round::Idle {}
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    gate.add_permits(1000);
    let stalled_result = round.await.unwrap();
    drain.await.unwrap();
    assert_eq!(store.lag().await.unwrap().outbox_pending, 0);

    let published = log.lock().unwrap().clone();
    let mut per_key: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for (_, key, seq) in &published {
        per_key.entry(key.clone()).or_default().push(*seq);
    }
    assert_eq!(per_key.len(), 8, "every key published");
    let successor_published = published.iter().filter(|(r, _, _)| *r == "successor").count();
    println!("stalled relay's round: {stalled_result:?}; the successor published {successor_published}");
    match stalled_result {
        // The batch ended before anyone else could take the partitions:
        // the successor published the rest.
        Ok(Round::Published(n)) => assert_eq!(n + successor_published, 40),
        // The partitions changed hands mid-batch: the stalled relay marked
        // nothing, and the successor published everything itself.
        Err(e) => {
            assert!(e.to_string().contains("changed hands"), "{e}");
            assert_eq!(
                successor_published, 40,
                "the successor publishes what the stalled relay could not mark"
            );
        }
        Ok(other) => panic!("the stalled relay's round ended {other:?}"),
    }
}
