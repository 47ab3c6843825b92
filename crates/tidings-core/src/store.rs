//! What a database store provides: the outbox, the relay's claims, the
//! consumers' idempotency and effects records, and the failure store.
//!
//! Each ability is its own small trait, so that a store can grow into them
//! one at a time and callers ask only for what they use.

use std::collections::HashSet;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::{Database, Transaction};
use uuid::Uuid;

use crate::envelope::Headers;
use crate::error::{Error, ErrorClass, Result};
use crate::lease::Lease;
use crate::message::Message;
use crate::set_aside::{Settlement, Undecodable};
use crate::transport::OutgoingMessage;

/// Writes messages into the outbox inside the caller's own transaction.
///
/// ```ignore
/// let mut tx = pool.begin().await?;
/// sqlx::query("INSERT INTO orders (id, total_cents) VALUES (?, ?)")
///     .bind(&order.id).bind(order.total_cents).execute(&mut *tx).await?;
/// let id = store.enqueue(&mut tx, &OrderPlaced { order_id: order.id.clone() }).await?;
/// store.commit(tx).await?; // commits, then wakes the relays
/// ```
#[async_trait]
pub trait Outbox: Send + Sync + 'static {
    /// The database the outbox lives in.
    type Database: Database;

    /// Adds `message` to the outbox on `conn`, which should be the caller's
    /// open transaction: the message then exists if and only if that
    /// transaction commits. Returns the id of its envelope, which consumers
    /// deduplicate on.
    ///
    /// The message's type says its topic, key, kind and version
    /// ([`Message`]); the envelope's `source` is the store's
    /// ([`Outbox::source`]). To set headers, a correlation or a causation,
    /// build the [`OutgoingMessage`] and call [`Outbox::enqueue_outgoing`].
    async fn enqueue<M: Message>(
        &self,
        conn: &mut <Self::Database as Database>::Connection,
        message: &M,
    ) -> Result<Uuid> {
        let outgoing = OutgoingMessage::new(self.source(), message)?;
        self.enqueue_outgoing(conn, &outgoing).await?;
        Ok(outgoing.envelope.id)
    }

    /// Adds an envelope built by hand to the outbox on `conn`, with the
    /// same guarantee as [`Outbox::enqueue`].
    async fn enqueue_outgoing(
        &self,
        conn: &mut <Self::Database as Database>::Connection,
        message: &OutgoingMessage,
    ) -> Result<()>;

    /// The `source` of the envelopes [`Outbox::enqueue`] builds: the
    /// producing service (`checkout`).
    fn source(&self) -> &str;

    /// Commits `tx`, the caller's transaction that enqueued, then wakes the
    /// relays ([`Outbox::wake`]): the usual end of a business write.
    async fn commit(&self, tx: Transaction<'_, Self::Database>) -> Result<()> {
        tx.commit()
            .await
            .map_err(|e| Error::database("committing the transaction", self.error_class(&e), e))?;
        self.wake();
        Ok(())
    }

    /// Whether trying again may help after `error`, an error of this
    /// store's database: each database has its own codes for a lost race,
    /// a busy lock or a server going down. Connection and pool faults are
    /// transient everywhere.
    fn error_class(&self, error: &sqlx::Error) -> ErrorClass;

    /// Tells relays that new messages were committed. Call it after commit;
    /// calls are coalesced, and relays poll anyway, so a missed wake-up only
    /// delays delivery by one polling interval.
    fn wake(&self);
}

/// The outbox partitions a relay holds, and the leases that allow it.
///
/// Records fall in partitions by the [`Partition::of`](crate::Partition::of)
/// their aggregate key; each partition is leased to one relay at a time
/// ([`lease`](crate::lease)), so that several relays publish in parallel
/// while each key's records go out in commit order, from one relay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxPartitions {
    /// The lease scope (`relay`).
    pub scope: String,
    /// The relay's member id.
    pub member: String,
    /// How many partitions the outbox has.
    pub count: u32,
    /// The partitions held, with their fencing tokens.
    pub leases: Vec<Lease>,
}

