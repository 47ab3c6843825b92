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

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

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
    /// Its last claim found nothing: ready again after a wake-up or when
    /// another lane published.
    Idle,
    /// Its last round failed: ready again at this instant.
    Resting(Instant),
}

impl<S: RelayStore + LeaseStore + Clone, P: Publisher> Relay<S, P> {
    /// Publishes the partitions of `lanes`, one round under way per lane,
    /// until `stop`; then lets every batch in flight end (confirmed and
    /// completed, or released) before it returns.
    pub(crate) async fn publish_pipelined(&self, stop: &CancellationToken, lanes: Vec<OutboxPartitions>) {
        let mut state = vec![Lane::Ready; lanes.len()];
        let mut failures = vec![0u32; lanes.len()];
        let bytes = AtomicUsize::new(0);
        let mut rounds = FuturesUnordered::new();
        let mut last_cleanup = Instant::now();
        tracing::debug!(lanes = lanes.len(), "publishing with several batches in flight");
        self.pipelined.store(true, Ordering::Relaxed);
        while !stop.is_cancelled() {
            self.cleanup_when_due(&mut last_cleanup).await;
            let now = Instant::now();
            for (lane, partitions) in lanes.iter().enumerate() {
                let due = match state[lane] {
                    Lane::Ready => true,
                    Lane::Resting(until) => until <= now,
                    Lane::Busy | Lane::Idle => false,
                };
                if due && bytes.load(Ordering::Relaxed) < self.config.max_in_flight_bytes {
                    state[lane] = Lane::Busy;
                    let bytes = &bytes;
                    rounds.push(async move { (lane, self.lane_round(partitions, bytes, stop).await) });
                }
            }
            let resting = state
                .iter()
                .filter_map(|s| match s {
                    Lane::Resting(until) => Some(*until),
                    _ => None,
                })
                .min();
            if rounds.is_empty() {
                // Nothing under way: wait for a producer, the polling
                // interval or the end of the first rest, whichever is first.
                let wait = resting.map_or(self.config.poll_interval, |until| {
                    until
                        .saturating_duration_since(Instant::now())
                        .min(self.config.poll_interval)
                });
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = self.store.wait_for_work(wait) => {}
                }
                wake(&mut state);
                continue;
            }
            let rest_ends = async {
                match resting {
                    Some(until) => tokio::time::sleep_until(until.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = rest_ends => {}
                Some((lane, result)) = rounds.next() => {
                    state[lane] = match result {
                        Ok(Round::Published(_)) => {
                            failures[lane] = 0;
                            // Records may have come for the idle lanes
                            // meanwhile: nobody waited for their wake-up.
                            wake(&mut state);
                            Lane::Ready
                        }
                        Ok(Round::Idle) => {
                            failures[lane] = 0;
                            Lane::Idle
                        }
                        Err(e) => {
                            failures[lane] += 1;
                            self.rest(lane, failures[lane], &e)
                        }
                    };
                }
            }
        }
        // Whatever is under way ends before the leases are given up.
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
        bytes: &AtomicUsize,
        stop: &CancellationToken,
    ) -> Result<Round> {
        let Some(batch) = self.claim_batch(partitions).await? else {
            return Ok(Round::Idle);
        };
        if stop.is_cancelled() {
            batch.release().await?;
            return Ok(Round::Idle);
        }
        let size: usize = batch.messages().iter().map(size_of).sum();
        bytes.fetch_add(size, Ordering::Relaxed);
        let result = self.send(batch).await;
        bytes.fetch_sub(size, Ordering::Relaxed);
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
}
