//! The consumer runtime: reads a subscription, spreads messages over key
//! lanes, and runs each through the stack documented in the crate root.

use std::collections::HashMap;
use std::fmt;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::Utc;
use futures::StreamExt;
use futures::stream::select_all;
use sqlx::Transaction;
use tidings_core::lease::{self, Held, Lease, Membership, Scope, sleep_unless};
use tidings_core::metrics::{self as m, Count};
use tidings_core::replay::ReplayStore;
use tidings_core::{
    AckKind, Acker, Backoff, ConsumerStore, DeadLetter, DecodeError, Delivery, Envelope, ErrorClass, Failure,
    Fence, Handling, LeaseStore, ParkedMessage, ParkingStore, Partition, RawMessage, Subscriber,
    Subscription,
};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use uuid::Uuid;

use crate::handler::{Context, Handler, HandlerError};
use crate::membership::{Claim, claims};

mod keyed;
mod replay;

use keyed::KeyQueue;

/// Tuning of a [`Consumer`].
#[derive(Debug, Clone)]
pub struct ConsumerConfig {
    max_attempts: u32,
    max_deliveries: u32,
    backoff: Backoff,
    handler_timeout: Duration,
    lanes: usize,
    lane_capacity: usize,
    batch: usize,
    source: Option<String>,
    lease_ttl: Duration,
    member: Option<String>,
    on_dead_letter: OnDeadLetter,
    replay_poll: Duration,
}

/// What happens to a key's later messages when one of its messages is dead-lettered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum OnDeadLetter {
    /// The key is held: its later messages are parked, unhandled, until the
    /// dead letter is redriven and handled, or skipped
    /// ([`tidings_core::FailureStore::skip`]); then they are handled in the
    /// order they came. The key's order holds even around a failure.
    #[default]
    HoldKey,
    /// The key's later messages are handled as if nothing happened: for
    /// consumers whose messages do not depend on each other.
    Continue,
}

impl Default for ConsumerConfig {
    /// 5 attempts, at most 10 deliveries, backoff from 100 ms to 10 s, a
    /// 30 s handler timeout, 16 key lanes of 32 queued messages each, one
    /// message per transaction, partition leases of 10 s, keys held after a
    /// dead letter, replays looked for every second.
    fn default() -> Self {
        ConsumerConfig {
            max_attempts: 5,
            max_deliveries: 10,
            backoff: Backoff::new(Duration::from_millis(100), Duration::from_secs(10)),
            handler_timeout: Duration::from_secs(30),
            lanes: 16,
            lane_capacity: 32,
            batch: 1,
            source: None,
            lease_ttl: Duration::from_secs(10),
            member: None,
            on_dead_letter: OnDeadLetter::HoldKey,
            replay_poll: Duration::from_secs(1),
        }
    }
}

impl ConsumerConfig {
    /// Attempts before a transiently failing message is dead-lettered (at least 1).
    ///
    /// ```
    /// let c = tidings_consumer::ConsumerConfig::default().max_attempts(3);
    /// ```
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n.max(1);
        self
    }

    /// Deliveries of one message the transport may make before it is
    /// dead-lettered unhandled. Retries happen in process, so a message
    /// delivered this often was never settled: most likely its handler
    /// crashes the process. Without this bound such a message would be
    /// redelivered, and crash a consumer, forever. Counts come from the
    /// transport (JetStream's delivery count, for example).
    pub fn max_deliveries(mut self, n: u32) -> Self {
        self.max_deliveries = n.max(1);
        self
    }

    /// Backoff between attempts.
    pub fn backoff(mut self, b: Backoff) -> Self {
        self.backoff = b;
        self
    }

    /// Time allowed for one attempt; past it the attempt is rolled back and counts as a transient failure.
    pub fn handler_timeout(mut self, d: Duration) -> Self {
        self.handler_timeout = d;
        self
    }

    /// Messages handled at once: one per lane. A lane holds a key while it
    /// handles it, so one key is handled in order while other keys run in
    /// parallel, on any free lane.
    pub fn lanes(mut self, n: usize) -> Self {
        self.lanes = n.max(1);
        self
    }

    /// Messages queued per lane before reading pauses (backpressure): the
    /// queue holds `lanes × lane_capacity` messages, of any keys.
    pub fn lane_capacity(mut self, n: usize) -> Self {
        self.lane_capacity = n.max(1);
        self
    }

    /// Messages a lane may handle in one transaction (default 1: a
    /// transaction per message). A lane takes what is already queued, of
    /// the waiting keys no other lane holds, up to `n`, and never waits for more, so batching adds no latency:
    /// it saves commits (an fsync each) when messages come faster than a
    /// transaction per message can take them.
    ///
    /// A batch's processed markers, fence check and handlers share one
    /// transaction, and its messages are acknowledged once it commits. If
    /// one of its handlers fails, the whole batch rolls back and its
    /// messages are handled again one at a time, each in its own
    /// transaction, with the usual retries and dead letters: a handler may
    /// then run twice for a message before its work commits once, as after
    /// any rolled-back attempt. Messages of a held key, undecodable ones
    /// and ones delivered too often always go one at a time.
    ///
    /// ```
    /// let c = tidings_consumer::ConsumerConfig::default().batch(64);
    /// ```
    pub fn batch(mut self, n: usize) -> Self {
        self.batch = n.max(1);
        self
    }

    /// How long a member's partition leases last without renewal (renewed
    /// three times as often). A member that dies is replaced after about
    /// this long; a shorter lease fails over faster and writes more often.
    pub fn lease_ttl(mut self, d: Duration) -> Self {
        self.lease_ttl = d.max(Duration::from_millis(300));
        self
    }

    /// This member's id in its group (default: unique per process and run).
    /// Two running members must never share one.
    pub fn member(mut self, id: impl Into<String>) -> Self {
        self.member = Some(id.into());
        self
    }

    /// What happens to a key's later messages after a dead letter (default: [`OnDeadLetter::HoldKey`]).
    ///
    /// ```
    /// use tidings_consumer::{ConsumerConfig, OnDeadLetter};
    /// let independent = ConsumerConfig::default().on_dead_letter(OnDeadLetter::Continue);
    /// ```
    pub fn on_dead_letter(mut self, policy: OnDeadLetter) -> Self {
        self.on_dead_letter = policy;
        self
    }

    /// How often a running member looks for replays asked of its consumer
    /// (`tidings replay`, [`tidings_core::ReplayStore::request_replay`]).
    pub fn replay_poll(mut self, every: Duration) -> Self {
        self.replay_poll = every.max(Duration::from_millis(10));
        self
    }

    /// The `source` of messages the handler emits (default: the consumer's name).
    pub fn source(mut self, source: impl Into<String>) -> Self {
        self.source = Some(source.into());
        self
    }
}

