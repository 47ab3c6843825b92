//! The key lanes: a session's deliveries queue by key ([`KeyQueue`]), and
//! each lane takes a waiting key no other lane holds and runs its jobs in
//! order.

use std::sync::Arc;

use futures::StreamExt;
use futures::stream::select_all;
use tidings_core::Store;
use tidings_core::{LeaseStore, Subscriber};
use tidings_lease::{Held, Membership};
use tokio::task::JoinSet;

use super::Worker;
use super::config::OnDeadLetter;
use super::holds::{HOLDS_REFRESH, HoldKey};
use super::keyed::KeyQueue;
use super::stats::bump;
use super::work::{Leased, Partitions, Work};
use crate::membership::{Claim, claims};

#[cfg(doc)]
use super::{Consumer, ConsumerConfig};

/// What a key lane does next.
#[allow(
    clippy::large_enum_variant,
    reason = "deliveries are the common case: boxing them would allocate per message"
)]
pub(super) enum Job {
    /// Handle a delivery.
    Deliver(Work),
    /// Handle what is parked behind a released key.
    Drain { key: HoldKey, claim: Claim },
}

/// How long a stopping session waits between two warnings that it is still stopping.
const SLOW_STOP: std::time::Duration = std::time::Duration::from_secs(10);

/// How long a stopping session waits for a subscription to close.
const CLOSE_LIMIT: std::time::Duration = std::time::Duration::from_secs(30);

/// What each lane is at, to say what holds up a session that is stopping.
#[derive(Clone, Default)]
struct Busy(Arc<std::sync::Mutex<Vec<Option<AtWork>>>>);

/// The keys a lane took, and when.
type AtWork = (Vec<String>, tokio::time::Instant);

impl Busy {
    /// A lane takes `keys`; returns its slot.
    fn start(&self, keys: &[String]) -> usize {
        let mut lanes = self.0.lock().expect("busy lock");
        let entry = Some((keys.to_vec(), tokio::time::Instant::now()));
        match lanes.iter().position(Option::is_none) {
            Some(slot) => {
                lanes[slot] = entry;
                slot
            }
            None => {
                lanes.push(entry);
                lanes.len() - 1
            }
        }
    }

    fn end(&self, slot: usize) {
        self.0.lock().expect("busy lock")[slot] = None;
    }

    /// The keys at work and for how long.
    fn describe(&self) -> String {
        let lanes = self.0.lock().expect("busy lock");
        let at_work: Vec<String> = lanes
            .iter()
            .flatten()
            .map(|(keys, since)| {
                let keys: Vec<String> = keys.iter().map(|k| k.replace('\u{1f}', "/")).collect();
                format!("{} for {} s", keys.join(", "), since.elapsed().as_secs())
            })
            .collect();
        at_work.join("; ")
    }
}

/// A key of the lanes' queue: the topic and the aggregate key.
fn queue_key(topic: &str, key: &str) -> String {
    format!("{topic}\u{1f}{key}")
}

