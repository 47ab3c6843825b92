//! The moving parts of a reference system in one process: its relays and
//! its consumers, each as many times as the scale says (as if each ran in
//! a process of its own), their counters, and the wait for the work to
//! drain.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use tidings_consumer::{Consumer, ConsumerConfig, ConsumerStats, Handler};
use tidings_core::duplicating::Duplicating;
use tidings_core::{Backoff, LeaseStore, Outbox, Publisher, RelayStore, Store, Subscriber};
use tidings_relay::{Relay, RelayConfig, RelayStats};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::Transport;

/// How many of each part run, and how unkind the transport is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scale {
    /// Members of each consumer group, sharing its partitions.
    pub members: usize,
    /// Relays, sharing the outbox's partitions.
    pub relays: usize,
    /// Partitions of the outbox and of every topic.
    pub partitions: u32,
    /// Fraction of deliveries redelivered a second time.
    pub duplicate_rate: f64,
}

impl Default for Scale {
    fn default() -> Self {
        Scale {
            members: 1,
            relays: 1,
            partitions: 4,
            duplicate_rate: 0.0,
        }
    }
}

/// The consumers' settings in the reference systems: eight lanes, four
/// attempts a few milliseconds apart, and short leases, so that a member
/// taking over after another one stopped does not wait long.
pub fn consumer_config() -> ConsumerConfig {
    ConsumerConfig::default()
        .lanes(8)
        .max_attempts(4)
        .lease_ttl(Duration::from_secs(3))
        .backoff(Backoff::new(Duration::from_millis(5), Duration::from_millis(50)))
}

/// Relays and consumers running on one store and transport, until stopped.
pub struct Runner<S> {
    store: S,
    publisher: Arc<dyn Publisher>,
    subscriber: Arc<dyn Subscriber>,
    injected: Arc<AtomicU64>,
    scale: Scale,
    shutdown: CancellationToken,
    tasks: JoinSet<tidings_core::Result<()>>,
    consumers: Vec<Arc<ConsumerStats>>,
    relays: Vec<Arc<RelayStats>>,
}

impl<S> std::fmt::Debug for Runner<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runner")
            .field("scale", &self.scale)
            .field("tasks", &self.tasks.len())
            .finish_non_exhaustive()
    }
}

impl<S: Store> Runner<S> {
    /// Nothing running yet. Consumers read through a transport that
    /// delivers `scale.duplicate_rate` of the messages twice.
    pub fn new(store: S, transport: &Transport, scale: Scale, shutdown: CancellationToken) -> Runner<S> {
        let duplicating = Duplicating::new(transport.subscriber.clone(), scale.duplicate_rate);
        let injected = duplicating.injected();
        Runner {
            store,
            publisher: transport.publisher.clone(),
            subscriber: Arc::new(duplicating),
            injected,
            scale,
            shutdown,
            tasks: JoinSet::new(),
            consumers: Vec::new(),
            relays: Vec::new(),
        }
    }

    /// The token that stops everything.
    pub fn shutdown(&self) -> &CancellationToken {
        &self.shutdown
    }

    /// Starts `scale.relays` relays sharing the outbox's partitions.
    pub fn relays(&mut self) {
        self.relays_on(self.store.clone(), self.scale.partitions);
    }

    /// Starts `scale.relays` relays claiming from `store` (a CDC store, say:
    /// one partition, one relay streaming at a time, the others standing by).
    pub fn relays_on<R: RelayStore + LeaseStore + Clone>(&mut self, store: R, partitions: u32) {
        for _ in 0..self.scale.relays.max(1) {
            let relay = Relay::new(store.clone(), self.publisher.clone()).config(
                RelayConfig::default()
                    .poll_interval(Duration::from_millis(100))
                    .partitions(partitions)
                    .lease_ttl(Duration::from_secs(3)),
            );
            self.relays.push(relay.stats());
            self.tasks.spawn(relay.run(self.shutdown.clone()));
        }
    }

    /// Starts `scale.members` members of the group `name` reading `topic`
    /// with `handler` and `config` (the group's source is its name).
    pub fn consumer<H>(&mut self, name: &str, topic: &str, handler: H, config: &ConsumerConfig)
    where
        H: Handler<S::Database> + Clone,
    {
        for _ in 0..self.scale.members.max(1) {
            let consumer = Consumer::new(name, self.store.clone(), handler.clone())
                .topic(topic)
                .config(config.clone().source(name));
            self.consumers.push(consumer.stats());
            let subscriber = self.subscriber.clone();
            let shutdown = self.shutdown.clone();
            self.tasks
                .spawn(async move { consumer.run(&*subscriber, shutdown).await });
        }
    }

