//! A harness that tells whether a handler stays correct under the
//! deliveries a real system makes: twice, out of order across keys, and
//! after a crash.
//!
//! Tidings makes a handler idempotent by committing its writes with a
//! processed marker, in one transaction. That holds only for the writes the
//! handler makes through [`Context::tx`](tidings_consumer::Context::tx) and
//! the effects it performs through
//! [`Context::once`](tidings_consumer::Context::once). A write on another
//! connection, a counter kept in memory, a provider called without its
//! idempotency key, or a result that depends on the order of *different*
//! keys escapes it. The harness finds those.
//!
//! It runs the handler through the real consumer stack
//! ([`Consumer::deliver`]) on a fresh store per scenario, then compares the
//! state the caller reads back with that of a clean run:
//!
//! | scenario | what it models |
//! |---|---|
//! | `clean` | each event once, in the given order: the reference |
//! | `delivered twice` | each event delivered again at once (an acknowledgement lost on the wire) |
//! | `crash after commit` | the whole stream delivered again after it was handled (the process died between its commits and its acknowledgements) |
//! | `reordered across keys` | keys interleaved differently, each key's own order kept (what partitions and parallel lanes do) |
//! | `crash before commit` | each event's first attempt runs the handler, then dies before the commit; the transport delivers it again |
//!
//! The dead letters and held keys of each run are part of the state it compares.
//!
//! ```no_run
//! # #[derive(Clone)] struct Loyalty;
//! # #[async_trait::async_trait]
//! # impl tidings_consumer::Handler<sqlx::Postgres> for Loyalty {
//! #     async fn handle(&self, _: &mut tidings_consumer::Context<'_, sqlx::Postgres>) -> Result<(), tidings_consumer::HandlerError> { Ok(()) }
//! # }
//! # async fn example(events: Vec<tidings_core::Envelope>) {
//! use tidings_testkit::idempotency::{Harness, State};
//! use tidings_testkit::services::PgTestDb;
//!
//! let mut dbs = Vec::new();
//! let report = Harness::new("loyalty", |_: &_| Loyalty)
//!     .events("orders", events)
//!     .check(
//!         async || {
//!             let db = PgTestDb::new().await;
//!             let store = db.store.clone();
//!             dbs.push(db);
//!             store
//!         },
//!         async |store| {
//!             let rows: Vec<(String, i64)> = sqlx::query_as("SELECT customer_id, points FROM loyalty_points")
//!                 .fetch_all(store.pool())
//!                 .await
//!                 .unwrap();
//!             rows.into_iter().collect::<State>()
//!         },
//!     )
//!     .await;
//! report.assert_idempotent();
//! # }
//! ```

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use rand::SeedableRng;
use rand::seq::SliceRandom;
use tidings_consumer::{Consumer, ConsumerConfig, Context, Handler, HandlerError, Settled};
use tidings_core::Store;
use tidings_core::{Backoff, DeadLetterFilter, Envelope};

/// The query [`State::read`] takes for what a handler emitted through the outbox.
pub const OUTBOX: &str = "outbox";

const EMITTED: &str = "SELECT aggregate_key, message_type, body FROM tidings_outbox ORDER BY seq";

/// Each key and type's payloads, in order, joined: what [`State::read`] compares by default.
pub fn joined(_: &str, payloads: Vec<String>) -> String {
    payloads.join(" | ")
}

/// What a run left behind, as the caller reads it: named values, compared
/// key by key between runs. Build it from rows (`(key, value)` pairs) or
/// with [`State::insert`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct State(BTreeMap<String, String>);

impl State {
    /// An empty state.
    pub fn new() -> Self {
        State::default()
    }

    /// Records `value` under `key` (a later value for the same key replaces it).
    pub fn insert(&mut self, key: impl fmt::Display, value: impl fmt::Display) {
        self.0.insert(key.to_string(), value.to_string());
    }

    /// Adds every entry of `other`, each key prefixed with `prefix` and `/`.
    pub fn extend_prefixed(&mut self, prefix: &str, other: State) {
        for (k, v) in other.0 {
            self.0.insert(format!("{prefix}/{k}"), v);
        }
    }

