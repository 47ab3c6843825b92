//! The production checklist of `tidings doctor`, as a daemon runs it.
//!
//! [`checklist`] answers the items a store can answer: its tables, the
//! relays, the outbox's age, the consumers' lag, the records the relay set
//! aside, the dead letters and their path, idempotency, the dedupe horizon
//! and the replication slots. Each item passes, warns or fails with its
//! evidence ([`Check`]). What only the operator's machine knows (a schema
//! directory, a Prometheus address, how the relays run) `tidings doctor`
//! adds itself.

use std::collections::BTreeSet;
use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tidings_core::inspect::{Inspect, MemberStatus, ReplicationSlot};
use tidings_core::replay::{ReplaySource, ReplayStore};
use tidings_core::{ConsumerStore, DeadLetterFilter, DeadLetterLag, FailureStore, LagReport, RELAY_LETTERS};

use crate::outbox::age;

/// The item about Tidings' tables: when it fails, the checklist stops there.
pub const TABLES: &str = "tables";

/// An item's outcome.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// As it should be.
    Pass,
    /// Worth a look, or not checked.
    Warn,
    /// Wrong: the deployment is not healthy.
    Fail,
}

/// One item of the checklist.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Check {
    /// What was checked (`relay`, `outbox lag`, ...).
    pub item: String,
    /// How it came out.
    pub verdict: Verdict,
    /// What was found, and what to do about it.
    pub evidence: String,
}

impl Check {
    /// An item's outcome with its evidence.
    pub fn new(item: impl Into<String>, verdict: Verdict, evidence: impl Into<String>) -> Check {
        Check {
            item: item.into(),
            verdict,
            evidence: evidence.into(),
        }
    }
}

impl fmt::Display for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verdict = match self.verdict {
            Verdict::Pass => "pass",
            Verdict::Warn => "warn",
            Verdict::Fail => "FAIL",
        };
        write!(f, "{verdict}  {:<18} {}", self.item, self.evidence)
    }
}

/// The thresholds of the checklist (and the query of `GET /api/doctor`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default)]
pub struct Limits {
    /// The oldest unsent outbox record may be this old, in milliseconds
    /// (a minute by default).
    pub max_oldest_unsent_ms: u64,
    /// A consumer group may be this many messages behind on the database
    /// log (10 000 by default).
    pub max_consumer_lag: u64,
    /// A dead letter may wait this long for a decision (redrive or skip),
    /// in milliseconds (an hour by default).
    pub max_dead_letter_age_ms: u64,
    /// A replication slot may hold this many MiB of write-ahead log (1024
    /// by default).
    pub max_retained_wal_mib: u64,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_oldest_unsent_ms: 60_000,
            max_consumer_lag: 10_000,
            max_dead_letter_age_ms: 3_600_000,
            max_retained_wal_mib: 1024,
        }
    }
}

impl Limits {
    /// How old the oldest unsent outbox record may be.
    pub fn max_oldest_unsent(&self) -> Duration {
        Duration::from_millis(self.max_oldest_unsent_ms)
    }

    /// How long a dead letter may wait for a decision.
    pub fn max_dead_letter_age(&self) -> Duration {
        Duration::from_millis(self.max_dead_letter_age_ms)
    }
}

/// Whether a relay streams the CDC slot of relay group `group`
/// (`tidings_<group>`), among the database's `slots`.
pub fn cdc_slot(slots: &[ReplicationSlot], group: &str) -> Check {
    let name = format!("tidings_{group}");
    let mib = |s: &ReplicationSlot| s.retained_bytes / (1024 * 1024);
    match slots.iter().find(|s| s.name == name) {
        None => Check::new(
            CDC,
            Verdict::Warn,
            format!("no slot {name} yet: the CDC relay makes it at start"),
        ),
        Some(s) if !s.active => Check::new(
            CDC,
            Verdict::Fail,
            format!(
                "no relay streams the slot {name}, which keeps {} MiB of log: start the CDC relay",
                mib(s)
            ),
        ),
        Some(s) => Check::new(
            CDC,
            Verdict::Pass,
            format!("a relay streams {name} ({} MiB of log kept)", mib(s)),
        ),
    }
}

