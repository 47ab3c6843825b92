//! `tidings replay`: re-deliver a time range of retained events to one
//! consumer, at a bounded rate, with progress; or count what it would do.
//!
//! The command records the request, on the database or through a running
//! daemon (`--daemon`); a running member of the consumer carries it out
//! through its own stack (`tidings_core::replay`), so the handler that runs
//! is the service's own and its processed markers suppress what it already
//! did.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use chrono::{DateTime, Utc};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use tidings_console::ConsoleStore;
use tidings_console::replay::{DryRun, ReplayAsk, Replayed};
use tidings_core::replay::{Replay, ReplayRequest, ReplaySource, ReplayState};
use uuid::Uuid;

use crate::audit::{CLI_ROLE, cli_actor};
use crate::daemon_client::Daemon;

use tidings::duration::parse as parse_duration;

#[derive(Debug, Args)]
pub(crate) struct ReplayArgs {
    /// The consumer (group) to re-deliver to; a member of it must be running.
    #[arg(long)]
    consumer: String,
    /// From: an RFC 3339 time (`2026-12-01T09:00:00Z`), or a duration ago (`2h`, `1d`).
    #[arg(long, value_parser = parse_time)]
    since: DateTime<Utc>,
    /// Until (excluded), the same way (default: now).
    #[arg(long, value_parser = parse_time)]
    until: Option<DateTime<Utc>>,
    /// Only this topic (repeatable; default: every topic the consumer reads).
    #[arg(long = "topic", value_name = "TOPIC")]
    topics: Vec<String>,
    /// Where the retained events are: `log` (the database log's entries) or
    /// `outbox` (sent records kept for retention); default: the log if the
    /// consumer reads it, else the outbox.
    #[arg(long, value_parser = parse_source)]
    source: Option<ReplaySource>,
    /// Events per second at most.
    #[arg(long, default_value_t = tidings_console::replay::DEFAULT_RATE)]
    rate: f64,
    /// Count what would be re-delivered and what the idempotency store
    /// would suppress, and change nothing.
    #[arg(long)]
    dry_run: bool,
    /// Record the request and return without following it.
    #[arg(long)]
    no_wait: bool,
    /// Print the outcome as JSON on stdout.
    #[arg(long)]
    json: bool,
    /// Replay from before the dedupe horizon anyway: what the consumer
    /// handled before it is handled, and its effects done, again.
    #[arg(long)]
    force: bool,
    /// Rewind the consumer's group on this Kafka cluster (`kafka://host:9092`)
    /// instead: its members re-read what the topics retain from --since
    /// (there is no --until). Stop the consumer's members first.
    #[arg(long, value_name = "URL")]
    kafka: Option<String>,
    /// With --kafka: the topic and group prefix the system uses (`broker.prefix`).
    #[arg(long, default_value = "", requires = "kafka")]
    kafka_prefix: String,
    /// With --kafka: partitions per topic (`broker.partitions`).
    #[arg(long, default_value_t = 4, requires = "kafka")]
    kafka_partitions: u32,
}

fn parse_time(text: &str) -> Result<DateTime<Utc>, String> {
    if let Ok(t) = DateTime::parse_from_rfc3339(text) {
        return Ok(t.with_timezone(&Utc));
    }
    let ago = parse_duration(text)
        .map_err(|_| format!("{text:?} is neither an RFC 3339 time nor a duration ago (2h, 1d)"))?;
    Ok(Utc::now() - chrono::Duration::from_std(ago).map_err(|e| e.to_string())?)
}

fn parse_source(text: &str) -> Result<ReplaySource, String> {
    ReplaySource::parse(text).ok_or_else(|| format!("{text:?} is not a source: log or outbox"))
}

