//! What one database supplies: its SQL, its list codecs, its claim, its
//! wake-ups, its error codes, its migrations. Everything else is written once.
//!
//! Conventions every dialect's statements keep, so that the flow binds and
//! reads the same Rust values on every database:
//!
//! - placeholders are `$1`, `$2`... in the order the field's doc gives; a
//!   statement may name one several times or leave it unused, on MySQL too
//!   ([`placeholders`](crate::placeholders));
//! - points in time cross the boundary as `i64` microseconds since the
//!   Unix epoch (bound and selected), durations and ages as `i64`
//!   milliseconds; each dialect converts to its own columns;
//! - JSON columns are bound and selected as text;
//! - a list parameter is the dialect's own list value
//!   ([`Dialect::int_list`], [`Dialect::text_list`], [`Dialect::uuid_list`]).

use std::time::Duration;

use async_trait::async_trait;
use sqlx::error::DatabaseError;
use sqlx::{Database, Pool};
use tidings_core::{ClaimedBatch, OutboxPartitions, OutgoingMessage, Result};
use tokio::sync::watch;
use uuid::Uuid;

use crate::db::{Bind, SqlDb};
use crate::migrate::MigrationPlan;
use crate::placeholders::Placeholders;
use crate::store::{SqlStore, StoreOptions};

/// One database's part of the store.
#[async_trait]
pub trait Dialect: Sized + Send + Sync + 'static {
    /// The sqlx database.
    type Db: SqlDb
        + for<'a> Bind<'a, Self::IntList>
        + for<'a> Bind<'a, Self::TextList>
        + for<'a> Bind<'a, Self::UuidList>;
    /// A list of integers as a parameter.
    type IntList: Send + Clone;
    /// A list of strings as a parameter.
    type TextList: Send + Clone;
    /// A list of ids as a parameter.
    type UuidList: Send + Clone;
    /// A batch the relay claimed ([`Dialect::claim`]).
    type Batch: ClaimedBatch + std::fmt::Debug;
    /// How producers wake relays and log readers ([`Wakeups`]).
    type Wakeups: Wakeups;

    /// The database's name in messages (`PostgreSQL`).
    const NAME: &'static str;
    /// How its URLs begin (`postgres://`): where a URL is opened by its
    /// scheme, these choose this dialect.
    const SCHEMES: &'static [&'static str];
    /// The database-log transport's name (`pg-log`).
    const LOG_TRANSPORT: &'static str;
    /// How its statements mark parameters: numbered (the default) or by
    /// position, where the store rewrites the `$n` of every statement.
    const PLACEHOLDERS: Placeholders = Placeholders::Numbered;
    /// The statements.
    const SQL: Statements;
    /// The migrations.
    const MIGRATIONS: MigrationPlan;

    /// `values` as a list parameter.
    fn int_list(values: &[i64]) -> Self::IntList;
    /// `values` as a list parameter.
    fn text_list(values: &[String]) -> Self::TextList;
    /// `values` as a list parameter.
    fn uuid_list(values: &[Uuid]) -> Self::UuidList;
    /// Rows a statement changed.
    fn rows_affected(result: &<Self::Db as Database>::QueryResult) -> u64;
    /// Whether `error`, an error the database itself returned, means that
    /// trying again may help: a lost race, a busy lock, a server going
    /// down or refusing connections for now ([`classify`](crate::errors::classify)
    /// adds the faults every driver shares).
    fn transient(error: &dyn DatabaseError) -> bool;

    /// Opens a pool on `url` (already known to be this database's).
    async fn open(url: &str, options: &StoreOptions) -> Result<Pool<Self::Db>>;

    /// The wake-ups of a store on `pool`.
    fn wakeups(pool: &Pool<Self::Db>, options: &StoreOptions) -> Self::Wakeups;

    /// Claims up to `limit` of the oldest unsent records of the partitions
    /// `held` leases ([`RelayStore::claim`](tidings_core::RelayStore::claim)):
    /// how the database keeps two relays off the same rows is its own.
    async fn claim(store: &SqlStore<Self>, limit: usize, held: &OutboxPartitions) -> Result<Self::Batch>;

    /// Appends `batch` to the database log in one transaction.
    async fn append(store: &SqlStore<Self>, batch: &[OutgoingMessage]) -> Result<()>;
}

/// Wake-ups from producers to relays and log readers. Relays and readers
/// poll anyway: a lost wake-up costs one polling interval, never a message.
#[async_trait]
pub trait Wakeups: Send + Sync + 'static {
    /// Outbox records were committed.
    fn outbox_committed(&self);
    /// Log entries were committed.
    fn log_appended(&self);
    /// Waits for [`outbox_committed`](Self::outbox_committed) or `timeout`.
    async fn wait_outbox(&self, timeout: Duration);
    /// A counter that moves on every append the store hears of.
    fn log_signal(&self) -> watch::Receiver<u64>;
}

