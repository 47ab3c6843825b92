//! Taking a partition over from a reader that left messages
//! unacknowledged, keeping each key in order.

use std::collections::HashSet;
use std::time::Duration;

use async_nats::jetstream::{self, consumer};

/// A partition taken over from a reader that left messages unacknowledged
/// (it crashed, or handed over with a pull in flight). JetStream redelivers
/// those only once their ack wait runs out, and meanwhile hands out newer
/// messages: delivering those at once would put a key's later message before
/// its earlier one. So newer messages are held back until as many old ones
/// as were unacknowledged came back (or, if some never do, for a while).
pub(crate) struct Takeover {
    /// Unacknowledged when the reader started.
    pub(crate) outstanding: usize,
    /// The last stream sequence delivered before: anything up to it is old.
    pub(crate) last_delivered: u64,
    pub(crate) seen_old: HashSet<u64>,
    /// Deliveries that went to another reader since this one started.
    pub(crate) missing: usize,
    /// Redeliveries come back since then, counted against `missing`.
    pub(crate) seen_back: HashSet<u64>,
    /// The stream sequences held: one copy of each.
    pub(crate) held_sequences: HashSet<u64>,
    pub(crate) held: Vec<jetstream::Message>,
    began: tokio::time::Instant,
    pub(crate) give_up_at: tokio::time::Instant,
}

impl Takeover {
    fn empty(patience: Duration) -> Takeover {
        let now = tokio::time::Instant::now();
        Takeover {
            outstanding: 0,
            last_delivered: 0,
            seen_old: HashSet::new(),
            missing: 0,
            seen_back: HashSet::new(),
            held_sequences: HashSet::new(),
            held: Vec::new(),
            began: now,
            give_up_at: now + patience,
        }
    }

    pub(crate) fn new(info: &consumer::Info, patience: Duration) -> Option<Self> {
        (info.num_ack_pending > 0).then(|| {
            tracing::info!(
                consumer = %info.name,
                unacknowledged = info.num_ack_pending,
                "an earlier reader left messages unacknowledged; holding newer ones back until they return"
            );
            Takeover {
                outstanding: info.num_ack_pending,
                last_delivered: info.delivered.stream_sequence,
                ..Takeover::empty(patience)
            }
        })
    }

    /// `missing` deliveries went to another reader (a member that woke up
    /// after its lease moved on and pulled once more, or a pull request
    /// this reader abandoned): they come back as redeliveries, possibly
    /// after newer messages of their keys. Newer messages are held, as in
    /// a takeover (and alongside one in progress), until as many
    /// redeliveries came back, or for `patience` (at most twice that since
    /// the hold began). `now` is the delivery that showed the gap.
    pub(crate) fn after_gap(
        hold: Option<Takeover>,
        missing: usize,
        now: jetstream::Message,
        patience: Duration,
    ) -> (Takeover, Vec<jetstream::Message>) {
        let mut t = hold.unwrap_or_else(|| Takeover::empty(patience));
        t.missing += missing;
        let later = tokio::time::Instant::now() + patience;
        t.give_up_at = t.give_up_at.max(later).min(t.began + patience * 2);
        let ready = t.admit(now);
        (t, ready)
    }

    /// Takes a message in; once every old one is in, returns all held, in
    /// stream order (old ones come back in whatever order their ack waits
    /// ran out, so they are held and sorted too).
    pub(crate) fn admit(&mut self, m: jetstream::Message) -> Vec<jetstream::Message> {
        let (seq, delivered) = m.info().map_or((0, 0), |i| (i.stream_sequence, i.delivered));
        if !self.held_sequences.insert(seq) {
            // Redelivered again while held (its ack wait ran out while the
            // takeover waited): the copy in hand will do. Keeping every copy
            // would hand the runtime copies whose delivery counts grew with
            // the wait, not with failed handling.
            return Vec::new();
        }
        if seq <= self.last_delivered && self.seen_old.len() < self.outstanding {
            self.seen_old.insert(seq);
        } else if delivered > 1 {
            // A first delivery is new: only a redelivery can be one that
            // went elsewhere.
            self.seen_back.insert(seq);
        }
        self.held.push(m);
        if self.complete() {
            self.release()
        } else {
            Vec::new()
        }
    }

    /// Everything held, in stream order.
    pub(crate) fn release(&mut self) -> Vec<jetstream::Message> {
        self.held_sequences.clear();
        let mut ready = std::mem::take(&mut self.held);
        ready.sort_by_key(stream_sequence);
        ready
    }

    pub(crate) fn complete(&self) -> bool {
        self.seen_old.len() >= self.outstanding && self.seen_back.len() >= self.missing
    }

    /// How many it still waits for.
    pub(crate) fn waiting_for(&self) -> usize {
        (self.outstanding - self.seen_old.len().min(self.outstanding))
            + (self.missing - self.seen_back.len().min(self.missing))
    }
}

fn stream_sequence(m: &jetstream::Message) -> u64 {
    m.info().map(|i| i.stream_sequence).unwrap_or(0)
}