impl<S: Store> Worker<S> {
    /// Reads the partitions `held` allows until the session stops, spreading
    /// deliveries over the key lanes.
    pub(super) async fn run<L: LeaseStore>(
        self: Arc<Self>,
        subscriber: &dyn Subscriber,
        membership: &Membership<L>,
        topics: &[String],
        held: &Held,
    ) -> tidings_core::Result<()> {
        // Held keys first: no message of a held key may be handled before we know it is held.
        self.load_holds(false).await?;
        let mut leased = Vec::new();
        let mut partitions = Partitions::default();
        for (topic, partition, claim) in claims(membership, topics, held) {
            partitions.add(topic, partition, &claim);
            match subscriber.subscribe_partition(&self.name, topic, partition).await {
                Ok(subscription) => leased.push(Leased { claim, subscription }),
                Err(e) => {
                    for open in leased {
                        let _ = open.subscription.close().await;
                    }
                    return Err(e);
                }
            }
        }
        let mut deliveries = select_all(leased);
        // Lanes take whichever key is waiting and no other lane holds: a
        // key's messages run one at a time, in order; a slow key holds
        // back only itself.
        let queue = Arc::new(KeyQueue::<Job>::new(
            self.config.lanes * self.config.lane_capacity,
        ));
        let mut tasks = JoinSet::new();
        let busy = Busy::default();
        for _ in 0..self.config.lanes {
            let (worker, queue, busy) = (self.clone(), queue.clone(), busy.clone());
            tasks.spawn(async move {
                while let Some((keys, jobs)) = queue.take(worker.config.batch).await {
                    let lane = busy.start(&keys);
                    worker.run_jobs(jobs.into_iter()).await;
                    busy.end(lane);
                    queue.done(keys);
                }
            });
        }
        let holding = self.config.on_dead_letter == OnDeadLetter::HoldKey;
        let mut keyless = 0u64;
        let mut refresh = tokio::time::interval(HOLDS_REFRESH);
        refresh.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let next = tokio::select! {
                _ = self.stop.cancelled() => break,
                _ = refresh.tick(), if holding => {
                    for (key, claim) in self.released_holds(&partitions).await {
                        tokio::select! {
                            _ = self.stop.cancelled() => break,
                            _ = queue.room() => {}
                        }
                        queue.put(queue_key(&key.0, &key.1), Job::Drain { key, claim });
                    }
                    continue;
                }
                next = deliveries.next() => next,
            };
            let (claim, delivery) = match next {
                None => break,
                Some((claim, Ok(d))) => (claim, d),
                Some((_, Err(e))) => {
                    tracing::warn!(consumer = %self.name, error = %e.report(), "subscription error");
                    continue;
                }
            };
            bump(&self.stats.received);
            let envelope = self.decode(&delivery.message);
            let key = match &envelope {
                Ok(e) => e.aggregate_key.as_str(),
                Err(_) => delivery.message.key.as_deref().unwrap_or(""),
            };
            // No key (a foreign event naming none): nothing to keep in
            // order, so it shares its lane with no other message.
            let key = match key {
                "" => {
                    keyless += 1;
                    format!("{}\u{1e}{keyless}", delivery.message.topic)
                }
                key => queue_key(&delivery.message.topic, key),
            };
            let work = Work {
                delivery,
                envelope,
                claim: Some(claim),
            };
            let room = tokio::select! {
                _ = self.stop.cancelled() => false,
                _ = queue.room() => true,
            };
            if room {
                queue.put(key, Job::Deliver(work));
            } else {
                self.give_back(&work.delivery).await;
                break;
            }
        }
        self.stop.cancel();
        queue.close();
        self.finish_lanes(&mut tasks, &busy).await;
        // Every lane is done: let the transport store the final acknowledgements.
        for part in deliveries {
            self.close_subscription(part.subscription).await;
        }
        tracing::debug!(consumer = %self.name, "session stopped");
        Ok(())
    }

    /// Waits for the lanes to finish what they hold, saying what holds
    /// them up every [`SLOW_STOP`]. A lane still at work a handler timeout
    /// and a lease after the stop is stuck on something that will not
    /// answer: it is abandoned, its transaction rolled back and its
    /// messages left unsettled for the transport to deliver again, because
    /// the partition's next reader may be waiting for this one to let go
    /// (RabbitMQ's single active consumer, a JetStream pull).
    async fn finish_lanes(&self, tasks: &mut JoinSet<()>, busy: &Busy) {
        let stopped = tokio::time::Instant::now();
        let give_up = self.config.handler_timeout + self.config.lease_ttl;
        let mut slow = tokio::time::interval_at(stopped + SLOW_STOP, SLOW_STOP);
        let abandon = tokio::time::sleep(give_up);
        tokio::pin!(abandon);
        loop {
            tokio::select! {
                next = tasks.join_next() => if next.is_none() { return },
                _ = slow.tick() => {
                    tracing::warn!(consumer = %self.name, waited_s = stopped.elapsed().as_secs(), busy = %busy.describe(), "the session is stopping and lanes are still at work");
                }
                _ = &mut abandon => {
                    tracing::error!(consumer = %self.name, waited_s = stopped.elapsed().as_secs(), busy = %busy.describe(), "lanes still at work long after the session stopped; abandoning them (their messages will be delivered again)");
                    tasks.abort_all();
                    while tasks.join_next().await.is_some() {}
                    return;
                }
            }
        }
    }

    /// Closes a subscription, so that the transport stores the last
    /// acknowledgements and lets the partition go. A close the transport
    /// does not finish within [`CLOSE_LIMIT`] is dropped: what it held comes
    /// back to the next reader as the transport gives up on this one.
    async fn close_subscription(&self, subscription: tidings_core::Subscription) {
        match tokio::time::timeout(CLOSE_LIMIT, subscription.close()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!(consumer = %self.name, error = %e.report(), "closing a subscription failed");
            }
            Err(_) => {
                tracing::error!(consumer = %self.name, waited_s = CLOSE_LIMIT.as_secs(), "closing a subscription did not finish; dropping it");
            }
        }
    }

    /// Runs a lane's jobs in order, batching the deliveries that may share a
    /// transaction ([`ConsumerConfig::batch`]).
    async fn run_jobs(&self, jobs: impl Iterator<Item = Job>) {
        let mut batch = Vec::new();
        for job in jobs {
            match job {
                // Given back unhandled: redelivered to whoever reads the partition next.
                Job::Deliver(work) if self.stop.is_cancelled() => {
                    self.give_back(&work.delivery).await;
                }
                Job::Deliver(work) if self.batchable(&work) => batch.push(work),
                Job::Deliver(work) => {
                    self.handle_batch(std::mem::take(&mut batch)).await;
                    self.handle(work).await;
                }
                Job::Drain { key, claim } => {
                    self.handle_batch(std::mem::take(&mut batch)).await;
                    self.drain(&key, Some(&claim)).await;
                }
            }
        }
        self.handle_batch(batch).await;
    }
}
