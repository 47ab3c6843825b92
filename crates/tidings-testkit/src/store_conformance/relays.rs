//! Several relays on one database: the outbox's partitions are leased
//! among them, each key's records go out in commit order while relays come
//! and go, and a relay whose lease was taken over publishes nothing more.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tidings_core::log::LogBackend;
use tidings_core::partition::key_hash;
use tidings_core::{
    Backoff, DeadLetterFilter, FailureStore, LagSource, OutgoingMessage, Publisher, RELAY_LETTERS,
};
use tidings_log::LogPublisher;
use tidings_relay::{Relay, RelayConfig, Round};
use tidings_sql::{Dialect, SqlStore};
use tokio_util::sync::CancellationToken;

use super::fixtures::{StoreExt, TestEvent, eventually, message, produce, setup};
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
    in_commit_order(per_key, 45);
}

/// Asserts that each key's records `1..=last` were first published in
/// commit order. A record may go out twice (a batch published, then not
/// completed in time); what counts is that each first publish keeps order.
fn in_commit_order(per_key: BTreeMap<String, Vec<i64>>, last: i64) {
    for (key, seqs) in per_key {
        let mut firsts = Vec::new();
        for s in seqs {
            if !firsts.contains(&s) {
                firsts.push(s);
            }
        }
        assert_eq!(
            firsts,
            (1..=last).collect::<Vec<_>>(),
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

/// The database log, freezing the whole relay once, in its third publish,
/// as a SIGSTOP would: the relay's lanes and its lease renewals run in one
/// task, which a blocking sleep stops with its thread.
struct Freezing<S> {
    inner: Recorded<S>,
    calls: Arc<AtomicUsize>,
    freeze: Duration,
}

#[async_trait]
impl<B: LogBackend> Publisher for Freezing<B> {
    async fn publish(&self, batch: &[OutgoingMessage]) -> tidings_core::Result<()> {
        if self.calls.fetch_add(1, Ordering::SeqCst) + 1 == 3 {
            std::thread::sleep(self.freeze);
        }
        self.inner.publish(batch).await
    }
}

/// A relay with several batches in flight, frozen past its leases while
/// another relay takes over: whatever it had in flight either ends before
/// the partitions change hands or is marked by nobody but their new
/// holder, its lanes claim nothing they no longer hold, and every key's
/// records still go out, first in commit order.
pub async fn a_pipelined_relay_frozen_past_its_leases_keeps_each_key_in_order<T: TestDb>(db: &T) {
    let store = setup(db).await;
    const KEYS: usize = 8;
    const LAST: i64 = 30;
    let log: PublishLog = Arc::default();
    produce(&store, KEYS, 1..=LAST).await;
    let calls = Arc::new(AtomicUsize::new(0));
    let frozen = Relay::new(
        store.clone(),
        Freezing {
            inner: Recorded {
                relay: "frozen",
                inner: LogPublisher::new(Arc::new(store.clone())),
                log: log.clone(),
            },
            calls: calls.clone(),
            freeze: Duration::from_millis(1500),
        },
    )
    .config(
        config("frozen")
            .lease_ttl(Duration::from_millis(300))
            .max_in_flight_batches(PARTITIONS as usize),
    );
    let stats = frozen.stats();
    let stop = CancellationToken::new();
    let task = tokio::spawn(frozen.run(stop.clone()));
    eventually(WAIT, "the relay froze in its third publish", || async {
        calls.load(Ordering::SeqCst) >= 3
    })
    .await;
    let successor = start(&store, "successor", &log);
    eventually(WAIT, "every record marked sent", || async {
        store.lag().await.unwrap().outbox_pending == 0
    })
    .await;
    stop.cancel();
    task.await.unwrap().unwrap();
    successor.stop.cancel();
    successor.task.await.unwrap().unwrap();

    assert!(
        stats.most_in_flight() >= 2,
        "the frozen relay had several batches in flight: {}",
        stats.most_in_flight()
    );
    let log = log.lock().unwrap().clone();
    let mut by_relay: BTreeMap<&str, usize> = BTreeMap::new();
    let mut per_key: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for (relay, key, seq) in &log {
        *by_relay.entry(relay).or_default() += 1;
        per_key.entry(key.clone()).or_default().push(*seq);
    }
    println!("published by relay: {by_relay:?}");
    assert_eq!(per_key.len(), KEYS, "every key published");
    in_commit_order(per_key, LAST);
}

/// The database log, counting the batches in flight at once, and refusing
/// the first batches of one partition as a broker that lost that
/// partition's leader would.
struct Windowed<B> {
    inner: LogPublisher<B>,
    refused_partition: u32,
    refusals_left: AtomicUsize,
    in_flight: AtomicUsize,
    most_in_flight: AtomicUsize,
    others_sent_while_refusing: AtomicUsize,
    log: PublishLog,
}

#[async_trait]
impl<B: LogBackend> Publisher for Windowed<B> {
    async fn publish(&self, batch: &[OutgoingMessage]) -> tidings_core::Result<()> {
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_in_flight.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(10)).await;
        let refused = batch
            .iter()
            .any(|m| key_hash(&m.envelope.aggregate_key) % PARTITIONS == self.refused_partition)
            && self
                .refusals_left
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
        let result = if refused {
            Err(tidings_core::Error::transport_reason(
                "test",
                "the partition's leader is away",
                true,
            ))
        } else {
            self.inner.publish(batch).await
        };
        if result.is_ok() {
            if self.refusals_left.load(Ordering::SeqCst) > 0 {
                self.others_sent_while_refusing
                    .fetch_add(batch.len(), Ordering::SeqCst);
            }
            let mut log = self.log.lock().unwrap();
            for m in batch {
                let event: TestEvent = m.envelope.decode().unwrap();
                log.push(("relay", event.key, event.seq));
            }
        }
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        result
    }
}

/// Records `1..=last` of `keys` keys (`key-0`, ...), in rounds of one record per key.
fn backlog(keys: usize, last: i64) -> Vec<OutgoingMessage> {
    (1..=last)
        .flat_map(|seq| (0..keys).map(move |k| message(&format!("key-{k}"), seq)))
        .collect()
}

/// One relay holding every partition keeps a batch of each in flight at
/// once; a partition whose batches fail waits alone, and every key's
/// records still go out in commit order.
pub async fn one_relay_keeps_several_partitions_in_flight_and_each_key_in_order<T: TestDb>(db: &T) {
    let store = setup(db).await;
    const KEYS: usize = 16;
    const LAST: i64 = 30;
    store.enqueue_all(&backlog(KEYS, LAST)).await;
    let publisher = Arc::new(Windowed {
        inner: LogPublisher::new(Arc::new(store.clone())),
        refused_partition: key_hash("key-0") % PARTITIONS,
        refusals_left: AtomicUsize::new(3),
        in_flight: AtomicUsize::new(0),
        most_in_flight: AtomicUsize::new(0),
        others_sent_while_refusing: AtomicUsize::new(0),
        log: PublishLog::default(),
    });
    let relay = Relay::new(store.clone(), publisher.clone()).config(
        config("relay")
            .max_in_flight_batches(PARTITIONS as usize)
            .backoff(Backoff::new(
                Duration::from_millis(50),
                Duration::from_millis(200),
            )),
    );
    let stop = CancellationToken::new();
    let task = tokio::spawn(relay.run(stop.clone()));
    eventually(WAIT, "every record published", || async {
        store.lag().await.unwrap().outbox_pending == 0
    })
    .await;
    stop.cancel();
    task.await.unwrap().unwrap();

    let most = publisher.most_in_flight.load(Ordering::SeqCst);
    assert!(
        (2..=PARTITIONS as usize).contains(&most),
        "at most one batch per partition in flight, and more than one at once: {most}"
    );
    assert_eq!(publisher.refusals_left.load(Ordering::SeqCst), 0);
    assert!(
        publisher.others_sent_while_refusing.load(Ordering::SeqCst) > 0,
        "the other partitions went on while one was refused"
    );
    let mut per_key: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for (_, key, seq) in publisher.log.lock().unwrap().iter() {
        per_key.entry(key.clone()).or_default().push(*seq);
    }
    assert_eq!(per_key.len(), KEYS, "every key published");
    in_commit_order(per_key, LAST);
}

/// The database log behind one channel that all publishes share, as
/// RabbitMQ's: the broker refuses one record by closing the channel, and
/// every publish under way on it fails with the same refusal.
struct SharedChannel<B> {
    inner: LogPublisher<B>,
    /// The record the broker refuses: (key, seq).
    refused: (String, i64),
    /// Grows each time the channel is closed.
    closings: AtomicUsize,
}

#[async_trait]
impl<B: LogBackend> Publisher for SharedChannel<B> {
    async fn publish(&self, batch: &[OutgoingMessage]) -> tidings_core::Result<()> {
        let closed = || {
            tidings_core::Error::transport_reason(
                "test",
                "the broker closed the channel: PRECONDITION_FAILED",
                false,
            )
        };
        let opened = self.closings.load(Ordering::SeqCst);
        let refused = batch.iter().any(|m| {
            let event: TestEvent = m.envelope.decode().unwrap();
            (event.key, event.seq) == self.refused
        });
        if refused {
            self.closings.fetch_add(1, Ordering::SeqCst);
            return Err(closed());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        if self.closings.load(Ordering::SeqCst) != opened {
            return Err(closed());
        }
        self.inner.publish(batch).await
    }
}

/// A refusal that fails every publish under way (a channel the lanes
/// share, closed by the broker) is blamed on its one record: the other
/// lanes' records go out, only that record becomes a dead letter, and
/// only its key waits behind it.
pub async fn a_refusal_that_fails_every_lane_blames_only_its_record<T: TestDb>(db: &T) {
    let store = setup(db).await;
    const KEYS: usize = 16;
    const LAST: i64 = 10;
    store.enqueue_all(&backlog(KEYS, LAST)).await;
    let publisher = SharedChannel {
        inner: LogPublisher::new(Arc::new(store.clone())),
        refused: ("key-0".to_owned(), 5),
        closings: AtomicUsize::new(0),
    };
    let relay = Relay::new(store.clone(), publisher).config(
        config("relay")
            .max_in_flight_batches(PARTITIONS as usize)
            // Batches of one record: a batch refused whole is its record
            // refused, unless the refusal is checked alone.
            .batch_size(1)
            .backoff(Backoff::new(Duration::from_millis(10), Duration::from_millis(50))),
    );
    let stop = CancellationToken::new();
    let task = tokio::spawn(relay.run(stop.clone()));
    // key-0's seq 5 is set aside, and its 5 later records wait behind it.
    let behind = (LAST - 5) as u64;
    eventually(
        WAIT,
        "everything but key-0's refused record and those behind it sent",
        || async {
            store.lag().await.unwrap().outbox_pending == behind + 1
                && !store
                    .dead_letters(&DeadLetterFilter::default().consumer(RELAY_LETTERS))
                    .await
                    .unwrap()
                    .is_empty()
        },
    )
    .await;
    // Long enough for a wrongly blamed record to show.
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.cancel();
    task.await.unwrap().unwrap();
    let letters = store
        .dead_letters(&DeadLetterFilter::default().consumer(RELAY_LETTERS))
        .await
        .unwrap();
    let blamed: Vec<(Option<String>, Option<uuid::Uuid>)> = letters
        .iter()
        .map(|l| (l.aggregate_key.clone(), l.message_id))
        .collect();
    assert_eq!(
        blamed.len(),
        1,
        "only the refused record is a dead letter: {blamed:?}"
    );
    assert_eq!(blamed[0].0.as_deref(), Some("key-0"));
    assert_eq!(
        store.lag().await.unwrap().outbox_pending,
        behind + 1,
        "every other key's records sent"
    );
}