/// Counters of a running consumer, also recorded as metrics labelled with
/// the consumer's name ([`tidings_core::metrics`]: `tidings_consumer_*`).
#[derive(Debug)]
pub struct ConsumerStats {
    received: Count,
    handled: Count,
    failed: Count,
    duplicates: Count,
    retries: Count,
    dead_lettered: Count,
    parked: Count,
    transactions: Count,
    store_errors: Count,
    handler_duration: metrics::Histogram,
}

impl ConsumerStats {
    /// The counters of the consumer named `consumer`, taking their metric
    /// handles from the recorder installed now.
    pub fn new(consumer: &str) -> Self {
        let count =
            |name: &'static str| Count::new(metrics::counter!(name, "consumer" => consumer.to_owned()));
        ConsumerStats {
            received: count(m::CONSUMER_RECEIVED),
            handled: count(m::CONSUMER_HANDLED),
            failed: count(m::CONSUMER_FAILED),
            duplicates: count(m::CONSUMER_DUPLICATES),
            retries: count(m::CONSUMER_RETRIED),
            dead_lettered: count(m::CONSUMER_DEAD_LETTERED),
            parked: count(m::CONSUMER_PARKED),
            transactions: Count::local(),
            store_errors: count(m::CONSUMER_STORE_ERRORS),
            handler_duration: metrics::histogram!(m::CONSUMER_HANDLER_DURATION, "consumer" => consumer.to_owned()),
        }
    }
}

macro_rules! counters {
    ($($name:ident: $doc:literal),* $(,)?) => {
        impl ConsumerStats {
            $(
                #[doc = $doc]
                pub fn $name(&self) -> u64 {
                    self.$name.get()
                }
            )*
        }
    };
}

counters! {
    received: "Deliveries received (duplicates included).",
    handled: "Messages handled and committed.",
    failed: "Handler attempts that failed (then retried or dead-lettered).",
    duplicates: "Deliveries recognised as already processed and skipped.",
    retries: "Attempts that failed and were retried.",
    dead_lettered: "Messages given up on and stored as dead letters.",
    parked: "Messages parked behind their key's dead letter.",
    transactions: "Handler transactions committed: one per handled message, fewer when batching ([`ConsumerConfig::batch`]).",
    store_errors: "Failures of Tidings' own database calls (retried without counting as attempts).",
}

fn bump(c: &Count) {
    c.bump();
}

/// A named consumer (group) running one handler over one or more topics.
pub struct Consumer<S: ConsumerStore> {
    name: String,
    topics: Vec<String>,
    store: S,
    handler: Arc<dyn Handler<S::Database>>,
    config: ConsumerConfig,
    stats: Arc<ConsumerStats>,
}

impl<S: ConsumerStore> fmt::Debug for Consumer<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Consumer")
            .field("name", &self.name)
            .field("topics", &self.topics)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

enum Outcome {
    Handled,
    Duplicate,
}

/// What a key lane does next.
#[allow(
    clippy::large_enum_variant,
    reason = "deliveries are the common case: boxing them would allocate per message"
)]
enum Job {
    /// Handle a delivery.
    Deliver(Work),
    /// Handle what is parked behind a released key.
    Drain { key: HoldKey, claim: Claim },
}

/// A key as a consumer holds it: (topic, aggregate key).
type HoldKey = (String, String);

/// What this member knows of a held key.
#[derive(Debug, Clone, Copy)]
struct Hold {
    /// The dead-lettered message holding the key.
    message_id: Uuid,
    /// Skipped, or its message handled: what is parked may go.
    released: bool,
}

/// The keys this member holds, shared by its lanes. The store is the truth;
/// a member loads it when a session starts, and only the lane holding a key
/// changes the key's hold (a skip only releases, and is picked up by the
/// session's refresh).
type Holds = Arc<Mutex<HashMap<HoldKey, Hold>>>;

/// How one delivery ended (see [`Consumer::deliver`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Settled {
    /// The handler ran and its transaction committed, with the processed marker.
    Handled,
    /// The message was already processed: nothing ran.
    Duplicate,
    /// The message was given up on and stored in the failure store.
    DeadLettered,
    /// The message's key is held behind a dead letter: it waits, unhandled,
    /// in the parking store ([`OnDeadLetter::HoldKey`]).
    Parked,
    /// The message was given back to the transport unhandled (shutdown,
    /// hand-over, lost lease), to be delivered again.
    GivenBack,
}

enum AttemptError {
    /// Tidings' own database work failed: retried, not counted as an attempt.
    Store(tidings_core::Error),
    /// The handler failed.
    Handler(HandlerError),
    /// The member no longer holds the partition's lease: nothing was committed.
    LeaseLost,
}

