//! Records the relay cannot send: a body that is not an envelope, a record
//! larger than the transport takes, a record the broker refuses for its
//! content. Each is set aside as a dead letter of `@relay`, only its key
//! waits behind it, and a redrive or a skip lets the key go on, in order.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tidings_core::log::LogBackend;
use tidings_core::{
    Backoff, DeadLetter, DeadLetterFilter, Error, FailureStore, OutgoingMessage, Publisher, RELAY_LETTERS,
    Redrive, Skip,
};
use tidings_log::LogPublisher;
use tidings_relay::{Relay, RelayConfig};
use tidings_sql::db::Stmt;
use tidings_sql::{Dialect, SqlStore};
use tokio_util::sync::CancellationToken;

use super::fixtures::{StoreExt, TestEvent, eventually, message, setup};
use crate::services::TestDb;

const WAIT: Duration = Duration::from_secs(60);
/// The largest payload [`Picky`] takes.
const MAX_PAYLOAD: usize = 4096;
/// The header that makes [`Picky`]'s broker refuse a record for its content.
const REFUSE: &str = "testrefuse";

/// The database log behind a broker's limits: it refuses, before sending,
/// payloads over [`MAX_PAYLOAD`] bytes ([`Publisher::refuses`]); and, while
/// `strict`, a batch holding a record marked [`REFUSE`], with a permanent
/// error and nothing published, as a broker validating what it is given
/// would; with `refuse_all`, every batch. Each publish takes at least
/// `slow` milliseconds, refused or not. It records what it confirmed.
#[derive(Clone)]
struct Picky<B> {
    inner: LogPublisher<B>,
    strict: Arc<AtomicBool>,
    slow: Arc<AtomicU64>,
    refuse_all: Arc<AtomicBool>,
    refusals: Arc<AtomicU64>,
    confirmed: Arc<Mutex<Vec<(String, i64)>>>,
}

impl<B> Picky<B> {
    fn new(inner: LogPublisher<B>) -> Self {
        Picky {
            inner,
            strict: Arc::new(AtomicBool::new(true)),
            slow: Arc::default(),
            refuse_all: Arc::default(),
            refusals: Arc::default(),
            confirmed: Arc::default(),
        }
    }

    /// (key, seq) of every record confirmed, first publication only, in order.
    fn firsts(&self) -> Vec<(String, i64)> {
        let mut seen = HashSet::new();
        self.confirmed
            .lock()
            .unwrap()
            .iter()
            .filter(|r| seen.insert((*r).clone()))
            .cloned()
            .collect()
    }
}

#[async_trait]
impl<B: LogBackend> Publisher for Picky<B> {
    async fn publish(&self, batch: &[OutgoingMessage]) -> tidings_core::Result<()> {
        let slow = self.slow.load(Ordering::SeqCst);
        if slow > 0 {
            tokio::time::sleep(Duration::from_millis(slow)).await;
        }
        let refused = self.refuse_all.load(Ordering::SeqCst)
            || (self.strict.load(Ordering::SeqCst)
                && batch.iter().any(|m| m.envelope.headers.contains_key(REFUSE)));
        if refused {
            self.refusals.fetch_add(1, Ordering::SeqCst);
            return Err(Error::transport_reason(
                "picky",
                "the broker refused the batch: a record is not acceptable",
                false,
            ));
        }
        self.inner.publish(batch).await?;
        let mut confirmed = self.confirmed.lock().unwrap();
        for m in batch {
            let event: TestEvent = m.envelope.decode().unwrap();
            confirmed.push((event.key, event.seq));
        }
        Ok(())
    }

    fn refuses(&self, m: &OutgoingMessage) -> Option<String> {
        let size = m.envelope.payload.len();
        (size > MAX_PAYLOAD)
            .then(|| format!("its {size} bytes are more than the broker's limit of {MAX_PAYLOAD}"))
    }
}

fn start<D: Dialect>(store: &SqlStore<D>, publisher: &Picky<SqlStore<D>>) -> Running {
    start_with(store, publisher, RelayConfig::default())
}

