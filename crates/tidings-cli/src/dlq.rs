//! `tidings dlq`: list dead letters grouped by cause, show one, redrive or
//! skip them, on either database.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use clap::{Args, Subcommand};
use serde::Serialize;
use tidings_core::{DeadLetter, DeadLetterFilter, FailureStore, Redrive, Skip};
use uuid::Uuid;

use crate::cause::Cause;

/// The dead-letter commands.
#[derive(Debug, Subcommand)]
pub(crate) enum Dlq {
    /// Dead letters grouped by cause (consumer, type and error shape): one
    /// bug is one line with a count. `--each` lists them one by one.
    List {
        #[command(flatten)]
        select: Select,
        /// One line per dead letter instead of per cause.
        #[arg(long)]
        each: bool,
        /// Print as JSON on stdout.
        #[arg(long)]
        json: bool,
    },
    /// One dead letter in full: its error history, headers and body.
    Show {
        /// The dead letter's id (from `list`).
        id: Uuid,
        /// Print as JSON on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Puts dead letters back in the outbox (same message id; consumers that
    /// already handled it skip it). Each redrive is recorded on the dead letter.
    Redrive {
        /// One dead letter by id; or select them with the options below.
        id: Option<Uuid>,
        #[command(flatten)]
        select: Select,
        /// Every pending dead letter the selection matches (without an id or
        /// a selection, nothing is redriven).
        #[arg(long)]
        all: bool,
        /// Print what would be redriven, and change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Redrives per second at most.
        #[arg(long, default_value_t = 100.0)]
        rate: f64,
        /// Redrive letters older than the dedupe horizon anyway: consumers
        /// that handled their messages before it handle them again.
        #[arg(long)]
        force: bool,
    },
    /// Deletes settled dead letters (redriven or skipped) the selection
    /// matches, after asking; pending ones stay (skip them first).
    Purge {
        #[command(flatten)]
        select: Select,
        /// Every settled dead letter the selection matches.
        #[arg(long)]
        all: bool,
        /// Do not ask.
        #[arg(long)]
        yes: bool,
    },
    /// Gives one dead letter up for good, releasing its key if it holds one.
    Skip {
        /// The dead letter's id.
        id: Uuid,
    },
}

/// Which dead letters.
#[derive(Debug, Clone, Default, Args)]
pub(crate) struct Select {
    /// Only this consumer's.
    #[arg(long)]
    consumer: Option<String>,
    /// Only this message type.
    #[arg(long = "type")]
    message_type: Option<String>,
    /// Only those whose last error contains this text.
    #[arg(long)]
    error: Option<String>,
    /// Only those of this cause (the fingerprint `list` prints).
    #[arg(long)]
    cause: Option<String>,
    /// Only those dead-lettered at or after this time (RFC 3339).
    #[arg(long)]
    since: Option<DateTime<Utc>>,
    /// Only those dead-lettered before this time (RFC 3339).
    #[arg(long)]
    until: Option<DateTime<Utc>>,
    /// Also those already redriven or skipped.
    #[arg(long)]
    include_settled: bool,
}

impl Select {
    fn is_empty(&self) -> bool {
        self.consumer.is_none()
            && self.message_type.is_none()
            && self.error.is_none()
            && self.cause.is_none()
            && self.since.is_none()
            && self.until.is_none()
    }