/// The item about a CDC relay's slot.
pub const CDC: &str = "cdc";

/// Whether nothing failed.
pub fn healthy(checks: &[Check]) -> bool {
    checks.iter().all(|c| c.verdict != Verdict::Fail)
}

/// `{failed} failed, {warned} warnings, {n} checks`.
pub fn summary(checks: &[Check]) -> String {
    let failed = checks.iter().filter(|c| c.verdict == Verdict::Fail).count();
    let warned = checks.iter().filter(|c| c.verdict == Verdict::Warn).count();
    format!("{failed} failed, {warned} warnings, {} checks", checks.len())
}

/// Whether the checklist stopped at the tables (they are missing or not
/// migrated), so that nothing else was checked.
pub fn stopped_at_tables(checks: &[Check]) -> bool {
    checks
        .iter()
        .any(|c| c.item == TABLES && c.verdict == Verdict::Fail)
}

/// Runs the store's items of the checklist. When Tidings' tables are
/// missing or not migrated, that item alone (failing) is the answer.
pub async fn checklist<S: Inspect + FailureStore + ReplayStore + ConsumerStore + ?Sized>(
    store: &S,
    limits: &Limits,
) -> tidings_core::Result<Vec<Check>> {
    let version = store.schema_version().await?;
    if version.applied < version.latest {
        let evidence = if version.applied == 0 {
            "no Tidings tables here: run `tidings migrate`".to_owned()
        } else {
            format!(
                "migration {} of {} applied: run `tidings migrate`",
                version.applied, version.latest
            )
        };
        return Ok(vec![Check::new(TABLES, Verdict::Fail, evidence)]);
    }
    let mut checks = vec![Check::new(
        TABLES,
        Verdict::Pass,
        format!("migrations 1 to {} applied", version.applied),
    )];
    let lag = store.lag().await?;
    let members = store.members().await?;
    checks.push(relay(&lag, &members));
    checks.push(outbox_age(&lag, limits));
    checks.push(consumer_lag(&lag, limits));
    checks.push(relay_holds(store).await?);
    checks.push(dead_letters(&lag, limits));
    let consumers = known_consumers(&lag, &members);
    checks.push(dead_letter_path(store, &consumers).await?);
    checks.push(idempotency(store, &consumers).await?);
    checks.push(dedupe_horizon(store, &lag, &members).await?);
    checks.push(replication_slots(store, limits, &members).await?);
    Ok(checks)
}

fn relay(lag: &LagReport, members: &[MemberStatus]) -> Check {
    let relays: Vec<_> = members.iter().filter(|m| m.is_relay()).collect();
    let publishing = relays.iter().filter(|r| !r.leases.is_empty()).count();
    match (publishing, lag.outbox_pending) {
        (0, 0) => Check::new(
            "relay",
            Verdict::Warn,
            "no relay is running (nothing waits in the outbox)",
        ),
        (0, pending) => Check::new(
            "relay",
            Verdict::Fail,
            format!(
                "no relay is running and {pending} records wait in the outbox (oldest {}): start `tidings run`",
                age(lag.oldest_unsent_age)
            ),
        ),
        (n, _) => {
            let held: usize = relays.iter().map(|r| r.leases.len()).sum();
            Check::new(
                "relay",
                Verdict::Pass,
                format!(
                    "{n} relay(s) publishing, holding {held} partition(s); {} standing by",
                    relays.len() - n
                ),
            )
        }
    }
}