impl OutboxPartitions {
    /// The same, holding only the leases of the partitions `keep` accepts.
    pub fn only(&self, keep: impl Fn(u32) -> bool) -> OutboxPartitions {
        OutboxPartitions {
            leases: self
                .leases
                .iter()
                .filter(|l| keep(l.partition))
                .copied()
                .collect(),
            ..self.clone()
        }
    }
}

/// Claims batches of committed outbox records for the relay.
#[async_trait]
pub trait RelayStore: Send + Sync + 'static {
    /// A claimed batch; dropping it without completing releases it.
    type Batch: ClaimedBatch;

    /// Claims up to `limit` of the oldest unsent records of the partitions
    /// `held` leases, in commit order per key. Only partitions whose lease
    /// is still the relay's (same fencing token) are claimed, and a batch
    /// is completed only while they still are: a relay that lost a lease
    /// never marks another's records.
    async fn claim(&self, limit: usize, held: &OutboxPartitions) -> Result<Self::Batch>;

    /// Waits until a producer signals new records or `timeout` passes.
    async fn wait_for_work(&self, timeout: Duration);

    /// Deletes sent records kept past their retention; returns how many.
    /// Stores that delete records when they are sent have nothing to do.
    async fn cleanup(&self) -> Result<u64> {
        Ok(0)
    }
}

/// A batch of outbox records claimed by one relay.
///
/// Records of keys the relay holds ([`set_aside`](crate::set_aside)) are
/// never claimed: they wait behind the record set aside.
#[async_trait]
pub trait ClaimedBatch: Send + 'static {
    /// The records that decoded, oldest first.
    fn messages(&self) -> &[OutgoingMessage];

    /// The outbox sequence number of each of [`messages`](Self::messages), in the same order.
    fn seqs(&self) -> &[i64];

    /// The records whose body is not an envelope, oldest first.
    fn undecodable(&self) -> &[Undecodable];

    /// Marks every record of [`messages`](Self::messages) sent (deletes
    /// them, or stamps them for retention). Only for a batch with nothing
    /// undecodable: otherwise [`settle`](Self::settle) it.
    async fn complete(self) -> Result<()>;

    /// Gives the records back unsent, to be claimed again.
    async fn release(self) -> Result<()>;

    /// Ends the batch in part, in one transaction that holds only while the
    /// relay still holds the partitions: marks the records `sent`, stores
    /// each record set aside as a dead letter holding its key for the
    /// relay, and gives every other record back unsent. Fails, changing
    /// nothing, if a partition changed hands (the new holder publishes the
    /// records again: duplicates, never a loss).
    async fn settle(self, settlement: Settlement) -> Result<()>;
}

/// The consumer-side records that make handling idempotent.
#[async_trait]
pub trait ConsumerStore: Outbox {
    /// Opens a transaction for one handler run.
    async fn begin(&self) -> Result<Transaction<'static, Self::Database>>;

    /// Records that `consumer` processed `message_id`, on the handler's
    /// transaction. Returns `false` if it was already recorded (a duplicate).
    async fn mark_processed(
        &self,
        conn: &mut <Self::Database as Database>::Connection,
        consumer: &str,
        message_id: Uuid,
    ) -> Result<bool>;

    /// Records that `consumer` processed each of `message_ids`, on one
    /// transaction (batched handling), and returns those that were not
    /// recorded yet: the others are duplicates. Stores that can should do
    /// it in one statement; the default records them one by one.
    async fn mark_processed_all(
        &self,
        conn: &mut <Self::Database as Database>::Connection,
        consumer: &str,
        message_ids: &[Uuid],
    ) -> Result<HashSet<Uuid>> {
        let mut fresh = HashSet::with_capacity(message_ids.len());
        for &id in message_ids {
            if self.mark_processed(&mut *conn, consumer, id).await? {
                fresh.insert(id);
            }
        }
        Ok(fresh)
    }

    /// Whether the side effect `effect` of (`consumer`, `message_id`) is recorded as done.
    async fn effect_recorded(
        &self,
        conn: &mut <Self::Database as Database>::Connection,
        consumer: &str,
        message_id: Uuid,
        effect: &str,
    ) -> Result<bool>;

