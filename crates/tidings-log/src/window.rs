//! What a subscription's reader and its ackers share: the window of
//! unsettled deliveries, in log order, and the channel deliveries go out on.

use std::collections::VecDeque;
use std::sync::Mutex;

use tidings_core::log::LogPosition;
use tidings_core::{Delivery, Result};
use tokio::sync::{Notify, mpsc};

/// The unsettled deliveries of one subscription, in log order.
#[derive(Debug, Default)]
pub(crate) struct Window {
    pub(crate) entries: VecDeque<(LogPosition, bool)>,
    /// Everything up to here is settled.
    pub(crate) settled: LogPosition,
}

impl Window {
    pub(crate) fn settle(&mut self, at: LogPosition) {
        if let Ok(i) = self.entries.binary_search_by(|(p, _)| p.cmp(&at)) {
            self.entries[i].1 = true;
        }
        while let Some(&(p, true)) = self.entries.front() {
            self.settled = p;
            self.entries.pop_front();
        }
    }
}

#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) window: Mutex<Window>,
    pub(crate) settled_signal: Notify,
}

pub(crate) type Sender = mpsc::Sender<Result<Delivery>>;

#[cfg(test)]
mod tests {
    use super::*;

    fn p(seq: i64) -> LogPosition {
        LogPosition { txid: 0, seq }
    }

    #[test]
    fn window_settles_only_contiguous_prefix() {
        let mut w = Window {
            entries: (1..=5).map(|s| (p(s), false)).collect(),
            settled: p(0),
        };
        w.settle(p(2));
        w.settle(p(3));
        assert_eq!(w.settled, p(0), "1 is still open");
        w.settle(p(1));
        assert_eq!(w.settled, p(3));
        w.settle(p(5));
        assert_eq!(w.settled, p(3));
        w.settle(p(4));
        assert_eq!(w.settled, p(5));
        assert!(w.entries.is_empty());
    }
}