fn outbox_age(lag: &LagReport, limits: &Limits) -> Check {
    let oldest = lag.oldest_unsent_age.unwrap_or_default();
    let max = limits.max_oldest_unsent();
    let evidence = format!(
        "{} pending, oldest unsent {} (threshold {:.0} s)",
        lag.outbox_pending,
        age(lag.oldest_unsent_age),
        max.as_secs_f64()
    );
    let verdict = if oldest > max {
        Verdict::Fail
    } else {
        Verdict::Pass
    };
    Check::new("outbox lag", verdict, evidence)
}

fn consumer_lag(lag: &LagReport, limits: &Limits) -> Check {
    if lag.consumers.is_empty() {
        return Check::new(
            "consumer lag",
            Verdict::Pass,
            "no group reads the database log (a broker's own lag is read from the broker)",
        );
    }
    let behind: Vec<String> = lag
        .consumers
        .iter()
        .filter(|c| c.pending > limits.max_consumer_lag)
        .map(|c| format!("{} on {}: {} behind", c.consumer, c.topic, c.pending))
        .collect();
    if behind.is_empty() {
        let worst = lag.consumers.iter().map(|c| c.pending).max().unwrap_or(0);
        Check::new(
            "consumer lag",
            Verdict::Pass,
            format!(
                "{} group(s) on the log, at most {worst} behind (threshold {})",
                lag.consumers.len(),
                limits.max_consumer_lag
            ),
        )
    } else {
        Check::new(
            "consumer lag",
            Verdict::Fail,
            format!("{} (threshold {})", behind.join("; "), limits.max_consumer_lag),
        )
    }
}

/// Records the relay set aside, each holding its key: named, with why.
async fn relay_holds<S: Inspect + FailureStore + ?Sized>(store: &S) -> tidings_core::Result<Check> {
    let holds = store.relay_holds().await?;
    if holds.is_empty() {
        return Ok(Check::new(
            "relay holds",
            Verdict::Pass,
            "no outbox record set aside",
        ));
    }
    let letters = store
        .dead_letters(&DeadLetterFilter::default().consumer(RELAY_LETTERS))
        .await?;
    let named: Vec<String> = holds
        .iter()
        .map(|h| {
            let letter = letters.iter().find(|l| l.message_id == Some(h.message_id));
            // An error may quote a value (a password in a URL): masked,
            // as the console masks every error it shows.
            let reason = letter.and_then(|l| l.errors.last()).map_or_else(
                || "no dead letter".to_owned(),
                |f| crate::letter::mask_words(&f.error).0,
            );
            let key = if h.aggregate_key.is_empty() {
                "no key".to_owned()
            } else {
                format!(
                    "key {:?} with {} record(s) waiting behind it",
                    h.aggregate_key, h.waiting
                )
            };
            format!(
                "record {} (seq {}, {}, {key}): {reason}; dead letter {}",
                h.message_id,
                h.seq,
                h.topic,
                letter.map_or("gone".to_owned(), |l| l.id.to_string())
            )
        })
        .collect();
    Ok(Check::new(
        "relay holds",
        Verdict::Fail,
        format!(
            "{}: fix and `tidings dlq redrive ID`, or `tidings dlq skip ID`",
            named.join("; ")
        ),
    ))
}

fn dead_letters(lag: &LagReport, limits: &Limits) -> Check {
    // The relay's own are the item "relay holds".
    let waiting: Vec<_> = lag
        .dead_letters
        .iter()
        .filter(|d| d.pending > 0 && d.consumer != RELAY_LETTERS)
        .collect();
    if waiting.is_empty() {
        return Check::new("dead letters", Verdict::Pass, "none waiting for a decision");
    }
    let describe = |d: &&DeadLetterLag| {
        format!(
            "{}: {} waiting, oldest {}",
            d.consumer,
            d.pending,
            age(d.oldest_age)
        )
    };
    let max = limits.max_dead_letter_age();
    let old: Vec<String> = waiting
        .iter()
        .filter(|d| d.oldest_age.unwrap_or_default() > max)
        .map(describe)
        .collect();
    let threshold = format!("threshold {:.0} s", max.as_secs_f64());
    if old.is_empty() {
        let all: Vec<String> = waiting.iter().map(describe).collect();
        Check::new(
            "dead letters",
            Verdict::Warn,
            format!("{} ({threshold}): `tidings dlq list`", all.join("; ")),
        )
    } else {
        Check::new(
            "dead letters",
            Verdict::Fail,
            format!("{} ({threshold}): `tidings dlq list`", old.join("; ")),
        )
    }
}

