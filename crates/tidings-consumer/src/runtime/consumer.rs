//! The public [`Consumer`]: building one, running it, and feeding it a
//! message by hand ([`Consumer::deliver`]).

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use tidings_core::Store;
use tidings_core::lease;
use tidings_core::plain::PlainJson;
use tidings_core::{ConsumerStore, Delivery, Envelope, RawMessage, Subscriber};
use tidings_lease::{Membership, Scope};
use tokio_util::sync::CancellationToken;

use super::config::ConsumerConfig;
use super::holds::Holds;
use super::stats::ConsumerStats;
use super::work::{Settled, Unsettled, Work};
use super::{Unheld, Worker};
use crate::handler::Handler;

use super::OnDeadLetter;

/// A named consumer (group) running one handler over one or more topics.
pub struct Consumer<S: ConsumerStore> {
    pub(super) name: String,
    pub(super) topics: Vec<String>,
    /// The topics read as plain JSON, and how.
    pub(super) plain: Arc<HashMap<String, PlainJson>>,
    pub(super) store: S,
    pub(super) handler: Arc<dyn Handler<S::Database>>,
    pub(super) config: ConsumerConfig,
    pub(super) stats: Arc<ConsumerStats>,
}

impl<S: ConsumerStore> fmt::Debug for Consumer<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Consumer")
            .field("name", &self.name)
            .field("topics", &self.topics)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl<S: Store> Consumer<S> {
    /// A consumer named `name` (its group name on the transport, and its key
    /// in the idempotency and effects records: keep it stable).
    pub fn new(name: impl Into<String>, store: S, handler: impl Handler<S::Database>) -> Self {
        let name = name.into();
        Consumer {
            stats: Arc::new(ConsumerStats::new(&name)),
            name,
            topics: Vec::new(),
            plain: Arc::default(),
            store,
            handler: Arc::new(handler),
            config: ConsumerConfig::default(),
        }
    }

    /// Adds a topic to read.
    pub fn topic(mut self, topic: impl Into<String>) -> Self {
        self.topics.push(topic.into());
        self
    }

    /// Adds a topic whose records another producer writes as plain JSON,
    /// not as CloudEvents: each is read as an event of the type `plain`
    /// declares, deduplicated on the id it locates
    /// ([`tidings_core::plain`]). Binary-mode CloudEvents on it are read as
    /// such; a record that is not JSON, or has no id, is dead-lettered
    /// with the reason and its bytes. A record the handler gave up on is
    /// dead-lettered as the CloudEvent it was read as, so that a redrive
    /// (which publishes to the topic) reads it back.
    pub fn json_topic(mut self, topic: impl Into<String>, plain: PlainJson) -> Self {
        let topic = topic.into();
        Arc::make_mut(&mut self.plain).insert(topic.clone(), plain);
        if !self.topics.contains(&topic) {
            self.topics.push(topic);
        }
        self
    }

    /// Replaces the configuration.
    pub fn config(mut self, config: ConsumerConfig) -> Self {
        self.config = config;
        self
    }

    /// The consumer's counters, shared with the running loop.
    pub fn stats(&self) -> Arc<ConsumerStats> {
        self.stats.clone()
    }

    /// The consumer's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The topics it reads.
    pub fn topics(&self) -> &[String] {
        &self.topics
    }

    /// Runs one message through the stack below the key lanes (retry, dead
    /// letter, transaction and idempotency, timeout, handler) as if a
    /// transport had delivered it on `topic`, and says how it ended. It runs
    /// outside the group: no partition lease is checked, so never call it
    /// for a topic members of this group are reading.
    ///
    /// For tests of handlers (see `tidings_testkit::idempotency`) and for
    /// tools that feed a consumer by hand. A message that keeps failing is
    /// retried with the configured backoff, then dead-lettered, as in
    /// [`Consumer::run`].
    pub async fn deliver(&self, topic: &str, envelope: &Envelope) -> Settled {
        let message = RawMessage {
            topic: topic.to_owned(),
            key: Some(envelope.aggregate_key.clone()),
            headers: Default::default(),
            body: tidings_core::cloudevents::to_json(envelope),
            refused: None,
        };
        let worker = self.worker(String::new(), Unheld::default(), CancellationToken::new());
        if let Err(e) = worker.load_holds(true).await {
            tracing::warn!(consumer = %self.name, error = %e.report(), "reading held keys failed; delivering as if none were held");
        }
        worker
            .handle(Work {
                delivery: Delivery::new(message, 1, Unsettled),
                envelope: Ok(envelope.clone()),
                claim: None,
            })
            .await
    }

    pub(super) fn worker(&self, member: String, unheld: Unheld, stop: CancellationToken) -> Worker<S> {
        Worker {
            name: self.name.clone(),
            member,
            source: self.config.source.clone().unwrap_or_else(|| self.name.clone()),
            store: self.store.clone(),
            handler: self.handler.clone(),
            plain: self.plain.clone(),
            config: self.config.clone(),
            stats: self.stats.clone(),
            holds: Holds::default(),
            unheld,
            stop,
        }
    }
}

