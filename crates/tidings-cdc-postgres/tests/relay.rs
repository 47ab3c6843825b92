//! The relay in CDC mode on a real PostgreSQL (`wal_level = logical`):
//! records committed before the slot and after it go out once, each key's
//! in commit order, with sixteen writers committing interleaved
//! transactions; a relay stopped mid-stream loses nothing and its successor
//! takes the slot over; a record that cannot go out holds only its key and
//! the rest goes on; the slot's position follows what was sent; and the
//! slot and publication go when dropped.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tidings_cdc_postgres::slot::{self, SlotName};
use tidings_cdc_postgres::{CdcOptions, CdcStore};
use tidings_core::{Error, FailureStore, Outbox, OutgoingMessage, Publisher, Result};
use tidings_relay::{Relay, RelayConfig};
use tidings_store_postgres::PgStore;
use tidings_testkit::services::PgTestDb;
use tidings_testkit::store_conformance::fixtures::{TestEvent, message};
use tokio_util::sync::CancellationToken;

/// What the transport confirmed, in order: (key, seq).
#[derive(Clone, Default)]
struct Recorded {
    sent: Arc<Mutex<Vec<(String, i64)>>>,
    /// While set, every publish fails as a broker away would.
    away: Arc<AtomicBool>,
}

#[async_trait]
impl Publisher for Recorded {
    async fn publish(&self, batch: &[OutgoingMessage]) -> Result<()> {
        if self.away.load(Ordering::SeqCst) {
            return Err(Error::transport_reason("test", "the broker is away", true));
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
        let mut sent = self.sent.lock().unwrap();
        for m in batch {
            let event: TestEvent = m.envelope.decode().unwrap();
            sent.push((event.key, event.seq));
        }
        Ok(())
    }
}

impl Recorded {
    fn sent(&self) -> Vec<(String, i64)> {
        self.sent.lock().unwrap().clone()
    }
}

struct Fixture {
    db: PgTestDb,
    options: CdcOptions,
    slot: SlotName,
    ended: bool,
}

impl Drop for Fixture {
    /// A test that failed still drops its slot: a slot left behind keeps
    /// the server's log forever.
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        let (url, slot) = (tidings_testkit::services::postgres_url(), self.slot.clone());
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async {
                if let Ok(pool) = sqlx::PgPool::connect(&url).await {
                    let _ = slot::drop(&pool, &slot).await;
                }
            });
        })
        .join();
    }
}

impl Fixture {
    async fn new() -> Fixture {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
        let db = PgTestDb::new().await;
        let group = format!("test_{}", uuid::Uuid::new_v4().simple());
        let slot = SlotName::of_group(&group).unwrap();
        Fixture {
            db,
            options: CdcOptions::default()
                .group(group)
                .status_interval(Duration::from_millis(50)),
            slot,
            ended: false,
        }
    }

    fn pg(&self) -> &PgStore {
        &self.db.store
    }

    fn cdc(&self) -> CdcStore {
        CdcStore::new(self.pg().clone(), &self.db.url, self.options.clone()).expect("a CDC store")
    }

    fn relay(
        &self,
        member: &str,
        publisher: Recorded,
    ) -> (CancellationToken, tokio::task::JoinHandle<Result<()>>) {
        self.relay_on(self.cdc(), member, publisher)
    }

    fn relay_on(
        &self,
        cdc: CdcStore,
        member: &str,
        publisher: Recorded,
    ) -> (CancellationToken, tokio::task::JoinHandle<Result<()>>) {
        let relay = Relay::new(cdc, publisher).config(
            RelayConfig::default()
                .member(member)
                .batch_size(50)
                .lease_ttl(Duration::from_millis(1500))
                .poll_interval(Duration::from_millis(200)),
        );
        let stop = CancellationToken::new();
        (stop.clone(), tokio::spawn(relay.run(stop)))
    }

    async fn commit(&self, records: &[(String, i64)]) {
        let mut tx = self.pg().pool().begin().await.unwrap();
        for (key, seq) in records {
            self.pg()
                .enqueue_outgoing(&mut tx, &message(key, *seq))
                .await
                .unwrap();
        }
        tx.commit().await.unwrap();
    }

