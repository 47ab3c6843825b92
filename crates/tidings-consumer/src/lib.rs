//! The consumer runtime: subscribe a [`Handler`] to topics and let the
//! runtime make it idempotent, patient with transient failures, quick to
//! give up on poison, bounded in concurrency and ordered per key.
//!
//! # Members of a group
//!
//! Run the same consumer in several processes and they share the work: each
//! topic's partitions (set on the transport) are leased to the members of
//! the group through the store, round robin, so that each partition, and
//! with it each key, is read by one member at a time. Members that join or
//! leave move the shares; a member that dies is replaced when its lease
//! lapses ([`ConsumerConfig::lease_ttl`]). Every handler transaction checks
//! the lease's fencing token, so a member that stalled past its lease
//! cannot commit work for a partition that moved on. With one partition,
//! extra members stand by.
//!
//! # The stack, outermost first
//!
//! Every delivery goes through the same layers, in this order:
//!
//! 1. **Key lanes (ordering and concurrency).** Messages queue by aggregate
//!    key; [`ConsumerConfig::lanes`] lanes each take a waiting key that no
//!    other lane holds, and hold it while they handle its messages. A key's
//!    messages therefore run one at a time, in order, while different keys
//!    run in parallel on whichever lane is free: a slow key holds back only
//!    itself, even within one partition. A full queue stops reading from
//!    the transport (backpressure).
//! 2. **Decode.** Bytes that are not a valid envelope are dead-lettered at
//!    once with the decoding error: they can never succeed. So is a message
//!    whose handling began more than [`ConsumerConfig::max_crashes`] times
//!    and never ended, counted in the store: its handling kills the process.
//! 3. **Retry.** A failed attempt is retried after a capped, jittered
//!    backoff (or the handler's `retry_after` delay), in the lane, so the
//!    key's later messages wait behind it and order holds.
//! 4. **Dead letter.** A permanent error, or the last of
//!    [`ConsumerConfig::max_attempts`] transient ones, stores the message with
//!    its full error history in the failure store and settles it: the rest
//!    of the stream flows. By default the message's key is then **held**
//!    ([`OnDeadLetter::HoldKey`]): the key's later messages are parked,
//!    unhandled, and acknowledged; when the dead letter is redriven and
//!    handled, or skipped, the parked messages are handled in the order they
//!    came and the key is released. Lag figures count held keys and parked
//!    messages. [`OnDeadLetter::Continue`] handles them at once instead.
//! 5. **Transaction and idempotency.** Each attempt opens a transaction and
//!    first inserts the processed marker (consumer, message id). If it is
//!    already there, the delivery is a duplicate: rolled back, acknowledged,
//!    nothing else runs. Otherwise it checks the partition's lease (the
//!    fence), then the handler runs on the same transaction and the marker
//!    commits with its writes, or not at all. With
//!    [`ConsumerConfig::batch`], a lane puts messages already queued (of the
//!    keys it takes) into one transaction (markers, fence, each handler, one commit); a
//!    failure rolls the batch back and its messages go through this stack
//!    one at a time.
//! 6. **Timeout.** The handler has [`ConsumerConfig::handler_timeout`]; past
//!    it the attempt is rolled back and counts as a transient failure. So
//!    does a handler that panics: the panic's message is the attempt's
//!    error, and its lane goes on with the next key.
//! 7. **Handler.** Your code, with a [`Context`]: the envelope, the
//!    transaction, [`Context::emit`] (outbox, same transaction) and
//!    [`Context::once`] (the effects ledger).
//!
//! Retry wraps the transaction rather than the reverse so that each attempt
//! starts clean; dead-lettering sits outside retry so that only exhausted
//! messages reach it. Failures of Tidings' own database calls (begin,
//! marker, commit) are retried without counting as attempts: an outage of
//! the database is not the message's fault and must not dead-letter it.
//! A commit the database refuses for a constraint the handler's writes
//! break (a deferred one, checked at commit) is the message's: it fails
//! the attempt permanently and the message is dead-lettered.
//!
//! ```no_run
//! use sqlx::Sqlite;
//! use tidings_consumer::{Consumer, Context, Handler, HandlerError};
//! use tidings_store_sqlite::SqliteStore;
//! use tokio_util::sync::CancellationToken;
//!
//! struct Loyalty;
//!
//! #[async_trait::async_trait]
//! impl Handler<Sqlite> for Loyalty {
//!     async fn handle(&self, ctx: &mut Context<'_, Sqlite>) -> Result<(), HandlerError> {
//!         let key = ctx.envelope().aggregate_key.clone();
//!         sqlx::query("UPDATE points SET n = n + 10 WHERE order_id = $1").bind(key).execute(ctx.tx()).await?;
//!         Ok(())
//!     }
//! }
//!
//! # async fn run() -> tidings_core::Result<()> {
//! let store = SqliteStore::connect("tidings.db").await?;
//! let subscriber = store.log_subscriber(Default::default());
//! Consumer::new("loyalty", store, Loyalty).topic("orders").run(&subscriber, CancellationToken::new()).await
//! # }
//! ```
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

mod effects;
mod handler;
mod membership;
mod runtime;
mod store;

pub use effects::IdempotencyKey;
pub use handler::{Context, Handler, HandlerError};
pub use runtime::{Consumer, ConsumerConfig, ConsumerStats, OnDeadLetter, Settled};
