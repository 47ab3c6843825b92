//! Several members of one consumer group: the leases that share a topic's
//! partitions among them, and the runtime that splits the work, keeps each
//! key in order across hand-overs, and fails over when a member leaves.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tidings_consumer::{Consumer, ConsumerConfig, ConsumerStats};
use tidings_core::{Backoff, ConsumerStore, Fence, Handling, LagSource, Lease, LeaseStore};
use tidings_log::{LogPublisher, LogReaderConfig, LogSubscriber};
use tidings_relay::{Relay, RelayConfig};
use tidings_sql::{Dialect, SqlStore};
use tokio_util::sync::CancellationToken;

use super::fixtures::{Recorder, StoreExt, TOPIC, eventually, produce, setup};
use crate::services::TestDb;

const WAIT: Duration = Duration::from_secs(60);
const PARTITIONS: u32 = 4;

async fn holds<D: Dialect>(store: &SqlStore<D>, member: &str, lease: Lease) -> bool {
    let mut tx = store.begin().await.unwrap();
    let held = store.holds_lease(&mut *tx, "g@t", member, lease).await.unwrap();
    tx.rollback().await.unwrap();
    held
}

fn lease(partition: u32, fence: i64) -> Lease {
    Lease { partition, fence }
}

/// Membership, leases and fences: a live lease has one holder, a lapsed or
/// released one passes on with a higher fence, and handling under a stale fence is refused.
pub async fn leases_go_to_one_member_and_fences_grow<T: TestDb>(db: &T) {
    let store = setup(db).await;
    let ttl = Duration::from_secs(30);
    let (s, a, b) = ("g@t", "member-a", "member-b");
    store.heartbeat(s, a, ttl).await.unwrap();
    assert_eq!(store.heartbeat(s, b, ttl).await.unwrap(), vec![a, b]);

    let taken = store.acquire(s, a, &[0, 1, 2], ttl).await.unwrap();
    assert_eq!(taken, vec![lease(0, 1), lease(1, 1), lease(2, 1)]);
    assert!(
        store.acquire(s, b, &[1], ttl).await.unwrap().is_empty(),
        "a live lease is not taken"
    );
    assert_eq!(
        store.acquire(s, a, &[0, 1, 2], ttl).await.unwrap(),
        taken,
        "renewing keeps the fence"
    );

    store.release(s, a, &[1]).await.unwrap();
    assert_eq!(store.acquire(s, b, &[1], ttl).await.unwrap(), vec![lease(1, 2)]);
    assert!(
        !holds(&store, a, lease(1, 1)).await,
        "the old holder's fence is refused"
    );
    assert!(holds(&store, b, lease(1, 2)).await);
    assert!(holds(&store, a, lease(0, 1)).await);

    // A lease that lapses passes to whoever asks, with a new fence.
    store
        .acquire(s, a, &[2], Duration::from_millis(300))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!holds(&store, a, lease(2, 1)).await, "a lapsed lease is not held");
    assert_eq!(store.acquire(s, b, &[2], ttl).await.unwrap(), vec![lease(2, 2)]);
    assert!(store.acquire(s, a, &[2], ttl).await.unwrap().is_empty());

    // Leaving frees every lease at once and leaves the membership.
    store.leave(s, b).await.unwrap();
    assert_eq!(store.heartbeat(s, a, ttl).await.unwrap(), vec![a]);
    assert_eq!(
        store.acquire(s, a, &[1, 2], ttl).await.unwrap(),
        vec![lease(1, 3), lease(2, 3)]
    );

    // Handling opens with the marker under the fence: refused with a stale
    // lease, fresh once, then a duplicate.
    let id = uuid::Uuid::now_v7();
    let fence = |member, lease| {
        Some(Fence {
            scope: s,
            member,
            lease,
        })
    };
    assert_eq!(
        begin_handling(&store, id, fence(a, lease(1, 2))).await,
        Handling::LeaseLost
    );
    assert_eq!(
        begin_handling(&store, id, fence(b, lease(1, 3))).await,
        Handling::LeaseLost
    );
    assert_eq!(
        begin_handling(&store, id, fence(a, lease(1, 3))).await,
        Handling::Fresh
    );
    assert_eq!(
        begin_handling(&store, id, fence(a, lease(1, 3))).await,
        Handling::Duplicate
    );
    assert_eq!(begin_handling(&store, id, None).await, Handling::Duplicate);
    assert_eq!(
        begin_handling(&store, uuid::Uuid::now_v7(), None).await,
        Handling::Fresh
    );
}

/// Opens the handling of `id` as the runtime does: commits if fresh, else rolls back.
async fn begin_handling<D: Dialect>(
    store: &SqlStore<D>,
    id: uuid::Uuid,
    fence: Option<Fence<'_>>,
) -> Handling {
    let mut tx = store.begin().await.unwrap();
    let handling = store.begin_handling(&mut *tx, "g", id, fence).await.unwrap();
    if handling == Handling::Fresh {
        tx.commit().await.unwrap();
    } else {
        tx.rollback().await.unwrap();
    }
    handling
}

