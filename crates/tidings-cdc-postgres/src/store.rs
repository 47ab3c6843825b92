//! [`CdcStore`]: the relay's store when it reads the change stream.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use pgwire_replication::{Lsn, ReplicationConfig};
use tidings_core::{ClaimedBatch, Lease, LeaseStore, OutboxPartitions, RelayStore, Result};
use tidings_sql::db_error;
use tidings_store_postgres::{Listed, Pg, PgStore, claim_listed, claim_oldest};
use tokio::sync::Mutex;

use crate::CdcOptions;
use crate::batch::CdcBatch;
use crate::slot::{self, SlotName};
use crate::stream::{self, Committed, Stream};

/// What a sweep batch that took every unsent record tells once sent.
pub(crate) struct CatchUp {
    store: CdcStore,
    session: u64,
    /// The stream's transactions received before the claim.
    before: usize,
    /// Whether a key was held when the claim began.
    holds: bool,
}

impl CatchUp {
    /// The batch was sent whole.
    pub(crate) async fn sent_whole(self) {
        let mut state = self.store.inner.state.lock().await;
        if state.session == self.session {
            self.store.caught_up(&mut state, self.before, self.holds);
        }
    }
}

/// Where the relay takes its next records from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// The oldest unsent records of the outbox, as the polling relay
    /// claims them: at each start (what was committed before the slot's
    /// position), while a key is held behind a record set aside, and after
    /// a batch that did not end whole.
    Sweep,
    /// The records the change stream says were committed, in commit order.
    Stream,
    /// No slot: it kept more log than the cap allows and was dropped. The
    /// outbox is swept until nothing is left, then a new slot is made.
    Unslotted,
}

struct State {
    stream: Option<Stream>,
    mode: Mode,
    /// Counts the sessions started, so that a batch of an ended session
    /// does not touch the next one.
    session: u64,
    /// When the last heartbeat was written.
    heartbeat: Instant,
    /// When the slot's log was last measured against the cap.
    guarded: Instant,
}

struct Inner {
    pg: PgStore,
    slot: SlotName,
    replication: ReplicationConfig,
    heartbeat_interval: Duration,
    /// Records claimed as the stream named them, and by sweeping.
    streamed: AtomicU64,
    swept: AtomicU64,
    /// The log the slot may keep, in bytes, and how often to look.
    wal_cap: Option<u64>,
    guard_interval: Duration,
    state: Mutex<State>,
}

/// The relay's store in CDC mode, on PostgreSQL: a [`RelayStore`] that
/// learns what was committed from the outbox table's inserts, streamed
/// from a logical replication slot (pgoutput), instead of looking for
/// unsent records; give it to a [`Relay`](https://docs.rs/tidings-relay)
/// in place of the [`PgStore`].
///
/// The outbox table stays the source of truth: a record is claimed by its
/// seq under the relay's lease, published, then deleted or stamped as the
/// polling relay does, and only then is the slot's position confirmed past
/// its transaction. A crash anywhere streams again from the last confirmed
/// position, and records already sent are passed over: nothing is lost and
/// nothing sent is claimed twice. When the stream cannot say everything (at
/// each start, for what was committed before the slot's position; while a
/// key waits behind a record set aside; after a batch that failed), the
/// relay claims the oldest unsent records as the polling relay does, until
/// none is left, then follows the stream again.
///
/// One relay streams the slot at a time: the one holding the relay lease
/// (so [`RelayConfig::partitions`](https://docs.rs/tidings-relay) must be
/// 1). A relay taking the lease over ends the stream of the one that lost
/// it, which claims nothing more (its claims are fenced by the lease, as
/// the polling relay's are).
#[derive(Clone)]
pub struct CdcStore {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for CdcStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CdcStore")
            .field("slot", &self.inner.slot)
            .finish_non_exhaustive()
    }
}

impl CdcStore {
    /// The CDC store of `pg`, whose server `url` reaches (the URL the
    /// store was opened with: the replication session logs in as it does).
    pub fn new(pg: PgStore, url: &str, options: CdcOptions) -> Result<CdcStore> {
        let slot = SlotName::of_group(&options.group)?;
        let replication = stream::config(url, slot.as_str(), options.status_interval)?;
        Ok(CdcStore {
            inner: Arc::new(Inner {
                pg,
                slot,
                replication,
                heartbeat_interval: options.heartbeat_interval,
                streamed: AtomicU64::new(0),
                swept: AtomicU64::new(0),
                wal_cap: options.wal_cap,
                guard_interval: options.guard_interval,
                state: Mutex::new(State {
                    stream: None,
                    mode: Mode::Sweep,
                    session: 0,
                    heartbeat: Instant::now(),
                    guarded: Instant::now(),
                }),
            }),
        })
    }

