//! The metrics Tidings records, through the [`metrics`] facade.
//!
//! The relay and the consumer runtime record counters and histograms as they
//! work; [`sample_lag`] turns a [`LagSource`]'s figures into gauges. Nothing is
//! exported until the process installs a recorder: the daemon installs the
//! Prometheus one (`tidings-prometheus`), and a service embedding the library
//! can install it too, or any other `metrics` recorder. Install it before
//! building relays and consumers: they take their metric handles when built.
//!
//! Names follow Prometheus conventions (`_total` counters, base units in the
//! name). Labels are bounded: `consumer`, `topic` and `provider` come from the
//! configuration and `outcome` from a fixed list, never from messages, so no
//! event id or key becomes a label.
//! [`CATALOG`] lists every metric; the shipped alert rules are tested to name
//! only metrics from it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::{LagReport, LagSource};

/// What kind of metric a name is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    /// Only goes up.
    Counter,
    /// Goes up and down.
    Gauge,
    /// A distribution (exported with buckets).
    Histogram,
}

/// One metric Tidings records.
#[derive(Debug, Clone, Copy)]
pub struct MetricInfo {
    /// Its name.
    pub name: &'static str,
    /// Counter, gauge or histogram.
    pub kind: MetricKind,
    /// Its labels.
    pub labels: &'static [&'static str],
    /// What it measures.
    pub help: &'static str,
}

macro_rules! catalog {
    ($($konst:ident = $name:literal, $kind:ident, [$($label:literal),*], $help:literal;)*) => {
        $(
            #[doc = $help]
            pub const $konst: &str = $name;
        )*
        /// Every metric Tidings records.
        pub const CATALOG: &[MetricInfo] = &[
            $(MetricInfo { name: $name, kind: MetricKind::$kind, labels: &[$($label),*], help: $help },)*
        ];
    };
}