fn subscriber<D: Dialect>(store: &SqlStore<D>) -> LogSubscriber<SqlStore<D>> {
    LogSubscriber::new(
        Arc::new(store.clone()),
        LogReaderConfig::default()
            .poll_interval(Duration::from_millis(20))
            .partitions(PARTITIONS),
    )
}

/// One member of the group `shared`, running until its token is cancelled.
struct Member {
    stop: CancellationToken,
    stats: Arc<ConsumerStats>,
    task: tokio::task::JoinHandle<()>,
}

impl Member {
    fn start<D: Dialect>(store: &SqlStore<D>, id: &str, recorder: &Recorder) -> Member {
        let consumer = Consumer::new("shared", store.clone(), recorder.clone())
            .topic(TOPIC)
            .config(
                ConsumerConfig::default()
                    .lanes(4)
                    .member(id)
                    .lease_ttl(Duration::from_millis(900))
                    .backoff(Backoff::new(Duration::from_millis(1), Duration::from_millis(5))),
            );
        let stats = consumer.stats();
        let stop = CancellationToken::new();
        let subscriber = subscriber(store);
        let task = tokio::spawn({
            let stop = stop.clone();
            async move { consumer.run(&subscriber, stop).await.unwrap() }
        });
        Member { stop, stats, task }
    }

    async fn stop(self) {
        self.stop.cancel();
        self.task.await.unwrap();
    }
}

async fn applied<D: Dialect>(store: &SqlStore<D>) -> i64 {
    store
        .count("SELECT count(*) FROM test_applied WHERE consumer = 'shared'")
        .await
}

/// Two members split a topic's partitions, hand them over as one joins and the
/// other leaves, and handle each event once, each key in order.
pub async fn members_split_the_partitions_and_keep_each_key_in_order<T: TestDb>(db: &T) {
    let store = setup(db).await;
    const KEYS: usize = 12;
    let stop = CancellationToken::new();
    let relay = Relay::new(store.clone(), LogPublisher::new(Arc::new(store.clone())))
        .config(RelayConfig::default().poll_interval(Duration::from_millis(20)));
    let relay = tokio::spawn(relay.run(stop.clone()));
    // One handler shared by both members: `seen` is the group's handling order.
    let recorder = Recorder {
        max_sleep_ms: 2,
        ..Recorder::default()
    };
    let first = Member::start(&store, "m1", &recorder);
    produce(&store, KEYS, 1..=10).await;
    // The second member joins mid-stream: the first hands half the partitions over.
    let second = Member::start(&store, "m2", &recorder);
    eventually(WAIT, "the second member takes its share", || async {
        store
            .count("SELECT count(*) FROM tidings_leases WHERE owner = 'm2'")
            .await
            > 0
    })
    .await;
    produce(&store, KEYS, 11..=30).await;
    eventually(WAIT, "every event handled by the group", || async {
        applied(&store).await == KEYS as i64 * 30
    })
    .await;
    let (by_first, by_second) = (first.stats.handled(), second.stats.handled());
    assert!(
        by_first > 0 && by_second > 0,
        "both members took part: {by_first} and {by_second}"
    );

    // The first member leaves: the second takes every partition over.
    first.stop().await;
    produce(&store, KEYS, 31..=40).await;
    eventually(WAIT, "the survivor handles the rest", || async {
        applied(&store).await == KEYS as i64 * 40
    })
    .await;
    // A member counts an event just after its transaction commits: the
    // last ones may be applied a moment before they are counted.
    eventually(WAIT, "the survivor counts the rest as its own", || async {
        second.stats.handled() >= by_second + KEYS as u64 * 10
    })
    .await;
    second.stop().await;
    stop.cancel();
    relay.await.unwrap().unwrap();
    let lag = store.lag().await.unwrap();
    let shared: Vec<_> = lag.consumers.iter().filter(|c| c.consumer == "shared").collect();
    assert_eq!(
        shared.len(),
        1,
        "one line per group, its partitions summed: {lag:?}"
    );
    assert_eq!(
        shared[0].pending, 0,
        "every partition's offset is stored on shutdown"
    );

    let distinct = store
        .count("SELECT count(*) FROM (SELECT DISTINCT k, seq FROM test_applied WHERE consumer = 'shared') d")
        .await;
    assert_eq!(distinct, KEYS as i64 * 40, "each event applied exactly once");
    let mut per_key: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for (key, seq) in recorder.seen() {
        per_key.entry(key).or_default().push(seq);
    }
    for (key, seqs) in per_key {
        assert!(
            seqs.windows(2).all(|w| w[0] <= w[1]),
            "key {key} handled out of order across members: {seqs:?}"
        );
    }
}
