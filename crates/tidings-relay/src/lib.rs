//! The relay: moves committed outbox records to a transport.
//!
//! One loop, in this order:
//!
//! 1. claim a bounded batch of the oldest unsent records ([`RelayStore::claim`]);
//! 2. publish it and wait for the transport's confirmation ([`Publisher::publish`]);
//! 3. only then complete the batch (delete or mark the records);
//! 4. on a publish failure, release the batch and retry after a capped,
//!    jittered backoff, forever: the broker's absence only delays delivery;
//! 5. with nothing to do, sleep until a producer's wake-up or the polling interval.
//!
//! One bad record never stops it: a record whose body does not decode, or
//! that the transport refuses whatever its state (larger than it accepts),
//! is set aside as a dead letter of `@relay` in the failure store, and only
//! the later records of its key wait behind it, in order, until a redrive
//! or a skip ([`tidings_core::set_aside`]). When the transport refuses a
//! batch as a whole with a permanent error, the relay splits it to find the
//! records at fault; a transport that refuses everything is retried.
//!
//! Because a batch is completed only after confirmation, a crash anywhere
//! republishes (consumers deduplicate on the message id) and never loses.
//! Because batches are claimed oldest first and published in order, a key's
//! records reach the transport in commit order.
//!
//! # Several relays
//!
//! Records fall in outbox partitions by their key ([`RelayConfig::partitions`],
//! 1 unless set). Relays of one database share the partitions through leases
//! in the database ([`tidings_core::lease`]): each claims only the partitions
//! it holds, so a key's records are published by one relay, in order, while
//! relays publish different partitions in parallel. Claims are fenced: on
//! PostgreSQL a claim holds a share lock on its leases until the batch
//! commits, so they cannot change hands mid-batch; on SQLite completing a
//! batch checks each partition's lease in the same statement that marks its
//! records. A relay that stalled past its lease and was replaced claims and
//! marks nothing more. With one partition, one relay publishes and the
//! others stand by.
//!
//! # Several batches in flight
//!
//! A relay holding several partitions deals them into up to
//! [`RelayConfig::max_in_flight_batches`] lanes, each running the loop
//! above for its own partitions: one lane claims its next batch while
//! another's is being confirmed. A partition's batches still go out one
//! after the other, so each key keeps its order, and a batch that fails
//! rests only its lane's partitions. With one partition there is one lane.
//!
//! ```no_run
//! use tidings_relay::{Relay, RelayConfig};
//! use tidings_store_sqlite::SqliteStore;
//! use tokio_util::sync::CancellationToken;
//! # async fn run() -> tidings_core::Result<()> {
//! let store = SqliteStore::connect("tidings.db").await?;
//! store.migrate().await?;
//! let relay = Relay::new(store.clone(), store.log_publisher()).config(RelayConfig::default().batch_size(200));
//! let shutdown = CancellationToken::new();
//! relay.run(shutdown).await
//! # }
//! ```
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tidings_core::lease::sleep_unless;
use tidings_core::metrics::{self as m, Count};
use tidings_core::{
    Backoff, ClaimedBatch, Error, Lease, LeaseStore, OutboxPartitions, OutgoingMessage, Publisher,
    RelayStore, Result, Settlement,
};
use tidings_lease::{Membership, Scope};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

mod isolate;
mod window;

/// Tuning of a [`Relay`].
///
/// With the `serde` feature it reads from a configuration file, every key
/// optional, durations written `500ms`, `30s`, `5m`
/// ([`tidings_core::duration`]); [`RelayConfig::check`] then says whether
/// the values make sense, as [`Relay::run`] does before it starts.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Deserialize),
    serde(default, deny_unknown_fields)
)]
pub struct RelayConfig {
    batch_size: usize,
    #[cfg_attr(feature = "serde", serde(with = "tidings_core::duration"))]
    poll_interval: Duration,
    #[cfg_attr(feature = "serde", serde(with = "tidings_core::duration"))]
    publish_timeout: Duration,
    #[cfg_attr(feature = "serde", serde(skip))]
    backoff: Backoff,
    #[cfg_attr(feature = "serde", serde(with = "tidings_core::duration"))]
    cleanup_interval: Duration,
    partitions: u32,
    #[cfg_attr(feature = "serde", serde(with = "tidings_core::duration"))]
    lease_ttl: Duration,
    member: Option<String>,
    max_in_flight_batches: usize,
    max_in_flight_bytes: usize,
}