    /// Records the side effect as done, on the handler's transaction.
    async fn record_effect(
        &self,
        conn: &mut <Self::Database as Database>::Connection,
        consumer: &str,
        message_id: Uuid,
        effect: &str,
        idempotency_key: &str,
    ) -> Result<()>;

    /// Whether `member` holds `lease` of `scope` (same fencing token, not
    /// expired), read on the handler's transaction so that the check holds
    /// until it commits: where the database can, the lease cannot change
    /// hands in between ([`lease`](crate::lease)).
    async fn holds_lease(
        &self,
        conn: &mut <Self::Database as Database>::Connection,
        scope: &str,
        member: &str,
        lease: Lease,
    ) -> Result<bool>;

    /// Opens the handling of `message_id` on the handler's transaction:
    /// records the processed marker, then, with a `fence`, checks that the
    /// member still holds the partition's lease ([`holds_lease`](Self::holds_lease)).
    /// The default makes the two calls; a store that can does both in one
    /// statement, one round trip less per message.
    async fn begin_handling(
        &self,
        conn: &mut <Self::Database as Database>::Connection,
        consumer: &str,
        message_id: Uuid,
        fence: Option<Fence<'_>>,
    ) -> Result<Handling> {
        if !self.mark_processed(&mut *conn, consumer, message_id).await? {
            return Ok(Handling::Duplicate);
        }
        if let Some(f) = fence
            && !self.holds_lease(conn, f.scope, f.member, f.lease).await?
        {
            return Ok(Handling::LeaseLost);
        }
        Ok(Handling::Fresh)
    }

    /// Records, in a transaction of its own, that a handling of `message_id`
    /// begins, and returns how many handlings of it began before and never
    /// ended: each one a member that died, or froze past the broker's
    /// deadline, while its handler ran. The crash-loop guard's count,
    /// taken from Tidings' own store, never from the message.
    async fn handling_started(&self, consumer: &str, message_id: Uuid) -> Result<u32>;

    /// Forgets the handlings of `message_id` begun ([`handling_started`](Self::handling_started)):
    /// this one ended, settled either way.
    async fn handling_ended(&self, consumer: &str, message_id: Uuid) -> Result<()>;

    /// The dedupe retention's cleanup, one bounded step: moves the dedupe
    /// horizon up to now minus `retention`, then deletes up to `limit`
    /// processed markers, effects records and handlings begun older than
    /// it, each; returns how many went. Call it again until it returns
    /// less than `limit`.
    async fn forget_processed(&self, retention: Duration, limit: usize) -> Result<u64>;

    /// The time before which processed markers and effects records may have
    /// been deleted ([`forget_processed`](Self::forget_processed)): a replay
    /// or a redrive of a message older than it could handle it twice.
    /// `None` if nothing was ever deleted.
    async fn dedupe_horizon(&self) -> Result<Option<chrono::DateTime<chrono::Utc>>>;

    /// The dedupe horizon, when what reaches back to `oldest` (a replay's
    /// start, or [`DeadLetter::reaches_back_to`]) goes past it: consumers
    /// that handled such a message before the horizon would handle it
    /// again. `None` when `oldest` is `None` or not past it.
    async fn past_dedupe_horizon(&self, oldest: Option<DateTime<Utc>>) -> Result<Option<DateTime<Utc>>> {
        let Some(oldest) = oldest else {
            return Ok(None);
        };
        Ok(self.dedupe_horizon().await?.filter(|horizon| oldest < *horizon))
    }
}

/// The lease a handler transaction must still hold to commit ([`ConsumerStore::begin_handling`]).
#[derive(Debug, Clone, Copy)]
pub struct Fence<'a> {
    /// The lease's scope (the consumer group and topic).
    pub scope: &'a str,
    /// The member that must hold it.
    pub member: &'a str,
    /// The partition and fencing token it must still have.
    pub lease: Lease,
}

/// How the handling of a message opened ([`ConsumerStore::begin_handling`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handling {
    /// Marked: the handler runs, and the marker commits with its writes.
    Fresh,
    /// Already processed: nothing to do.
    Duplicate,
    /// The member no longer holds the lease: roll back, let its new holder have it.
    LeaseLost,
}