/// In-process wake-ups: a relay waiting in this process is woken at once.
/// Dialects that can reach other processes build on it.
#[derive(Debug, Clone)]
pub struct LocalWakeups {
    outbox: std::sync::Arc<tokio::sync::Notify>,
    log: std::sync::Arc<watch::Sender<u64>>,
}

impl Default for LocalWakeups {
    fn default() -> Self {
        LocalWakeups {
            outbox: Default::default(),
            log: std::sync::Arc::new(watch::Sender::new(0)),
        }
    }
}

#[async_trait]
impl Wakeups for LocalWakeups {
    fn outbox_committed(&self) {
        // One permit is kept if nobody waits: the next wait returns at once.
        self.outbox.notify_one();
    }

    fn log_appended(&self) {
        self.log.send_modify(|n| *n = n.wrapping_add(1));
    }

    async fn wait_outbox(&self, timeout: Duration) {
        let _ = tokio::time::timeout(timeout, self.outbox.notified()).await;
    }

    fn log_signal(&self) -> watch::Receiver<u64> {
        self.log.subscribe()
    }
}

/// A dialect's statements, one field per statement, each documented with
/// its parameters and columns. Statements that read the same on several
/// databases are declared once in [`shared`](crate::shared).
#[derive(Debug, Clone, Copy)]
pub struct Statements {
    // The outbox.
    /// ($1 id, $2 topic, $3 aggregate key, $4 key hash, $5 type, $6 body).
    pub enqueue: &'static str,
    /// ($1 retention ms): deletes sent records older.
    pub outbox_cleanup: &'static str,

    // Consumer records.
    /// ($1 consumer, $2 message id): inserts the marker unless it is
    /// recorded already, changing one row if it was not.
    pub mark_processed: &'static str,
    /// ($1 consumer, $2 id list) -> (message id) of those not recorded yet,
    /// where one statement can do it; else one by one.
    pub mark_processed_all: Option<&'static str>,
    /// ($1 consumer, $2 message id, $3 effect) -> a row if recorded.
    pub effect_recorded: &'static str,
    /// ($1 consumer, $2 message id, $3 effect, $4 idempotency key).
    pub record_effect: &'static str,
    /// ($1 scope, $2 partition i32, $3 member, $4 fence) -> a row if held,
    /// locked until the transaction ends where the database can.
    pub holds_lease: &'static str,
    /// ($1 consumer, $2 message id, $3 scope, $4 partition, $5 member,
    /// $6 fence) -> (lease held, marker new), where one statement can do
    /// the fence check and the marker; else `holds_lease` after `mark_processed`.
    pub begin_handling: Option<&'static str>,
    /// ($1 consumer, $2 message id): counts one more handling begun, in its
    /// own transaction.
    pub handling_started: &'static str,
    /// ($1 consumer, $2 message id) -> (handlings begun, i32), a row if any.
    pub handlings_begun: &'static str,
    /// ($1 consumer, $2 message id): forgets the handlings begun.
    pub handling_ended: &'static str,
    /// ($1 retention ms, $2 limit): deletes up to `limit` processed
    /// markers older than the retention.
    pub forget_processed: &'static str,
    /// ($1 retention ms, $2 limit): the same for effects records.
    pub forget_effects: &'static str,
    /// ($1 retention ms, $2 limit): the same for handlings begun.
    pub forget_handlings: &'static str,
    /// ($1 name, $2 retention ms): moves the horizon `name` up to now
    /// minus the retention, never back.
    pub set_horizon: &'static str,
    /// ($1 name) -> (horizon µs), a row if set.
    pub horizon: &'static str,

    // The webhook inbox.
    /// ($1 provider, $2 the provider's event id, $3 message id): records a
    /// delivery unless it is recorded already, changing one row if it was not.
    pub record_delivery: &'static str,
    /// ($1 retention ms, $2 limit): deletes up to `limit` deliveries
    /// recorded longer ago than the retention.
    pub forget_deliveries: &'static str,

    // The audit trail.
    /// ($1 at µs, $2 actor, $3 action, $4 target, $5 detail JSON): writes one entry.
    pub audit_insert: &'static str,
    /// ($1 target or null, $2 limit) -> (at µs, actor, action, target,
    /// detail JSON) of the entries, only those of the target when given,
    /// newest first (the last written first among entries of one time).
    pub audit_trail: &'static str,