/// Consumers the database knows of: live group members, log readers, dead letters.
fn known_consumers(lag: &LagReport, members: &[MemberStatus]) -> BTreeSet<String> {
    members
        .iter()
        .filter_map(|m| m.group_and_topic().map(|(group, _)| group.to_owned()))
        .chain(lag.consumers.iter().map(|c| c.consumer.clone()))
        .chain(lag.dead_letters.iter().map(|d| d.consumer.clone()))
        .filter(|c| c != RELAY_LETTERS)
        .collect()
}

async fn dead_letter_path<S: FailureStore + ?Sized>(
    store: &S,
    consumers: &BTreeSet<String>,
) -> tidings_core::Result<Check> {
    if consumers.is_empty() {
        return Ok(Check::new(
            "dead-letter path",
            Verdict::Warn,
            "no consumer seen (none running, none reading the log, no dead letters)",
        ));
    }
    // The failure store answers: every consumer of Tidings' runtime dead-letters there.
    store
        .dead_letters(&DeadLetterFilter::default().include_redriven())
        .await?;
    Ok(Check::new(
        "dead-letter path",
        Verdict::Pass,
        format!(
            "the failure store answers for {} consumer(s): {}",
            consumers.len(),
            consumers.iter().cloned().collect::<Vec<_>>().join(", ")
        ),
    ))
}

async fn idempotency<S: Inspect + ?Sized>(
    store: &S,
    consumers: &BTreeSet<String>,
) -> tidings_core::Result<Check> {
    let mut without = Vec::new();
    for consumer in consumers {
        if !store.has_processed(consumer).await? {
            without.push(consumer.clone());
        }
    }
    Ok(if consumers.is_empty() {
        Check::new("idempotency", Verdict::Warn, "no consumer seen")
    } else if without.is_empty() {
        Check::new(
            "idempotency",
            Verdict::Pass,
            format!(
                "processed markers recorded by all {} consumer(s)",
                consumers.len()
            ),
        )
    } else {
        Check::new(
            "idempotency",
            Verdict::Warn,
            format!(
                "no processed marker yet for {} (new, or handling outside Tidings' runtime)",
                without.join(", ")
            ),
        )
    })
}

/// Whether anything retained for replay (database-log entries, sent
/// outbox records) is older than the dedupe horizon: replaying it would
/// find no processed marker and handle it twice.
async fn dedupe_horizon<S: ReplayStore + ConsumerStore + ?Sized>(
    store: &S,
    lag: &LagReport,
    members: &[MemberStatus],
) -> tidings_core::Result<Check> {
    const ITEM: &str = "dedupe horizon";
    let Some(horizon) = store.dedupe_horizon().await? else {
        return Ok(Check::new(
            ITEM,
            Verdict::Pass,
            "processed markers were never deleted",
        ));
    };
    let mut topics: Vec<String> = lag.consumers.iter().map(|c| c.topic.clone()).collect();
    topics.extend(
        members
            .iter()
            .filter_map(|m| m.group_and_topic())
            .map(|(_, t)| t.to_owned()),
    );
    topics.sort();
    topics.dedup();
    let epoch = chrono::DateTime::<chrono::Utc>::UNIX_EPOCH;
    for source in [ReplaySource::Log, ReplaySource::Outbox] {
        let older = store.count_retained(source, &topics, epoch, horizon).await?;
        if older > 0 {
            return Ok(Check::new(
                ITEM,
                Verdict::Fail,
                format!(
                    "{older} events retained in the {} are older than the dedupe horizon ({horizon}): a replay of them \
                     would handle them twice; make consumer.dedupe_retention longer than what is retained",
                    source.as_str()
                ),
            ));
        }
    }
    Ok(Check::new(
        ITEM,
        Verdict::Pass,
        format!("processed markers kept since {horizon}; nothing retained is older"),
    ))
}