/// One failed attempt at handling a message.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct Failure {
    /// The attempt number, from 1.
    pub attempt: u32,
    /// When it failed.
    pub at: DateTime<Utc>,
    /// `transient` or `permanent`.
    pub class: String,
    /// The error, with its sources.
    pub error: String,
}

/// A message a consumer gave up on, with everything needed to understand and redrive it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    /// The dead letter's own id.
    pub id: Uuid,
    /// The consumer that failed.
    pub consumer: String,
    /// The topic it was read from.
    pub topic: String,
    /// The message id, when the message could be decoded.
    pub message_id: Option<Uuid>,
    /// The message type, when known.
    pub message_type: Option<String>,
    /// The aggregate key, when known.
    pub aggregate_key: Option<String>,
    /// Transport headers.
    pub headers: Headers,
    /// The raw body as received.
    pub body: Vec<u8>,
    /// Attempts made.
    pub attempts: u32,
    /// Every failure, oldest first.
    pub errors: Vec<Failure>,
    /// When it was first dead-lettered.
    pub created_at: DateTime<Utc>,
    /// How many times it was redriven.
    pub redrives: u32,
    /// When it was last redriven; `None` while it waits for a decision.
    /// A redriven message that fails again is pending again.
    pub redriven_at: Option<DateTime<Utc>>,
    /// When it was skipped ([`FailureStore::skip`]): given up for good, its
    /// key's parked messages let go without it.
    pub skipped_at: Option<DateTime<Utc>>,
}

/// What a redrive did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Redrive {
    /// The message is back in the outbox, to be published to its topic
    /// again. Consumers that already processed it skip it (their markers are
    /// durable); the one that failed handles it.
    Enqueued {
        /// The message's id (unchanged).
        message_id: Uuid,
        /// Which redrive of this dead letter this is, from 1.
        redrive: u32,
    },
    /// A record the relay set aside ([`RELAY_LETTERS`](crate::RELAY_LETTERS)):
    /// its hold is gone, and the relay tries it again where it stands in the
    /// outbox, before the later records of its key. Fix its body in the
    /// outbox, or raise the transport's limit, first: failing again sets it
    /// aside again.
    Released {
        /// The record's message id.
        message_id: Uuid,
        /// Which redrive of this dead letter this is, from 1.
        redrive: u32,
    },
    /// The message is back in the outbox with the data of an edit
    /// ([`FailureStore::redrive_edited`]), like [`Redrive::Enqueued`], and
    /// marked with [`EDIT_HEADER`].
    Edited {
        /// The message's id (unchanged).
        message_id: Uuid,
        /// Which redrive of this dead letter this is, from 1.
        redrive: u32,
        /// The edit's id ([`DeadLetterEdit::id`]).
        edit: Uuid,
    },
    /// No dead letter has that id.
    NotFound,
    /// The stored body is not a valid envelope (it was dead-lettered for
    /// that): fix it at the source and publish it anew.
    Undecodable,
    /// Already redriven (and not failed since) or skipped: nothing done.
    /// Two operators who act on one letter at once redrive it once.
    Settled,
    /// An edit of a record the relay set aside
    /// ([`RELAY_LETTERS`](crate::RELAY_LETTERS)): nothing done. Such a
    /// record never reached a consumer; it is fixed in the outbox or at its
    /// source, then redriven as it stands.
    NotEditable,
}

/// The header a redriven envelope carries: which redrive it is. Transports
/// with publish-side deduplication use it so that a redrive is not dropped
/// as a duplicate of the original publish.
pub const REDRIVE_HEADER: &str = "tidingsredrive";

/// The header an edited redrive carries ([`FailureStore::redrive_edited`]):
/// the id of the edit, whose record keeps the original body beside the edited one.
pub const EDIT_HEADER: &str = "tidingsedit";

/// New data for a dead letter's message, and who wrote it
/// ([`FailureStore::redrive_edited`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Edit {
    /// The payload that replaces the message's (its `data`).
    pub data: serde_json::Value,
    /// Who edited it: a token's name, a user.
    pub by: String,
}

