//! Several batches in flight at once.
//!
//! The partitions a relay holds are dealt into lanes, at most
//! [`RelayConfig::max_in_flight_batches`](crate::RelayConfig::max_in_flight_batches)
//! of them. A lane publishes one batch at a time, of its partitions only,
//! exactly as a relay with one lane does; the lanes run side by side, so
//! one lane claims its next batch while another's is being confirmed. A
//! partition belongs to one lane, so its records still go out one batch
//! after the other, in commit order, and a failed batch rests its own lane
//! only: nothing later of its partitions is claimed, let alone marked,
//! before it is sent again.

use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use futures::future::{Fuse, FusedFuture, FutureExt};
use futures::stream::{FuturesUnordered, StreamExt};
use tidings_core::{
    ClaimedBatch, LeaseStore, OutboxPartitions, OutgoingMessage, Publisher, RelayStore, Result,
};
use tokio_util::sync::CancellationToken;

use crate::{Relay, Round};

/// Deals the partitions `held` into `window` lanes or fewer (one per
/// partition at most), round robin in partition order.
pub(crate) fn lanes(held: &OutboxPartitions, window: usize) -> Vec<OutboxPartitions> {
    let mut leases = held.leases.clone();
    leases.sort_unstable_by_key(|l| l.partition);
    let mut lanes = vec![held.only(|_| false); window.min(leases.len()).max(1)];
    let n = lanes.len();
    for (i, lease) in leases.into_iter().enumerate() {
        lanes[i % n].leases.push(lease);
    }
    lanes
}

/// About how many bytes a record holds in memory.
fn size_of(m: &OutgoingMessage) -> usize {
    let e = &m.envelope;
    m.topic.len()
        + e.message_type.len()
        + e.source.len()
        + e.aggregate_type.len()
        + e.aggregate_key.len()
        + e.content_type.len()
        + e.payload.len()
        + 128
}

/// What a lane is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lane {
    /// Claims at the next turn.
    Ready,
    /// Its round (a claim, then the batch's publish) is under way.
    Busy,
    /// Its last claim found nothing: ready again after a wake-up, the
    /// polling interval, or when another lane published.
    Idle,
    /// Its last round failed: ready again at this instant.
    Resting(Instant),
}

/// The bytes of the window: those of the batches in flight, and an
/// estimate for the claims under way, whose size is not known yet (the
/// last batch's). A lane claims only while both together stay under the
/// bound, so the window exceeds it by about one batch at most, once the
/// first batches have told their size.
#[derive(Debug, Default)]
struct Bytes {
    held: AtomicUsize,
    claiming: AtomicUsize,
    last_batch: AtomicUsize,
}

impl Bytes {
    fn room(&self, max: usize) -> bool {
        let held = self.held.load(Ordering::Relaxed);
        let claiming = self.claiming.load(Ordering::Relaxed);
        held.saturating_add(claiming.saturating_mul(self.last_batch.load(Ordering::Relaxed))) < max
    }

    fn claim_started(&self) {
        self.claiming.fetch_add(1, Ordering::Relaxed);
    }

    /// A claim ended with a batch of `size` bytes (0: nothing, or failed).
    fn claimed(&self, size: usize) {
        self.claiming.fetch_sub(1, Ordering::Relaxed);
        if size > 0 {
            self.held.fetch_add(size, Ordering::Relaxed);
            self.last_batch.store(size, Ordering::Relaxed);
        }
    }

    fn ended(&self, size: usize) {
        self.held.fetch_sub(size, Ordering::Relaxed);
    }
}