catalog! {
    OUTBOX_PENDING = "tidings_outbox_pending", Gauge, [],
        "Outbox records committed and not yet published.";
    OUTBOX_OLDEST_UNSENT_AGE = "tidings_outbox_oldest_unsent_age_seconds", Gauge, [],
        "Age of the oldest outbox record not yet published (0 when none is waiting).";
    RELAY_PUBLISHED = "tidings_relay_published_total", Counter, [],
        "Outbox records published, confirmed by the transport and marked sent.";
    RELAY_BATCHES = "tidings_relay_batches_total", Counter, [],
        "Relay batches published and completed.";
    RELAY_BATCH_SIZE = "tidings_relay_batch_size", Histogram, [],
        "Records per published relay batch.";
    RELAY_PUBLISH_DURATION = "tidings_relay_publish_duration_seconds", Histogram, [],
        "Time from handing a batch to the transport to its confirmation.";
    RELAY_PUBLISH_ERRORS = "tidings_relay_publish_errors_total", Counter, [],
        "Batches the transport refused or did not confirm in time (retried).";
    RELAY_CLAIM_ERRORS = "tidings_relay_claim_errors_total", Counter, [],
        "Relay rounds that failed in the database (retried).";
    RELAY_SET_ASIDE = "tidings_relay_set_aside_total", Counter, [],
        "Outbox records the relay set aside as dead letters (undecodable, or refused by the transport), each holding its key.";
    RELAY_BATCHES_IN_FLIGHT = "tidings_relay_batches_in_flight", Gauge, [],
        "Relay batches claimed and not yet ended (confirmed and marked, or given back).";
    CONSUMER_RECEIVED = "tidings_consumer_received_total", Counter, ["consumer"],
        "Deliveries received, duplicates included.";
    CONSUMER_HANDLED = "tidings_consumer_handled_total", Counter, ["consumer"],
        "Messages handled and committed.";
    CONSUMER_FAILED = "tidings_consumer_failed_total", Counter, ["consumer"],
        "Handler attempts that failed (each one retried or dead-lettered).";
    CONSUMER_RETRIED = "tidings_consumer_retried_total", Counter, ["consumer"],
        "Failed attempts that were retried.";
    CONSUMER_DUPLICATES = "tidings_consumer_duplicates_total", Counter, ["consumer"],
        "Deliveries recognised as already processed and skipped.";
    CONSUMER_DEAD_LETTERED = "tidings_consumer_dead_lettered_total", Counter, ["consumer"],
        "Messages given up on and stored as dead letters.";
    CONSUMER_PARKED = "tidings_consumer_parked_total", Counter, ["consumer"],
        "Messages parked behind their key's dead letter.";
    CONSUMER_STORE_ERRORS = "tidings_consumer_store_errors_total", Counter, ["consumer"],
        "Failures of Tidings' own database calls in a consumer (retried).";
    CONSUMER_HANDLER_DURATION = "tidings_consumer_handler_duration_seconds", Histogram, ["consumer"],
        "Time a handler attempt took inside its transaction (the commit not included).";
    CONSUMER_LAG = "tidings_consumer_lag_messages", Gauge, ["consumer", "topic"],
        "Messages on a topic a consumer group has not settled: past its committed offset on the database log, pending or unacknowledged on a broker.";
    DEAD_LETTERS = "tidings_dead_letters", Gauge, ["consumer"],
        "Dead letters waiting for a decision (neither redriven nor skipped).";
    DEAD_LETTER_OLDEST_AGE = "tidings_dead_letter_oldest_age_seconds", Gauge, ["consumer"],
        "Age of a consumer's oldest dead letter waiting for a decision.";
    PARKED_MESSAGES = "tidings_parked_messages", Gauge, ["consumer", "topic"],
        "Messages parked behind held keys.";
    HELD_KEYS = "tidings_held_keys", Gauge, ["consumer", "topic"],
        "Keys held behind a dead letter.";
    INBOX_DELIVERIES = "tidings_inbox_deliveries_total", Counter, ["provider", "outcome"],
        "Webhook deliveries the inbox answered, by outcome: accepted, duplicate, unsigned, malformed, too_large, timeout, refused, failed.";
    LAG_SAMPLE_ERRORS = "tidings_lag_sample_errors_total", Counter, [],
        "Lag measurements that failed (the gauges keep their last value).";
    CDC_SLOT_RETAINED = "tidings_cdc_slot_retained_bytes", Gauge, ["slot"],
        "Write-ahead log the server keeps for a CDC relay's replication slot, in bytes.";
    CDC_SLOT_ACTIVE = "tidings_cdc_slot_active", Gauge, ["slot"],
        "Whether a relay streams the CDC replication slot now (1) or none does (0).";
    CDC_SLOT_STALLED = "tidings_cdc_slot_stalled_seconds", Gauge, ["slot"],
        "How long the CDC slot's confirmed position has not moved while the server's log moved past it (0 when it follows).";
}

/// Registers every metric's help text with the installed recorder.
pub fn describe() {
    for m in CATALOG {
        match m.kind {
            MetricKind::Counter => metrics::describe_counter!(m.name, m.help),
            MetricKind::Gauge => metrics::describe_gauge!(m.name, m.help),
            MetricKind::Histogram => metrics::describe_histogram!(m.name, m.help),
        }
    }
}

/// The metric named `name`, if Tidings records it.
pub fn info(name: &str) -> Option<&'static MetricInfo> {
    CATALOG.iter().find(|m| m.name == name)
}

/// A counter kept in memory (for a component's own stats) and in the
/// installed metrics recorder at once.
#[derive(Debug)]
pub struct Count {
    local: AtomicU64,
    metric: metrics::Counter,
}

impl Count {
    /// A count that also increments `metric`.
    pub fn new(metric: metrics::Counter) -> Self {
        Count {
            local: AtomicU64::new(0),
            metric,
        }
    }

    /// A count recorded nowhere but in memory.
    pub fn local() -> Self {
        Count::new(metrics::Counter::noop())
    }

    /// Adds `n`.
    pub fn add(&self, n: u64) {
        self.local.fetch_add(n, Ordering::Relaxed);
        self.metric.increment(n);
    }

    /// Adds one.
    pub fn bump(&self) {
        self.add(1);
    }

    /// The count so far (in this process, since this was built).
    pub fn get(&self) -> u64 {
        self.local.load(Ordering::Relaxed)
    }
}