    async fn unsent(&self) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM tidings_outbox WHERE published_at IS NULL")
            .fetch_one(self.pg().pool())
            .await
            .unwrap()
    }

    async fn end(mut self) {
        self.ended = true;
        slot::drop(self.pg().pool(), &self.slot).await.unwrap();
        assert_eq!(slot::status(self.pg().pool(), &self.slot).await.unwrap(), None);
        let publications: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_publication WHERE pubname = $1")
            .bind(self.slot.as_str())
            .fetch_one(self.pg().pool())
            .await
            .unwrap();
        assert_eq!(publications, 0, "the publication is dropped with the slot");
        self.db.drop_schema_ref().await;
    }
}

/// Sixteen writers, each committing `per_key` records of its own key in
/// transactions of one to three records, interleaved with the others'.
async fn write(fixture: &Fixture, writers: usize, first: i64, per_key: i64) {
    let mut tasks = Vec::new();
    for w in 0..writers {
        let pg = fixture.pg().clone();
        tasks.push(tokio::spawn(async move {
            let key = format!("k{w:02}");
            let mut seq = first;
            while seq < first + per_key {
                let n = 1 + (seq + w as i64) % 3;
                let mut tx = pg.pool().begin().await.unwrap();
                for s in seq..(seq + n).min(first + per_key) {
                    pg.enqueue_outgoing(&mut tx, &message(&key, s)).await.unwrap();
                }
                tx.commit().await.unwrap();
                seq += n;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

/// Waits until the outbox has nothing unsent and `expected` records
/// went out, or fails saying what is missing.
async fn drained(fixture: &Fixture, publisher: &Recorded, expected: usize) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let unsent = fixture.unsent().await;
        let firsts = first_sends(&publisher.sent()).len();
        if unsent == 0 && firsts == expected {
            return;
        }
        if Instant::now() >= deadline {
            let rows: Vec<(i64, String)> =
                sqlx::query_as("SELECT seq, aggregate_key FROM tidings_outbox WHERE published_at IS NULL")
                    .fetch_all(fixture.pg().pool())
                    .await
                    .unwrap();
            panic!("after 60 s: {unsent} records unsent ({rows:?}), {firsts} of {expected} sent");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Each record's first send, in order: a record sent twice (a relay
/// stopped between the broker's confirmation and its mark) counts once.
fn first_sends(sent: &[(String, i64)]) -> Vec<(String, i64)> {
    let mut seen = std::collections::HashSet::new();
    sent.iter()
        .filter(|r| seen.insert((*r).clone()))
        .cloned()
        .collect()
}

/// Each key's records, in the order they first went out, are 1, 2, 3...
fn assert_in_order(sent: &[(String, i64)], keys: usize, per_key: i64) {
    let mut by_key: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for (key, seq) in first_sends(sent) {
        by_key.entry(key).or_default().push(seq);
    }
    assert_eq!(by_key.len(), keys, "every key went out");
    for (key, seqs) in by_key {
        let expected: Vec<i64> = (1..=per_key).collect();
        assert_eq!(seqs, expected, "key {key} out of order or incomplete");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn what_was_committed_before_and_after_the_slot_goes_out_once_in_commit_order() {
    let fixture = Fixture::new().await;
    // Committed before the slot exists: only the outbox has them.
    let early: Vec<(String, i64)> = (0..16).map(|w| (format!("k{w:02}"), 1)).collect();
    fixture.commit(&early).await;

    let publisher = Recorded::default();
    let cdc = fixture.cdc();
    let (stop, relay) = fixture.relay_on(cdc.clone(), "r1", publisher.clone());
    // Swept at start: the slot did not exist when they were committed.
    drained(&fixture, &publisher, 16).await;
    write(&fixture, 16, 2, 59).await;
    drained(&fixture, &publisher, 16 * 60).await;
    let sent = publisher.sent();
    assert_eq!(
        sent.len(),
        16 * 60,
        "nothing sent twice by one relay running through"
    );
    assert_in_order(&sent, 16, 60);
    let (streamed, swept) = cdc.claimed();
    assert!(
        streamed > 0,
        "the stream named what went out: {streamed} streamed, {swept} swept"
    );
    assert_eq!(streamed + swept, 16 * 60, "each record claimed once");

    // The slot's position follows what was sent: past every insert, so the
    // server keeps no log for them.
    fixture.confirmed_past_now().await;

    stop.cancel();
    relay.await.unwrap().unwrap();
    fixture.end().await;
}

impl Fixture {
    /// Waits until the slot's confirmed position passes the server's
    /// current one (as of now), or fails with the slot's state.
    async fn confirmed_past_now(&self) {
        let pool = self.pg().pool();
        let now: String = sqlx::query_scalar("SELECT pg_current_wal_lsn()::text")
            .fetch_one(pool)
            .await
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let passed: bool = sqlx::query_scalar(
                "SELECT confirmed_flush_lsn >= $2::pg_lsn FROM pg_replication_slots WHERE slot_name = $1",
            )
            .bind(self.slot.as_str())
            .bind(&now)
            .fetch_one(pool)
            .await
            .unwrap();
            if passed {
                return;
            }
            let status = slot::status(pool, &self.slot).await.unwrap();
            assert!(
                Instant::now() < deadline,
                "after 20 s the slot's confirmed position is not past {now}: {status:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_relay_stopped_mid_stream_loses_nothing_and_its_standby_takes_the_slot_over() {
    let fixture = Fixture::new().await;
    let publisher = Recorded::default();
    let (_stop1, relay1) = fixture.relay("r1", publisher.clone());
    fixture.commit(&[("k00".into(), 0)]).await;
    drained(&fixture, &publisher, 1).await;
    // r1 holds the lease and streams; r2 stands by.
    let (stop2, relay2) = fixture.relay("r2", publisher.clone());
    let writer = Writer {
        pg: fixture.pg().clone(),
    };
    let writers = tokio::spawn(async move { writer.write(16, 40).await });
    // Killed mid-stream, as a process would be: its batch's transaction
    // is rolled back, its leases run out, its session is ended.
    let deadline = Instant::now() + Duration::from_secs(30);
    while publisher.sent().len() < 150 {
        assert!(
            Instant::now() < deadline,
            "r1 sent {} records in 30 s",
            publisher.sent().len()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    relay1.abort();
    let _ = relay1.await;
    writers.await.unwrap();
    drained(&fixture, &publisher, 16 * 40 + 1).await;
    let sent: Vec<(String, i64)> = publisher.sent().into_iter().filter(|r| r.1 > 0).collect();
    assert_in_order(&sent, 16, 40);
    let owner: String = sqlx::query_scalar("SELECT owner FROM tidings_leases WHERE scope = 'relay'")
        .fetch_one(fixture.pg().pool())
        .await
        .unwrap();
    assert_eq!(owner, "r2", "the standby holds the lease");
    fixture.confirmed_past_now().await;
    stop2.cancel();
    relay2.await.unwrap().unwrap();
    fixture.end().await;
}

struct Writer {
    pg: PgStore,
}

impl Writer {
    async fn write(&self, writers: usize, per_key: i64) {
        let mut tasks = Vec::new();
        for w in 0..writers {
            let pg = self.pg.clone();
            tasks.push(tokio::spawn(async move {
                let key = format!("k{w:02}");
                for seq in 1..=per_key {
                    let mut tx = pg.pool().begin().await.unwrap();
                    pg.enqueue_outgoing(&mut tx, &message(&key, seq)).await.unwrap();
                    tx.commit().await.unwrap();
                    tokio::time::sleep(Duration::from_millis(3)).await;
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_record_that_cannot_go_out_holds_its_key_alone_and_the_rest_goes_on() {
    let fixture = Fixture::new().await;
    let publisher = Recorded::default();
    let (stop, relay) = fixture.relay("r1", publisher.clone());
    fixture.commit(&[("b".into(), 1)]).await;
    drained(&fixture, &publisher, 1).await;

    // a1's body is spoiled in its own transaction: not an envelope.
    let mut tx = fixture.pg().pool().begin().await.unwrap();
    let spoiled = message("a", 1);
    fixture.pg().enqueue_outgoing(&mut tx, &spoiled).await.unwrap();
    fixture
        .pg()
        .enqueue_outgoing(&mut tx, &message("b", 2))
        .await
        .unwrap();
    sqlx::query("UPDATE tidings_outbox SET body = 'not an envelope' WHERE id = $1")
        .bind(spoiled.envelope.id)
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    fixture.commit(&[("a".into(), 2), ("b".into(), 3)]).await;
    fixture.commit(&[("c".into(), 1)]).await;

    // b1, b2, b3 and c1 go out and are marked; a1 and a2 stay in the outbox.
    let deadline = Instant::now() + Duration::from_secs(30);
    while first_sends(&publisher.sent()).len() < 4 || fixture.unsent().await != 2 {
        assert!(
            Instant::now() < deadline,
            "sent {:?}, {} unsent",
            publisher.sent(),
            fixture.unsent().await
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let letters = fixture
        .pg()
        .dead_letters(&tidings_core::DeadLetterFilter::default().consumer("@relay"))
        .await
        .unwrap();
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert!(
        letters[0].errors.last().unwrap().error.contains("envelope"),
        "{letters:?}"
    );
    assert!(
        !publisher.sent().iter().any(|(k, _)| k == "a"),
        "nothing of key a went out"
    );

    // Skipped: a2 goes, then what comes next of a, in order.
    fixture.pg().skip(letters[0].id).await.unwrap();
    fixture.commit(&[("a".into(), 3), ("d".into(), 1)]).await;
    drained(&fixture, &publisher, 7).await;
    let a: Vec<i64> = first_sends(&publisher.sent())
        .into_iter()
        .filter(|(k, _)| k == "a")
        .map(|(_, s)| s)
        .collect();
    assert_eq!(a, vec![2, 3]);
    fixture.confirmed_past_now().await;
    stop.cancel();
    relay.await.unwrap().unwrap();
    fixture.end().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_broker_away_delays_the_stream_and_the_backlog_drains_in_order() {
    let fixture = Fixture::new().await;
    let publisher = Recorded::default();
    let (stop, relay) = fixture.relay("r1", publisher.clone());
    let firsts: Vec<(String, i64)> = (0..8).map(|w| (format!("k{w:02}"), 1)).collect();
    fixture.commit(&firsts).await;
    drained(&fixture, &publisher, 8).await;
    publisher.away.store(true, Ordering::SeqCst);
    write(&fixture, 8, 2, 29).await;
    assert_eq!(
        fixture.unsent().await,
        8 * 29,
        "nothing can go while the broker is away"
    );
    publisher.away.store(false, Ordering::SeqCst);
    drained(&fixture, &publisher, 8 * 30).await;
    assert_in_order(&publisher.sent(), 8, 30);
    fixture.confirmed_past_now().await;
    stop.cancel();
    relay.await.unwrap().unwrap();
    fixture.end().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_idle_slot_keeps_following_the_servers_log() {
    let fixture = Fixture::new().await;
    let publisher = Recorded::default();
    let (stop, relay) = fixture.relay("r1", publisher.clone());
    fixture.commit(&[("k".into(), 1)]).await;
    drained(&fixture, &publisher, 1).await;
    // Other work grows the server's log; the outbox stays idle.
    sqlx::raw_sql("CREATE TABLE other_work (n int)")
        .execute(fixture.pg().pool())
        .await
        .unwrap();
    for n in 0..50 {
        sqlx::query("INSERT INTO other_work VALUES ($1)")
            .bind(n)
            .execute(fixture.pg().pool())
            .await
            .unwrap();
    }
    fixture.confirmed_past_now().await;
    stop.cancel();
    relay.await.unwrap().unwrap();
    fixture.end().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slot_past_its_cap_is_dropped_and_made_again_losing_nothing() {
    let mut fixture = Fixture::new().await;
    fixture.options = fixture
        .options
        .clone()
        .wal_cap(Some(1024 * 1024))
        .guard_interval(Duration::from_millis(100));
    let publisher = Recorded::default();
    let (stop, relay) = fixture.relay("r1", publisher.clone());
    let firsts: Vec<(String, i64)> = (0..8).map(|w| (format!("k{w:02}"), 1)).collect();
    fixture.commit(&firsts).await;
    drained(&fixture, &publisher, 8).await;

    // The broker away, producers go on: the slot's log passes the cap and
    // the relay drops the slot.
    publisher.away.store(true, Ordering::SeqCst);
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut next = 2;
    loop {
        write(&fixture, 8, next, 20).await;
        next += 20;
        if slot::status(fixture.pg().pool(), &fixture.slot)
            .await
            .unwrap()
            .is_none()
        {
            break;
        }
        assert!(Instant::now() < deadline, "the slot was never dropped");
    }
    // Back: the backlog goes out from the outbox, in order, then a new
    // slot follows what comes next.
    publisher.away.store(false, Ordering::SeqCst);
    let per_key = next - 1;
    drained(&fixture, &publisher, 8 * per_key as usize).await;
    write(&fixture, 8, next, 5).await;
    drained(&fixture, &publisher, 8 * (per_key + 5) as usize).await;
    assert_in_order(&publisher.sent(), 8, per_key + 5);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !slot::status(fixture.pg().pool(), &fixture.slot)
        .await
        .unwrap()
        .is_some_and(|s| s.active)
    {
        assert!(Instant::now() < deadline, "no new slot streamed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.cancel();
    relay.await.unwrap().unwrap();
    fixture.end().await;
}