impl Default for RelayConfig {
    /// Batches of 500 records; poll every 500 ms when no wake-up arrives;
    /// give a publish 30 s to be confirmed; back off from 100 ms to 30 s
    /// after failures; run retention cleanup every minute; one outbox
    /// partition (one relay publishes at a time, others stand by), leases
    /// of 10 s; one batch in flight at a time (a window of up to 16 MiB
    /// once [`max_in_flight_batches`](RelayConfig::max_in_flight_batches) is raised).
    fn default() -> Self {
        RelayConfig {
            batch_size: 500,
            poll_interval: Duration::from_millis(500),
            publish_timeout: Duration::from_secs(30),
            backoff: Backoff::default(),
            cleanup_interval: Duration::from_secs(60),
            partitions: 1,
            lease_ttl: Duration::from_secs(10),
            member: None,
            max_in_flight_batches: 1,
            max_in_flight_bytes: 16 << 20,
        }
    }
}

impl RelayConfig {
    /// Records claimed and published at once (bounds memory and the database's work per round).
    ///
    /// ```
    /// let c = tidings_relay::RelayConfig::default().batch_size(100);
    /// ```
    pub fn batch_size(mut self, n: usize) -> Self {
        self.batch_size = n.max(1);
        self
    }

    /// How long to sleep when idle if no wake-up arrives.
    pub fn poll_interval(mut self, d: Duration) -> Self {
        self.poll_interval = d;
        self
    }

    /// How long a publish may wait for the transport's confirmation before it
    /// counts as failed. A batch that outlasts it makes the next rounds
    /// claim fewer records ([`Relay::claim_limit`]).
    pub fn publish_timeout(mut self, d: Duration) -> Self {
        self.publish_timeout = d;
        self
    }

    /// The backoff between retries after a failure.
    pub fn backoff(mut self, b: Backoff) -> Self {
        self.backoff = b;
        self
    }

    /// How often to delete sent records past their retention.
    pub fn cleanup_interval(mut self, d: Duration) -> Self {
        self.cleanup_interval = d;
        self
    }

    /// Outbox partitions: up to this many relays publish at once, each the
    /// partitions it holds a lease on. Every relay of one database must use
    /// the same count.
    pub fn partitions(mut self, n: u32) -> Self {
        self.partitions = n.max(1);
        self
    }

    /// The outbox partitions set ([`partitions`](RelayConfig::partitions)).
    pub fn partition_count(&self) -> u32 {
        self.partitions
    }

    /// How long a relay's partition leases last without renewal (renewed
    /// three times as often): a relay that dies is replaced after about this long.
    pub fn lease_ttl(mut self, d: Duration) -> Self {
        self.lease_ttl = d.max(Duration::from_millis(300));
        self
    }

    /// This relay's id among the relays (default: unique per process and run).
    pub fn member(mut self, id: impl Into<String>) -> Self {
        self.member = Some(id.into());
        self
    }

    /// How many batches may be in flight at once, at most one per outbox
    /// partition: a relay holding several
    /// partitions claims the next batch of one while another's are being
    /// confirmed. 1 publishes one batch at a time. On PostgreSQL and MySQL
    /// each batch in flight holds a connection of the pool until it ends.
    pub fn max_in_flight_batches(mut self, n: usize) -> Self {
        self.max_in_flight_batches = n.max(1);
        self
    }

    /// How many batches this relay may have in flight at once:
    /// [`max_in_flight_batches`](RelayConfig::max_in_flight_batches), at
    /// most one per outbox partition.
    pub fn window(&self) -> usize {
        self.max_in_flight_batches.min(self.partitions as usize)
    }