impl Default for Count {
    fn default() -> Self {
        Count::local()
    }
}

/// Sets the lag gauges from `report`.
pub fn record_lag(report: &LagReport) {
    metrics::gauge!(OUTBOX_PENDING).set(report.outbox_pending as f64);
    metrics::gauge!(OUTBOX_OLDEST_UNSENT_AGE).set(report.oldest_unsent_age.map_or(0.0, |d| d.as_secs_f64()));
    for c in &report.consumers {
        metrics::gauge!(CONSUMER_LAG, "consumer" => c.consumer.clone(), "topic" => c.topic.clone())
            .set(c.pending as f64);
    }
    for d in &report.dead_letters {
        metrics::gauge!(DEAD_LETTERS, "consumer" => d.consumer.clone()).set(d.pending as f64);
        metrics::gauge!(DEAD_LETTER_OLDEST_AGE, "consumer" => d.consumer.clone())
            .set(d.oldest_age.map_or(0.0, |a| a.as_secs_f64()));
    }
    for p in &report.parked {
        let labels = [("consumer", p.consumer.clone()), ("topic", p.topic.clone())];
        metrics::gauge!(PARKED_MESSAGES, &labels).set(p.messages as f64);
        metrics::gauge!(HELD_KEYS, &labels).set(p.held_keys as f64);
    }
}

/// Measures `source` every `every` and sets the lag gauges, until `shutdown`.
/// A failed measurement is logged and counted; the gauges keep their last value.
pub async fn sample_lag(source: impl LagSource, every: Duration, shutdown: CancellationToken) {
    let errors = metrics::counter!(LAG_SAMPLE_ERRORS);
    // A consumer or topic seen once keeps its series at 0 when it has nothing
    // waiting, rather than vanishing (which would read as "no data").
    let mut seen = SeenLabels::default();
    while !shutdown.is_cancelled() {
        match source.lag().await {
            Ok(mut report) => {
                seen.fill(&mut report);
                record_lag(&report);
            }
            Err(e) => {
                errors.increment(1);
                tracing::warn!(error = %e.report(), "measuring lag failed");
            }
        }
        crate::lease::sleep_unless(&shutdown, every).await;
    }
}

/// Each consumer group's count of unsettled messages on the broker, as
/// [`sample_broker_lag`] last measured it: shared with whoever shows it
/// (the console's overview) beside the gauge it sets.
#[derive(Debug, Clone, Default)]
pub struct BrokerLag(
    std::sync::Arc<std::sync::RwLock<std::collections::BTreeMap<(String, String), BrokerPending>>>,
);

/// One group's unsettled messages on one topic, as the broker counted them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerPending {
    /// The consumer group.
    pub group: String,
    /// The topic.
    pub topic: String,
    /// Messages waiting or in flight; `None` where the broker cannot tell
    /// (Pub/Sub counts a backlog only in Cloud Monitoring).
    pub pending: Option<u64>,
    /// When it was counted.
    pub at: std::time::SystemTime,
}

impl BrokerLag {
    /// The last count of every group seen, by group then topic.
    pub fn measured(&self) -> Vec<BrokerPending> {
        let map = self.0.read().unwrap_or_else(|e| e.into_inner());
        map.values().cloned().collect()
    }

    /// Records a count.
    pub fn set(&self, group: &str, topic: &str, pending: Option<u64>) {
        let measured = BrokerPending {
            group: group.to_owned(),
            topic: topic.to_owned(),
            pending,
            at: std::time::SystemTime::now(),
        };
        let mut map = self.0.write().unwrap_or_else(|e| e.into_inner());
        map.insert((group.to_owned(), topic.to_owned()), measured);
    }
}

