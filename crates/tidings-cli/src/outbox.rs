//! `tidings outbox status`: the backlog, its age and rates, per partition,
//! and the relays with the partitions each holds.

use std::collections::BTreeMap;
use std::fmt;
use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use serde::Serialize;
use tidings_core::inspect::{Inspect, MemberStatus, PartitionBacklog, held_partitions, relay_holders};

use tidings::duration::parse as parse_duration;

/// The outbox commands.
#[derive(Debug, Subcommand)]
pub(crate) enum OutboxCommand {
    /// Pending records and the age of the oldest, write and publish rates,
    /// per partition, and the relays with the partitions each holds.
    Status(StatusArgs),
}

#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    /// How long to watch to measure the rates (`2s`, `500ms`).
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    window: Duration,
    /// The outbox's partition count (default: as the live relays hold them, or 1).
    #[arg(long)]
    partitions: Option<u32>,
    /// Print as one JSON object on stdout.
    #[arg(long)]
    json: bool,
}

/// What `outbox status` found.
#[derive(Debug, Serialize)]
pub(crate) struct OutboxStatus {
    pending: u64,
    oldest_unsent_age: Option<Duration>,
    /// Over the window: records written per second (rolled-back transactions' numbers included).
    written_per_second: f64,
    /// Over the window: records published per second.
    published_per_second: f64,
    window: Duration,
    partitions: Vec<PartitionRow>,
    relays: Vec<MemberStatus>,
}

#[derive(Debug, Serialize)]
struct PartitionRow {
    #[serde(flatten)]
    backlog: PartitionBacklog,
    /// The relay holding the partition's lease, and its fencing token.
    relay: Option<(String, i64)>,
}

pub(crate) async fn run(store: &impl Inspect, command: OutboxCommand) -> anyhow::Result<()> {
    let OutboxCommand::Status(args) = command;
    let status = status(store, &args).await?;
    if args.json {
        say!("{}", serde_json::to_string(&status)?);
    } else {
        say_part!("{status}");
    }
    Ok(())
}

async fn status(store: &impl Inspect, args: &StatusArgs) -> anyhow::Result<OutboxStatus> {
    let started = Instant::now();
    let (first, high_first) = (store.lag().await?, store.outbox_high_water().await?);
    tokio::time::sleep(args.window).await;
    let (last, high_last) = (store.lag().await?, store.outbox_high_water().await?);
    let window = started.elapsed();
    let written = (high_last - high_first).max(0) as f64;
    // Everything waiting before, plus everything written since, less what still waits.
    let published = (first.outbox_pending as f64 + written - last.outbox_pending as f64).max(0.0);
    let relays: Vec<MemberStatus> = store
        .members()
        .await?
        .into_iter()
        .filter(|m| m.scope == tidings_relay::SCOPE)
        .collect();
    let count = args.partitions.unwrap_or_else(|| held_partitions(&relays));
    let holders = relay_holders(&relays);
    let backlog: BTreeMap<u32, PartitionBacklog> = store
        .outbox_backlog(count)
        .await?
        .into_iter()
        .map(|b| (b.partition, b))
        .collect();
    let partitions = (0..count)
        .map(|p| PartitionRow {
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
pub(crate) fn age(d: Option<Duration>) -> String {
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