impl<S: RelayStore + LeaseStore + Clone, P: Publisher> Relay<S, P> {
    /// Publishes the partitions of `lanes`, one round under way per lane,
    /// until `stop`; then lets every batch in flight end (confirmed and
    /// completed, or released) before it returns. Nothing here waits on
    /// one lane: the retention cleanup runs beside the rounds, and an idle
    /// lane hears a producer's wake-up while the others publish.
    pub(crate) async fn publish_pipelined(&self, stop: &CancellationToken, lanes: Vec<OutboxPartitions>) {
        let mut state = vec![Lane::Ready; lanes.len()];
        let mut failures = vec![0u32; lanes.len()];
        // A wake-up heard while a lane's claim was under way: its claim
        // may have looked before the records came.
        let mut heard = vec![false; lanes.len()];
        let mut next_poll = Instant::now() + self.config.poll_interval;
        let bytes = Bytes::default();
        let mut rounds = FuturesUnordered::new();
        let mut cleaning = pin!(Fuse::terminated());
        let mut next_cleanup = Instant::now() + self.config.cleanup_interval;
        tracing::debug!(lanes = lanes.len(), "publishing with several batches in flight");
        self.pipelined.store(true, Ordering::Relaxed);
        while !stop.is_cancelled() {
            let now = Instant::now();
            if now >= next_cleanup && cleaning.is_terminated() {
                next_cleanup = now + self.config.cleanup_interval;
                cleaning.set(self.cleanup().fuse());
            }
            for (lane, partitions) in lanes.iter().enumerate() {
                let due = match state[lane] {
                    Lane::Ready => true,
                    Lane::Resting(until) => until <= now,
                    Lane::Busy | Lane::Idle => false,
                };
                if due && bytes.room(self.config.max_in_flight_bytes) {
                    state[lane] = Lane::Busy;
                    heard[lane] = false;
                    bytes.claim_started();
                    let bytes = &bytes;
                    rounds.push(async move { (lane, self.lane_round(partitions, bytes, stop).await) });
                }
            }
            // A rest already over waits for room in the window, which only
            // a round ending makes.
            let resting = state
                .iter()
                .filter_map(|s| match s {
                    Lane::Resting(until) if *until > now => Some(*until),
                    _ => None,
                })
                .min();
            let rest_ends = async {
                match resting {
                    Some(until) => tokio::time::sleep_until(until.into()).await,
                    None => std::future::pending().await,
                }
            };
            // With a lane idle, or nothing under way: a producer's
            // wake-up, or the polling interval (a deadline of its own, which
            // the other branches do not put off).
            let listen = rounds.is_empty() || state.contains(&Lane::Idle);
            let woken = async {
                if listen {
                    let left = next_poll.saturating_duration_since(Instant::now());
                    self.store.wait_for_work(left).await
                } else {
                    std::future::pending().await
                }
            };
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = &mut cleaning => {}
                _ = rest_ends => {}
                _ = woken => {
                    next_poll = Instant::now() + self.config.poll_interval;
                    wake(&mut state);
                    for (lane, s) in state.iter().enumerate() {
                        heard[lane] |= *s == Lane::Busy;
                    }
                }
                Some((lane, result)) = rounds.next() => {
                    state[lane] = match result {
                        Ok(Round::Published(_)) => {
                            failures[lane] = 0;
                            // Records may have come for the idle lanes
                            // meanwhile, their wake-up heard by this one.
                            wake(&mut state);
                            Lane::Ready
                        }
                        Ok(Round::Idle) => {
                            failures[lane] = 0;
                            if heard[lane] { Lane::Ready } else { Lane::Idle }
                        }
                        Err(e) => {
                            failures[lane] += 1;
                            self.rest(lane, failures[lane], &e)
                        }
                    };
                }
            }
        }
        // Whatever is under way ends before the leases are given up; a
        // cleanup under way is dropped (one statement, which the database
        // rolls back).
        cleaning.set(Fuse::terminated());
        while let Some((lane, result)) = rounds.next().await {
            if let Err(e) = result {
                tracing::debug!(lane, error = %e.report(), "a batch in flight at shutdown failed; its records stay unsent");
            }
        }
        self.pipelined.store(false, Ordering::Relaxed);
    }

    /// One round of a lane: claims a batch of its partitions and publishes
    /// it, counting its bytes in `bytes` while it is in flight. A batch
    /// claimed as the relay stops is given back unsent.
    async fn lane_round(
        &self,
        partitions: &OutboxPartitions,
        bytes: &Bytes,
        stop: &CancellationToken,
    ) -> Result<Round> {
        let claimed = self.claim_batch(partitions).await;
        let size = match &claimed {
            Ok(Some(batch)) => batch.messages().iter().map(size_of).sum(),
            _ => 0,
        };
        bytes.claimed(size);
        let Some(batch) = claimed? else {
            return Ok(Round::Idle);
        };
        let result = if stop.is_cancelled() {
            batch.release().await.map(|()| Round::Idle)
        } else {
            self.send(batch).await
        };
        bytes.ended(size);
        result
    }

    /// Logs a lane's failed round and returns when it may claim again.
    fn rest(&self, lane: usize, failures: u32, e: &tidings_core::Error) -> Lane {
        let delay = self.config.backoff.delay(failures);
        tracing::warn!(error = %e.report(), lane, attempt = failures, retry_in_ms = delay.as_millis() as u64, "relay round failed; retrying");
        Lane::Resting(Instant::now() + delay)
    }
}

/// Makes idle lanes claim again.
fn wake(state: &mut [Lane]) {
    for s in state.iter_mut() {
        if *s == Lane::Idle {
            *s = Lane::Ready;
        }
    }
}

#[cfg(test)]
mod tests {
    use tidings_core::Lease;

    use super::*;

    fn held(partitions: &[u32]) -> OutboxPartitions {
        OutboxPartitions {
            scope: "relay".into(),
            member: "r".into(),
            count: 8,
            leases: partitions
                .iter()
                .map(|&partition| Lease { partition, fence: 1 })
                .collect(),
        }
    }

    fn partitions_of(lanes: &[OutboxPartitions]) -> Vec<Vec<u32>> {
        lanes
            .iter()
            .map(|l| {
                let mut partitions: Vec<u32> = l.leases.iter().map(|l| l.partition).collect();
                partitions.sort_unstable();
                partitions
            })
            .collect()
    }

    #[test]
    fn partitions_are_dealt_round_robin_into_at_most_the_window() {
        assert_eq!(
            partitions_of(&lanes(&held(&[6, 1, 3, 0, 7]), 2)),
            [vec![0, 3, 7], vec![1, 6]]
        );
        assert_eq!(partitions_of(&lanes(&held(&[2, 5]), 4)), [vec![2], vec![5]]);
        assert_eq!(partitions_of(&lanes(&held(&[2, 5]), 1)), [vec![2, 5]]);
        assert_eq!(lanes(&held(&[]), 4).len(), 1, "no partition: one idle lane");
    }

    #[test]
    fn a_claim_under_way_counts_as_large_as_the_last_batch() {
        let b = Bytes::default();
        b.claim_started();
        b.claim_started();
        assert!(b.room(100), "no batch has told its size yet");
        b.claimed(60);
        assert!(!b.room(100), "60 held, and 60 expected of the claim under way");
        b.ended(60);
        assert!(b.room(100), "only the claim under way, at 60");
        b.claimed(0);
        assert!(b.room(100));
        assert_eq!(b.held.load(Ordering::Relaxed), 0);
        assert_eq!(b.claiming.load(Ordering::Relaxed), 0);
    }
}
