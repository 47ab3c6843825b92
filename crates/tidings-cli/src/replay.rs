//! `tidings replay`: re-deliver a time range of retained events to one
//! consumer, at a bounded rate, with progress; or count what it would do.
//!
//! The command records the request; a running member of the consumer
//! carries it out through its own stack (`tidings_core::replay`), so the
//! handler that runs is the service's own and its processed markers
//! suppress what it already did.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use chrono::{DateTime, Utc};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use tidings_core::replay::{Replay, ReplayRequest, ReplaySource, ReplayState, ReplayStore};
use tidings_core::{ConsumerStore, Inspect};
use uuid::Uuid;

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
    #[arg(long, default_value_t = 500.0)]
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

/// What a dry run found.
#[derive(Debug, Serialize)]
struct DryRun {
    consumer: String,
    topics: Vec<String>,
    source: ReplaySource,
    since: DateTime<Utc>,
    until: DateTime<Utc>,
    /// Events in the range: each would be re-delivered.
    events: u64,
    /// Of those, already processed: the idempotency store suppresses them.
    suppressed: u64,
    /// Of those, not processed yet: they would be handled.
    to_handle: u64,
    /// Events that do not decode (skipped).
    undecodable: u64,
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

/// Runs the command; `Ok(false)` if the replay was cancelled.
pub(crate) async fn run<S: Inspect + ReplayStore + ConsumerStore>(
    store: &S,
    args: ReplayArgs,
) -> anyhow::Result<bool> {
    let until = args.until.unwrap_or_else(Utc::now);
    anyhow::ensure!(args.since < until, "--since must be before --until");
    anyhow::ensure!(args.rate > 0.0, "--rate must be more than 0");
    let what = format!("replaying to {} from {}", args.consumer, args.since);
    crate::within_dedupe_horizon(store, args.since, &what, args.force || args.dry_run).await?;
    let lag = store.lag().await?;
    let members = store.members().await?;
    let reads_log: Vec<String> = lag
        .consumers
        .iter()
        .filter(|c| c.consumer == args.consumer)
        .map(|c| c.topic.clone())
        .collect();
    let topics: Vec<String> = if args.topics.is_empty() {
        let mut topics: Vec<String> = members
            .iter()
            .filter_map(|m| m.group_and_topic())
            .filter(|(group, _)| *group == args.consumer)
            .map(|(_, topic)| topic.to_owned())
            .chain(reads_log.iter().cloned())
            .collect();
        topics.sort();
        topics.dedup();
        topics
    } else {
        args.topics.clone()
    };
    anyhow::ensure!(
        !topics.is_empty(),
        "cannot tell which topics {} reads: no member of it is running and it has no log offsets; give --topic",
        args.consumer
    );
    let source = args.source.unwrap_or(if reads_log.is_empty() {
        ReplaySource::Outbox
    } else {
        ReplaySource::Log
    });
    let total = store.count_retained(source, &topics, args.since, until).await?;
    if let Some(url) = &args.kafka {
        return rewind_kafka(url, &args, &topics, &members).await;
    }
    if total == 0 {
        let hint = match source {
            ReplaySource::Log => "",
            ReplaySource::Outbox => {
                " (the outbox keeps sent records only with a retention: database.outbox_retention)"
            }
        };
        eprintln!(
            "nothing retained for {} on {} between {} and {until} in the {}{hint}",
            args.consumer,
            topics.join(", "),
            args.since,
            source.as_str()
        );
    }
    if args.dry_run {
        let dry = dry_run(store, &args, topics, source, until, total).await?;
        if args.json {
            say!("{}", serde_json::to_string(&dry)?);
        } else {
            say!(
                "dry run: {} event(s) of {} on {} from {} to {} ({}) would be re-delivered: \
                 {} already processed (suppressed by the idempotency store), {} to handle{}; \
                 about {:.1} s at {}/s. Nothing was changed.",
                dry.events,
                dry.consumer,
                dry.topics.join(", "),
                dry.since,
                dry.until,
                dry.source.as_str(),
                dry.suppressed,
                dry.to_handle,
                if dry.undecodable > 0 {
                    format!(", {} undecodable (skipped)", dry.undecodable)
                } else {
                    String::new()
                },
                dry.events as f64 / args.rate,
                args.rate
            );
        }
        return Ok(true);
    }
    if total == 0 {
        return Ok(true);
    }
    if !members.iter().any(|m| m.is_in_group(&args.consumer)) {
        eprintln!(
            "no member of {} is running: the replay waits until one starts",
            args.consumer
        );
    }
    let request = ReplayRequest {
        consumer: args.consumer.clone(),
        topics,
        source,
        since: args.since,
        until,
        rate: args.rate,
        total,
    };
    let id = store.request_replay(&request).await?;
    eprintln!(
        "replay {id}: {total} event(s) to re-deliver to {} at {}/s at most",
        args.consumer, args.rate
    );
    if args.no_wait {
        if args.json {
            say!("{}", serde_json::json!({ "id": id, "total": total }));
        }
        return Ok(true);
    }
    let replay = follow(store, id, total).await?;
    if args.json {
        say!("{}", serde_json::to_string(&replay)?);
    } else {
        let c = replay.counts;
        say!(
            "replay {id} {}: {} event(s) re-delivered to {}: {} suppressed (already processed), {} handled, {} failed",
            replay.state.as_str(),
            c.delivered,
            args.consumer,
            c.suppressed,
            c.handled,
            c.failed
        );
    }
    Ok(replay.state == ReplayState::Done)
}

async fn dry_run<S: ReplayStore>(
    store: &S,
    args: &ReplayArgs,
    topics: Vec<String>,
    source: ReplaySource,
    until: DateTime<Utc>,
    total: u64,
) -> anyhow::Result<DryRun> {
    let (mut events, mut suppressed, mut undecodable, mut after) = (0, 0, 0, 0);
    loop {
        let page = store
            .retained(source, &topics, args.since, until, after, 1000)
            .await?;
        let Some(last) = page.last() else { break };
        after = last.position;
        let ids: Vec<Uuid> = page
            .iter()
            .filter_map(|r| r.message.decode().ok().map(|e| e.id))
            .collect();
        undecodable += (page.len() - ids.len()) as u64;
        events += page.len() as u64;
        suppressed += store.count_processed(&args.consumer, &ids).await?;
    }
    debug_assert!(events >= total);
    Ok(DryRun {
        consumer: args.consumer.clone(),
        topics,
        source,
        since: args.since,
        until,
        events,
        suppressed,
        to_handle: events - suppressed - undecodable,
        undecodable,
    })
}

/// Shows the replay's progress until it ends; Ctrl-C cancels it.
async fn follow<S: ReplayStore>(store: &S, id: Uuid, total: u64) -> anyhow::Result<Replay> {
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
        let replay = store
            .replay(id)
            .await?
            .with_context(|| format!("replay {id} disappeared"))?;
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
                store.cancel_replay(id).await?;
                eprintln!("replay {id} cancelled at {}/{total}", c.delivered);
                return Ok(store.replay(id).await?.unwrap_or(replay));
            }
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
    }
}