    async fn letters<S: FailureStore>(&self, store: &S) -> anyhow::Result<Vec<DeadLetter>> {
        let filter = DeadLetterFilter {
            consumer: self.consumer.clone(),
            message_type: self.message_type.clone(),
            limit: None,
            include_redriven: self.include_settled,
        };
        let mut letters = store.dead_letters(&filter).await?;
        letters.retain(|l| {
            let last_error = l.errors.last().map_or("", |f| f.error.as_str());
            self.error.as_deref().is_none_or(|e| last_error.contains(e))
                && self
                    .cause
                    .as_deref()
                    .is_none_or(|c| Cause::of(l).fingerprint() == c)
                && self.since.is_none_or(|t| l.created_at >= t)
                && self.until.is_none_or(|t| l.created_at < t)
        });
        Ok(letters)
    }
}

/// The dead letter `id`, pending or (with `settled`) any. The failure store
/// has no lookup by id: this reads the list.
async fn find<S: FailureStore>(store: &S, id: Uuid, settled: bool) -> anyhow::Result<Option<DeadLetter>> {
    let select = Select {
        include_settled: settled,
        ..Select::default()
    };
    Ok(select.letters(store).await?.into_iter().find(|l| l.id == id))
}

/// The dead letters of one cause.
#[derive(Debug, Serialize)]
struct Group {
    fingerprint: String,
    cause: Cause,
    count: usize,
    first_at: DateTime<Utc>,
    last_at: DateTime<Utc>,
    /// The newest dead letter's last error, as it was.
    example: String,
    ids: Vec<Uuid>,
}

fn groups(letters: &[DeadLetter]) -> Vec<Group> {
    let mut by_cause: BTreeMap<Cause, Vec<&DeadLetter>> = BTreeMap::new();
    for letter in letters {
        by_cause.entry(Cause::of(letter)).or_default().push(letter);
    }
    let mut groups: Vec<Group> = by_cause
        .into_iter()
        .map(|(cause, letters)| Group {
            fingerprint: cause.fingerprint(),
            count: letters.len(),
            first_at: letters.iter().map(|l| l.created_at).min().unwrap_or_default(),
            last_at: letters.iter().map(|l| l.created_at).max().unwrap_or_default(),
            example: letters
                .iter()
                .max_by_key(|l| l.created_at)
                .and_then(|l| l.errors.last())
                .map_or_else(String::new, |f| f.error.clone()),
            ids: letters.iter().map(|l| l.id).collect(),
            cause,
        })
        .collect();
    groups.sort_by(|a, b| b.count.cmp(&a.count).then(b.last_at.cmp(&a.last_at)));
    groups
}

fn when(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S").to_string()
}

fn state(letter: &DeadLetter) -> &'static str {
    match (letter.skipped_at, letter.redriven_at) {
        (Some(_), _) => "skipped",
        (None, Some(_)) => "redriven",
        (None, None) => "pending",
    }
}