    /// Measures lag every `every` into the metrics gauges.
    pub fn sample_lag(&mut self, every: Duration) {
        let sampler = tidings_core::metrics::sample_lag(self.store.clone(), every, self.shutdown.clone());
        self.tasks.spawn(async move {
            sampler.await;
            Ok(())
        });
    }

    /// Runs `task` beside the relays and consumers, until shut down.
    pub fn spawn(&mut self, task: impl Future<Output = tidings_core::Result<()>> + Send + 'static) {
        self.tasks.spawn(task);
    }

    /// Every consumer member's counters.
    pub fn consumer_stats(&self) -> &[Arc<ConsumerStats>] {
        &self.consumers
    }

    /// Messages the relays published (confirmed by the transport).
    pub fn published(&self) -> u64 {
        self.relays.iter().map(|s| s.published()).sum()
    }

    /// Duplicate deliveries injected.
    pub fn duplicates_delivered(&self) -> u64 {
        self.injected.load(Ordering::Relaxed)
    }

    /// Duplicate deliveries recognised and skipped.
    pub fn duplicates_suppressed(&self) -> u64 {
        self.consumers.iter().map(|s| s.duplicates()).sum()
    }

    /// Handler attempts retried.
    pub fn retries(&self) -> u64 {
        self.consumers.iter().map(|s| s.retries()).sum()
    }

    /// Fails if a relay or consumer stopped on its own: it stopped on an
    /// error (a refused configuration, say), and waiting cannot help.
    pub fn check(&mut self) -> anyhow::Result<()> {
        if let Some(done) = self.tasks.try_join_next() {
            self.shutdown.cancel();
            done.context("a task panicked")??;
            anyhow::bail!("a relay or consumer stopped before the work was done");
        }
        Ok(())
    }

    /// Runs until shut down; fails if a relay or consumer stops first.
    pub async fn until_shutdown(mut self) -> anyhow::Result<()> {
        // Biased: tasks end when shut down too, and that is not them stopping on their own.
        let stopped = tokio::select! {
            biased;
            _ = self.shutdown.cancelled() => None,
            done = self.tasks.join_next() => done,
        };
        self.shutdown.cancel();
        if let Some(done) = stopped {
            done.context("a task panicked")??;
            anyhow::bail!("a relay or consumer stopped on its own");
        }
        self.stop().await
    }

    /// Stops everything and waits for it: each consumer finishes the
    /// message it is handling.
    pub async fn stop(&mut self) -> anyhow::Result<()> {
        self.shutdown.cancel();
        while let Some(joined) = self.tasks.join_next().await {
            joined.context("a task panicked")??;
        }
        Ok(())
    }

    /// Runs `work` (the producers) and waits until `drained` says the
    /// figures show everything done, or until `timeout` has passed since
    /// `work` ended: every tick reads the figures with `read` (a database
    /// restarting is waited out) and passes them to `drained` with whether
    /// `work` is over. Returns the last figures, and whether they drained.
    pub async fn drain<T, W, R, RF, D>(
        &mut self,
        work: W,
        timeout: Duration,
        mut read: R,
        mut drained: D,
    ) -> anyhow::Result<(T, bool)>
    where
        W: Future<Output = anyhow::Result<()>>,
        R: FnMut() -> RF,
        RF: Future<Output = anyhow::Result<T>>,
        D: FnMut(&T, bool) -> bool,
    {
        tokio::pin!(work);
        // None while the work runs: it faces the same database, and fails
        // on its own if the database never comes back.
        let mut deadline: Option<Instant> = None;
        loop {
            if deadline.is_none() {
                tokio::select! {
                    done = &mut work => {
                        done?;
                        deadline = Some(Instant::now() + timeout);
                    }
                    _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                }
            } else {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let overdue = deadline.is_some_and(|d| Instant::now() > d);
            let figures = match read().await {
                Ok(figures) => figures,
                // The database restarting or failing over: the figures wait
                // for the next tick, as the producers, relays and consumers wait.
                Err(e) if transient(&self.store, &e) && !overdue => {
                    tracing::warn!(error = %e, "reading the figures failed; trying again");
                    continue;
                }
                Err(e) => return Err(e),
            };
            let worked = deadline.is_some();
            if drained(&figures, worked) && worked {
                return Ok((figures, true));
            }
            if overdue {
                return Ok((figures, false));
            }
            self.check()?;
        }
    }
}

/// Whether `e` is worth another try: a lost connection, a database
/// restarting ([`Error::class`](tidings_core::Error::class)).
pub fn transient<S: Outbox>(store: &S, e: &anyhow::Error) -> bool {
    if let Some(e) = e.downcast_ref::<tidings_core::Error>() {
        return e.class().is_retryable();
    }
    e.downcast_ref::<sqlx::Error>()
        .is_some_and(|e| store.error_class(e).is_retryable())
}
