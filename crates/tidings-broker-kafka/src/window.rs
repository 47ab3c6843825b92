//! The in-flight window of a partition: what was delivered and not yet
//! settled, and the offset that is safe to commit.

use std::collections::BTreeMap;
use std::sync::Mutex;

use tidings_core::RawMessage;
use tokio::sync::Notify;

/// The messages of one partition a subscription has delivered and not yet
/// settled, and the offset every message below is settled to.
#[derive(Debug, Default)]
pub(crate) struct Window {
    /// Offset -> settled, for every delivered message not yet committed past.
    pub(crate) open: BTreeMap<i64, bool>,
    /// The offset to commit: every message below it is settled.
    pub(crate) floor: Option<i64>,
    /// The offset last committed.
    pub(crate) committed: Option<i64>,
}

impl Window {
    pub(crate) fn delivered(&mut self, offset: i64) {
        self.open.entry(offset).or_insert(false);
        if self.floor.is_none() {
            self.floor = Some(offset);
        }
    }

    pub(crate) fn settle(&mut self, offset: i64) {
        if let Some(done) = self.open.get_mut(&offset) {
            *done = true;
        }
        while let Some(entry) = self.open.first_entry() {
            if !*entry.get() {
                self.floor = Some(*entry.key());
                return;
            }
            let offset = *entry.key();
            entry.remove();
            self.floor = Some(offset + 1);
        }
    }

    /// The offset to commit, if it moved since the last commit.
    pub(crate) fn to_commit(&self) -> Option<i64> {
        self.floor.filter(|f| Some(*f) != self.committed)
    }
}

/// What a subscription's deliveries share.
pub(crate) struct Shared {
    pub(crate) window: Mutex<Window>,
    pub(crate) settled: Notify,
    /// The Tidings topic.
    pub(crate) topic: String,
    /// Its Kafka topic.
    pub(crate) kafka_topic: String,
    pub(crate) partition: i32,
}

impl Shared {
    pub(crate) fn settle(&self, offset: i64) {
        self.window.lock().expect("window lock").settle(offset);
        self.settled.notify_one();
    }
}

pub(crate) type Redelivery = (RawMessage, i64, u32);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_floor_is_the_lowest_unsettled_offset() {
        let mut w = Window::default();
        for o in 10..15 {
            w.delivered(o);
        }
        assert_eq!(
            w.to_commit(),
            Some(10),
            "nothing settled: commit where reading started"
        );
        w.settle(12);
        w.settle(11);
        assert_eq!(w.to_commit(), Some(10), "10 is still in flight");
        w.settle(10);
        assert_eq!(w.to_commit(), Some(13), "10 to 12 done, 13 is next");
        w.committed = Some(13);
        assert_eq!(w.to_commit(), None, "already committed");
        w.settle(14);
        assert_eq!(w.to_commit(), None, "13 still holds the floor, already committed");
        w.settle(13);
        assert_eq!(w.to_commit(), Some(15));
        assert!(w.open.is_empty());
    }
}