/// Every replication slot keeps write-ahead log until its reader confirms:
/// a slot past the cap fails (read or not), and so does a CDC relay's slot
/// (`tidings_<group>`) that no relay streams while no relay runs at all.
async fn replication_slots<S: Inspect + ?Sized>(
    store: &S,
    limits: &Limits,
    members: &[MemberStatus],
) -> tidings_core::Result<Check> {
    let slots = store.replication_slots().await?;
    if slots.is_empty() {
        return Ok(Check::new(
            "replication slots",
            Verdict::Pass,
            "none (nothing retains write-ahead log)",
        ));
    }
    let limit = limits.max_retained_wal_mib.saturating_mul(1024 * 1024);
    let relays = members.iter().filter(|m| m.is_relay()).count();
    let mib = |bytes: u64| bytes / (1024 * 1024);
    let mut wrong: Vec<String> = Vec::new();
    for s in &slots {
        if s.retained_bytes > limit {
            let reader = if s.active {
                "its reader confirms nothing"
            } else {
                "with no reader"
            };
            wrong.push(format!(
                "{} retains {} MiB, {reader}",
                s.name,
                mib(s.retained_bytes)
            ));
        } else if !s.active && relays == 0 && s.name.starts_with("tidings_") {
            let group = &s.name["tidings_".len()..];
            wrong.push(format!(
                "{} has no reader and no relay runs: start the CDC relay, or `tidings cdc drop --group {group}` if it is gone",
                s.name
            ));
        }
    }
    Ok(if wrong.is_empty() {
        Check::new(
            "replication slots",
            Verdict::Pass,
            format!(
                "{} slot(s), {} with a reader; none retains over {} MiB",
                slots.len(),
                slots.iter().filter(|s| s.active).count(),
                limits.max_retained_wal_mib
            ),
        )
    } else {
        Check::new(
            "replication slots",
            Verdict::Fail,
            format!("{} (drop the slot or start its reader)", wrong.join("; ")),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_check_reads_back_from_its_json() {
        let check = Check::new("relay", Verdict::Warn, "no relay is running");
        let json = serde_json::to_string(&check).unwrap();
        assert_eq!(
            json,
            r#"{"item":"relay","verdict":"warn","evidence":"no relay is running"}"#
        );
        assert_eq!(serde_json::from_str::<Check>(&json).unwrap(), check);
    }

    #[test]
    fn limits_default_to_the_command_line_defaults() {
        let limits: Limits = serde_json::from_str("{}").unwrap();
        assert_eq!(limits, Limits::default());
        assert_eq!(limits.max_oldest_unsent(), Duration::from_secs(60));
        assert_eq!(limits.max_dead_letter_age(), Duration::from_secs(3600));
    }

    #[test]
    fn the_summary_counts_failures_and_warnings() {
        let checks = [
            Check::new(TABLES, Verdict::Pass, "migrations 1 to 9 applied"),
            Check::new("relay", Verdict::Warn, "no relay"),
            Check::new("outbox lag", Verdict::Fail, "old"),
        ];
        assert_eq!(summary(&checks), "1 failed, 1 warnings, 3 checks");
        assert!(!healthy(&checks));
        assert!(healthy(&checks[..2]));
        assert!(!stopped_at_tables(&checks));
        assert!(stopped_at_tables(&[Check::new(
            TABLES,
            Verdict::Fail,
            "no Tidings tables"
        )]));
    }
}