struct Work {
    delivery: Delivery,
    envelope: Result<Envelope, DecodeError>,
    /// The lease that allows handling it; none outside a group ([`Consumer::deliver`]).
    claim: Option<Claim>,
}

impl<S: ConsumerStore + ParkingStore + LeaseStore + Clone> Consumer<S> {
    /// A consumer named `name` (its group name on the transport, and its key
    /// in the idempotency and effects records: keep it stable).
    pub fn new(name: impl Into<String>, store: S, handler: impl Handler<S::Database>) -> Self {
        let name = name.into();
        Consumer {
            stats: Arc::new(ConsumerStats::new(&name)),
            name,
            topics: Vec::new(),
            store,
            handler: Arc::new(handler),
            config: ConsumerConfig::default(),
        }
    }

    /// Adds a topic to read.
    pub fn topic(mut self, topic: impl Into<String>) -> Self {
        self.topics.push(topic.into());
        self
    }

    /// Replaces the configuration.
    pub fn config(mut self, config: ConsumerConfig) -> Self {
        self.config = config;
        self
    }

    /// The consumer's counters, shared with the running loop.
    pub fn stats(&self) -> Arc<ConsumerStats> {
        self.stats.clone()
    }

    /// The consumer's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Runs one message through the stack below the key lanes (retry, dead
    /// letter, transaction and idempotency, timeout, handler) as if a
    /// transport had delivered it on `topic`, and says how it ended. It runs
    /// outside the group: no partition lease is checked, so never call it
    /// for a topic members of this group are reading.
    ///
    /// For tests of handlers (see `tidings_testkit::idempotency`) and for
    /// tools that feed a consumer by hand. A message that keeps failing is
    /// retried with the configured backoff, then dead-lettered, as in
    /// [`Consumer::run`].
    pub async fn deliver(&self, topic: &str, envelope: &Envelope) -> Settled {
        let message = RawMessage {
            topic: topic.to_owned(),
            key: Some(envelope.aggregate_key.clone()),
            headers: Default::default(),
            body: tidings_core::cloudevents::to_json(envelope),
        };
        let worker = self.worker(String::new(), CancellationToken::new());
        if let Err(e) = worker.load_holds(true).await {
            tracing::warn!(consumer = %self.name, error = %e, "reading held keys failed; delivering as if none were held");
        }
        worker
            .handle(Work {
                delivery: Delivery::new(message, 1, Unsettled),
                envelope: Ok(envelope.clone()),
                claim: None,
            })
            .await
    }

    fn worker(&self, member: String, stop: CancellationToken) -> Worker<S> {
        Worker {
            name: self.name.clone(),
            member,
            source: self.config.source.clone().unwrap_or_else(|| self.name.clone()),
            store: self.store.clone(),
            handler: self.handler.clone(),
            config: self.config.clone(),
            stats: self.stats.clone(),
            holds: Holds::default(),
            stop,
        }
    }
}

impl<S: ConsumerStore + ParkingStore + LeaseStore + ReplayStore + Clone> Consumer<S> {
    /// Runs until `shutdown` is cancelled.
    ///
    /// The consumer joins its group: for each topic it takes the leases of
    /// its share of the topic's partitions ([`tidings_core::lease`]) and
    /// reads those, while other members of the group read the rest. When
    /// members come or go, the shares move: each member stops reading
    /// (finishing what it is handling), hands over what is no longer its
    /// share and starts again with its new one. A member with no partition
    /// free stands by and takes over when one is.
    ///
    /// On shutdown or a hand-over, each lane finishes the message it is
    /// handling; queued messages are given back to the transport unhandled
    /// and are delivered again, to whichever member reads their partition.
    pub async fn run(
        self,
        subscriber: &dyn Subscriber,
        shutdown: CancellationToken,
    ) -> tidings_core::Result<()> {
        if self.topics.is_empty() {
            return Err(tidings_core::Error::Config {
                key: format!("consumer {}.topics", self.name),
                reason: "no topic to read".into(),
            });
        }
        let member = self
            .config
            .member
            .clone()
            .unwrap_or_else(|| lease::unique_member("consumer"));
        let scopes = self
            .topics
            .iter()
            .map(|topic| Scope {
                name: lease::scope(&self.name, topic).into(),
                partitions: subscriber.partitions(topic),
            })
            .collect::<Vec<_>>();
        let membership = Membership::new(self.store.clone(), member.clone(), self.config.lease_ttl, scopes);
        let worker = self.worker(member.clone(), shutdown.clone());
        // Replays stop with the group's reading, whichever way it ends.
        let replays = shutdown.child_token();
        let (result, ()) = tokio::join!(
            async {
                let result = self.read_group(membership, worker, subscriber, &shutdown).await;
                replays.cancel();
                result
            },
            self.serve_replays(&member, &replays)
        );
        result
    }