    /// No further batch is claimed while the batches in flight, and the
    /// claims under way (each counted as large as the last batch), hold
    /// this many bytes of records or more: the window exceeds it by about
    /// one batch at most.
    pub fn max_in_flight_bytes(mut self, n: usize) -> Self {
        self.max_in_flight_bytes = n.max(1);
        self
    }

    /// The first value that makes no sense, as [`Error::Config`] naming
    /// its key (`batch_size`): a batch of 1 to 100 000 records, 1 to 1024
    /// partitions, intervals and timeouts above 0, leases of at least 300 ms,
    /// 1 to 64 batches and 1 KiB to 1 GiB in flight.
    /// The setters keep the lower bounds; the upper bounds, and every bound
    /// of a deserialized configuration, are checked here.
    ///
    /// ```
    /// let e = tidings_relay::RelayConfig::default().batch_size(200_000).check().unwrap_err();
    /// assert_eq!(e.to_string(), "invalid configuration batch_size: 200000 is out of range (1 to 100000)");
    /// ```
    pub fn check(&self) -> Result<()> {
        let refuse = |key: &str, reason: String| {
            Err(Error::Config {
                key: key.to_owned(),
                reason,
            })
        };
        let range = |key: &str, v: u64, lo: u64, hi: u64| {
            if (lo..=hi).contains(&v) {
                Ok(())
            } else {
                refuse(key, format!("{v} is out of range ({lo} to {hi})"))
            }
        };
        range("batch_size", self.batch_size as u64, 1, 100_000)?;
        range("partitions", self.partitions.into(), 1, 1024)?;
        range("max_in_flight_batches", self.max_in_flight_batches as u64, 1, 64)?;
        range(
            "max_in_flight_bytes",
            self.max_in_flight_bytes as u64,
            1 << 10,
            1 << 30,
        )?;
        for (key, d) in [
            ("poll_interval", self.poll_interval),
            ("publish_timeout", self.publish_timeout),
            ("cleanup_interval", self.cleanup_interval),
        ] {
            if d.is_zero() {
                return refuse(key, "must be more than 0".into());
            }
        }
        if self.lease_ttl < Duration::from_millis(300) {
            return refuse("lease_ttl", "must be at least 300ms".into());
        }
        Ok(())
    }
}

/// Counters of a running relay, also recorded as metrics
/// ([`tidings_core::metrics`]: `tidings_relay_*`).
#[derive(Debug)]
pub struct RelayStats {
    published: Count,
    batches: Count,
    publish_failures: Count,
    claim_failures: Count,
    set_aside: Count,
    batch_size: metrics::Histogram,
    publish_duration: metrics::Histogram,
    in_flight: AtomicUsize,
    most_in_flight: AtomicUsize,
    in_flight_gauge: metrics::Gauge,
}

impl Default for RelayStats {
    fn default() -> Self {
        RelayStats {
            published: Count::new(metrics::counter!(m::RELAY_PUBLISHED)),
            batches: Count::new(metrics::counter!(m::RELAY_BATCHES)),
            publish_failures: Count::new(metrics::counter!(m::RELAY_PUBLISH_ERRORS)),
            claim_failures: Count::new(metrics::counter!(m::RELAY_CLAIM_ERRORS)),
            set_aside: Count::new(metrics::counter!(m::RELAY_SET_ASIDE)),
            batch_size: metrics::histogram!(m::RELAY_BATCH_SIZE),
            publish_duration: metrics::histogram!(m::RELAY_PUBLISH_DURATION),
            in_flight: AtomicUsize::new(0),
            most_in_flight: AtomicUsize::new(0),
            in_flight_gauge: metrics::gauge!(m::RELAY_BATCHES_IN_FLIGHT),
        }
    }
}

impl RelayStats {
    /// Records published and confirmed.
    pub fn published(&self) -> u64 {
        self.published.get()
    }