    /// The entries, in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// Reads a business system's state from `store`: each of `tables` is a
    /// name and a query of (key, value) rows as text. A query named
    /// `OUTBOX` reads instead what the handler emitted through the outbox,
    /// each key and type's payloads in order, passed through `payloads`
    /// (which sees the type): two runs may emit the same messages with
    /// other ids, so the payloads are what is compared.
    pub async fn read<D: tidings_sql::Dialect>(
        store: &tidings_sql::SqlStore<D>,
        tables: &[(&str, &'static str)],
        payloads: impl Fn(&str, Vec<String>) -> String,
    ) -> State {
        use tidings_sql::db::Stmt;
        let mut conn = store.conn("reading the state").await.unwrap();
        let mut state = State::new();
        for (name, query) in tables {
            let query = if *query == OUTBOX { EMITTED } else { *query };
            let rows = Stmt::<D>::new(query, "reading the state")
                .fetch_all(&mut conn)
                .await
                .unwrap_or_else(|e| panic!("reading {name} with {query}: {e}"));
            let mut table = State::new();
            if query == EMITTED {
                let mut grouped = BTreeMap::<(String, String), Vec<String>>::new();
                for row in rows {
                    let (key, kind, body): (String, String, Vec<u8>) =
                        (row.get(0).unwrap(), row.get(1).unwrap(), row.get(2).unwrap());
                    let envelope = tidings_core::cloudevents::from_json(&body).unwrap();
                    grouped
                        .entry((key, kind))
                        .or_default()
                        .push(String::from_utf8(envelope.payload).unwrap());
                }
                for ((key, kind), emitted) in grouped {
                    table.insert(format!("{key}/{kind}"), payloads(&kind, emitted));
                }
            } else {
                for row in rows {
                    table.insert(row.get::<String>(0).unwrap(), row.get::<String>(1).unwrap());
                }
            }
            state.extend_prefixed(name, table);
        }
        state
    }

    /// The first key whose value differs between `self` (the reference) and `other`.
    fn first_difference(&self, other: &State) -> Option<Difference> {
        let keys = self
            .0
            .keys()
            .chain(other.0.keys())
            .collect::<std::collections::BTreeSet<_>>();
        keys.into_iter().find_map(|key| {
            let (expected, found) = (self.0.get(key), other.0.get(key));
            (expected != found).then(|| Difference {
                key: key.clone(),
                expected: expected.cloned(),
                found: found.cloned(),
            })
        })
    }
}

impl<K: fmt::Display, V: fmt::Display> FromIterator<(K, V)> for State {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        let mut state = State::new();
        for (k, v) in iter {
            state.insert(k, v);
        }
        state
    }
}

/// Where a scenario's final state departs from the clean run's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Difference {
    /// The state key.
    pub key: String,
    /// Its value after the clean run (`None`: absent).
    pub expected: Option<String>,
    /// Its value after the scenario (`None`: absent).
    pub found: Option<String>,
}

impl fmt::Display for Difference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let show = |v: &Option<String>| v.clone().unwrap_or_else(|| "(absent)".to_owned());
        write!(
            f,
            "{}: {} after a clean run, {} here",
            self.key,
            show(&self.expected),
            show(&self.found)
        )
    }
}

/// One scenario's run.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Its name (see the module's table).
    pub name: &'static str,
    /// Deliveries made.
    pub deliveries: usize,
    /// Deliveries whose handler committed.
    pub handled: usize,
    /// Deliveries recognised as duplicates.
    pub duplicates: usize,
    /// Deliveries that ended in the failure store.
    pub dead_lettered: usize,
    /// Deliveries parked behind their key's dead letter.
    pub parked: usize,
    /// The first difference from the clean run, if any.
    pub difference: Option<Difference>,
}

/// The harness's verdict: one [`Scenario`] per delivery pattern, the clean run first.
#[derive(Debug, Clone)]
pub struct Report {
    /// The consumer checked.
    pub consumer: String,
    /// The scenarios, in the module table's order.
    pub scenarios: Vec<Scenario>,
}