/// One edit of a dead letter's message, as it was redriven.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterEdit {
    /// The edit's own id (the value of [`EDIT_HEADER`] on the message).
    pub id: Uuid,
    /// The dead letter edited.
    pub dead_letter_id: Uuid,
    /// Who edited it.
    pub by: String,
    /// When.
    pub at: DateTime<Utc>,
    /// The dead letter's body as it was stored.
    pub original: Vec<u8>,
    /// The envelope enqueued in its place, as the outbox holds it.
    pub edited: Vec<u8>,
}

impl DeadLetter {
    /// Whether it waits for a decision: neither redriven since it last
    /// failed, nor skipped. A letter that fails again after a redrive or a
    /// skip is pending again.
    pub fn is_pending(&self) -> bool {
        self.redriven_at.is_none() && self.skipped_at.is_none()
    }

    /// `pending`, `redriven` or `skipped`: [`dead_letter_state`].
    pub fn state(&self) -> &'static str {
        dead_letter_state(self.redriven_at, self.skipped_at)
    }

    /// How far back a redrive of it reaches, for the dedupe horizon: a
    /// redrive delivers its message to every group of the topic again, and
    /// the other groups may have handled it long before it failed here. So
    /// the time the message occurred, as its envelope says, when earlier
    /// than the failure; else (or when the body does not decode) the
    /// failure. `None` for a record the relay set aside, which never
    /// reached a consumer.
    pub fn reaches_back_to(&self) -> Option<DateTime<Utc>> {
        if self.consumer == crate::RELAY_LETTERS {
            return None;
        }
        let occurred = crate::cloudevents::from_json(&self.body)
            .ok()
            .map(|e| e.occurred_at);
        Some(occurred.map_or(self.created_at, |o| o.min(self.created_at)))
    }
}

/// A dead letter's state by when it was last redriven and skipped: the
/// later of the two decisions (a letter failing again clears both, so both
/// are set only on letters from before a skip refused a redriven one),
/// else `pending`.
pub fn dead_letter_state<T: Ord>(redriven_at: Option<T>, skipped_at: Option<T>) -> &'static str {
    match (redriven_at, skipped_at) {
        (Some(r), Some(s)) if r > s => "redriven",
        (_, Some(_)) => "skipped",
        (Some(_), None) => "redriven",
        (None, None) => "pending",
    }
}

/// What a skip did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Skip {
    /// The dead letter is marked skipped. `released_key`: its key was held
    /// for its consumer, and the consumer now lets the parked messages go on.
    Skipped {
        /// Whether a held key was released.
        released_key: bool,
    },
    /// No dead letter has that id.
    NotFound,
    /// Already redriven (and not failed since) or skipped: nothing done.
    /// Skipping a redriven letter would let the messages parked behind its
    /// key go before the redriven message comes back.
    Settled,
}

/// Which dead letters to list.
#[derive(Debug, Clone, Default)]
pub struct DeadLetterFilter {
    /// Only this consumer's.
    pub consumer: Option<String>,
    /// Only this message type.
    pub message_type: Option<String>,
    /// At most this many (newest first); unlimited when `None`.
    pub limit: Option<u32>,
    /// Also those already redriven or skipped (by default only pending ones).
    pub include_redriven: bool,
}

impl DeadLetterFilter {
    /// Only `consumer`'s dead letters.
    pub fn consumer(mut self, consumer: impl Into<String>) -> Self {
        self.consumer = Some(consumer.into());
        self
    }

    /// Only messages of `message_type`.
    pub fn message_type(mut self, message_type: impl Into<String>) -> Self {
        self.message_type = Some(message_type.into());
        self
    }

    /// At most `n` results.
    pub fn limit(mut self, n: u32) -> Self {
        self.limit = Some(n);
        self
    }

    /// Include dead letters already redriven or skipped.
    pub fn include_redriven(mut self) -> Self {
        self.include_redriven = true;
        self
    }
}