    /// Batches completed.
    pub fn batches(&self) -> u64 {
        self.batches.get()
    }

    /// Publishes that failed and were retried.
    pub fn publish_failures(&self) -> u64 {
        self.publish_failures.get()
    }

    /// Claims that failed (database errors).
    pub fn claim_failures(&self) -> u64 {
        self.claim_failures.get()
    }

    /// Records set aside as dead letters ([`tidings_core::set_aside`]).
    pub fn set_aside(&self) -> u64 {
        self.set_aside.get()
    }

    /// Batches claimed and not yet ended, now.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// The most batches that were in flight at once since the relay started.
    pub fn most_in_flight(&self) -> usize {
        self.most_in_flight.load(Ordering::Relaxed)
    }

    /// Counts a batch in flight until the guard is dropped.
    fn batch_in_flight(&self) -> InFlight<'_> {
        let now = self.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        self.most_in_flight.fetch_max(now, Ordering::Relaxed);
        self.in_flight_gauge.increment(1.0);
        InFlight(self)
    }
}

/// A batch in flight, counted in [`RelayStats`] while it lives.
struct InFlight<'a>(&'a RelayStats);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.0.in_flight_gauge.decrement(1.0);
    }
}

/// One span per record that carries a trace, in that trace
/// (`tidings.relay.send`): the relay's part of the message's story, from
/// its claim until its batch ends (confirmed and marked, or given back), so
/// that one order's trace holds its producer's, relay's and consumers'
/// spans whatever processes they ran in. Nothing is made without a trace
/// backend ([`tidings_core::trace::has_backend`]: a log alone would only
/// get one line per record), or when no subscriber records such spans.
fn send_spans(messages: &[OutgoingMessage]) -> Vec<tracing::Span> {
    let mut spans = Vec::new();
    if !tidings_core::trace::has_backend() {
        return spans;
    }
    for m in messages {
        let Some(parent) = m.envelope.trace() else {
            continue;
        };
        let span = tracing::info_span!(
            "tidings.relay.send",
            topic = %m.topic,
            message_id = %m.envelope.id,
            message_type = %m.envelope.message_type,
        );
        if span.is_disabled() {
            break;
        }
        tidings_core::trace::set_parent(&span, &parent);
        spans.push(span);
    }
    spans
}

/// The lease scope of relays.
pub const SCOPE: &str = "relay";

/// Moves outbox records from a [`RelayStore`] to a [`Publisher`].
pub struct Relay<S, P> {
    store: S,
    publisher: P,
    config: RelayConfig,
    stats: Arc<RelayStats>,
    member: String,
    /// The partitions held now (empty until the relay joined).
    held: Mutex<Vec<Lease>>,
    /// The most records a round claims now (0: the batch size); see
    /// [`Relay::claim_limit`].
    claim_limit: AtomicUsize,
    /// Shared by the publishes of the lanes, taken alone by a search for
    /// the records at fault: a refusal that closes a connection or channel
    /// the lanes share is then never blamed on another lane's records.
    alone: tokio::sync::RwLock<()>,
    /// More than one lane publishes now ([`window`]).
    pipelined: AtomicBool,
}

impl<S, P> fmt::Debug for Relay<S, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Relay")
            .field("config", &self.config)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

/// What one round did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Round {
    /// Published and completed this many records.
    Published(usize),
    /// Nothing was waiting.
    Idle,
}

impl<S: RelayStore + LeaseStore + Clone, P: Publisher> Relay<S, P> {
    /// A relay with the default configuration.
    pub fn new(store: S, publisher: P) -> Self {
        Relay {
            store,
            publisher,
            config: RelayConfig::default(),
            stats: Arc::default(),
            member: tidings_lease::unique_member("relay"),
            held: Mutex::default(),
            claim_limit: AtomicUsize::new(0),
            alone: tokio::sync::RwLock::new(()),
            pipelined: AtomicBool::new(false),
        }
    }

