//! Outbox records the relay sets aside: a body that is not an envelope, or
//! a record its transport refuses whatever its state (too large, refused
//! for its content).
//!
//! A record set aside becomes a dead letter of [`RELAY_LETTERS`] in the
//! failure store, and holds its key for the relay: the later records of the
//! key wait in the outbox, in order, while every other key goes on. A
//! redrive ([`FailureStore::redrive`](crate::FailureStore::redrive)) lets
//! the relay try the record again where it stands, after the body was
//! fixed in the outbox or the limit raised; a skip deletes it from the
//! outbox and lets its key go on without it.

use uuid::Uuid;

use crate::store::DeadLetter;

/// The consumer name of the relay's dead letters in the failure store
/// (`tidings dlq list --consumer @relay`). No consumer can be named so.
pub const RELAY_LETTERS: &str = "@relay";

/// The header of a relay dead letter that gives the outbox sequence number
/// of the record it stands for.
pub const OUTBOX_SEQ_HEADER: &str = "tidings-outbox-seq";

/// An outbox record as stored, before its body is decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxRecord {
    /// Its outbox sequence number.
    pub seq: i64,
    /// Its message id.
    pub id: Uuid,
    /// Its topic.
    pub topic: String,
    /// Its aggregate key (empty for none).
    pub aggregate_key: String,
    /// Its message type.
    pub message_type: String,
    /// The body as stored.
    pub body: Vec<u8>,
}

/// A record the relay claimed whose body does not decode as an envelope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Undecodable {
    /// The record.
    pub record: OutboxRecord,
    /// Why it does not decode.
    pub reason: String,
}

/// A record the relay sets aside: where it stands in the outbox, and the
/// dead letter that stands for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetAside {
    /// Its outbox sequence number.
    pub seq: i64,
    /// The dead letter ([`RELAY_LETTERS`], the message id of the record).
    pub letter: DeadLetter,
}

impl SetAside {
    /// The record held by its key while it waits for a decision.
    pub fn key(&self) -> &str {
        self.letter.aggregate_key.as_deref().unwrap_or_default()
    }
}

/// How a claimed batch ends when not all of it went out: the records sent,
/// the records set aside; every other record goes back unsent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Settlement {
    /// Outbox sequence numbers of the records the transport confirmed.
    pub sent: Vec<i64>,
    /// The records set aside, each holding its key.
    pub set_aside: Vec<SetAside>,
}

impl Settlement {
    /// Whether it changes nothing: the batch is released whole.
    pub fn is_empty(&self) -> bool {
        self.sent.is_empty() && self.set_aside.is_empty()
    }
}