impl Report {
    /// The first scenario whose state departs from the clean run's.
    pub fn first_failure(&self) -> Option<(&'static str, &Difference)> {
        self.scenarios
            .iter()
            .find_map(|s| s.difference.as_ref().map(|d| (s.name, d)))
    }

    /// Whether every scenario ended in the clean run's state.
    pub fn is_idempotent(&self) -> bool {
        self.first_failure().is_none()
    }

    /// Panics with the report and the first difference unless every scenario
    /// ended in the clean run's state.
    pub fn assert_idempotent(&self) {
        if let Some((scenario, difference)) = self.first_failure() {
            panic!(
                "{self}\n{} is not idempotent: {scenario}: {difference}",
                self.consumer
            );
        }
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "idempotency of {}:", self.consumer)?;
        for s in &self.scenarios {
            let verdict = match &s.difference {
                None => "same state".to_owned(),
                Some(d) => format!("DIFFERS: {d}"),
            };
            writeln!(
                f,
                "  {:<22} {:>5} deliveries {:>5} handled {:>5} duplicates {:>3} dead-lettered {:>3} parked  {verdict}",
                s.name, s.deliveries, s.handled, s.duplicates, s.dead_lettered, s.parked
            )?;
        }
        Ok(())
    }
}

/// An event and the topic it is read from.
type Event = (String, Envelope);

/// Checks one handler against a set of events (see the module docs).
pub struct Harness<F> {
    consumer: String,
    handler: F,
    events: Vec<Event>,
    seed: u64,
    max_attempts: u32,
}

impl<F> fmt::Debug for Harness<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Harness")
            .field("consumer", &self.consumer)
            .field("events", &self.events.len())
            .field("seed", &self.seed)
            .finish_non_exhaustive()
    }
}

impl<F> Harness<F> {
    /// Checks the handler `handler` makes for each scenario's store (a
    /// handler that keeps its own connection gets the scenario's), run as
    /// the consumer named `consumer`.
    pub fn new(consumer: impl Into<String>, handler: F) -> Self {
        Harness {
            consumer: consumer.into(),
            handler,
            events: Vec::new(),
            seed: 7,
            max_attempts: 3,
        }
    }

    /// Adds events read from `topic`, in their order.
    pub fn events(mut self, topic: &str, events: impl IntoIterator<Item = Envelope>) -> Self {
        self.events
            .extend(events.into_iter().map(|e| (topic.to_owned(), e)));
        self
    }