    /// Reads the group's share of the topics until `shutdown`.
    async fn read_group(
        &self,
        membership: Membership<S>,
        worker: Worker<S>,
        subscriber: &dyn Subscriber,
        shutdown: &CancellationToken,
    ) -> tidings_core::Result<()> {
        let mut held: Held = vec![Vec::new(); membership.scopes().len()];
        let mut failures = 0u32;
        let mut first = true;
        while !shutdown.is_cancelled() {
            match membership.sync(&held).await {
                Ok(now) => held = now,
                Err(e) => {
                    failures += 1;
                    let delay = self.config.backoff.delay(failures);
                    tracing::warn!(consumer = %self.name, error = %e, retry_in_ms = delay.as_millis() as u64, "joining the group failed; retrying");
                    sleep_unless(shutdown, delay).await;
                    continue;
                }
            }
            if held.iter().all(Vec::is_empty) {
                tracing::debug!(consumer = %self.name, member = %membership.member(), "no partition free; standing by");
                sleep_unless(shutdown, membership.tick()).await;
                continue;
            }
            let stop = shutdown.child_token();
            let session = Arc::new(worker.with_stop(stop.clone()));
            let (_, result) = tokio::join!(membership.watch(&held, stop.clone()), async {
                let result = session.run(subscriber, &membership, &self.topics, &held).await;
                stop.cancel();
                result
            });
            match result {
                Ok(()) => failures = 0,
                // A refused configuration fails the first start; a broker
                // that is away is waited for.
                Err(e) if first && !e.class().is_retryable() => {
                    membership.leave().await;
                    return Err(e);
                }
                Err(e) => {
                    failures += 1;
                    let delay = self.config.backoff.delay(failures);
                    tracing::warn!(consumer = %self.name, error = %e, retry_in_ms = delay.as_millis() as u64, "subscribing failed; retrying");
                    sleep_unless(shutdown, delay).await;
                }
            }
            first = false;
        }
        membership.leave().await;
        Ok(())
    }
}

/// A subscription to one partition, tagging each delivery with the lease that allows it.
struct Leased {
    claim: Claim,
    subscription: Subscription,
}

impl futures::Stream for Leased {
    type Item = (Claim, tidings_core::Result<Delivery>);

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        let claim = self.claim.clone();
        self.subscription
            .poll_next_unpin(cx)
            .map(|next| next.map(|item| (claim, item)))
    }
}

/// The span of handling one message: a child of its `traceparent` where a
/// tracing backend can link it ([`tidings_core::trace`]).
fn handle_span(consumer: &str, topic: &str, envelope: &Envelope) -> tracing::Span {
    let trace = envelope.trace();
    let span = tracing::info_span!(
        "tidings.handle",
        consumer = %consumer,
        topic = %topic,
        message_id = %envelope.id,
        message_type = %envelope.message_type,
        correlation_id = %envelope.correlation_id,
        causation_id = %envelope.causation_id.map(|c| c.to_string()).unwrap_or_default(),
        trace_id = %trace.map(|t| t.trace_id_hex()).unwrap_or_default(),
    );
    if let Some(parent) = trace {
        tidings_core::trace::set_parent(&span, &parent);
    }
    span
}

/// A key of the lanes' queue: the topic and the aggregate key.
fn queue_key(topic: &str, key: &str) -> String {
    format!("{topic}\u{1f}{key}")
}

/// Handles deliveries for one session: the time between two hand-overs.
struct Worker<S: ConsumerStore> {
    name: String,
    member: String,
    source: String,
    store: S,
    handler: Arc<dyn Handler<S::Database>>,
    config: ConsumerConfig,
    stats: Arc<ConsumerStats>,
    /// The keys held after a dead letter ([`OnDeadLetter::HoldKey`]).
    holds: Holds,
    /// Cancelled when the session ends (shutdown, hand-over, lost lease).
    stop: CancellationToken,
}

impl<S: ConsumerStore + Clone> Worker<S> {
    fn with_stop(&self, stop: CancellationToken) -> Self {
        Worker {
            name: self.name.clone(),
            member: self.member.clone(),
            source: self.source.clone(),
            store: self.store.clone(),
            handler: self.handler.clone(),
            config: self.config.clone(),
            stats: self.stats.clone(),
            holds: Holds::default(),
            stop,
        }
    }
}