/// Measures every `every`, until `shutdown`, how many messages each consumer
/// group has not settled on `broker`, into `tidings_consumer_lag_messages`
/// and `into`: for every group with a member running now or since this
/// started (read from the live members in `store`), on each topic it reads.
/// A group whose members all stopped keeps being measured, so its lag shows
/// as it grows. A count that fails keeps the last one in `into`.
pub async fn sample_broker_lag(
    store: impl crate::Inspect,
    broker: std::sync::Arc<dyn crate::Subscriber>,
    every: Duration,
    into: BrokerLag,
    shutdown: CancellationToken,
) {
    let errors = metrics::counter!(LAG_SAMPLE_ERRORS);
    let mut groups = std::collections::BTreeSet::new();
    while !shutdown.is_cancelled() {
        match store.members().await {
            Ok(members) => groups.extend(members.iter().filter_map(|m| {
                m.group_and_topic()
                    .map(|(group, topic)| (group.to_owned(), topic.to_owned()))
            })),
            Err(e) => {
                errors.increment(1);
                tracing::warn!(error = %e.report(), "listing consumer groups failed");
            }
        }
        for (group, topic) in &groups {
            match broker.pending(group, topic).await {
                Ok(pending) => {
                    if let Some(pending) = pending {
                        metrics::gauge!(CONSUMER_LAG, "consumer" => group.clone(), "topic" => topic.clone())
                            .set(pending as f64);
                    }
                    into.set(group, topic, pending);
                }
                Err(e) => {
                    errors.increment(1);
                    tracing::warn!(error = %e.report(), consumer = %group, %topic, "measuring a group's lag on the broker failed");
                }
            }
        }
        crate::lease::sleep_unless(&shutdown, every).await;
    }
}

/// Consumers with dead letters once, and (consumer, topic) pairs with held
/// keys once, so that their gauges go back to 0 instead of disappearing.
#[derive(Debug, Default)]
struct SeenLabels {
    dead: std::collections::BTreeSet<String>,
    parked: std::collections::BTreeSet<(String, String)>,
}

impl SeenLabels {
    fn fill(&mut self, report: &mut LagReport) {
        self.dead
            .extend(report.dead_letters.iter().map(|d| d.consumer.clone()));
        for consumer in &self.dead {
            if !report.dead_letters.iter().any(|d| &d.consumer == consumer) {
                report.dead_letters.push(crate::DeadLetterLag {
                    consumer: consumer.clone(),
                    pending: 0,
                    oldest_age: None,
                });
            }
        }
        self.parked.extend(
            report
                .parked
                .iter()
                .map(|p| (p.consumer.clone(), p.topic.clone())),
        );
        for (consumer, topic) in &self.parked {
            if !report
                .parked
                .iter()
                .any(|p| &p.consumer == consumer && &p.topic == topic)
            {
                report.parked.push(crate::ParkedLag {
                    consumer: consumer.clone(),
                    topic: topic.clone(),
                    held_keys: 0,
                    messages: 0,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_prometheus_conventions() {
        for m in CATALOG {
            assert!(m.name.starts_with("tidings_"), "{}", m.name);
            assert!(
                m.name.chars().all(|c| c.is_ascii_lowercase() || c == '_'),
                "{}",
                m.name
            );
            assert_eq!(
                m.kind == MetricKind::Counter,
                m.name.ends_with("_total"),
                "{}",
                m.name
            );
            assert!(
                !m.labels
                    .iter()
                    .any(|l| l.split('_').any(|word| word == "id" || word == "key")),
                "{}",
                m.name
            );
        }
        let mut names: Vec<_> = CATALOG.iter().map(|m| m.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), CATALOG.len(), "a name is listed twice");
    }

    #[test]
    fn gauges_of_a_consumer_seen_once_stay_at_zero() {
        let mut seen = SeenLabels::default();
        let mut first = LagReport {
            outbox_pending: 0,
            oldest_unsent_age: None,
            consumers: vec![],
            dead_letters: vec![crate::DeadLetterLag {
                consumer: "inventory".into(),
                pending: 2,
                oldest_age: Some(Duration::from_secs(3)),
            }],
            parked: vec![],
        };
        seen.fill(&mut first);
        assert_eq!(first.dead_letters.len(), 1);
        let mut later = LagReport {
            dead_letters: vec![],
            ..first
        };
        seen.fill(&mut later);
        assert_eq!(later.dead_letters.len(), 1);
        assert_eq!(later.dead_letters[0].consumer, "inventory");
        assert_eq!(later.dead_letters[0].pending, 0);
    }
}