    /// Replaces the configuration.
    pub fn config(mut self, config: RelayConfig) -> Self {
        if let Some(member) = &config.member {
            self.member = member.clone();
        }
        self.config = config;
        self
    }

    fn membership(&self) -> Membership<S> {
        Membership::new(
            self.store.clone(),
            self.member.clone(),
            self.config.lease_ttl,
            vec![Scope {
                name: SCOPE.into(),
                partitions: self.config.partitions,
            }],
        )
    }

    fn partitions(&self) -> OutboxPartitions {
        OutboxPartitions {
            scope: SCOPE.to_owned(),
            member: self.member.clone(),
            count: self.config.partitions,
            leases: self.held.lock().expect("held lock").clone(),
        }
    }

    /// Joins the relays: takes this relay's share of the partitions that
    /// is free, and returns what it holds. [`run`](Relay::run) and
    /// [`round`](Relay::round) do this themselves.
    pub async fn join(&self) -> Result<Vec<Lease>> {
        let held = self.held.lock().expect("held lock").clone();
        let now = self
            .membership()
            .sync(&vec![held])
            .await?
            .pop()
            .unwrap_or_default();
        *self.held.lock().expect("held lock") = now.clone();
        Ok(now)
    }

    /// How many records a round claims: the batch size, halved after a
    /// round whose publish outlasted the publish timeout and doubled back
    /// after each that went through. A backlog that built up while the
    /// broker was away, more than it confirms within the timeout in one
    /// go, still drains, in smaller rounds, rather than being sent whole,
    /// timed out and sent again forever.
    pub fn claim_limit(&self) -> usize {
        match self.claim_limit.load(Ordering::Relaxed) {
            0 => self.config.batch_size,
            n => n.min(self.config.batch_size),
        }
    }

    fn claimed_too_much(&self, n: usize) {
        let limit = (n / 2).max(1);
        if limit < self.claim_limit() {
            self.claim_limit.store(limit, Ordering::Relaxed);
            tracing::warn!(
                records = n,
                publish_timeout_ms = self.config.publish_timeout.as_millis() as u64,
                claim_limit = limit,
                "the broker did not confirm a batch within the publish timeout; claiming fewer records per round until batches go through"
            );
        }
    }

    fn went_through(&self) {
        let limit = self.claim_limit();
        if limit < self.config.batch_size {
            self.claim_limit
                .store((limit * 2).min(self.config.batch_size), Ordering::Relaxed);
        }
    }

    /// The relay's counters, shared with the running loop.
    pub fn stats(&self) -> Arc<RelayStats> {
        self.stats.clone()
    }

    /// Claims, publishes and completes one batch of the partitions held
    /// (joining the relays first if it holds none). Errors are returned, not retried.
    pub async fn round(&self) -> Result<Round> {
        if self.held.lock().expect("held lock").is_empty() {
            self.join().await?;
        }
        match self.claim_batch(&self.partitions()).await? {
            Some(batch) => self.send(batch).await,
            None => Ok(Round::Idle),
        }
    }

    /// Claims a batch of `partitions`: `None` when nothing of theirs waits.
    async fn claim_batch(&self, partitions: &OutboxPartitions) -> Result<Option<S::Batch>> {
        let batch = self
            .store
            .claim(self.claim_limit(), partitions)
            .await
            .inspect_err(|_| self.stats.claim_failures.bump())?;
        if batch.messages().is_empty() && batch.undecodable().is_empty() {
            batch.release().await?;
            return Ok(None);
        }
        Ok(Some(batch))
    }

    /// Publishes a claimed batch and ends it, in its trace spans.
    async fn send(&self, batch: S::Batch) -> Result<Round> {
        let _in_flight = self.stats.batch_in_flight();
        let n = batch.messages().len() + batch.undecodable().len();
        let span = tracing::info_span!("tidings.relay.batch", records = n, member = %self.member);
        let _sends = send_spans(batch.messages());
        self.publish_batch(batch, n).instrument(span).await
    }