/// Runs one dead-letter command against `store`.
pub(crate) async fn run<S: FailureStore + tidings_core::ConsumerStore>(
    store: &S,
    command: Dlq,
) -> anyhow::Result<()> {
    match command {
        Dlq::List { select, each, json } => {
            let letters = select.letters(store).await?;
            if each {
                if json {
                    let views: Vec<LetterView<'_>> = letters.iter().map(LetterView::of).collect();
                    say!("{}", serde_json::to_string(&views)?);
                    return Ok(());
                }
                for l in &letters {
                    say!(
                        "{}  {}  {:<9} {:<16} {:<20} {:<9} {}",
                        l.id,
                        when(l.created_at),
                        state(l),
                        l.consumer,
                        l.message_type.as_deref().unwrap_or("?"),
                        Cause::of(l).fingerprint(),
                        l.errors.last().map_or("", |f| f.error.as_str())
                    );
                }
                say!("{} dead letter(s)", letters.len());
                return Ok(());
            }
            let groups = groups(&letters);
            if json {
                say!("{}", serde_json::to_string(&groups)?);
                return Ok(());
            }
            say!(
                "{:>5}  {:<12}  {:<16} {:<20} {:<19}  {:<19}  cause",
                "count",
                "fingerprint",
                "consumer",
                "type",
                "first",
                "last"
            );
            for g in &groups {
                say!(
                    "{:>5}  {:<12}  {:<16} {:<20} {}  {}  {}",
                    g.count,
                    g.fingerprint,
                    g.cause.consumer,
                    g.cause.message_type.as_deref().unwrap_or("?"),
                    when(g.first_at),
                    when(g.last_at),
                    g.cause
                );
            }
            say!("{} dead letter(s), {} cause(s)", letters.len(), groups.len());
            Ok(())
        }
        Dlq::Show { id, json } => {
            let letter = find(store, id, true)
                .await?
                .ok_or_else(|| anyhow::anyhow!("no dead letter has id {id}"))?;
            if json {
                say!("{}", serde_json::to_string(&LetterView::of(&letter))?);
                return Ok(());
            }
            say_part!("{}", describe(&letter));
            Ok(())
        }
        Dlq::Redrive {
            id,
            select,
            all,
            dry_run,
            rate,
            force,
        } => {
            anyhow::ensure!(rate > 0.0, "--rate must be positive");
            let letters = match id {
                Some(id) => {
                    let letter = find(store, id, false)
                        .await?
                        .ok_or_else(|| anyhow::anyhow!("no pending dead letter has id {id}"))?;
                    vec![letter]
                }
                None => {
                    anyhow::ensure!(
                        all || !select.is_empty(),
                        "say which dead letters: an id, a selection (--consumer, --type, --cause, --error, --since, --until), or --all"
                    );
                    select.letters(store).await?
                }
            };
            anyhow::ensure!(
                !letters.is_empty(),
                "no pending dead letter matches the selection; nothing redriven"
            );
            // A redrive delivers the message to every group of its topic again.
            // Records the relay set aside never reached a consumer.
            if let Some(oldest) = letters
                .iter()
                .filter(|l| l.consumer != tidings_core::RELAY_LETTERS)
                .map(|l| l.created_at)
                .min()
            {
                let what = format!("redriving {} dead letter(s)", letters.len());
                crate::within_dedupe_horizon(store, oldest, &what, force || dry_run).await?;
            }
            if dry_run {
                for l in &letters {
                    say!(
                        "would redrive {}  {} {} ({})",
                        l.id,
                        l.consumer,
                        l.message_type.as_deref().unwrap_or("?"),
                        Cause::of(l)
                    );
                }
                say!(
                    "{} dead letter(s) would be redriven; nothing changed",
                    letters.len()
                );
                return Ok(());
            }
            let pause = Duration::from_secs_f64(1.0 / rate);
            let mut redriven = 0;
            for (i, l) in letters.iter().enumerate() {
                if i > 0 {
                    tokio::time::sleep(pause).await;
                }
                match store.redrive(l.id).await? {
                    Redrive::Enqueued { message_id, redrive } => {
                        redriven += 1;
                        say!(
                            "redriven {}  message {message_id} to {} again (redrive {redrive})",
                            l.id,
                            l.topic
                        );
                    }
                    Redrive::Released { message_id, redrive } => {
                        redriven += 1;
                        say!(
                            "redriven {}  message {message_id} released to the relay, which tries it again before the rest of its key (redrive {redrive})",
                            l.id
                        );
                    }
                    Redrive::NotFound => say!("gone {}  (no longer stored)", l.id),
                    Redrive::Undecodable => say!(
                        "kept {}  its body is not a valid envelope: fix it at the source and publish it anew",
                        l.id
                    ),
                }
            }
            say!("{redriven} of {} dead letter(s) redriven", letters.len());
            anyhow::ensure!(
                redriven > 0,
                "none of the {} dead letter(s) could be redriven (see above)",
                letters.len()
            );
            Ok(())
        }
        Dlq::Purge { select, all, yes } => {
            anyhow::ensure!(
                all || !select.is_empty(),
                "say which dead letters: a selection (--consumer, --type, --cause, --error, --since, --until), or --all"
            );
            let select = Select {
                include_settled: true,
                ..select
            };
            let ids: Vec<Uuid> = select
                .letters(store)
                .await?
                .into_iter()
                .filter(|l| state(l) != "pending")
                .map(|l| l.id)
                .collect();
            if ids.is_empty() {
                say!("no settled dead letter matches; nothing purged");
                return Ok(());
            }
            if !yes {
                use std::io::{BufRead, IsTerminal};
                anyhow::ensure!(
                    std::io::stdin().is_terminal(),
                    "purging {} dead letter(s) deletes them for good: pass --yes to do it without a prompt",
                    ids.len()
                );
                say_part!("delete {} settled dead letter(s) for good? type yes: ", ids.len());
                let mut answer = String::new();
                std::io::stdin().lock().read_line(&mut answer)?;
                if answer.trim() != "yes" {
                    say!("nothing purged");
                    return Ok(());
                }
            }
            let purged = store.purge(&ids).await?;
            say!("purged {purged} dead letter(s)");
            Ok(())
        }
        Dlq::Skip { id } => {
            match store.skip(id).await? {
                Skip::Skipped { released_key: true } => {
                    say!("skipped {id}; its key is released")
                }
                Skip::Skipped { released_key: false } => say!("skipped {id}"),
                Skip::NotFound => anyhow::bail!("no dead letter has id {id}"),
            }
            Ok(())
        }
    }
}

