//! Membership of the group and hand-over: a member reads its share of the
//! partitions in sessions, one from each hand-over to the next.

use std::sync::Arc;

use tidings_core::Store;
use tidings_core::lease::sleep_unless;
use tidings_core::{ConsumerStore, Subscriber};
use tidings_lease::{Held, Membership};
use tokio_util::sync::CancellationToken;

use super::holds::Holds;
use super::{Consumer, Worker};

impl<S: Store> Consumer<S> {
    /// Reads the group's share of the topics until `shutdown`.
    pub(super) async fn read_group(
        &self,
        membership: Membership<S>,
        worker: Worker<S>,
        subscriber: &dyn Subscriber,
        shutdown: &CancellationToken,
    ) -> tidings_core::Result<()> {
        let mut held: Held = vec![Vec::new(); membership.scopes().len()];
        let mut failures = 0u32;
        let mut first = true;
        while !shutdown.is_cancelled() {
            match membership.sync(&held).await {
                Ok(now) => held = now,
                Err(e) => {
                    failures += 1;
                    let delay = self.config.backoff.delay(failures);
                    tracing::warn!(consumer = %self.name, error = %e.report(), retry_in_ms = delay.as_millis() as u64, "joining the group failed; retrying");
                    sleep_unless(shutdown, delay).await;
                    continue;
                }
            }
            if held.iter().all(Vec::is_empty) {
                tracing::debug!(consumer = %self.name, member = %membership.member(), "no partition free; standing by");
                sleep_unless(shutdown, membership.tick()).await;
                continue;
            }
            let stop = shutdown.child_token();
            let session = Arc::new(worker.with_stop(stop.clone()));
            let (_, result) = tokio::join!(membership.watch(&held, stop.clone()), async {
                let result = session.run(subscriber, &membership, &self.topics, &held).await;
                stop.cancel();
                result
            });
            match result {
                Ok(()) => failures = 0,
                // A refused configuration fails the first start; a broker
                // that is away is waited for.
                Err(e) if first && !e.class().is_retryable() => {
                    membership.leave().await;
                    return Err(e);
                }
                Err(e) => {
                    failures += 1;
                    let delay = self.config.backoff.delay(failures);
                    tracing::warn!(consumer = %self.name, error = %e.report(), retry_in_ms = delay.as_millis() as u64, "subscribing failed; retrying");
                    sleep_unless(shutdown, delay).await;
                }
            }
            first = false;
        }
        membership.leave().await;
        Ok(())
    }
}

impl<S: ConsumerStore + Clone> Worker<S> {
    pub(super) fn with_stop(&self, stop: CancellationToken) -> Self {
        Worker {
            name: self.name.clone(),
            member: self.member.clone(),
            source: self.source.clone(),
            store: self.store.clone(),
            handler: self.handler.clone(),
            plain: self.plain.clone(),
            config: self.config.clone(),
            stats: self.stats.clone(),
            holds: Holds::default(),
            unheld: self.unheld.clone(),
            stop,
        }
    }
}