impl<S: Store> Consumer<S> {
    /// Runs until `shutdown` is cancelled.
    ///
    /// The consumer joins its group: for each topic it takes the leases of
    /// its share of the topic's partitions ([`tidings_core::lease`]) and
    /// reads those, while other members of the group read the rest. When
    /// members come or go, the shares move: each member stops reading
    /// (finishing what it is handling), hands over what is no longer its
    /// share and starts again with its new one. A member with no partition
    /// free stands by and takes over when one is.
    ///
    /// On shutdown or a hand-over, each lane finishes the message it is
    /// handling; queued messages are given back to the transport unhandled
    /// and are delivered again, to whichever member reads their partition.
    pub async fn run(
        self,
        subscriber: &dyn Subscriber,
        shutdown: CancellationToken,
    ) -> tidings_core::Result<()> {
        if self.topics.is_empty() {
            return Err(tidings_core::Error::Config {
                key: format!("consumer {}.topics", self.name),
                reason: "no topic to read".into(),
            });
        }
        // A broker away at start is waited for; a wrong partition count is
        // an error to fix, not to wait out.
        for topic in &self.topics {
            let mut wait = std::time::Duration::from_millis(200);
            loop {
                match subscriber.check_partitions(topic).await {
                    Ok(()) => break,
                    Err(e) if e.class() == tidings_core::ErrorClass::Transient => {
                        tracing::warn!(consumer = %self.name, topic, error = %e.report(), "checking the topic's partitions failed; trying again");
                        tokio::select! {
                            _ = shutdown.cancelled() => return Ok(()),
                            _ = tokio::time::sleep(wait) => {}
                        }
                        wait = (wait * 2).min(std::time::Duration::from_secs(5));
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        let member = self
            .config
            .member
            .clone()
            .unwrap_or_else(|| tidings_lease::unique_member("consumer"));
        let scopes = self
            .topics
            .iter()
            .map(|topic| Scope {
                name: lease::scope(&self.name, topic).into(),
                partitions: subscriber.partitions(topic),
            })
            .collect::<Vec<_>>();
        let membership = Membership::new(self.store.clone(), member.clone(), self.config.lease_ttl, scopes);
        // Keys are held where a key's messages are in the partition its
        // hash names; elsewhere a dead letter holds back nothing.
        let mut unheld = std::collections::HashSet::new();
        for topic in &self.topics {
            if !subscriber.places_keys(topic) {
                if self.config.on_dead_letter == OnDeadLetter::HoldKey {
                    tracing::warn!(consumer = %self.name, topic, "another partitioner placed this topic's messages: a dead letter here does not hold its key (OnDeadLetter::HoldKey needs Tidings' own placement)");
                }
                unheld.insert(topic.clone());
            }
        }
        let unheld = Unheld::new(unheld);
        let worker = self.worker(member.clone(), unheld.clone(), shutdown.clone());
        // Replays stop with the group's reading, whichever way it ends.
        let replays = shutdown.child_token();
        let (result, ()) = tokio::join!(
            async {
                let result = self.read_group(membership, worker, subscriber, &shutdown).await;
                replays.cancel();
                result
            },
            self.serve_replays(&member, &unheld, &replays)
        );
        result
    }
}
