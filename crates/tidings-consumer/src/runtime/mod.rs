//! The consumer runtime: reads a subscription, spreads messages over key
//! lanes, and runs each through the stack documented in the crate root.
//!
//! One concern per file. Around the stack: `consumer` (the public
//! [`Consumer`]: building, running, [`Consumer::deliver`]), `config`
//! ([`ConsumerConfig`], [`OnDeadLetter`]), `stats` ([`ConsumerStats`]),
//! `group` (membership of the group and hand-over: a member reads its
//! share in sessions, one from each hand-over to the next) and `replay`
//! (replays, fed in below the key lanes).
//!
//! The stack's layers, outermost first, numbered as in the crate root:
//!
//! - `lanes`: the key lanes (1), over the queue of `keyed`.
//! - `retry`: decode (2), retry (3) and dead letter (4).
//! - `holds`: the key a dead letter holds (4), its parked messages and
//!   their release. A decoded message meets its key's hold before it goes
//!   through decode, retry and dead letter.
//! - `attempt`: the transaction, processed marker and fence (5), the
//!   timeout (6) and the handler (7).
//! - `batch`: several messages in one transaction (5,
//!   [`ConsumerConfig::batch`]). A lane batches only decoded messages of
//!   keys not held; a batch that fails goes through holds and the stack
//!   one message at a time.

use std::collections::HashMap;
use std::sync::Arc;

use tidings_core::plain::PlainJson;
use tidings_core::{ConsumerStore, DecodeError, Envelope, RawMessage};
use tokio_util::sync::CancellationToken;

use crate::handler::Handler;

mod attempt;
mod batch;
mod config;
mod consumer;
mod group;
mod holds;
mod keyed;
mod lanes;
mod replay;
mod retry;
mod stats;
mod work;

pub use config::{ConsumerConfig, OnDeadLetter};
pub use consumer::Consumer;
pub use stats::ConsumerStats;
pub use work::Settled;

use holds::Holds;

impl<S: ConsumerStore> Worker<S> {
    /// The envelope of `raw`: as its topic's records are written (plain
    /// JSON or CloudEvents).
    fn decode(&self, raw: &RawMessage) -> Result<Envelope, DecodeError> {
        match self.plain.get(&raw.topic) {
            Some(plain) => plain.decode(raw),
            None => raw.decode(),
        }
    }
}

/// Handles deliveries for one session: the time between two hand-overs.
struct Worker<S: ConsumerStore> {
    name: String,
    member: String,
    source: String,
    store: S,
    handler: Arc<dyn Handler<S::Database>>,
    /// The topics read as plain JSON ([`Consumer::json_topic`]).
    plain: Arc<HashMap<String, PlainJson>>,
    config: ConsumerConfig,
    stats: Arc<ConsumerStats>,
    /// The keys held after a dead letter ([`OnDeadLetter::HoldKey`]).
    holds: Holds,
    /// Topics whose keys are not held, [`OnDeadLetter::HoldKey`] or not:
    /// another partitioner placed their messages
    /// ([`Subscriber::places_keys`](tidings_core::Subscriber::places_keys)).
    unheld: Unheld,
    /// Cancelled when the session ends (shutdown, hand-over, lost lease).
    stop: CancellationToken,
}

impl<S: ConsumerStore> Worker<S> {
    /// Whether a dead letter on `topic` holds its key.
    fn holds_keys_of(&self, topic: &str) -> bool {
        self.config.on_dead_letter == OnDeadLetter::HoldKey && !self.unheld.contains(topic)
    }
}

/// Topics on which a dead letter holds no key: another partitioner placed
/// their messages ([`Subscriber::places_keys`](tidings_core::Subscriber::places_keys)).
pub(super) type Unheld = Arc<std::collections::HashSet<String>>;