    /// Publishes a claimed batch of `n` records, then completes it, or releases it on failure.
    ///
    /// A batch with a record that cannot go out (its body does not decode,
    /// the transport refuses it) is sorted instead ([`isolate`]): the
    /// record is set aside, its key waits, the rest goes out.
    async fn publish_batch(&self, batch: S::Batch, n: usize) -> Result<Round> {
        let started = Instant::now();
        let clean = batch.undecodable().is_empty()
            && !batch
                .messages()
                .iter()
                .any(|m| self.publisher.refuses(m).is_some());
        let failed = if clean {
            let published = {
                let _shared = self.alone.read().await;
                isolate::publish(&self.publisher, self.config.publish_timeout, batch.messages()).await
            };
            match published {
                Ok(()) => {
                    self.went_through();
                    return self.complete(batch, n, started).await;
                }
                Err(e) if e.class().is_retryable() => {
                    self.stats.publish_failures.bump();
                    if started.elapsed() >= self.config.publish_timeout {
                        self.claimed_too_much(n);
                    }
                    // Give the records back at once so that another relay (or the
                    // next round) can take them; a failed release only delays that
                    // until the database notices the transaction is gone.
                    if let Err(release) = batch.release().await {
                        tracing::debug!(error = %release.report(), "releasing a batch failed");
                    }
                    return Err(e);
                }
                Err(e) => {
                    self.stats.publish_failures.bump();
                    tracing::warn!(error = %e.report(), records = n, "the transport refused the batch; looking for the records at fault");
                    Some(e)
                }
            }
        } else {
            None
        };
        // The search publishes alone. With other lanes publishing, the
        // batch's refusal may have been caused by one of their records (a
        // broker closing the channel they share): it is published again,
        // alone, before anything is blamed.
        let isolated = {
            let _alone = self.alone.write().await;
            let failed = failed.filter(|_| !self.pipelined.load(Ordering::Relaxed));
            isolate::isolate(
                &self.publisher,
                self.config.publish_timeout,
                isolate::Records::of(&batch),
                failed,
            )
            .instrument(tracing::info_span!("tidings.relay.isolate", records = n))
            .await
        };
        let sent = isolated.settlement.sent.len();
        self.settle(batch, isolated.settlement, started).await?;
        match isolated.error {
            Some(e) => {
                self.stats.publish_failures.bump();
                Err(e)
            }
            None => Ok(Round::Published(sent)),
        }
    }

    /// Marks the whole batch sent.
    async fn complete(&self, batch: S::Batch, n: usize, started: Instant) -> Result<Round> {
        let publish_time = started.elapsed();
        // If completing fails, the records stay unsent and are published
        // again: a duplicate, which consumers absorb, rather than a loss.
        batch.complete().await?;
        self.stats.published.add(n as u64);
        self.stats.batches.bump();
        self.stats.batch_size.record(n as f64);
        self.stats.publish_duration.record(publish_time.as_secs_f64());
        tracing::debug!(
            records = n,
            publish_ms = publish_time.as_millis() as u64,
            "relay batch published"
        );
        Ok(Round::Published(n))
    }

    /// Ends a sorted batch: what went out is marked sent, what was set
    /// aside becomes a dead letter holding its key, the rest goes back.
    async fn settle(&self, batch: S::Batch, settlement: Settlement, started: Instant) -> Result<()> {
        if settlement.is_empty() {
            return batch.release().await;
        }
        let sent = settlement.sent.len();
        let aside: Vec<_> = settlement
            .set_aside
            .iter()
            .map(|a| (a.seq, a.letter.clone()))
            .collect();
        batch.settle(settlement).await?;
        for (seq, letter) in aside {
            self.stats.set_aside.bump();
            tracing::error!(
                seq,
                message_id = %letter.message_id.unwrap_or_default(),
                topic = %letter.topic,
                key = %letter.aggregate_key.as_deref().unwrap_or_default(),
                message_type = %letter.message_type.as_deref().unwrap_or_default(),
                reason = %letter.errors.last().map(|f| f.error.as_str()).unwrap_or_default(),
                "outbox record set aside as a dead letter; later records of its key wait behind it (tidings dlq list --consumer @relay)"
            );
        }
        if sent > 0 {
            self.stats.published.add(sent as u64);
            self.stats.batches.bump();
            self.stats.batch_size.record(sent as f64);
            self.stats
                .publish_duration
                .record(started.elapsed().as_secs_f64());
        }
        Ok(())
    }

