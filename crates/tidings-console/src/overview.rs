//! The whole pipeline at a glance: the outbox backlog per partition and the
//! relays holding them, each consumer group's lag, held keys, parked
//! messages and members, the dead letters waiting, the keys the relay
//! holds, and the replication slots.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tidings_core::inspect::{Inspect, MemberStatus, held_partitions, relay_holders};
use tidings_core::metrics::BrokerLag;

use crate::history::Sample;

/// Everything the overview shows, read at `at`.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Overview {
    /// When it was read.
    pub at: DateTime<Utc>,
    /// Outbox records not yet sent.
    pub outbox_pending: u64,
    /// Age of the oldest of them, in seconds.
    pub oldest_unsent_seconds: Option<f64>,
    /// Every partition of the outbox, with its backlog and its relay.
    pub partitions: Vec<PartitionRow>,
    /// The relays running, each with the partitions it holds.
    pub relays: Vec<Member>,
    /// Each consumer group on each topic.
    pub groups: Vec<GroupRow>,
    /// Dead letters waiting for a decision, per consumer.
    pub dead_letters: Vec<DeadLetterRow>,
    /// Keys the relay holds behind records it set aside.
    pub relay_holds: Vec<tidings_core::inspect::RelayHold>,
    /// Replication slots, with the log each keeps.
    pub slots: Vec<tidings_core::inspect::ReplicationSlot>,
}

/// One outbox partition.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct PartitionRow {
    /// Its index.
    pub partition: u32,
    /// Records waiting in it.
    pub pending: u64,
    /// Age of the oldest, in seconds.
    pub oldest_seconds: Option<f64>,
    /// The relay holding its lease, if one does.
    pub relay: Option<String>,
}

/// A live member of a relay group or a consumer group.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Member {
    /// Its id.
    pub member: String,
    /// The partitions whose lease it holds.
    pub partitions: Vec<u32>,
    /// Seconds its membership lasts without renewal.
    pub expires_in_seconds: f64,
}

/// One consumer group on one topic.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct GroupRow {
    /// The group.
    pub group: String,
    /// The topic.
    pub topic: String,
    /// Messages not yet handled: from the store on the database log, from
    /// the broker as the daemon last counted them on a broker; `None` where
    /// neither can tell.
    pub pending: Option<u64>,
    /// Where `pending` comes from.
    pub pending_from: Option<PendingFrom>,
    /// Seconds since the broker counted `pending` (for a broker's figure).
    pub counted_seconds_ago: Option<f64>,
    /// Messages the group handled per second over the last minute, over
    /// every topic it reads (its processed markers, which do not name the
    /// topic), as last sampled; `None` before the first sample.
    pub handled_per_second: Option<f64>,
    /// Keys held behind a dead letter.
    pub held_keys: u64,
    /// Messages parked behind them.
    pub parked: u64,
    /// Its live members.
    pub members: Vec<Member>,
}

/// Where a group's pending count comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum PendingFrom {
    /// The store: the database log's read positions, read with the overview.
    DatabaseLog,
    /// The broker, as the daemon's sampler last counted it.
    Broker,
}

/// One consumer's dead letters waiting for a decision.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct DeadLetterRow {
    /// The consumer (`@relay` for records the relay set aside).
    pub consumer: String,
    /// How many wait.
    pub pending: u64,
    /// Age of the oldest, in seconds.
    pub oldest_seconds: Option<f64>,
}

fn seconds(d: Option<Duration>) -> Option<f64> {
    d.map(|d| d.as_secs_f64())
}

fn member(m: &MemberStatus) -> Member {
    Member {
        member: m.member.clone(),
        partitions: m.leases.iter().map(|(p, _)| *p).collect(),
        expires_in_seconds: m.expires_in.as_secs_f64(),
    }
}