/// A dead letter as JSON: its body as JSON when it is, as text when it is
/// text, else in hex (`body_hex`).
#[derive(Serialize)]
struct LetterView<'a> {
    id: Uuid,
    state: &'static str,
    fingerprint: String,
    cause: Cause,
    consumer: &'a str,
    topic: &'a str,
    message_id: Option<Uuid>,
    message_type: Option<&'a str>,
    aggregate_key: Option<&'a str>,
    created_at: DateTime<Utc>,
    attempts: u32,
    errors: &'a [tidings_core::Failure],
    redrives: u32,
    redriven_at: Option<DateTime<Utc>>,
    skipped_at: Option<DateTime<Utc>>,
    headers: &'a tidings_core::Headers,
    /// The body as JSON when it is, as text when it is text, else null.
    body: serde_json::Value,
    /// The body in hex, when it is not text.
    #[serde(skip_serializing_if = "Option::is_none")]
    body_hex: Option<String>,
}

impl<'a> LetterView<'a> {
    fn of(l: &'a DeadLetter) -> Self {
        let cause = Cause::of(l);
        let (body, body_hex) = match Body::of(&l.body) {
            Body::Json(v) => (v, None),
            Body::Text(t) => (serde_json::Value::String(t.to_owned()), None),
            Body::Binary => (serde_json::Value::Null, Some(hex(&l.body))),
        };
        LetterView {
            id: l.id,
            state: state(l),
            fingerprint: cause.fingerprint(),
            cause,
            consumer: &l.consumer,
            topic: &l.topic,
            message_id: l.message_id,
            message_type: l.message_type.as_deref(),
            aggregate_key: l.aggregate_key.as_deref(),
            created_at: l.created_at,
            attempts: l.attempts,
            errors: &l.errors,
            redrives: l.redrives,
            redriven_at: l.redriven_at,
            skipped_at: l.skipped_at,
            headers: &l.headers,
            body,
            body_hex,
        }
    }
}

/// A dead letter in full, for people.
fn describe(l: &DeadLetter) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(out, "dead letter   {} ({})", l.id, state(l));
    let _ = writeln!(out, "consumer      {}", l.consumer);
    let _ = writeln!(out, "topic         {}", l.topic);
    let _ = writeln!(
        out,
        "message       {} {} key {}",
        l.message_id.map_or("?".to_owned(), |id| id.to_string()),
        l.message_type.as_deref().unwrap_or("?"),
        l.aggregate_key.as_deref().unwrap_or("?")
    );
    let _ = writeln!(
        out,
        "cause         {} ({})",
        Cause::of(l),
        Cause::of(l).fingerprint()
    );
    let _ = writeln!(
        out,
        "dead-lettered {} after {} attempt(s)",
        when(l.created_at),
        l.attempts
    );
    if l.redrives > 0 {
        let _ = writeln!(
            out,
            "redriven      {} time(s), last {}",
            l.redrives,
            l.redriven_at.map_or("-".to_owned(), when)
        );
    }
    if let Some(t) = l.skipped_at {
        let _ = writeln!(out, "skipped       {}", when(t));
    }
    let _ = writeln!(out, "errors");
    for f in &l.errors {
        let _ = writeln!(out, "  #{} {} {}: {}", f.attempt, when(f.at), f.class, f.error);
    }
    let _ = writeln!(out, "headers");
    for (name, value) in l.headers.iter() {
        let _ = writeln!(out, "  {name}: {value}");
    }
    match Body::of(&l.body) {
        Body::Json(v) => {
            let pretty = serde_json::to_string_pretty(&v).unwrap_or_default();
            let _ = writeln!(out, "body\n{pretty}");
        }
        Body::Text(t) => {
            let _ = writeln!(out, "body\n{t}");
        }
        Body::Binary => {
            let _ = writeln!(
                out,
                "body ({} bytes, not text; in hex)\n{}",
                l.body.len(),
                hex(&l.body)
            );
        }
    }
    out
}

/// What a dead letter's body holds, for showing it.
enum Body<'a> {
    /// A JSON document (an envelope, usually).
    Json(serde_json::Value),
    /// Text that is not JSON.
    Text(&'a str),
    /// Bytes that are not text, or text with control characters a
    /// terminal would act on: shown in hex, never raw.
    Binary,
}

impl<'a> Body<'a> {
    fn of(bytes: &'a [u8]) -> Body<'a> {
        if let Ok(v) = serde_json::from_slice(bytes) {
            return Body::Json(v);
        }
        match std::str::from_utf8(bytes) {
            Ok(t)
                if !t
                    .chars()
                    .any(|c| c.is_control() && !matches!(c, '\n' | '\t' | '\r')) =>
            {
                Body::Text(t)
            }
            _ => Body::Binary,
        }
    }
}

/// `bytes` in lowercase hex.
fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut out, b| {
            let _ = write!(out, "{b:02x}");
            out
        })
}
