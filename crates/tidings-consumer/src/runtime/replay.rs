//! Carrying out replays asked of a consumer ([`tidings_core::replay`]).
//!
//! A member polls for a replay of its consumer, claims it, and feeds the
//! retained events of the range through the stack below the key lanes
//! (retry, dead letter, transaction and idempotency), one at a time, in the
//! order they were written, at the requested rate. An event already
//! processed is suppressed by its marker; one not processed is handled.
//! Progress is stored twice a second: the operator follows it, a cancel
//! stops it, and another member resumes from it if this one stops.

use std::time::{Duration, Instant};

use tidings_core::Delivery;
use tidings_core::Store;
use tidings_core::lease::sleep_unless;
use tidings_core::replay::{Replay, ReplayCounts};
use tokio_util::sync::CancellationToken;

use super::Consumer;
use super::work::Work;
use super::work::{Settled, Unsettled};

/// Retained events read per query.
const PAGE: usize = 200;
/// How often progress is stored.
const REPORT_EVERY: Duration = Duration::from_millis(500);

use super::Unheld;

impl<S: Store> Consumer<S> {
    /// Until `shutdown`: takes up replays asked of this consumer, one at a time.
    pub(super) async fn serve_replays(&self, member: &str, unheld: &Unheld, shutdown: &CancellationToken) {
        let mut failures = 0u32;
        while !shutdown.is_cancelled() {
            match self
                .store
                .claim_replay(&self.name, member, self.config.lease_ttl)
                .await
            {
                Ok(Some(replay)) => {
                    failures = 0;
                    self.carry_out(replay, member, unheld, shutdown).await;
                }
                Ok(None) => {
                    failures = 0;
                    sleep_unless(shutdown, self.config.replay_poll).await;
                }
                Err(e) => {
                    failures += 1;
                    tracing::warn!(consumer = %self.name, error = %e.report(), "looking for replays failed");
                    sleep_unless(
                        shutdown,
                        self.config.backoff.delay(failures).max(self.config.replay_poll),
                    )
                    .await;
                }
            }
        }
    }

    async fn carry_out(&self, replay: Replay, member: &str, unheld: &Unheld, shutdown: &CancellationToken) {
        let request = &replay.request;
        let topics: Vec<String> = request
            .topics
            .iter()
            .filter(|t| self.topics.contains(t))
            .cloned()
            .collect();
        tracing::info!(
            consumer = %self.name, replay = %replay.id, source = request.source.as_str(),
            since = %request.since, until = %request.until, rate = request.rate, resume_after = replay.cursor,
            "replaying"
        );
        let worker = self.worker(format!("{member}/replay"), unheld.clone(), shutdown.clone());
        if let Err(e) = worker.load_holds(true).await {
            tracing::warn!(consumer = %self.name, error = %e.report(), "reading held keys failed; replaying as if none were held");
        }
        let interval = Duration::from_secs_f64(1.0 / request.rate.max(0.001));
        let mut next = tokio::time::Instant::now();
        let (mut cursor, mut counts) = (replay.cursor, replay.counts);
        let mut reported = Instant::now();
        let report = |cursor, counts: ReplayCounts, done| {
            self.store
                .replay_progress(replay.id, member, cursor, counts, self.config.lease_ttl, done)
        };
        loop {
            let page = match self
                .store
                .retained(
                    request.source,
                    &topics,
                    request.since,
                    request.until,
                    cursor,
                    PAGE,
                )
                .await
            {
                Ok(page) => page,
                Err(e) => {
                    tracing::warn!(consumer = %self.name, error = %e.report(), "reading retained events failed; retrying");
                    sleep_unless(shutdown, self.config.replay_poll).await;
                    if shutdown.is_cancelled() {
                        return;
                    }
                    continue;
                }
            };
            if page.is_empty() {
                match report(cursor, counts, true).await {
                    Ok(true) => {
                        tracing::info!(consumer = %self.name, replay = %replay.id, ?counts, "replay done")
                    }
                    Ok(false) => {
                        tracing::info!(consumer = %self.name, replay = %replay.id, "replay cancelled")
                    }
                    Err(e) => {
                        tracing::warn!(consumer = %self.name, error = %e.report(), "recording the end of a replay failed")
                    }
                }
                return;
            }
            for retained in page {
                tokio::select! {
                    _ = shutdown.cancelled() => {}
                    _ = tokio::time::sleep_until(next) => {}
                }
                if shutdown.is_cancelled() {
                    // Claimed until the lease runs out; then another member resumes from here.
                    let _ = report(cursor, counts, false).await;
                    return;
                }
                next = next.max(tokio::time::Instant::now() - interval) + interval;
                let topic = retained.message.topic.clone();
                // Replayed from the outbox or the log: Tidings' own CloudEvents, on
                // any topic.
                let settled = match retained.message.decode() {
                    Ok(envelope) => Some(
                        worker
                            .handle(Work {
                                delivery: Delivery::new(retained.message, 1, Unsettled),
                                envelope: Ok(envelope),
                                claim: None,
                            })
                            .await,
                    ),
                    Err(e) => {
                        tracing::warn!(consumer = %self.name, %topic, error = %e, "a retained event does not decode; skipped");
                        None
                    }
                };
                match settled {
                    Some(Settled::GivenBack) => {
                        let _ = report(cursor, counts, false).await;
                        return;
                    }
                    Some(Settled::Duplicate) => counts.suppressed += 1,
                    Some(Settled::Handled) => counts.handled += 1,
                    Some(Settled::DeadLettered | Settled::Parked) | None => counts.failed += 1,
                }
                counts.delivered += 1;
                cursor = retained.position;
                if reported.elapsed() >= REPORT_EVERY {
                    reported = Instant::now();
                    match report(cursor, counts, false).await {
                        Ok(true) => {}
                        Ok(false) => {
                            tracing::info!(consumer = %self.name, replay = %replay.id, "replay cancelled");
                            return;
                        }
                        Err(e) => {
                            tracing::warn!(consumer = %self.name, error = %e.report(), "recording a replay's progress failed")
                        }
                    }
                }
            }
        }
    }
}