impl<S: ConsumerStore + ParkingStore + LeaseStore + Clone> Worker<S> {
    /// Reads the partitions `held` allows until the session stops, spreading
    /// deliveries over the key lanes.
    async fn run<L: LeaseStore>(
        self: Arc<Self>,
        subscriber: &dyn Subscriber,
        membership: &Membership<L>,
        topics: &[String],
        held: &Held,
    ) -> tidings_core::Result<()> {
        // Held keys first: no message of a held key may be handled before we know it is held.
        self.load_holds(false).await?;
        let mut leased = Vec::new();
        let mut partitions = Partitions::default();
        for (topic, partition, claim) in claims(membership, topics, held) {
            partitions.add(topic, partition, &claim);
            match subscriber.subscribe_partition(&self.name, topic, partition).await {
                Ok(subscription) => leased.push(Leased { claim, subscription }),
                Err(e) => {
                    for open in leased {
                        let _ = open.subscription.close().await;
                    }
                    return Err(e);
                }
            }
        }
        let mut deliveries = select_all(leased);
        // Lanes take whichever key is waiting and no other lane holds: a
        // key's messages run one at a time, in order; a slow key holds
        // back only itself.
        let queue = Arc::new(KeyQueue::<Job>::new(
            self.config.lanes * self.config.lane_capacity,
        ));
        let mut tasks = JoinSet::new();
        for _ in 0..self.config.lanes {
            let (worker, queue) = (self.clone(), queue.clone());
            tasks.spawn(async move {
                while let Some((keys, jobs)) = queue.take(worker.config.batch).await {
                    worker.run_jobs(jobs.into_iter()).await;
                    queue.done(keys);
                }
            });
        }
        let holding = self.config.on_dead_letter == OnDeadLetter::HoldKey;
        let mut refresh = tokio::time::interval(HOLDS_REFRESH);
        refresh.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let next = tokio::select! {
                _ = self.stop.cancelled() => break,
                _ = refresh.tick(), if holding => {
                    for (key, claim) in self.released_holds(&partitions).await {
                        tokio::select! {
                            _ = self.stop.cancelled() => break,
                            _ = queue.room() => {}
                        }
                        queue.put(queue_key(&key.0, &key.1), Job::Drain { key, claim });
                    }
                    continue;
                }
                next = deliveries.next() => next,
            };
            let (claim, delivery) = match next {
                None => break,
                Some((claim, Ok(d))) => (claim, d),
                Some((_, Err(e))) => {
                    tracing::warn!(consumer = %self.name, error = %e, "subscription error");
                    continue;
                }
            };
            bump(&self.stats.received);
            let envelope = delivery.message.decode();
            let key = match &envelope {
                Ok(e) => e.aggregate_key.as_str(),
                Err(_) => delivery.message.key.as_deref().unwrap_or(""),
            };
            let key = queue_key(&delivery.message.topic, key);
            let work = Work {
                delivery,
                envelope,
                claim: Some(claim),
            };
            let room = tokio::select! {
                _ = self.stop.cancelled() => false,
                _ = queue.room() => true,
            };
            if room {
                queue.put(key, Job::Deliver(work));
            } else {
                self.give_back(&work.delivery).await;
                break;
            }
        }
        self.stop.cancel();
        queue.close();
        while tasks.join_next().await.is_some() {}
        // Every lane is done: let the transport store the final acknowledgements.
        for part in deliveries {
            if let Err(e) = part.subscription.close().await {
                tracing::warn!(consumer = %self.name, error = %e, "closing a subscription failed");
            }
        }
        Ok(())
    }

    /// Runs a lane's jobs in order, batching the deliveries that may share a
    /// transaction ([`ConsumerConfig::batch`]).
    async fn run_jobs(&self, jobs: impl Iterator<Item = Job>) {
        let mut batch = Vec::new();
        for job in jobs {
            match job {
                // Given back unhandled: redelivered to whoever reads the partition next.
                Job::Deliver(work) if self.stop.is_cancelled() => {
                    self.give_back(&work.delivery).await;
                }
                Job::Deliver(work) if self.batchable(&work) => batch.push(work),
                Job::Deliver(work) => {
                    self.handle_batch(std::mem::take(&mut batch)).await;
                    self.handle(work).await;
                }
                Job::Drain { key, claim } => {
                    self.handle_batch(std::mem::take(&mut batch)).await;
                    self.drain(&key, Some(&claim)).await;
                }
            }
        }
        self.handle_batch(batch).await;
    }

    /// Whether a delivery may join a batch: decoded, not delivered too
    /// often, its key not held.
    fn batchable(&self, work: &Work) -> bool {
        let Ok(envelope) = &work.envelope else {
            return false;
        };
        if self.config.batch == 1 || work.delivery.delivery_count > self.config.max_deliveries {
            return false;
        }
        self.config.on_dead_letter == OnDeadLetter::Continue
            || !self.holds.lock().expect("holds lock").contains_key(&(
                work.delivery.message.topic.clone(),
                envelope.aggregate_key.clone(),
            ))
    }

    /// Handles deliveries in one transaction, or, if that fails, one at a time.
    async fn handle_batch(&self, works: Vec<Work>) {
        if works.len() <= 1 {
            for work in works {
                self.handle(work).await;
            }
            return;
        }
        if self.stop.is_cancelled() {
            for work in works {
                self.give_back(&work.delivery).await;
            }
            return;
        }
        match self.attempt_batch(&works).await {
            Ok(fresh) => {
                for (work, fresh) in works.iter().zip(fresh) {
                    bump(if fresh {
                        &self.stats.handled
                    } else {
                        &self.stats.duplicates
                    });
                    self.settle(&work.delivery, AckKind::Ack).await;
                }
            }
            Err(e) => {
                let error = match e {
                    AttemptError::Store(e) => e.to_string(),
                    AttemptError::Handler(e) => e.to_string(),
                    AttemptError::LeaseLost => "partition lease lost".to_owned(),
                };
                tracing::debug!(consumer = %self.name, messages = works.len(), %error, "batch rolled back; handling its messages one at a time");
                for work in works {
                    self.handle(work).await;
                }
            }
        }
    }

    /// One transaction for a batch: the processed markers, the fence, then
    /// each fresh message's handler. Returns, per delivery, whether it was
    /// handled (false: a duplicate).
    async fn attempt_batch(&self, works: &[Work]) -> Result<Vec<bool>, AttemptError> {
        let envelopes: Vec<&Envelope> = works.iter().filter_map(|w| w.envelope.as_ref().ok()).collect();
        let ids: Vec<Uuid> = envelopes.iter().map(|e| e.id).collect();
        let mut tx = self.store.begin().await.map_err(AttemptError::Store)?;
        let mut fresh = self
            .store
            .mark_processed_all(&mut *tx, &self.name, &ids)
            .await
            .map_err(AttemptError::Store)?;
        let mut fenced: Vec<(&str, Lease)> = Vec::new();
        for claim in works.iter().filter_map(|w| w.claim.as_ref()) {
            if fenced.contains(&(&*claim.scope, claim.lease)) {
                continue;
            }
            let holds = self
                .store
                .holds_lease(&mut *tx, &claim.scope, &self.member, claim.lease)
                .await
                .map_err(AttemptError::Store)?;
            if !holds {
                let _ = tx.rollback().await;
                return Err(AttemptError::LeaseLost);
            }
            fenced.push((&claim.scope, claim.lease));
        }
        let mut handled = Vec::with_capacity(envelopes.len());
        let mut emitted = false;
        for envelope in envelopes {
            // A message twice in one batch runs once: the second copy finds it taken.
            let run = fresh.remove(&envelope.id);
            handled.push(run);
            if !run {
                continue;
            }
            match self.run_handler(&mut tx, envelope, 1).await {
                Ok(emits) => emitted |= emits,
                Err(e) => {
                    self.roll_back(tx).await;
                    return Err(AttemptError::Handler(e));
                }
            }
        }
        self.commit(tx, emitted, "committing a batch of handlers").await?;
        Ok(handled)
    }

    /// The handler on `tx`, within [`ConsumerConfig::handler_timeout`];
    /// whether it emitted messages through the outbox.
    async fn run_handler(
        &self,
        tx: &mut Transaction<'static, S::Database>,
        envelope: &Envelope,
        attempt: u32,
    ) -> Result<bool, HandlerError> {
        let mut ctx = Context {
            envelope,
            tx,
            consumer: &self.name,
            source: &self.source,
            attempt,
            store: &self.store,
            emitted: false,
        };
        let timeout = self.config.handler_timeout;
        let started = Instant::now();
        let ran = tokio::time::timeout(timeout, self.handler.handle(&mut ctx)).await;
        self.stats
            .handler_duration
            .record(started.elapsed().as_secs_f64());
        match ran {
            Ok(result) => result.map(|()| ctx.emitted),
            Err(_) => Err(HandlerError::transient(format!(
                "handler timed out after {timeout:?}"
            ))),
        }
    }

    /// Rolls a failed attempt back now rather than on drop: on SQLite the
    /// open transaction holds the database's only write lock.
    async fn roll_back(&self, tx: Transaction<'static, S::Database>) {
        if let Err(e) = tx.rollback().await {
            tracing::debug!(consumer = %self.name, error = %e, "rollback after a failed attempt failed");
        }
    }

    /// Commits handler work, then wakes the relays if it emitted messages.
    async fn commit(
        &self,
        tx: Transaction<'static, S::Database>,
        emitted: bool,
        operation: &'static str,
    ) -> Result<(), AttemptError> {
        tx.commit()
            .await
            .map_err(|source| AttemptError::Store(tidings_core::Error::Database { operation, source }))?;
        bump(&self.stats.transactions);
        if emitted {
            self.store.wake();
        }
        Ok(())
    }

    /// Applies the key's hold, if any ([`OnDeadLetter::HoldKey`]), then the stack.
    async fn handle(&self, work: Work) -> Settled {
        let key = match &work.envelope {
            Ok(e) if self.config.on_dead_letter == OnDeadLetter::HoldKey => {
                (work.delivery.message.topic.clone(), e.aggregate_key.clone())
            }
            _ => return self.process(work).await,
        };
        let id = work.envelope.as_ref().map(|e| e.id).ok();
        let hold = self.holds.lock().expect("holds lock").get(&key).copied();
        match hold {
            None => self.process(work).await,
            // The message holding the key, back (redriven, or redelivered).
            Some(hold) if Some(hold.message_id) == id => {
                let claim = work.claim.clone();
                let settled = self.process(work).await;
                if matches!(settled, Settled::Handled | Settled::Duplicate) {
                    self.drain(&key, claim.as_ref()).await;
                }
                settled
            }
            Some(hold) if hold.released => {
                if self.drain(&key, work.claim.as_ref()).await {
                    self.process(work).await
                } else {
                    self.park(work).await
                }
            }
            Some(_) => self.park(work).await,
        }
    }

    /// Handles the messages parked behind a released key, oldest first, then
    /// lets the key go. False if the key is held again (a parked message
    /// was dead-lettered: the rest wait behind it) or the session stopped.
    async fn drain(&self, key: &HoldKey, claim: Option<&Claim>) -> bool {
        let (topic, aggregate_key) = (key.0.as_str(), key.1.as_str());
        loop {
            let next = self
                .store_op("reading parked messages", || {
                    self.store.next_parked(&self.name, topic, aggregate_key)
                })
                .await;
            let parked = match next {
                None => return false,
                Some(None) => {
                    // Only the lane holding this key parks behind it, so nothing can arrive meanwhile.
                    if self
                        .store_op("releasing a key", || {
                            self.store.release_key(&self.name, topic, aggregate_key)
                        })
                        .await
                        .is_none()
                    {
                        return false;
                    }
                    self.holds.lock().expect("holds lock").remove(key);
                    tracing::info!(consumer = %self.name, topic, key = aggregate_key, "held key released");
                    return true;
                }
                Some(Some(parked)) => parked,
            };
            let raw = parked.raw();
            let work = Work {
                envelope: raw.decode(),
                delivery: Delivery::new(raw, 1, Unsettled),
                claim: claim.cloned(),
            };
            let settled = self.process(work).await;
            if !matches!(
                settled,
                Settled::Handled | Settled::Duplicate | Settled::DeadLettered
            ) {
                return false;
            }
            let id = parked.message_id;
            if self
                .store_op("removing a parked message", || self.store.unpark(&self.name, id))
                .await
                .is_none()
                || settled == Settled::DeadLettered
            {
                return false;
            }
        }
    }

    /// Sets the message aside behind its held key, and settles the delivery.
    async fn park(&self, work: Work) -> Settled {
        let Ok(envelope) = &work.envelope else {
            return self.process(work).await;
        };
        let message = &work.delivery.message;
        let parked = ParkedMessage {
            topic: message.topic.clone(),
            aggregate_key: envelope.aggregate_key.clone(),
            message_id: envelope.id,
            headers: message.headers.clone(),
            body: message.body.clone(),
        };
        if self
            .store_op("parking a message", || self.store.park(&self.name, &parked))
            .await
            .is_none()
        {
            return self.give_back(&work.delivery).await;
        }
        tracing::debug!(consumer = %self.name, message_id = %envelope.id, key = %envelope.aggregate_key, "parked behind the key's dead letter");
        bump(&self.stats.parked);
        self.settle(&work.delivery, AckKind::Ack).await;
        Settled::Parked
    }

    /// Loads the held keys from the store. A session loads them unreleased
    /// and lets its first refresh release and drain them, in the key's lane.
    async fn load_holds(&self, with_released: bool) -> tidings_core::Result<()> {
        if self.config.on_dead_letter != OnDeadLetter::HoldKey {
            return Ok(());
        }
        let stored = self.store.held_keys(&self.name).await?;
        let mut holds = self.holds.lock().expect("holds lock");
        holds.clear();
        for h in stored {
            let hold = Hold {
                message_id: h.message_id,
                released: with_released && h.released,
            };
            holds.insert((h.topic, h.aggregate_key), hold);
        }
        Ok(())
    }

    /// Held keys the store says are released (skipped, or their message
    /// handled) that this session reads and has not released yet: marked
    /// released, to be drained by their lanes.
    async fn released_holds(&self, partitions: &Partitions) -> Vec<(HoldKey, Claim)> {
        let stored = match self.store.held_keys(&self.name).await {
            Ok(stored) => stored,
            Err(e) => {
                tracing::warn!(consumer = %self.name, error = %e, "reading held keys failed");
                return Vec::new();
            }
        };
        let mut holds = self.holds.lock().expect("holds lock");
        stored
            .into_iter()
            .filter(|h| h.released)
            .filter_map(|h| {
                let claim = partitions.claim(&h.topic, &h.aggregate_key)?;
                let key = (h.topic, h.aggregate_key);
                let hold = holds
                    .get_mut(&key)
                    .filter(|c| c.message_id == h.message_id && !c.released)?;
                hold.released = true;
                Some((key, claim))
            })
            .collect()
    }

    /// Runs one of Tidings' own store calls, retrying with backoff while it
    /// fails; `None` if the session stopped first.
    async fn store_op<T, F, Fut>(&self, what: &str, op: F) -> Option<T>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = tidings_core::Result<T>>,
    {
        let mut failures = 0u32;
        loop {
            match op().await {
                Ok(value) => return Some(value),
                Err(e) => {
                    failures += 1;
                    bump(&self.stats.store_errors);
                    tracing::warn!(consumer = %self.name, error = %e, "{what} failed; retrying");
                    if !self.pause(self.config.backoff.delay(failures)).await {
                        return None;
                    }
                }
            }
        }
    }

    /// decode -> retry -> transaction + idempotency -> timeout -> handler; dead-letter; settle.
    async fn process(&self, work: Work) -> Settled {
        let Work {
            delivery,
            envelope,
            claim,
        } = work;
        let envelope = match envelope {
            Ok(e) => e,
            Err(e) => {
                let failure = failure(1, ErrorClass::Permanent, &e.to_string());
                tracing::warn!(consumer = %self.name, topic = %delivery.message.topic, error = %e, "undecodable message; dead-lettering");
                return self.dead_letter(&delivery, None, vec![failure]).await;
            }
        };
        let span = handle_span(&self.name, &delivery.message.topic, &envelope);
        self.process_decoded(delivery, envelope, claim)
            .instrument(span)
            .await
    }

    /// [`Worker::process`] once the message decoded, inside its handling span.
    async fn process_decoded(&self, delivery: Delivery, envelope: Envelope, claim: Option<Claim>) -> Settled {
        if delivery.delivery_count > self.config.max_deliveries {
            let error = format!(
                "delivered {} times without being settled (more than {}): its handling may be crashing the consumer",
                delivery.delivery_count, self.config.max_deliveries
            );
            tracing::error!(consumer = %self.name, message_id = %envelope.id, %error, "dead-lettering unhandled");
            return self
                .dead_letter(
                    &delivery,
                    Some(&envelope),
                    vec![failure(0, ErrorClass::Permanent, &error)],
                )
                .await;
        }
        let mut failures = Vec::new();
        let mut attempt = 0u32;
        let mut store_failures = 0u32;
        loop {
            attempt += 1;
            let error = match self.attempt(&envelope, claim.as_ref(), attempt).await {
                Ok(outcome) => {
                    let settled = match outcome {
                        Outcome::Handled => {
                            bump(&self.stats.handled);
                            Settled::Handled
                        }
                        Outcome::Duplicate => {
                            bump(&self.stats.duplicates);
                            Settled::Duplicate
                        }
                    };
                    self.settle(&delivery, AckKind::Ack).await;
                    return settled;
                }
                Err(AttemptError::LeaseLost) => {
                    // Another member reads the partition now: stop, and let it have the message.
                    tracing::info!(consumer = %self.name, "partition lease lost; handing over");
                    self.stop.cancel();
                    return self.give_back(&delivery).await;
                }
                Err(AttemptError::Store(e)) => {
                    // Our own database is unavailable: not the message's fault.
                    attempt -= 1;
                    store_failures += 1;
                    bump(&self.stats.store_errors);
                    let delay = self.config.backoff.delay(store_failures);
                    tracing::warn!(consumer = %self.name, error = %e, retry_in_ms = delay.as_millis() as u64, "store unavailable; retrying");
                    if !self.pause(delay).await {
                        return self.give_back(&delivery).await;
                    }
                    continue;
                }
                Err(AttemptError::Handler(e)) => {
                    bump(&self.stats.failed);
                    (e.class(), e.to_string())
                }
            };
            let (class, message) = error;
            failures.push(failure(attempt, class, &message));
            if class == ErrorClass::Permanent || attempt >= self.config.max_attempts {
                tracing::warn!(consumer = %self.name, message_id = %envelope.id, message_type = %envelope.message_type, attempts = attempt, error = %message, "dead-lettering");
                return self.dead_letter(&delivery, Some(&envelope), failures).await;
            }
            bump(&self.stats.retries);
            let delay = match class {
                ErrorClass::RetryAfter(d) => d.max(self.config.backoff.delay(attempt)),
                _ => self.config.backoff.delay(attempt),
            };
            tracing::debug!(consumer = %self.name, message_id = %envelope.id, attempt, error = %message, retry_in_ms = delay.as_millis() as u64, "handler failed; retrying");
            if !self.pause(delay).await {
                return self.give_back(&delivery).await;
            }
        }
    }

    /// One attempt: a transaction holding the processed marker and the handler's writes.
    async fn attempt(
        &self,
        envelope: &Envelope,
        claim: Option<&Claim>,
        attempt: u32,
    ) -> Result<Outcome, AttemptError> {
        let mut tx = self.store.begin().await.map_err(AttemptError::Store)?;
        // The marker goes first: a concurrent duplicate then waits on it. With
        // it, the fence: only the lease's holder commits work for its partition.
        let fence = claim.map(|c| Fence {
            scope: &c.scope,
            member: &self.member,
            lease: c.lease,
        });
        let handling = self
            .store
            .begin_handling(&mut *tx, &self.name, envelope.id, fence)
            .await
            .map_err(AttemptError::Store)?;
        match handling {
            Handling::Fresh => {}
            Handling::Duplicate => {
                let _ = tx.rollback().await;
                return Ok(Outcome::Duplicate);
            }
            Handling::LeaseLost => {
                let _ = tx.rollback().await;
                return Err(AttemptError::LeaseLost);
            }
        }
        match self.run_handler(&mut tx, envelope, attempt).await {
            Ok(emitted) => self.commit(tx, emitted, "committing a handler").await?,
            Err(e) => {
                self.roll_back(tx).await;
                return Err(AttemptError::Handler(e));
            }
        }
        Ok(Outcome::Handled)
    }

    /// Stores the dead letter (holding its key, unless the policy is
    /// [`OnDeadLetter::Continue`]), then settles the delivery.
    async fn dead_letter(
        &self,
        delivery: &Delivery,
        envelope: Option<&Envelope>,
        errors: Vec<Failure>,
    ) -> Settled {
        let letter = DeadLetter {
            id: Uuid::now_v7(),
            consumer: self.name.clone(),
            topic: delivery.message.topic.clone(),
            message_id: envelope.map(|e| e.id),
            message_type: envelope.map(|e| e.message_type.clone()),
            aggregate_key: envelope.map(|e| e.aggregate_key.clone()),
            headers: delivery.message.headers.clone(),
            body: delivery.message.body.clone(),
            attempts: errors.len() as u32,
            errors,
            created_at: Utc::now(),
            redrives: 0,
            redriven_at: None,
            skipped_at: None,
        };
        let hold = match (&letter.aggregate_key, letter.message_id) {
            (Some(key), Some(id)) if self.config.on_dead_letter == OnDeadLetter::HoldKey => {
                Some(((letter.topic.clone(), key.clone()), id))
            }
            _ => None,
        };
        // Retried until the store takes it: a message is never dropped.
        let stored = self
            .store_op("storing a dead letter", || async {
                match hold {
                    Some(_) => self.store.dead_letter_holding_key(&letter).await,
                    None => self.store.dead_letter(&letter).await,
                }
            })
            .await;
        if stored.is_none() {
            return self.give_back(delivery).await;
        }
        if let Some((key, message_id)) = hold {
            let hold = Hold {
                message_id,
                released: false,
            };
            self.holds.lock().expect("holds lock").insert(key, hold);
        }
        bump(&self.stats.dead_lettered);
        self.settle(delivery, AckKind::Term).await;
        Settled::DeadLettered
    }

    /// Gives the delivery back unhandled, to be delivered again.
    async fn give_back(&self, delivery: &Delivery) -> Settled {
        self.settle(delivery, AckKind::Nak(None)).await;
        Settled::GivenBack
    }

    async fn settle(&self, delivery: &Delivery, kind: AckKind) {
        if let Err(e) = delivery.ack(kind).await {
            // The transport will deliver it again; the marker makes that harmless.
            tracing::warn!(consumer = %self.name, error = %e, ?kind, "settling a delivery failed");
        }
    }

    /// Sleeps for `delay`; false if shutdown came first.
    async fn pause(&self, delay: Duration) -> bool {
        tokio::select! {
            _ = self.stop.cancelled() => false,
            _ = tokio::time::sleep(delay) => true,
        }
    }
}

