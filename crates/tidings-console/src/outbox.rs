//! `tidings outbox status` and `GET /api/outbox`: the backlog, its age and
//! rates over a window, per partition, and the relays with the partitions
//! each holds.

use std::collections::BTreeMap;
use std::fmt;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tidings_core::inspect::{Inspect, MemberStatus, PartitionBacklog, held_partitions, relay_holders};

/// The longest window `GET /api/outbox` watches.
pub const MAX_WINDOW: Duration = Duration::from_secs(10);

/// What `GET /api/outbox` measures over.
#[derive(Debug, Clone, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default)]
pub struct OutboxQuery {
    /// How long to watch for the rates, in milliseconds (2000 by default,
    /// 10000 at most).
    pub window_ms: Option<u64>,
    /// The outbox's partition count (default: the console's, else as the
    /// live relays hold them).
    pub partitions: Option<u32>,
}

/// What `outbox status` found.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct OutboxStatus {
    /// Records committed and not yet published.
    pub pending: u64,
    /// Age of the oldest of them.
    pub oldest_unsent_age: Option<Duration>,
    /// Over the window: records written per second (rolled-back transactions' numbers included).
    pub written_per_second: f64,
    /// Over the window: records published per second.
    pub published_per_second: f64,
    /// How long it watched.
    pub window: Duration,
    /// Every partition, with its backlog and its relay.
    pub partitions: Vec<OutboxPartition>,
    /// The relays running.
    pub relays: Vec<MemberStatus>,
}

/// One partition of the outbox, with the relay holding it.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct OutboxPartition {
    /// Its backlog.
    #[serde(flatten)]
    pub backlog: PartitionBacklog,
    /// The relay holding the partition's lease, and its fencing token.
    pub relay: Option<(String, i64)>,
}

/// Watches `store` for `window` and says what it found; `partitions` is
/// the outbox's partition count when known (else as the live relays hold
/// them, or 1).
pub async fn measure<S: Inspect + ?Sized>(
    store: &S,
    window: Duration,
    partitions: Option<u32>,
) -> tidings_core::Result<OutboxStatus> {
    let started = Instant::now();
    let (first, high_first) = (store.lag().await?, store.outbox_high_water().await?);
    tokio::time::sleep(window).await;
    let (last, high_last) = (store.lag().await?, store.outbox_high_water().await?);
    let window = started.elapsed();
    let written = (high_last - high_first).max(0) as f64;
    // Everything waiting before, plus everything written since, less what still waits.
    let published = (first.outbox_pending as f64 + written - last.outbox_pending as f64).max(0.0);
    let relays: Vec<MemberStatus> = store
        .members()
        .await?
        .into_iter()
        .filter(|m| m.is_relay())
        .collect();
    let count = partitions.unwrap_or_else(|| held_partitions(&relays));
    let holders = relay_holders(&relays);
    let backlog: BTreeMap<u32, PartitionBacklog> = store
        .outbox_backlog(count)
        .await?
        .into_iter()
        .map(|b| (b.partition, b))
        .collect();
    let partitions = (0..count)
        .map(|p| OutboxPartition {
            backlog: backlog.get(&p).cloned().unwrap_or(PartitionBacklog {
                partition: p,
                pending: 0,
                oldest_age: None,
            }),
            relay: holders.get(&p).map(|(m, fence)| ((*m).to_owned(), *fence)),
        })
        .collect();
    let seconds = window.as_secs_f64().max(1e-3);
    Ok(OutboxStatus {
        pending: last.outbox_pending,
        oldest_unsent_age: last.oldest_unsent_age,
        written_per_second: written / seconds,
        published_per_second: published / seconds,
        window,
        partitions,
        relays,
    })
}

/// `1.5 s`, or `-` for none.
pub fn age(d: Option<Duration>) -> String {
    d.map_or("-".to_owned(), |d| format!("{:.1} s", d.as_secs_f64()))
}

impl fmt::Display for OutboxStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "outbox      {} pending, oldest {}; written {:.0}/s, published {:.0}/s (over {:.1} s)",
            self.pending,
            age(self.oldest_unsent_age),
            self.written_per_second,
            self.published_per_second,
            self.window.as_secs_f64()
        )?;
        writeln!(
            f,
            "{:<11} {:>9} {:>10}  relay (fence)",
            "partition", "pending", "oldest"
        )?;
        for p in &self.partitions {
            let relay = p
                .relay
                .as_ref()
                .map_or("none".to_owned(), |(member, fence)| format!("{member} ({fence})"));
            writeln!(
                f,
                "{:<11} {:>9} {:>10}  {relay}",
                p.backlog.partition,
                p.backlog.pending,
                age(p.backlog.oldest_age)
            )?;
        }
        if self.relays.is_empty() {
            writeln!(f, "relays      none running")?;
        } else {
            writeln!(f, "relays      {} running", self.relays.len())?;
            for r in &self.relays {
                let held: Vec<String> = r.leases.iter().map(|(p, _)| p.to_string()).collect();
                writeln!(
                    f,
                    "  {:<40} holds {}",
                    r.member,
                    if held.is_empty() {
                        "nothing (standing by)".to_owned()
                    } else {
                        held.join(", ")
                    }
                )?;
            }
        }
        Ok(())
    }
}