    // Dead letters.
    /// ($1 id, $2 consumer, $3 topic, $4 message id, $5 type, $6 key,
    /// $7 headers JSON, $8 body, $9 attempts i32, $10 errors JSON, $11 created µs):
    /// inserts, or for the same (consumer, message id) adds attempts,
    /// appends errors and makes it pending again.
    pub dead_letter_upsert: &'static str,
    /// ($1 consumer or null, $2 type or null, $3 limit, $4 include
    /// settled) -> [`DEAD_LETTER_COLUMNS`](crate::DEAD_LETTER_COLUMNS), newest first.
    pub dead_letters: &'static str,
    /// ($1 id): run before `dead_letter_for_redrive` where reading cannot lock.
    pub lock_dead_letter: Option<&'static str>,
    /// ($1 id) -> the dead letter's columns, locked for a redrive or a skip.
    pub dead_letter_for_redrive: &'static str,
    /// ($1 id) -> [`DEAD_LETTER_COLUMNS`](crate::DEAD_LETTER_COLUMNS) of
    /// the dead letter, whatever its state.
    pub dead_letter_by_id: &'static str,
    /// ($1 id).
    pub mark_redriven: &'static str,
    /// ($1 id).
    pub mark_skipped: &'static str,
    /// ($1 id list): deletes the settled ones.
    pub purge: &'static str,
    /// ($1 id list): deletes the edits of the settled ones, before `purge`.
    pub purge_edits: &'static str,
    /// ($1 id, $2 dead letter id, $3 edited by, $4 edited µs, $5 original
    /// body, $6 edited body): records an edit of a dead letter.
    pub edit_insert: &'static str,
    /// ($1 dead letter id) -> (id, dead letter id, edited by, edited µs,
    /// original body, edited body) of its edits, oldest first.
    pub edits: &'static str,

    // Held keys and parked messages.
    /// ($1 consumer, $2 topic, $3 key, $4 message id, $5 released).
    pub hold: &'static str,
    /// ($1 consumer) -> (topic, key, message id, released).
    pub held_keys: &'static str,
    /// ($1 consumer, $2 topic, $3 key, $4 message id, $5 headers JSON, $6 body).
    pub park: &'static str,
    /// ($1 consumer, $2 topic, $3 key) -> (message id, headers JSON, body).
    pub next_parked: &'static str,
    /// ($1 consumer, $2 message id).
    pub unpark: &'static str,
    /// ($1 consumer, $2 topic, $3 key): deletes the hold if nothing is parked.
    pub release_key: &'static str,
    /// ($1 consumer, $2 topic, $3 key, $4 message id, $5 released).
    pub release_skipped: &'static str,

    // The relay's holds behind records set aside (`tidings_core::set_aside`).
    /// ($1 seq, $2 message id, $3 topic, $4 key): holds the key behind the
    /// record set aside; nothing if that record holds it already.
    pub relay_hold: &'static str,
    /// ($1 seq list): deletes the records sent.
    pub relay_delete_sent: &'static str,
    /// ($1 seq list): stamps the records sent (with a retention).
    pub relay_stamp_sent: &'static str,
    /// ($1 seq, $2 message id): deletes the unsent record a relay dead letter stands for (a skip).
    pub relay_drop_held: &'static str,
    /// ($1 message id): lets the message's hold go.
    pub relay_unhold: &'static str,
    /// () -> (seq, message id, topic, key, records waiting behind it) of every hold, oldest first.
    pub relay_holds: &'static str,

    // Membership and leases.
    /// ($1 scope, $2 member, $3 ttl ms).
    pub heartbeat: &'static str,
    /// ($1 scope).
    pub forget_expired_members: &'static str,
    /// ($1 scope) -> (member), sorted.
    pub members: &'static str,
    /// ($1 scope, $2 member, $3 partition list, $4 ttl ms) -> (partition
    /// i32, fence) of those taken or renewed; or no rows, where the database
    /// cannot return them and `held_leases` reads them after.
    pub acquire_leases: &'static str,
    /// ($1 scope, $2 member, $3 partition list) -> (partition i32, fence) of
    /// those it holds live: read after `acquire_leases`, in its transaction,
    /// where that cannot return them.
    pub held_leases: Option<&'static str>,
    /// ($1 scope, $2 member, $3 partition list).
    pub release_leases: &'static str,
    /// ($1 scope, $2 member): lapses all its leases.
    pub release_all_leases: &'static str,
    /// ($1 scope, $2 member).
    pub leave: &'static str,