fn start_with<D: Dialect>(
    store: &SqlStore<D>,
    publisher: &Picky<SqlStore<D>>,
    config: RelayConfig,
) -> Running {
    let relay = Relay::new(store.clone(), publisher.clone()).config(
        config
            .batch_size(200)
            .poll_interval(Duration::from_millis(20))
            .backoff(Backoff::new(Duration::from_millis(5), Duration::from_millis(50))),
    );
    let stop = CancellationToken::new();
    let task = tokio::spawn(relay.run(stop.clone()));
    Running { stop, task }
}

struct Running {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<tidings_core::Result<()>>,
}

impl Running {
    async fn stop(self) {
        self.stop.cancel();
        self.task.await.unwrap().unwrap();
    }
}

/// Overwrites the stored body of record `id` (a bad migration, a bit flip, a hand-written row).
pub(crate) async fn overwrite_body<D: Dialect>(store: &SqlStore<D>, id: uuid::Uuid, body: &[u8]) {
    let mut conn = store.conn("overwriting a body").await.unwrap();
    Stmt::<D>::new(
        "UPDATE tidings_outbox SET body = $1 WHERE id = $2",
        "overwriting a body",
    )
    .bind(body)
    .bind(id)
    .execute(&mut *conn)
    .await
    .unwrap();
}

async fn relay_letters<D: Dialect>(store: &SqlStore<D>) -> Vec<DeadLetter> {
    store
        .dead_letters(&DeadLetterFilter::default().consumer(RELAY_LETTERS))
        .await
        .unwrap()
}

fn letter_of<'a>(letters: &'a [DeadLetter], key: &str) -> &'a DeadLetter {
    letters
        .iter()
        .find(|l| l.aggregate_key.as_deref() == Some(key))
        .unwrap_or_else(|| panic!("no relay dead letter for key {key}: {letters:?}"))
}

/// Per key, the seqs confirmed, first publications in order.
fn by_key(firsts: &[(String, i64)]) -> BTreeMap<String, Vec<i64>> {
    let mut keys: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for (k, s) in firsts {
        keys.entry(k.clone()).or_default().push(*s);
    }
    keys
}

/// A corrupt, an oversized and a broker-refused record among 1 000 others:
/// every other record goes out in order, each bad one is set aside with its
/// reason and holds only its key; fixing and redriving, or skipping, lets
/// each key go on in order.
pub async fn records_that_cannot_go_out_wait_alone_with_their_keys<T: TestDb>(db: &T) {
    cannot_go_out(&setup(db).await).await;
}

/// The same with sent records kept for a retention (stamped, not deleted).
pub async fn with_a_retention_records_that_cannot_go_out_wait_alone<T: TestDb>(db: &T) {
    cannot_go_out(&setup(db).await.with_retention(Duration::from_secs(3600))).await;
}