/// `--kafka`: rewinds the group's committed offsets to `--since` on each topic.
async fn rewind_kafka(
    url: &str,
    args: &ReplayArgs,
    topics: &[String],
    members: &[tidings_core::inspect::MemberStatus],
) -> anyhow::Result<bool> {
    anyhow::ensure!(
        url.starts_with("kafka://"),
        "--kafka takes a kafka://host:port URL"
    );
    anyhow::ensure!(
        args.until.is_none() && args.source.is_none(),
        "a Kafka rewind re-reads everything retained from --since: --until and --source do not apply"
    );
    let running: Vec<&str> = members
        .iter()
        .filter(|m| m.is_in_group(&args.consumer))
        .map(|m| m.member.as_str())
        .collect();
    anyhow::ensure!(
        running.is_empty() || args.dry_run,
        "{} has running members ({}): stop them first, a running member commits its position over the rewind",
        args.consumer,
        running.join(", ")
    );
    let options = tidings_broker_kafka::KafkaOptions::default()
        .prefix(&args.kafka_prefix)
        .partitions(args.kafka_partitions);
    let kafka = tidings_broker_kafka::KafkaTransport::connect_with(url, options)
        .await
        .with_context(|| format!("connecting to Kafka at {}", tidings_core::secret::redact_url(url)))?;
    let since = std::time::SystemTime::from(args.since);
    let mut outcome = Vec::new();
    for topic in topics {
        let rewind = if args.dry_run {
            kafka.plan_rewind(&args.consumer, topic, since).await?
        } else {
            kafka.rewind(&args.consumer, topic, since).await?
        };
        if !args.json {
            say!(
                "{}{} {} on {topic}: {} record(s) to read again ({})",
                if args.dry_run { "dry run: " } else { "" },
                if args.dry_run { "would rewind" } else { "rewound" },
                args.consumer,
                rewind.messages,
                rewind
                    .partitions
                    .iter()
                    .map(|p| format!(
                        "partition {}: {} -> {}",
                        p.partition,
                        p.from.map_or("none".to_owned(), |f| f.to_string()),
                        p.to
                    ))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        outcome.push(serde_json::json!({"topic": topic, "messages": rewind.messages}));
    }
    if args.json {
        say!(
            "{}",
            serde_json::json!({"consumer": args.consumer, "dry_run": args.dry_run, "topics": outcome})
        );
    }
    Ok(true)
}

impl ReplayArgs {
    /// What this command asks.
    fn ask(&self) -> ReplayAsk {
        ReplayAsk {
            consumer: self.consumer.clone(),
            since: self.since,
            until: self.until,
            topics: self.topics.clone(),
            source: self.source,
            rate: Some(self.rate),
            dry_run: self.dry_run,
            force: self.force,
        }
    }
}

/// Runs the command on the database; `Ok(false)` if the replay was cancelled.
pub(crate) async fn local<S: ConsoleStore>(store: &S, args: ReplayArgs) -> anyhow::Result<bool> {
    if let Some(url) = &args.kafka {
        // Resolves the topics and checks the range as any replay, then
        // rewinds the group on the cluster instead of recording a request.
        let resolved = tidings_console::replay::resolve(store, &args.ask()).await?;
        for note in &resolved.notes {
            eprintln!("warning: {note}");
        }
        let members = store.members().await?;
        return rewind_kafka(url, &args, &resolved.request.topics, &members).await;
    }
    let answer = tidings_console::replay::ask(store, &args.ask(), &cli_actor(), CLI_ROLE).await?;
    finish(&Local(store), answer, &args).await
}

/// Runs the command through a running daemon's console.
pub(crate) async fn remote(daemon: &Daemon, args: ReplayArgs) -> anyhow::Result<bool> {
    anyhow::ensure!(
        args.kafka.is_none(),
        "--kafka rewinds a group on the cluster from here: run it with --database, not --daemon"
    );
    let answer: Replayed = daemon.post("/replays", &args.ask()).await?;
    finish(daemon, answer, &args).await
}

/// A dry run as `--json` prints it: the request as resolved, and what it found.
#[derive(Debug, Serialize)]
struct DryRunReport<'a> {
    #[serde(flatten)]
    request: &'a ReplayRequest,
    #[serde(flatten)]
    found: &'a DryRun,
}

/// Says what the answer found, then follows the replay it recorded.
async fn finish(replays: &impl Replays, answer: Replayed, args: &ReplayArgs) -> anyhow::Result<bool> {
    for note in &answer.notes {
        eprintln!("warning: {note}");
    }
    let request = &answer.request;
    if let Some(dry) = &answer.dry_run {
        if args.json {
            say!(
                "{}",
                serde_json::to_string(&DryRunReport { request, found: dry })?
            );
        } else {
            say!(
                "dry run: {} event(s) of {} on {} from {} to {} ({}) would be re-delivered: \
                 {} already processed (suppressed by the idempotency store), {} to handle{}; \
                 about {:.1} s at {}/s. Nothing was changed.",
                dry.events,
                request.consumer,
                request.topics.join(", "),
                request.since,
                request.until,
                request.source.as_str(),
                dry.suppressed,
                dry.to_handle,
                if dry.undecodable > 0 {
                    format!(", {} undecodable (skipped)", dry.undecodable)
                } else {
                    String::new()
                },
                dry.events as f64 / request.rate,
                request.rate
            );
        }
        return Ok(true);
    }
    let Some(id) = answer.id else {
        return Ok(true);
    };
    let total = request.total;
    eprintln!(
        "replay {id}: {total} event(s) to re-deliver to {} at {}/s at most",
        request.consumer, request.rate
    );
    if args.no_wait {
        if args.json {
            say!("{}", serde_json::json!({ "id": id, "total": total }));
        }
        return Ok(true);
    }
    let replay = follow(replays, id, total).await?;
    if args.json {
        say!("{}", serde_json::to_string(&replay)?);
    } else {
        let c = replay.counts;
        say!(
            "replay {id} {}: {} event(s) re-delivered to {}: {} suppressed (already processed), {} handled, {} failed",
            replay.state.as_str(),
            c.delivered,
            request.consumer,
            c.suppressed,
            c.handled,
            c.failed
        );
    }
    Ok(replay.state == ReplayState::Done)
}

/// Where a recorded replay is followed: the database, or a daemon.
trait Replays {
    /// The replay `id` as it stands.
    async fn get(&self, id: Uuid) -> anyhow::Result<Replay>;
    /// Cancels it (audited).
    async fn cancel(&self, id: Uuid) -> anyhow::Result<Replay>;
}

/// The database, directly.
struct Local<'a, S>(&'a S);