/// Where consumers put what they could not handle.
#[async_trait]
pub trait FailureStore: Send + Sync + 'static {
    /// Stores a dead letter. Storing the same (consumer, message id) again
    /// updates it instead of adding a second one: attempts and history
    /// grow, and the headers and body become those that failed last (an
    /// edited redrive that fails again keeps its edit; the edits keep the
    /// original).
    async fn dead_letter(&self, letter: &DeadLetter) -> Result<()>;

    /// Lists dead letters, newest first.
    async fn dead_letters(&self, filter: &DeadLetterFilter) -> Result<Vec<DeadLetter>>;

    /// The dead letter `id`, whatever its state.
    async fn letter(&self, id: Uuid) -> Result<Option<DeadLetter>>;

    /// Puts a dead letter's message back on its way, in one transaction:
    /// it is enqueued in the outbox (same id, with [`REDRIVE_HEADER`]) and the
    /// dead letter is marked redriven. Transport-independent: the relay
    /// publishes it like any other message. Its state is read under the
    /// letter's lock: one already settled (redriven and not failed since,
    /// or skipped) is left as it is ([`Redrive::Settled`]).
    async fn redrive(&self, id: Uuid) -> Result<Redrive>;

    /// Redrives a dead letter's message with the data of `edit` in place of
    /// its own, in one transaction under the letter's lock: the envelope
    /// (same id, with [`REDRIVE_HEADER`], and [`EDIT_HEADER`] naming the
    /// edit) is enqueued, the edit is recorded with the letter's original
    /// body and the edited envelope ([`FailureStore::edits`]), and the
    /// letter is marked redriven. Refused, changing nothing, for a letter
    /// settled ([`Redrive::Settled`]), unknown, whose body does not decode,
    /// or that the relay set aside ([`Redrive::NotEditable`]). Checking the
    /// data against its schema is the caller's part.
    async fn redrive_edited(&self, id: Uuid, edit: &Edit) -> Result<Redrive>;

    /// The edits of the dead letter `dead_letter_id`, oldest first.
    async fn edits(&self, dead_letter_id: Uuid) -> Result<Vec<DeadLetterEdit>>;

    /// Gives a dead letter up for good, in one transaction: it is marked
    /// skipped and, if it holds its key for its consumer, the hold is
    /// released, so that the consumer handles the messages parked behind it
    /// without it. A later failure of the same message makes it pending again.
    async fn skip(&self, id: Uuid) -> Result<Skip>;

    /// Deletes the dead letters of `ids` that are settled (redriven or
    /// skipped), with their edits, and returns how many went. Pending ones
    /// stay: skip them first, which releases the key they may hold.
    async fn purge(&self, ids: &[Uuid]) -> Result<u64>;
}

/// A key a consumer holds back because one of its messages was dead-lettered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldKey {
    /// The consumer.
    pub consumer: String,
    /// The topic the key's messages are read from.
    pub topic: String,
    /// The key.
    pub aggregate_key: String,
    /// The dead-lettered message holding it: the only message of the key
    /// the consumer handles while the key is held (a redrive delivers it).
    pub message_id: Uuid,
    /// Set by a skip: the consumer handles the parked messages, then lets the key go.
    pub released: bool,
}

/// A message a consumer set aside, unhandled, behind its key's dead letter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParkedMessage {
    /// The topic it was read from.
    pub topic: String,
    /// Its key.
    pub aggregate_key: String,
    /// Its id.
    pub message_id: Uuid,
    /// Transport headers as received.
    pub headers: Headers,
    /// The body as received.
    pub body: Vec<u8>,
}

impl ParkedMessage {
    /// The message as its transport delivered it.
    pub fn raw(&self) -> crate::RawMessage {
        crate::RawMessage {
            topic: self.topic.clone(),
            key: Some(self.aggregate_key.clone()),
            headers: self.headers.clone(),
            body: self.body.clone(),
            refused: None,
        }
    }
}