    /// Runs until `shutdown` is cancelled. A batch being published when
    /// shutdown arrives is finished (confirmed and completed) or released;
    /// it is never abandoned half-marked.
    ///
    /// The relay joins the other relays of the database and publishes the
    /// partitions it holds a lease on; when relays come or go, it finishes
    /// its batch, hands over what is no longer its share and takes up its
    /// new one. With nothing held, it stands by.
    pub async fn run(self, shutdown: CancellationToken) -> Result<()> {
        self.config.check()?;
        let membership = self.membership();
        let mut failures = 0u32;
        while !shutdown.is_cancelled() {
            let held = match self.join().await {
                Ok(held) => {
                    failures = 0;
                    vec![held]
                }
                Err(e) => {
                    failures += 1;
                    let delay = self.config.backoff.delay(failures);
                    tracing::warn!(error = %e.report(), retry_in_ms = delay.as_millis() as u64, "joining the relays failed; retrying");
                    sleep_unless(&shutdown, delay).await;
                    continue;
                }
            };
            if held[0].is_empty() {
                tracing::debug!(member = %self.member, "no outbox partition free; standing by");
                sleep_unless(&shutdown, membership.tick()).await;
                continue;
            }
            let stop = shutdown.child_token();
            tokio::join!(membership.watch(&held, stop.clone()), async {
                self.publish_until(&stop).await;
                stop.cancel();
            });
        }
        membership.leave().await;
        tracing::info!(published = self.stats.published(), "relay stopped");
        Ok(())
    }

    /// Publishes round after round until `stop` (shutdown, or a hand-over):
    /// one batch at a time, or several in flight when the relay holds
    /// several partitions and the window allows it
    /// ([`RelayConfig::max_in_flight_batches`]).
    async fn publish_until(&self, stop: &CancellationToken) {
        let lanes = window::lanes(&self.partitions(), self.config.max_in_flight_batches);
        if lanes.len() > 1 {
            return self.publish_pipelined(stop, lanes).await;
        }
        let mut failures = 0u32;
        let mut last_cleanup = Instant::now();
        while !stop.is_cancelled() {
            self.cleanup_when_due(&mut last_cleanup).await;
            match self.round().await {
                Ok(Round::Published(_)) => failures = 0,
                Ok(Round::Idle) => {
                    failures = 0;
                    tokio::select! {
                        _ = stop.cancelled() => break,
                        _ = self.store.wait_for_work(self.config.poll_interval) => {}
                    }
                }
                Err(e) => {
                    failures += 1;
                    let delay = self.config.backoff.delay(failures);
                    tracing::warn!(error = %e.report(), attempt = failures, retry_in_ms = delay.as_millis() as u64, "relay round failed; retrying");
                    sleep_unless(stop, delay).await;
                }
            }
        }
    }

    /// Deletes sent records past retention once per cleanup interval.
    async fn cleanup_when_due(&self, last: &mut Instant) {
        if last.elapsed() < self.config.cleanup_interval {
            return;
        }
        *last = Instant::now();
        self.cleanup().await;
    }

    /// Deletes sent records past retention; a failure is logged, and tried
    /// again at the next interval.
    async fn cleanup(&self) {
        match self.store.cleanup().await {
            Ok(0) => {}
            Ok(n) => tracing::debug!(deleted = n, "deleted sent outbox records past retention"),
            Err(e) => tracing::warn!(error = %e.report(), "outbox retention cleanup failed"),
        }
    }
}