impl<S: ConsoleStore> Replays for Local<'_, S> {
    async fn get(&self, id: Uuid) -> anyhow::Result<Replay> {
        Ok(tidings_console::replay::get(self.0, id).await?)
    }

    async fn cancel(&self, id: Uuid) -> anyhow::Result<Replay> {
        Ok(tidings_console::replay::cancel(self.0, id, &cli_actor(), CLI_ROLE).await?)
    }
}

impl Replays for Daemon {
    async fn get(&self, id: Uuid) -> anyhow::Result<Replay> {
        Daemon::get(self, &format!("/replays/{id}"), &()).await
    }

    async fn cancel(&self, id: Uuid) -> anyhow::Result<Replay> {
        self.post(&format!("/replays/{id}/cancel"), &()).await
    }
}

/// Shows the replay's progress until it ends; Ctrl-C cancels it.
async fn follow(replays: &impl Replays, id: Uuid, total: u64) -> anyhow::Result<Replay> {
    let bar = if std::io::stderr().is_terminal() {
        let bar = ProgressBar::new(total);
        bar.set_style(
            ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} re-delivered · {msg} · ETA {eta}",
            )
            .expect("valid template"),
        );
        bar
    } else {
        ProgressBar::hidden()
    };
    let started = Instant::now();
    let mut last_line = started.checked_sub(Duration::from_secs(2)).unwrap_or(started);
    let interrupted = tokio::signal::ctrl_c();
    tokio::pin!(interrupted);
    loop {
        let replay = replays.get(id).await?;
        let c = replay.counts;
        bar.set_position(c.delivered);
        bar.set_message(format!(
            "{} suppressed, {} handled, {} failed",
            c.suppressed, c.handled, c.failed
        ));
        if bar.is_hidden() && last_line.elapsed() >= Duration::from_secs(2) {
            last_line = Instant::now();
            let elapsed = started.elapsed().as_secs_f64();
            let rate = c.delivered as f64 / elapsed.max(1e-3);
            let eta = if rate > 0.0 {
                format!("{:.0} s", total.saturating_sub(c.delivered) as f64 / rate)
            } else {
                "-".to_owned()
            };
            eprintln!(
                "[{elapsed:>5.1} s] {} {}/{total} re-delivered ({} suppressed, {} handled, {} failed), ETA {eta}",
                replay.state.as_str(),
                c.delivered,
                c.suppressed,
                c.handled,
                c.failed
            );
        }
        if replay.state.is_final() {
            bar.finish_and_clear();
            return Ok(replay);
        }
        tokio::select! {
            _ = &mut interrupted => {
                bar.finish_and_clear();
                let cancelled = match replays.cancel(id).await {
                    Ok(cancelled) => cancelled,
                    // It ended between the two reads (409), or the cancel
                    // was refused: said, and the replay shown as it stands.
                    Err(e) => {
                        eprintln!("replay {id} was not cancelled: {e:#}");
                        replays.get(id).await?
                    }
                };
                eprintln!("replay {id} {} at {}/{total}", cancelled.state.as_str(), cancelled.counts.delivered);
                return Ok(cancelled);
            }
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
    }
}