/// Where a consumer holds keys after a dead letter and parks their later
/// messages, so that a key's messages are never handled around a failed one.
///
/// The consumer runtime drives it: a dead letter holds its key
/// ([`ParkingStore::dead_letter_holding_key`]); later messages of the key
/// are parked; when the dead-lettered message is redriven and handled, or
/// skipped ([`FailureStore::skip`]), the parked messages are handled in the
/// order they came, then the key is released.
#[async_trait]
pub trait ParkingStore: FailureStore {
    /// Stores the dead letter and holds its key (consumer, topic, key), in
    /// one transaction. A key already held moves its hold to this message.
    ///
    /// With a `fence`, only while the member still holds the partition's
    /// lease: otherwise nothing is written and it returns `false`, so that
    /// a member that stalled past its lease never holds a key its successor,
    /// which loaded the holds when it took the partition, knows nothing of.
    async fn dead_letter_holding_key(&self, letter: &DeadLetter, fence: Option<Fence<'_>>) -> Result<bool>;

    /// The keys `consumer` holds.
    async fn held_keys(&self, consumer: &str) -> Result<Vec<HeldKey>>;

    /// Parks a message behind its key (once per message id).
    async fn park(&self, consumer: &str, message: &ParkedMessage) -> Result<()>;

    /// The oldest message parked for the key.
    async fn next_parked(&self, consumer: &str, topic: &str, key: &str) -> Result<Option<ParkedMessage>>;

    /// Removes a parked message, once it was handled or dead-lettered.
    async fn unpark(&self, consumer: &str, message_id: Uuid) -> Result<()>;

    /// Releases the key if nothing is parked behind it; `false` if something is (or it was not held).
    async fn release_key(&self, consumer: &str, topic: &str, key: &str) -> Result<bool>;
}

/// The envelope to redrive a dead letter with: decoded from the body and
/// headers as received (structured or binary mode), marked with its
/// redrive number. `None` if it does not decode.
pub fn redrive_envelope(letter: &DeadLetter) -> Option<crate::Envelope> {
    let raw = crate::RawMessage {
        topic: letter.topic.clone(),
        key: letter.aggregate_key.clone(),
        headers: letter.headers.clone(),
        body: letter.body.clone(),
        refused: None,
    };
    let envelope = raw.decode().ok()?;
    Some(envelope.header(REDRIVE_HEADER, (letter.redrives + 1).to_string()))
}

/// Lag of one consumer group on one topic.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct ConsumerLag {
    /// The consumer group.
    pub consumer: String,
    /// The topic.
    pub topic: String,
    /// Messages on the topic the group has not yet committed past.
    pub pending: u64,
}

/// The figures that say whether the system keeps up.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct LagReport {
    /// Outbox records not yet sent.
    pub outbox_pending: u64,
    /// Age of the oldest unsent outbox record.
    pub oldest_unsent_age: Option<Duration>,
    /// Per consumer group and topic (database-log transport).
    pub consumers: Vec<ConsumerLag>,
    /// Dead letters waiting for a decision (neither redriven nor skipped), per consumer.
    pub dead_letters: Vec<DeadLetterLag>,
    /// Keys held after a dead letter, and the messages parked behind them,
    /// per consumer and topic (every transport).
    pub parked: Vec<ParkedLag>,
}

impl LagReport {
    /// Dead letters waiting for a decision, over every consumer.
    pub fn dead_letters_pending(&self) -> u64 {
        self.dead_letters.iter().map(|d| d.pending).sum()
    }
}

/// One consumer's dead letters waiting for a decision.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct DeadLetterLag {
    /// The consumer group.
    pub consumer: String,
    /// Dead letters neither redriven nor skipped.
    pub pending: u64,
    /// Age of the oldest of them.
    pub oldest_age: Option<Duration>,
}

/// Keys one consumer holds on one topic, and what waits behind them.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct ParkedLag {
    /// The consumer group.
    pub consumer: String,
    /// The topic.
    pub topic: String,
    /// Keys held.
    pub held_keys: u64,
    /// Messages parked behind them.
    pub messages: u64,
}

impl From<(String, String, i64, i64)> for ParkedLag {
    /// From a row of held keys and parked messages: (consumer, topic, keys, messages).
    fn from((consumer, topic, keys, messages): (String, String, i64, i64)) -> Self {
        ParkedLag {
            consumer,
            topic,
            held_keys: keys.max(0) as u64,
            messages: messages.max(0) as u64,
        }
    }
}

/// Reports lag figures.
#[async_trait]
pub trait LagSource: Send + Sync + 'static {
    /// Measures the figures now.
    async fn lag(&self) -> Result<LagReport>;
}