    // Lag and inspection.
    /// () -> (unsent count, oldest unsent age ms or null).
    pub outbox_lag: &'static str,
    /// () -> (group, topic, pending) over the log's offsets.
    pub log_lag: &'static str,
    /// () -> (consumer, pending dead letters, oldest age ms or null).
    pub dead_letter_lag: &'static str,
    /// () -> (consumer, topic, held keys, parked messages).
    pub parked_lag: &'static str,
    /// () -> (scope, member, ms left) of live members.
    pub live_members: &'static str,
    /// () -> (scope, owner, partition i32, fence) of live leases.
    pub live_leases: &'static str,
    /// ($1 partition count) -> (partition, unsent, oldest age ms or null).
    pub outbox_backlog: &'static str,
    /// () -> the highest sequence number the outbox ever gave.
    pub outbox_high_water: &'static str,
    /// ($1 consumer) -> whether it has processed markers.
    pub has_processed: &'static str,
    /// ($1 milliseconds) -> (consumer, count) of the processed markers
    /// written in the last $1 ms, by consumer.
    pub handled_recently: &'static str,
    /// () -> whether `tidings_migrations` exists.
    pub migrations_table_exists: &'static str,
    /// () -> the highest applied migration, or null.
    pub applied_migration: &'static str,
    /// () -> (slot, active, retained bytes or null), where the database has them.
    pub replication_slots: Option<&'static str>,

    // Message traces.
    /// ($1 key, $2 limit) -> (message id, first seen µs, outbox seq or
    /// null) of the messages of the key the outbox, dead letters and parked
    /// messages know of, oldest first (first seen, then seq, then id).
    pub trace_key_messages: &'static str,
    /// ($1 id list) -> (message id, seq, key hash or null, topic, key,
    /// type, created µs, published µs or null, held by the relay) of the
    /// messages' outbox records, by seq.
    pub trace_outbox: &'static str,
    /// ($1 id list) -> (message id, consumer, processed µs) of their
    /// processed markers, oldest first.
    pub trace_processed: &'static str,
    /// ($1 id list) -> (message id, consumer, effect, idempotency key,
    /// recorded µs) of their effects, oldest first.
    pub trace_effects: &'static str,
    /// ($1 id list) -> (message id, dead letter id, consumer, topic, type,
    /// key, attempts i32, errors JSON, created µs, redriven µs or null,
    /// skipped µs or null) of their dead letters, oldest first.
    pub trace_dead_letters: &'static str,
    /// ($1 id list) -> (message id, consumer, topic, key, parked µs, the
    /// message holding the key or null, its dead letter's id or null,
    /// released) of their parked copies, by seq.
    pub trace_parked: &'static str,

    // Replay.
    /// ($1 topic list, $2 since µs, $3 until µs, $4 after seq, $5 limit) ->
    /// (seq, topic, key, body) of the log.
    pub retained_log: &'static str,
    /// The same over sent outbox records.
    pub retained_outbox: &'static str,
    /// ($1 topic list, $2 since µs, $3 until µs) -> count, of the log.
    pub count_retained_log: &'static str,
    /// The same over sent outbox records.
    pub count_retained_outbox: &'static str,
    /// ($1 consumer, $2 id list) -> count of those processed.
    pub count_processed: &'static str,
    /// ($1 id, $2 consumer, $3 topics JSON, $4 source, $5 since µs,
    /// $6 until µs, $7 rate f64, $8 total).
    pub request_replay: &'static str,
    /// ($1 id) -> the replay's columns.
    pub replay: &'static str,
    /// ($1 consumer, $2 member, $3 ttl ms) -> the claimed replay's columns;
    /// or no rows, where the database cannot return them and
    /// `claimed_replay` reads them after.
    pub claim_replay: &'static str,
    /// ($1 consumer, $2 member) -> the columns of the replay the member
    /// runs: read after `claim_replay`, in its transaction, where that
    /// cannot return them.
    pub claimed_replay: Option<&'static str>,
    /// ($1 id, $2 member, $3 cursor, $4 delivered, $5 suppressed, $6
    /// handled, $7 failed, $8 ttl ms, $9 done).
    pub replay_progress: &'static str,
    /// ($1 id).
    pub cancel_replay: &'static str,

    // The database log.
    /// ($1 topic, $2 after txid, $3 after seq, $4 limit, $5 partition
    /// count, $6 partition index) -> (txid, seq, key, body), only of
    /// entries no earlier transaction can still overtake.
    pub log_read: &'static str,
    /// ($1 group, $2 topic, $3 partition count i32, $4 index i32) -> (txid, seq).
    pub log_offset: &'static str,
    /// ($1 group, $2 topic, $3 txid, $4 seq, $5 count i32, $6 index i32):
    /// never moves an offset backwards.
    pub log_commit: &'static str,
    /// ($1 older than ms, $2 limit): deletes entries every reader passed.
    pub log_trim: &'static str,
}