    /// The PostgreSQL store underneath.
    pub fn pg(&self) -> &PgStore {
        &self.inner.pg
    }

    /// The slot's (and the publication's) name.
    pub fn slot(&self) -> &SlotName {
        &self.inner.slot
    }

    /// Makes the publication and the slot where missing (a relay does it
    /// at its first claim): `tidings migrate` in CDC mode.
    pub async fn prepare(&self) -> Result<()> {
        slot::ensure(self.inner.pg.pool(), &self.inner.slot)
            .await
            .map(|_| ())
    }

    /// Starts streaming the slot, ending another session's stream of it.
    async fn start(&self, state: &mut State) -> Result<()> {
        let pool = self.inner.pg.pool();
        slot::ensure(pool, &self.inner.slot).await?;
        let schema: String = sqlx::query_scalar("SELECT current_schema()")
            .fetch_one(pool)
            .await
            .map_err(db_error::<Pg>("reading the outbox's schema"))?;
        let mut attempt = 0;
        let stream = loop {
            if slot::take_over(pool, &self.inner.slot).await? {
                tracing::info!(slot = %self.inner.slot, "ended the stream of a relay that lost its lease");
            }
            match Stream::start(self.inner.replication.clone(), schema.clone()).await {
                Ok(stream) => break stream,
                // The session ended is not gone at once: the slot stays
                // active a moment longer.
                Err(e) if attempt < 20 && is_active(&e) => {
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => return Err(e),
            }
        };
        tracing::info!(slot = %self.inner.slot, "streaming the outbox's inserts");
        state.stream = Some(stream);
        state.mode = Mode::Sweep;
        state.session += 1;
        Ok(())
    }

    /// The oldest unsent records, as the polling relay claims them; with
    /// none left, everything the stream brought before is sent (or waits
    /// behind a held key, in the outbox): its position is confirmed, and
    /// the relay follows the stream again unless a key is held.
    async fn sweep(&self, state: &mut State, limit: usize, held: &OutboxPartitions) -> Result<CdcBatch> {
        let before = state.stream.as_ref().map_or(0, |s| s.ready.len());
        // What the stream brought before must be visible to the claim's
        // snapshot for an empty claim to say it was all sent.
        let xids: Vec<i64> = state.stream.as_ref().map_or_else(Vec::new, |s| {
            s.ready
                .iter()
                .take(before)
                .filter(|c| !c.seqs.is_empty())
                .map(|c| i64::from(c.xid))
                .collect()
        });
        let visible = self.until_visible(&xids).await?;
        // `holds` is looked at before the records are: a key released
        // meanwhile (a redrive, a skip) is swept up at the next claim.
        let Some((batch, holds)) = claim_oldest(&self.inner.pg, limit, held).await? else {
            // Claimed nothing because the lease is gone, which says nothing
            // of what the stream brought: leave the slot to the new holder.
            state.stream = None;
            return Ok(CdcBatch::empty());
        };
        let claimed = batch.messages().len() + batch.undecodable().len();
        if claimed > 0 {
            self.count(&self.inner.swept, &batch);
            // Fewer than asked: every record unsent at the claim's snapshot
            // is in this batch (or waits behind a held key). Once it is
            // sent, the outbox has caught up with the stream.
            if claimed < limit && visible {
                let catch_up = CatchUp {
                    store: self.clone(),
                    session: state.session,
                    before,
                    holds,
                };
                return Ok(CdcBatch::swept_catching_up(batch, catch_up));
            }
            return Ok(CdcBatch::swept(batch));
        }
        batch.release().await?;
        if visible {
            self.caught_up(state, before, holds);
        }
        Ok(CdcBatch::empty())
    }

    /// Nothing unsent is left that the stream brought before its `before`
    /// first transactions: they are confirmed, and the relay follows the
    /// stream again unless a key is held.
    fn caught_up(&self, state: &mut State, before: usize, holds: bool) {
        if let Some(stream) = state.stream.as_mut() {
            let before = before.min(stream.ready.len());
            let end = stream.ready.drain(..before).next_back().map(|c| c.end);
            if let Some(end) = end {
                stream.confirm(end);
            }
            if !holds && state.mode == Mode::Sweep {
                tracing::debug!(slot = %self.inner.slot, "outbox caught up; following the change stream");
                state.mode = Mode::Stream;
            }
        }
    }

    /// The records of the next transactions streamed, claimed by seq.
    async fn streamed(
        &self,
        state: &mut State,
        limit: usize,
        held: &OutboxPartitions,
    ) -> Result<Option<CdcBatch>> {
        let session = state.session;
        let Some(stream) = state.stream.as_mut() else {
            return Ok(Some(CdcBatch::empty()));
        };
        let mut taken: Vec<Committed> = Vec::new();
        let mut records = 0;
        while records < limit {
            let Some(next) = stream.ready.pop_front() else {
                break;
            };
            records += next.seqs.len();
            taken.push(next);
        }
        let Some(end) = taken.last().map(|c| c.end) else {
            return Ok(Some(CdcBatch::empty()));
        };
        if records == 0 {
            stream.confirm(end);
            return Ok(Some(CdcBatch::empty()));
        }
        let seqs: Vec<i64> = taken.iter().flat_map(|c| c.seqs.iter().copied()).collect();
        let xids: Vec<i64> = taken
            .iter()
            .filter(|c| !c.seqs.is_empty())
            .map(|c| i64::from(c.xid))
            .collect();
        // A transaction is in the log a moment before other sessions
        // see it: a record not visible yet must not pass for sent.
        match self.until_visible(&xids).await {
            Ok(true) => {}
            Ok(false) => {
                give_back(stream, taken);
                return Ok(Some(CdcBatch::empty()));
            }
            Err(e) => {
                give_back(stream, taken);
                return Err(e);
            }
        }
        let listed = claim_listed(&self.inner.pg, &seqs, held).await;
        match listed {
            Ok(Listed::Claimed(batch)) if batch.messages().is_empty() && batch.undecodable().is_empty() => {
                // Every one was sent already (by a sweep, or before a
                // stream started again from an earlier position).
                if let Err(e) = batch.release().await {
                    give_back(stream, taken);
                    return Err(e);
                }
                stream.confirm(end);
                Ok(Some(CdcBatch::empty()))
            }
            Ok(Listed::Claimed(batch)) => {
                // Records missing were sent already: they are visible, so
                // the claim would have found them unsent.
                self.count(&self.inner.streamed, &batch);
                Ok(Some(CdcBatch::streamed(batch, taken, self.clone(), session)))
            }
            Ok(Listed::KeysHeld) => {
                give_back(stream, taken);
                state.mode = Mode::Sweep;
                Ok(None)
            }
            Ok(Listed::LeaseLost) => {
                state.stream = None;
                Ok(Some(CdcBatch::empty()))
            }
            Err(e) => {
                give_back(stream, taken);
                Err(e)
            }
        }
    }

    /// Waits until every transaction of `xids` (32-bit ids, as streamed)
    /// is visible to new snapshots: its commit is in the log slightly
    /// before (for as long as a synchronous standby takes to answer, with
    /// one). Says whether they are, after a second at most: the caller
    /// tries again later rather than take an invisible record for sent.
    async fn until_visible(&self, xids: &[i64]) -> Result<bool> {
        if xids.is_empty() {
            return Ok(true);
        }
        for _ in 0..1000 {
            let visible: Option<bool> = sqlx::query_scalar(VISIBLE)
                .bind(xids)
                .fetch_one(self.inner.pg.pool())
                .await
                .map_err(db_error::<Pg>("waiting for streamed transactions to be visible"))?;
            if visible.unwrap_or(true) {
                return Ok(true);
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        Ok(false)
    }

    /// The slot guard: a slot keeping more log than the cap is dropped
    /// rather than left to fill the server's disk. Nothing is lost: every
    /// record not sent is in the outbox, swept until none is left, and a
    /// new slot is made then.
    async fn guard(&self, state: &mut State, held: &OutboxPartitions) -> Result<()> {
        let Some(cap) = self.inner.wal_cap else {
            return Ok(());
        };
        if state.mode == Mode::Unslotted || state.guarded.elapsed() < self.inner.guard_interval {
            return Ok(());
        }
        state.guarded = Instant::now();
        let pool = self.inner.pg.pool();
        let Some(status) = slot::status(pool, &self.inner.slot).await? else {
            return Ok(());
        };
        // What the relay has not confirmed: the log before the slot's
        // restart position may also be held by a long transaction, which
        // dropping the slot would not free.
        let retained = u64::try_from(status.unconfirmed_bytes).unwrap_or(0);
        if retained <= cap {
            return Ok(());
        }
        // Only the lease's holder: a relay that lost it must not end its
        // successor's stream.
        if !self.holds_lease(held).await? {
            return Ok(());
        }
        tracing::error!(
            slot = %self.inner.slot,
            retained_mib = retained / (1024 * 1024),
            cap_mib = cap / (1024 * 1024),
            "the CDC slot keeps more unconfirmed log than relay.slot_wal_cap_mib allows: dropping it and sending from the outbox until it is caught up, then making a new slot (nothing is lost)"
        );
        if let Some(stream) = state.stream.take() {
            stream.close().await;
        }
        slot::drop(pool, &self.inner.slot).await?;
        state.mode = Mode::Unslotted;
        Ok(())
    }

    /// Without a slot: the oldest unsent records; with none left, a new
    /// slot, swept once more past its position before the stream is
    /// followed.
    async fn unslotted(&self, state: &mut State, limit: usize, held: &OutboxPartitions) -> Result<CdcBatch> {
        let Some((batch, _)) = claim_oldest(&self.inner.pg, limit, held).await? else {
            return Ok(CdcBatch::empty());
        };
        if !batch.messages().is_empty() || !batch.undecodable().is_empty() {
            self.count(&self.inner.swept, &batch);
            return Ok(CdcBatch::swept(batch));
        }
        batch.release().await?;
        tracing::info!(slot = %self.inner.slot, "the outbox is caught up: making a new CDC slot");
        self.start(state).await?;
        state.guarded = Instant::now();
        Ok(CdcBatch::empty())
    }

    /// Whether the relay's lease is still live (an empty claim under it).
    async fn holds_lease(&self, held: &OutboxPartitions) -> Result<bool> {
        match claim_listed(&self.inner.pg, &[], held).await? {
            Listed::LeaseLost => Ok(false),
            Listed::Claimed(nothing) => nothing.release().await.map(|()| true),
            Listed::KeysHeld => Ok(true),
        }
    }

    /// A streamed batch was sent whole: confirms its last transaction.
    pub(crate) async fn sent(&self, session: u64, end: Lsn) {
        let mut state = self.inner.state.lock().await;
        if state.session == session
            && let Some(stream) = state.stream.as_mut()
        {
            stream.confirm(end);
        }
    }

    /// A streamed batch was given back unsent: its transactions are next again.
    pub(crate) async fn unsent(&self, session: u64, taken: Vec<Committed>) {
        let mut state = self.inner.state.lock().await;
        if state.session == session
            && let Some(stream) = state.stream.as_mut()
        {
            give_back(stream, taken);
        }
    }

    /// A batch did not end whole (settled in part, or its end failed): the
    /// records left are in the outbox, found by sweeping it.
    pub(crate) async fn unsettled(&self) {
        let mut state = self.inner.state.lock().await;
        if state.mode == Mode::Stream {
            state.mode = Mode::Sweep;
        }
    }

    /// Ends the stream, if one runs (the relay using this store has
    /// stopped): the slot is free for another session, or to be dropped.
    pub async fn close(&self) {
        let stream = self.inner.state.lock().await.stream.take();
        if let Some(stream) = stream {
            stream.close().await;
        }
    }

    fn count(&self, counter: &AtomicU64, batch: &impl ClaimedBatch) {
        let n = batch.messages().len() + batch.undecodable().len();
        counter.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Records claimed so far as the change stream named them, and by
    /// sweeping the outbox (at starts, behind held keys, past the cap).
    pub fn claimed(&self) -> (u64, u64) {
        (
            self.inner.streamed.load(Ordering::Relaxed),
            self.inner.swept.load(Ordering::Relaxed),
        )
    }

    /// The position this relay confirmed last (zero before its first).
    pub async fn confirmed(&self) -> Option<Lsn> {
        self.inner
            .state
            .lock()
            .await
            .stream
            .as_ref()
            .map(Stream::confirmed)
    }
}

/// Whether every transaction id of `$1` (32 bits) is visible to a snapshot
/// taken now. Each is widened to 64 bits as the id nearest the snapshot's
/// xmax: its signed 32-bit distance from xmax's low half added to xmax.
const VISIBLE: &str = "WITH m AS (SELECT snap, pg_snapshot_xmax(snap)::text::int8 AS xmax
                    FROM (SELECT pg_current_snapshot() AS snap) s)
     SELECT bool_and(pg_visible_in_snapshot(
         (CASE WHEN d < 2147483648 THEN xmax + d ELSE xmax + d - 4294967296 END)::text::xid8, snap))
     FROM m, LATERAL (SELECT (x - (xmax & 4294967295)) & 4294967295 AS d
                      FROM unnest($1::int8[]) AS x) t";

fn is_active(e: &tidings_core::Error) -> bool {
    let text = e.report().to_string();
    text.contains("55006") || text.contains("is active for PID")
}

fn give_back(stream: &mut Stream, taken: Vec<Committed>) {
    for committed in taken.into_iter().rev() {
        stream.ready.push_front(committed);
    }
}

#[async_trait]
impl RelayStore for CdcStore {
    type Batch = CdcBatch;

    async fn claim(&self, limit: usize, held: &OutboxPartitions) -> Result<CdcBatch> {
        let mut state = self.inner.state.lock().await;
        if held.count != 1 {
            return Err(tidings_core::Error::Config {
                key: "relay.partitions".into(),
                reason: format!(
                    "a CDC relay streams one slot, from one relay at a time: partitions must be 1, not {}",
                    held.count
                ),
            });
        }
        if held.leases.is_empty() {
            state.stream = None;
            return Ok(CdcBatch::empty());
        }
        self.guard(&mut state, held).await?;
        if state.mode == Mode::Unslotted {
            return self.unslotted(&mut state, limit, held).await;
        }
        if state.stream.is_none() {
            // Only while the lease is this relay's: one that lost it must
            // not take the slot back from its successor.
            if !self.holds_lease(held).await? {
                return Ok(CdcBatch::empty());
            }
            self.start(&mut state).await?;
        }
        if let Some(stream) = state.stream.as_mut()
            && let Err(e) = stream.pull()
        {
            state.stream = None;
            return Err(e);
        }
        if state.mode == Mode::Stream
            && let Some(batch) = self.streamed(&mut state, limit, held).await?
        {
            return Ok(batch);
        }
        self.sweep(&mut state, limit, held).await
    }

    async fn wait_for_work(&self, timeout: Duration) {
        let mut state = self.inner.state.lock().await;
        let Some(stream) = state.stream.as_mut() else {
            drop(state);
            tokio::time::sleep(timeout).await;
            return;
        };
        if stream.ready.iter().any(|c| !c.seqs.is_empty()) {
            return;
        }
        // Idle: a message of its own in the log keeps the slot's position
        // moving while the server's log grows with other work.
        if state.heartbeat.elapsed() >= self.inner.heartbeat_interval {
            state.heartbeat = Instant::now();
            if let Err(e) = sqlx::query("SELECT pg_logical_emit_message(false, 'tidings.heartbeat', '')")
                .execute(self.inner.pg.pool())
                .await
            {
                tracing::debug!(error = %e, "writing a CDC heartbeat failed");
            }
        }
        let Some(stream) = state.stream.as_mut() else {
            return;
        };
        if let Err(e) = stream.wait(timeout).await {
            tracing::warn!(error = %e.report(), "the change stream ended; starting it again");
            state.stream = None;
        }
    }

    async fn cleanup(&self) -> Result<u64> {
        self.inner.pg.cleanup().await
    }
}

#[async_trait]
impl LeaseStore for CdcStore {
    async fn heartbeat(&self, scope: &str, member: &str, ttl: Duration) -> Result<Vec<String>> {
        self.inner.pg.heartbeat(scope, member, ttl).await
    }

    async fn acquire(&self, scope: &str, member: &str, wanted: &[u32], ttl: Duration) -> Result<Vec<Lease>> {
        self.inner.pg.acquire(scope, member, wanted, ttl).await
    }

    async fn release(&self, scope: &str, member: &str, partitions: &[u32]) -> Result<()> {
        self.inner.pg.release(scope, member, partitions).await
    }

    async fn leave(&self, scope: &str, member: &str) -> Result<()> {
        self.inner.pg.leave(scope, member).await
    }
}