impl Overview {
    /// Reads the overview from `store`; `partitions` is the outbox's
    /// partition count when known (else as the relays hold them, or 1).
    pub async fn read<S: Inspect + ?Sized>(
        store: &S,
        partitions: Option<u32>,
    ) -> tidings_core::Result<Overview> {
        let lag = store.lag().await?;
        let members = store.members().await?;
        let relays: Vec<&MemberStatus> = members.iter().filter(|m| m.is_relay()).collect();
        let count = partitions.unwrap_or_else(|| held_partitions(&members));
        let holders = relay_holders(&members);
        let backlog: BTreeMap<u32, _> = store
            .outbox_backlog(count)
            .await?
            .into_iter()
            .map(|b| (b.partition, b))
            .collect();
        let partitions = (0..count)
            .map(|p| PartitionRow {
                partition: p,
                pending: backlog.get(&p).map_or(0, |b| b.pending),
                oldest_seconds: backlog.get(&p).and_then(|b| seconds(b.oldest_age)),
                relay: holders.get(&p).map(|(m, _)| (*m).to_owned()),
            })
            .collect();
        let mut groups: BTreeMap<(String, String), GroupRow> = BTreeMap::new();
        for c in &lag.consumers {
            let r = row(&mut groups, &c.consumer, &c.topic);
            r.pending = Some(c.pending);
            r.pending_from = Some(PendingFrom::DatabaseLog);
        }
        for p in &lag.parked {
            let r = row(&mut groups, &p.consumer, &p.topic);
            r.held_keys = p.held_keys;
            r.parked = p.messages;
        }
        for m in &members {
            if let Some((g, t)) = m.group_and_topic() {
                row(&mut groups, g, t).members.push(member(m));
            }
        }
        Ok(Overview {
            at: Utc::now(),
            outbox_pending: lag.outbox_pending,
            oldest_unsent_seconds: seconds(lag.oldest_unsent_age),
            partitions,
            relays: relays.iter().map(|m| member(m)).collect(),
            groups: groups.into_values().collect(),
            dead_letters: lag
                .dead_letters
                .iter()
                .map(|d| DeadLetterRow {
                    consumer: d.consumer.clone(),
                    pending: d.pending,
                    oldest_seconds: seconds(d.oldest_age),
                })
                .collect(),
            relay_holds: store.relay_holds().await?,
            slots: store.replication_slots().await?,
        })
    }

    /// Adds the groups' counts on the broker, as `broker` last measured
    /// them, to the groups the store cannot count: a group the broker knows
    /// and the store does not (its members all stopped) gets a row.
    pub fn with_broker_lag(mut self, broker: &BrokerLag) -> Overview {
        let mut groups: BTreeMap<(String, String), GroupRow> = std::mem::take(&mut self.groups)
            .into_iter()
            .map(|g| ((g.group.clone(), g.topic.clone()), g))
            .collect();
        let now = std::time::SystemTime::now();
        for m in broker.measured() {
            let r = row(&mut groups, &m.group, &m.topic);
            if r.pending_from == Some(PendingFrom::DatabaseLog) {
                continue;
            }
            if let Some(pending) = m.pending {
                r.pending = Some(pending);
                r.pending_from = Some(PendingFrom::Broker);
                r.counted_seconds_ago = Some(now.duration_since(m.at).unwrap_or_default().as_secs_f64());
            }
        }
        self.groups = groups.into_values().collect();
        self
    }

    /// Sets each group's handling rate from the last sample, where it was measured.
    pub fn with_rates(mut self, last: Option<&Sample>) -> Overview {
        if let Some(rates) = last.and_then(|s| s.handled_per_second.as_ref()) {
            for g in &mut self.groups {
                g.handled_per_second = Some(rates.get(&g.group).copied().unwrap_or(0.0));
            }
        }
        self
    }

    /// Dead letters waiting, over every consumer.
    pub fn dead_letters_pending(&self) -> u64 {
        self.dead_letters.iter().map(|d| d.pending).sum()
    }
}

/// The row of `group` on `topic`, made if missing.
fn row<'a>(
    groups: &'a mut BTreeMap<(String, String), GroupRow>,
    group: &str,
    topic: &str,
) -> &'a mut GroupRow {
    groups
        .entry((group.to_owned(), topic.to_owned()))
        .or_insert_with(|| GroupRow {
            group: group.to_owned(),
            topic: topic.to_owned(),
            pending: None,
            pending_from: None,
            counted_seconds_ago: None,
            handled_per_second: None,
            held_keys: 0,
            parked: 0,
            members: Vec::new(),
        })
}
