//! `tidings outbox status`: the backlog, its age and rates, per partition,
//! and the relays with the partitions each holds, measured on the database
//! or by a running daemon.

use std::time::Duration;

use clap::{Args, Subcommand};
use tidings_console::outbox::{OutboxQuery, OutboxStatus, measure};
use tidings_core::inspect::Inspect;

use crate::daemon_client::Daemon;
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
    /// How long to watch to measure the rates (`2s`, `500ms`; through a
    /// daemon, 10 s at most).
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    window: Duration,
    /// The outbox's partition count (default: as the live relays hold them, or 1).
    #[arg(long)]
    partitions: Option<u32>,
    /// Print as one JSON object on stdout.
    #[arg(long)]
    pub(crate) json: bool,
}

/// Measures on the database.
pub(crate) async fn local(store: &impl Inspect, args: &StatusArgs) -> anyhow::Result<OutboxStatus> {
    Ok(measure(store, args.window, args.partitions).await?)
}

/// Asks a running daemon to measure.
pub(crate) async fn remote(daemon: &Daemon, args: &StatusArgs) -> anyhow::Result<OutboxStatus> {
    let query = OutboxQuery {
        window_ms: Some(args.window.as_millis().try_into().unwrap_or(u64::MAX)),
        partitions: args.partitions,
    };
    daemon.get("/outbox", &query).await
}

/// Prints `status`, as one JSON object with `json`.
pub(crate) fn print(status: &OutboxStatus, json: bool) -> anyhow::Result<()> {
    if json {
        say!("{}", serde_json::to_string(status)?);
    } else {
        say_part!("{status}");
    }
    Ok(())
}