async fn cannot_go_out<D: Dialect>(store: &SqlStore<D>) {
    let store = store.clone();
    const KEYS: usize = 20;
    const PER_KEY: i64 = 50;
    let (corrupt, big, refused) = ("k-corrupt", "k-big", "k-refused");
    let key = |k: usize| match k {
        0 => corrupt.to_owned(),
        1 => big.to_owned(),
        2 => refused.to_owned(),
        k => format!("k{k:02}"),
    };
    let mut corrupt_id = None;
    for seq in 1..=PER_KEY {
        let mut round = Vec::with_capacity(KEYS);
        for k in 0..KEYS {
            let mut m = message(&key(k), seq);
            if seq == 10 && k == 0 {
                corrupt_id = Some(m.envelope.id);
            }
            if seq == 10 && k == 1 {
                let pad = "x".repeat(MAX_PAYLOAD + 1);
                m.envelope.payload = format!(r#"{{"key":"{big}","seq":10,"pad":"{pad}"}}"#).into_bytes();
            }
            if seq == 10 && k == 2 {
                m.envelope.headers.insert(REFUSE.to_owned(), "yes".to_owned());
            }
            round.push(m);
        }
        store.enqueue_all(&round).await;
    }
    let corrupt_id = corrupt_id.unwrap();
    overwrite_body(&store, corrupt_id, b"\x00\x9f not json").await;

    let publisher = Picky::new(LogPublisher::new(Arc::new(store.clone())));
    let relay = start(&store, &publisher);
    let total = KEYS * PER_KEY as usize;
    let waiting = 3 * (PER_KEY as usize - 9);
    eventually(
        WAIT,
        "every record but the three bad keys' from seq 10 published",
        || async { publisher.firsts().len() == total - waiting },
    )
    .await;
    let keys = by_key(&publisher.firsts());
    for k in 3..KEYS {
        assert_eq!(
            keys[&key(k)],
            (1..=PER_KEY).collect::<Vec<_>>(),
            "key {} in order, whole",
            key(k)
        );
    }
    for k in [corrupt, big, refused] {
        assert_eq!(
            keys[k],
            (1..=9).collect::<Vec<_>>(),
            "key {k} stops before its bad record"
        );
    }
    let letters = relay_letters(&store).await;
    assert_eq!(letters.len(), 3, "one dead letter per bad record: {letters:?}");
    let reason = |k: &str| letter_of(&letters, k).errors.last().unwrap().error.clone();
    assert!(reason(corrupt).contains("not an envelope"), "{}", reason(corrupt));
    assert!(
        reason(big).contains("more than the broker's limit"),
        "{}",
        reason(big)
    );
    assert!(reason(refused).contains("not acceptable"), "{}", reason(refused));
    assert_eq!(
        letter_of(&letters, corrupt).body,
        b"\x00\x9f not json",
        "the raw bytes are kept"
    );
    assert_eq!(letter_of(&letters, corrupt).message_id, Some(corrupt_id));
    // The relay marks a batch once the transport confirmed it: the last
    // one may still be on its way.
    eventually(
        WAIT,
        "the held records waiting in the outbox, and only they",
        || async {
            store
                .count("SELECT count(*) FROM tidings_outbox WHERE published_at IS NULL")
                .await
                == waiting as i64
        },
    )
    .await;

    // Held keys do not slow the others: a new record goes out.
    store.enqueue_in_tx(&message("k03", PER_KEY + 1), true).await;
    eventually(WAIT, "a record enqueued afterwards published", || async {
        publisher.firsts().contains(&("k03".to_owned(), PER_KEY + 1))
    })
    .await;

    // The corrupt body fixed in the outbox, then redriven: its key goes on in order.
    let fixed = message(corrupt, 10);
    overwrite_body(
        &store,
        corrupt_id,
        &tidings_core::cloudevents::to_json(&fixed.envelope),
    )
    .await;
    let redrive = store.redrive(letter_of(&letters, corrupt).id).await.unwrap();
    assert!(
        matches!(redrive, Redrive::Released { message_id, redrive: 1 } if message_id == corrupt_id),
        "{redrive:?}"
    );
    // The broker now takes what it refused: redriven, it goes out.
    publisher.strict.store(false, Ordering::SeqCst);
    store.redrive(letter_of(&letters, refused).id).await.unwrap();
    // The oversized record is given up: the rest of its key goes on without it.
    let skip = store.skip(letter_of(&letters, big).id).await.unwrap();
    assert_eq!(skip, Skip::Skipped { released_key: true });
    eventually(WAIT, "the held keys published after redrive and skip", || async {
        publisher.firsts().len() == total + 1 - 1
    })
    .await;
    let keys = by_key(&publisher.firsts());
    for k in [corrupt, refused] {
        assert_eq!(
            keys[k],
            (1..=PER_KEY).collect::<Vec<_>>(),
            "key {k} whole and in order"
        );
    }
    assert_eq!(
        keys[big],
        (1..=PER_KEY).filter(|&s| s != 10).collect::<Vec<_>>(),
        "key {big} in order without the record skipped"
    );
    assert_eq!(
        store.count("SELECT count(*) FROM tidings_relay_holds").await,
        0,
        "no key held any more"
    );
    assert!(
        relay_letters(&store).await.is_empty(),
        "no relay dead letter pending"
    );
    relay.stop().await;
}

/// A transport that refuses every record is the transport's fault, not
/// the records': nothing is set aside, and everything goes out once it takes them.
pub async fn a_transport_refusing_everything_sets_nothing_aside<T: TestDb>(db: &T) {
    let store = setup(db).await;
    let records: Vec<_> = (1..=30)
        .map(|seq| message(&format!("k{}", seq % 3), seq))
        .collect();
    store.enqueue_all(&records).await;
    let publisher = Picky::new(LogPublisher::new(Arc::new(store.clone())));
    publisher.refuse_all.store(true, Ordering::SeqCst);
    let relay = start(&store, &publisher);
    eventually(WAIT, "several rounds refused", || async {
        publisher.refusals.load(Ordering::SeqCst) > 100
    })
    .await;
    assert!(relay_letters(&store).await.is_empty(), "no record set aside");
    assert_eq!(store.count("SELECT count(*) FROM tidings_relay_holds").await, 0);
    publisher.refuse_all.store(false, Ordering::SeqCst);
    eventually(
        WAIT,
        "everything published once the transport takes it",
        || async { publisher.firsts().len() == records.len() },
    )
    .await;
    relay.stop().await;
}

/// A record the broker refuses with nothing but later records of its own
/// key behind it: nothing else can show the transport works, and it is
/// set aside all the same, not tried forever.
pub async fn a_refused_record_with_only_its_key_behind_it_is_set_aside<T: TestDb>(db: &T) {
    let store = setup(db).await;
    let mut records: Vec<_> = (1..=10).map(|seq| message("only", seq)).collect();
    records[0]
        .envelope
        .headers
        .insert(REFUSE.to_owned(), "yes".to_owned());
    store.enqueue_all(&records).await;
    let publisher = Picky::new(LogPublisher::new(Arc::new(store.clone())));
    let relay = start(&store, &publisher);
    eventually(WAIT, "the refused record set aside", || async {
        relay_letters(&store).await.len() == 1
    })
    .await;
    assert!(publisher.firsts().is_empty(), "its key waits behind it");
    publisher.strict.store(false, Ordering::SeqCst);
    let letter = relay_letters(&store).await.remove(0);
    store.redrive(letter.id).await.unwrap();
    eventually(WAIT, "the key published in order after the redrive", || async {
        publisher.firsts() == (1..=10).map(|s| ("only".to_owned(), s)).collect::<Vec<_>>()
    })
    .await;
    relay.stop().await;
}

/// A search for the record at fault that lasts longer than the relay's
/// leases still settles, the first time: every other record is published
/// once, the refused one is set aside. (A settlement that needed the leases
/// still live would fail, and the relay would publish the batch and search
/// again, round after round.)
pub async fn a_search_longer_than_the_lease_settles_once<T: TestDb>(db: &T) {
    let store = setup(db).await;
    let mut records: Vec<_> = (1..=40)
        .map(|seq| message(&format!("k{}", seq % 4), seq))
        .collect();
    // Seq 21, of key k1: k1's later records (25, 29, 33, 37) wait behind it.
    records[20]
        .envelope
        .headers
        .insert(REFUSE.to_owned(), "yes".to_owned());
    store.enqueue_all(&records).await;
    let publisher = Picky::new(LogPublisher::new(Arc::new(store.clone())));
    // About twelve publishes to find it, 3.6 s against leases of 1 s
    // (which SQLite's relay, holding no lock while it publishes, renews).
    publisher.slow.store(300, Ordering::SeqCst);
    let relay = start_with(
        &store,
        &publisher,
        RelayConfig::default().lease_ttl(Duration::from_secs(1)),
    );
    let expected: Vec<(String, i64)> = records
        .iter()
        .enumerate()
        .map(|(i, _)| i as i64 + 1)
        .filter(|&seq| seq % 4 != 1 || seq < 21)
        .map(|seq| (format!("k{}", seq % 4), seq))
        .collect();
    eventually(
        Duration::from_secs(30),
        "the refused record set aside and the rest published",
        || async { relay_letters(&store).await.len() == 1 && publisher.firsts().len() == expected.len() },
    )
    .await;
    relay.stop().await;
    assert_eq!(
        by_key(&publisher.firsts()),
        by_key(&expected),
        "each key in order"
    );
    let confirmed = publisher.confirmed.lock().unwrap().len();
    assert_eq!(
        confirmed,
        expected.len(),
        "every record published once: the search settled the first time"
    );
    assert_eq!(
        letter_of(&relay_letters(&store).await, "k1").message_id,
        Some(records[20].envelope.id)
    );
}