    /// The seed of the reordering (default 7): the same seed, the same order.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Attempts before a failing event is dead-lettered (default 3, at least 1);
    /// the crash-before-commit scenario adds one.
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n.max(1);
        self
    }

    /// Runs every scenario, each on a store from `fresh` (with the caller's
    /// tables, empty), and compares what `snapshot` reads after each.
    pub async fn check<S, H>(
        &self,
        mut fresh: impl AsyncFnMut() -> S,
        snapshot: impl AsyncFn(&S) -> State,
    ) -> Report
    where
        S: Store,
        F: Fn(&S) -> H,
        H: Handler<S::Database>,
    {
        let once = self.events.iter().collect::<Vec<_>>();
        let twice = once.iter().flat_map(|e| [*e, *e]).collect::<Vec<_>>();
        let again = once.iter().chain(once.iter()).copied().collect::<Vec<_>>();
        let reordered = self.reordered();
        let plans: [(&'static str, &[&Event], bool); 5] = [
            ("clean", &once, false),
            ("delivered twice", &twice, false),
            ("crash after commit", &again, false),
            ("reordered across keys", &reordered, false),
            ("crash before commit", &once, true),
        ];
        let mut reference = None;
        let mut scenarios = Vec::new();
        for (name, deliveries, crash) in plans {
            let store = fresh().await;
            let (mut scenario, state) = self.run(name, &store, deliveries, crash, &snapshot).await;
            match &reference {
                None => reference = Some(state),
                Some(clean) => scenario.difference = clean.first_difference(&state),
            }
            scenarios.push(scenario);
        }
        Report {
            consumer: self.consumer.clone(),
            scenarios,
        }
    }

    async fn run<S, H>(
        &self,
        name: &'static str,
        store: &S,
        deliveries: &[&Event],
        crash: bool,
        snapshot: &impl AsyncFn(&S) -> State,
    ) -> (Scenario, State)
    where
        S: Store,
        F: Fn(&S) -> H,
        H: Handler<S::Database>,
    {
        let config = ConsumerConfig::default()
            .max_attempts(self.max_attempts + u32::from(crash))
            .backoff(Backoff::new(Duration::from_millis(1), Duration::from_millis(5)));
        let handler = CrashBeforeCommit {
            inner: (self.handler)(store),
            crash,
        };
        let consumer = Consumer::new(self.consumer.clone(), store.clone(), handler).config(config);
        let mut scenario = Scenario {
            name,
            deliveries: deliveries.len(),
            handled: 0,
            duplicates: 0,
            dead_lettered: 0,
            parked: 0,
            difference: None,
        };
        for (topic, envelope) in deliveries {
            match consumer.deliver(topic, envelope).await {
                Settled::Handled => scenario.handled += 1,
                Settled::Duplicate => scenario.duplicates += 1,
                Settled::DeadLettered => scenario.dead_lettered += 1,
                Settled::Parked => scenario.parked += 1,
                other => panic!("{name}: delivery of {} ended {other:?}", envelope.id),
            }
        }
        let mut state = snapshot(store).await;
        let letters = store
            .dead_letters(&DeadLetterFilter::default().consumer(&self.consumer))
            .await
            .expect("listing the run's dead letters");
        for letter in letters {
            let id = letter
                .message_id
                .map_or_else(|| letter.id.to_string(), |id| id.to_string());
            state.insert(
                format!("dead letter/{id}"),
                letter.message_type.unwrap_or_default(),
            );
        }
        let held = store
            .held_keys(&self.consumer)
            .await
            .expect("listing the run's held keys");
        for key in held {
            state.insert(
                format!("held key/{}/{}", key.topic, key.aggregate_key),
                key.message_id,
            );
        }
        (scenario, state)
    }

    /// Each key's events in their order, keys interleaved in a shuffled order.
    fn reordered(&self) -> Vec<&Event> {
        let mut by_key: Vec<Vec<&Event>> = Vec::new();
        let mut index = HashMap::new();
        for event in &self.events {
            let i = *index.entry(event.1.aggregate_key.as_str()).or_insert_with(|| {
                by_key.push(Vec::new());
                by_key.len() - 1
            });
            by_key[i].push(event);
        }
        // One ticket per event, naming its key; shuffled, each ticket takes the key's next event.
        let mut tickets = by_key
            .iter()
            .enumerate()
            .flat_map(|(i, events)| std::iter::repeat_n(i, events.len()))
            .collect::<Vec<_>>();
        tickets.shuffle(&mut rand::rngs::StdRng::seed_from_u64(self.seed));
        let mut next = vec![0; by_key.len()];
        tickets
            .into_iter()
            .map(|i| {
                next[i] += 1;
                by_key[i][next[i] - 1]
            })
            .collect()
    }
}

/// Runs the handler; when `crash`, its first attempt at each message then
/// fails, so the runtime rolls back everything it wrote through the
/// transaction and tries again, as after a crash before the commit.
struct CrashBeforeCommit<H> {
    inner: H,
    crash: bool,
}

#[async_trait]
impl<DB: sqlx::Database, H: Handler<DB>> Handler<DB> for CrashBeforeCommit<H> {
    async fn handle(&self, ctx: &mut Context<'_, DB>) -> Result<(), HandlerError> {
        self.inner.handle(ctx).await?;
        if self.crash && ctx.attempt() == 1 {
            return Err(HandlerError::transient(
                "the process died after the handler ran, before its commit",
            ));
        }
        Ok(())
    }
}