fn failure(attempt: u32, class: ErrorClass, error: &str) -> Failure {
    Failure {
        attempt,
        at: Utc::now(),
        class: match class {
            ErrorClass::Permanent => "permanent",
            ErrorClass::Transient | ErrorClass::RetryAfter(_) => "transient",
        }
        .to_owned(),
        error: error.to_owned(),
    }
}

/// The acknowledgement of a message no transport delivered ([`Consumer::deliver`]).
struct Unsettled;

#[async_trait]
impl Acker for Unsettled {
    async fn ack(&self, _: AckKind) -> tidings_core::Result<()> {
        Ok(())
    }
}

/// How often a session looks for held keys released from outside (a skip).
const HOLDS_REFRESH: Duration = Duration::from_secs(1);

/// The partitions a session reads, to find the claim covering a key.
#[derive(Default)]
struct Partitions {
    counts: HashMap<String, u32>,
    claims: HashMap<(String, u32), Claim>,
}

impl Partitions {
    fn add(&mut self, topic: &str, partition: Partition, claim: &Claim) {
        self.counts.insert(topic.to_owned(), partition.count);
        self.claims
            .insert((topic.to_owned(), partition.index), claim.clone());
    }

    /// The claim under which this session handles `key` of `topic`, if it reads it.
    fn claim(&self, topic: &str, key: &str) -> Option<Claim> {
        let count = *self.counts.get(topic)?;
        let index = Partition::of(key, count).index;
        self.claims.get(&(topic.to_owned(), index)).cloned()
    }
}
