//! `tidings dlq`: list dead letters grouped by cause, show one, redrive or
//! skip them, on either database.

use std::time::Duration;

use chrono::{DateTime, Utc};
use clap::{Args, Subcommand};
use tidings_console::actions::{PurgeRequest, Purged, RedriveReport, RedriveRequest, Redriven, Skipped};
use tidings_console::letter::LetterView;
use tidings_console::triage::{self, Cause, CauseGroup, Selection, state};
use tidings_core::{AuditStore, DeadLetter, FailureStore, Skip};

use crate::daemon_client::Daemon;
use uuid::Uuid;

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
    fn selection(&self) -> Selection {
        Selection {
            consumer: self.consumer.clone(),
            message_type: self.message_type.clone(),
            error: self.error.clone(),
            cause: self.cause.clone(),
            since: self.since,
            until: self.until,
            include_settled: self.include_settled,
        }
    }

    fn is_empty(&self) -> bool {
        self.selection().is_empty()
    }

    async fn letters<S: FailureStore>(&self, store: &S) -> anyhow::Result<Vec<DeadLetter>> {
        Ok(self.selection().letters(store).await?)
    }
}

/// The dead letter `id`, pending or (with `settled`) any.
async fn find<S: FailureStore>(store: &S, id: Uuid, settled: bool) -> anyhow::Result<Option<DeadLetter>> {
    Ok(triage::find(store, id)
        .await?
        .filter(|l| settled || state(l) == "pending"))
}

fn when(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S").to_string()
}

/// Runs one dead-letter command against `store`.
pub(crate) async fn run<S: FailureStore + tidings_core::ConsumerStore + AuditStore>(
    store: &S,
    command: Dlq,
) -> anyhow::Result<()> {
    match command {
        Dlq::List { select, each, json } => {
            let letters = select.letters(store).await?;
            if each {
                let views: Vec<LetterView> = letters.iter().map(LetterView::of).collect();
                return print_each(&views, json);
            }
            print_causes(&triage::by_cause(&letters), json)
        }
        Dlq::Show { id, json } => {
            let letter = find(store, id, true)
                .await?
                .ok_or_else(|| anyhow::anyhow!("no dead letter has id {id}"))?;
            print_letter(&LetterView::of(&letter), json)
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
            if let Some(oldest) = letters.iter().filter_map(DeadLetter::reaches_back_to).min() {
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
                let outcome = Redriven::of(l.id, store.redrive(l.id).await?);
                redriven += usize::from(outcome.message_id.is_some());
                let detail = serde_json::json!({
                    "outcome": outcome.outcome,
                    "message_id": outcome.message_id,
                    "redrive": outcome.redrive,
                    "consumer": l.consumer,
                });
                audit(store, "redrive", l.id.to_string(), detail).await?;
                print_redriven(&outcome, Some(&l.topic))?;
            }
            redrive_done(redriven, letters.len())
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
            let detail = serde_json::json!({
                "purged": purged,
                "first_ids": ids.iter().take(100).collect::<Vec<_>>(),
            });
            audit(store, "purge", "dead letters".to_owned(), detail).await?;
            say!("purged {purged} dead letter(s)");
            Ok(())
        }
        Dlq::Skip { id } => match store.skip(id).await? {
            Skip::Skipped { released_key } => {
                let detail = serde_json::json!({ "released_key": released_key });
                audit(store, "skip", id.to_string(), detail).await?;
                print_skipped(&Skipped { id, released_key })
            }
            Skip::NotFound => anyhow::bail!("no dead letter has id {id}"),
            Skip::Settled => anyhow::bail!("dead letter {id} is already redriven or skipped; nothing done"),
        },
    }
}

/// Writes the audit entry of an action this command took on the database
/// directly, as the console writes those taken through it: the actor is
/// `cli:` and the user running the command.
async fn audit<S: AuditStore>(
    store: &S,
    action: &str,
    target: String,
    detail: serde_json::Value,
) -> anyhow::Result<()> {
    let actor = crate::audit::cli_actor();
    Ok(
        tidings_console::actions::record(store, &actor, crate::audit::CLI_ROLE, action, target, detail)
            .await?,
    )
}

/// Runs one dead-letter command through a daemon's console.
pub(crate) async fn run_remote(daemon: &Daemon, command: Dlq) -> anyhow::Result<()> {
    let none: &[(&str, &str)] = &[];
    match command {
        Dlq::List { select, each, json } => {
            let selection = select.selection();
            if each {
                print_each(
                    &daemon.get::<Vec<LetterView>>("/dead-letters", &selection).await?,
                    json,
                )
            } else {
                print_causes(&daemon.get::<Vec<CauseGroup>>("/causes", &selection).await?, json)
            }
        }
        Dlq::Show { id, json } => {
            print_letter(&daemon.get(&format!("/dead-letters/{id}"), &none).await?, json)
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
            anyhow::ensure!(
                id.is_some() || all || !select.is_empty(),
                "say which dead letters: an id, a selection (--consumer, --type, --cause, --error, --since, --until), or --all"
            );
            let selection = Selection {
                include_settled: false,
                ..select.selection()
            };
            if dry_run {
                let letters: Vec<LetterView> = match id {
                    Some(id) => vec![daemon.get(&format!("/dead-letters/{id}"), &none).await?],
                    None => daemon.get("/dead-letters", &selection).await?,
                };
                for l in &letters {
                    say!(
                        "would redrive {}  {} {} ({})",
                        l.id,
                        l.consumer,
                        l.message_type.as_deref().unwrap_or("?"),
                        l.cause
                    );
                }
                say!(
                    "{} dead letter(s) would be redriven; nothing changed",
                    letters.len()
                );
                return Ok(());
            }
            let request = RedriveRequest {
                ids: id.into_iter().collect(),
                selection,
                all,
                force,
                rate: Some(rate),
            };
            let report: RedriveReport = daemon.post("/redrive", &request).await?;
            for outcome in &report.letters {
                print_redriven(outcome, None)?;
            }
            redrive_done(report.redriven, report.letters.len())
        }
        Dlq::Purge { select, all, yes } => {
            anyhow::ensure!(
                all || !select.is_empty(),
                "say which dead letters: a selection (--consumer, --type, --cause, --error, --since, --until), or --all"
            );
            anyhow::ensure!(
                yes,
                "purging through the daemon deletes the settled dead letters for good: pass --yes"
            );
            let request = PurgeRequest {
                selection: select.selection(),
                all,
            };
            let done: Purged = daemon.post("/purge", &request).await?;
            say!("purged {} dead letter(s)", done.purged);
            Ok(())
        }
        Dlq::Skip { id } => print_skipped(&daemon.post(&format!("/dead-letters/{id}/skip"), &()).await?),
    }
}

/// Prints what one redrive did; `topic` is the message's, when known.
fn print_redriven(r: &Redriven, topic: Option<&str>) -> anyhow::Result<()> {
    let message = r.message_id.map_or("?".to_owned(), |m| m.to_string());
    let redrive = r.redrive.unwrap_or(0);
    match r.outcome.as_str() {
        "enqueued" => say!(
            "redriven {}  message {message} to {} again (redrive {redrive})",
            r.id,
            topic.unwrap_or("its topic")
        ),
        "released" => say!(
            "redriven {}  message {message} released to the relay, which tries it again before the rest of its key (redrive {redrive})",
            r.id
        ),
        "edited" => say!(
            "redriven {}  message {message} to {} again with edited data (redrive {redrive})",
            r.id,
            topic.unwrap_or("its topic")
        ),
        "gone" => say!("gone {}  (no longer stored)", r.id),
        "settled" => say!("kept {}  already redriven or skipped: nothing done", r.id),
        "not-editable" => say!(
            "kept {}  set aside by the relay: fix it in the outbox or at the source, then redrive it as it stands",
            r.id
        ),
        _ => say!(
            "kept {}  its body is not a valid envelope: fix it at the source and publish it anew",
            r.id
        ),
    }
    Ok(())
}

/// Says how many of `total` went back; an error if none did.
fn redrive_done(redriven: usize, total: usize) -> anyhow::Result<()> {
    say!("{redriven} of {total} dead letter(s) redriven");
    anyhow::ensure!(
        redriven > 0,
        "none of the {total} dead letter(s) could be redriven (see above)"
    );
    Ok(())
}

fn print_skipped(s: &Skipped) -> anyhow::Result<()> {
    if s.released_key {
        say!("skipped {}; its key is released", s.id);
    } else {
        say!("skipped {}", s.id);
    }
    Ok(())
}

/// `text` safe for a terminal: control characters (an escape sequence in an
/// error or a header a foreign producer wrote) are shown escaped, not acted on.
pub(crate) fn shown(text: &str) -> std::borrow::Cow<'_, str> {
    if text.chars().any(char::is_control) {
        text.chars()
            .map(|c| {
                if c.is_control() {
                    c.escape_default().to_string()
                } else {
                    c.to_string()
                }
            })
            .collect::<String>()
            .into()
    } else {
        text.into()
    }
}

/// Prints dead letters one by one.
fn print_each(letters: &[LetterView], json: bool) -> anyhow::Result<()> {
    if json {
        say!("{}", serde_json::to_string(letters)?);
        return Ok(());
    }
    for l in letters {
        say!(
            "{}  {}  {:<9} {:<16} {:<20} {:<9} {}",
            l.id,
            when(l.created_at),
            l.state,
            shown(&l.consumer),
            shown(l.message_type.as_deref().unwrap_or("?")),
            l.fingerprint,
            shown(l.errors.last().map_or("", |f| f.error.as_str()))
        );
    }
    say!("{} dead letter(s)", letters.len());
    Ok(())
}

/// Prints dead letters grouped by cause.
fn print_causes(groups: &[CauseGroup], json: bool) -> anyhow::Result<()> {
    if json {
        say!("{}", serde_json::to_string(groups)?);
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
    for g in groups {
        say!(
            "{:>5}  {:<12}  {:<16} {:<20} {}  {}  {}",
            g.count,
            g.fingerprint,
            shown(&g.cause.consumer),
            shown(g.cause.message_type.as_deref().unwrap_or("?")),
            when(g.first_at),
            when(g.last_at),
            shown(&g.cause.to_string())
        );
    }
    let letters: usize = groups.iter().map(|g| g.count).sum();
    say!("{letters} dead letter(s), {} cause(s)", groups.len());
    Ok(())
}

/// Prints one dead letter in full.
fn print_letter(letter: &LetterView, json: bool) -> anyhow::Result<()> {
    if json {
        say!("{}", serde_json::to_string(letter)?);
    } else {
        say_part!("{}", describe(letter));
    }
    Ok(())
}

/// A dead letter in full, for people.
fn describe(l: &LetterView) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(out, "dead letter   {} ({})", l.id, l.state);
    let _ = writeln!(out, "consumer      {}", shown(&l.consumer));
    let _ = writeln!(out, "topic         {}", shown(&l.topic));
    let _ = writeln!(
        out,
        "message       {} {} key {}",
        l.message_id.map_or("?".to_owned(), |id| id.to_string()),
        shown(l.message_type.as_deref().unwrap_or("?")),
        shown(l.aggregate_key.as_deref().unwrap_or("?"))
    );
    let _ = writeln!(
        out,
        "cause         {} ({})",
        shown(&l.cause.to_string()),
        l.fingerprint
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
        let _ = writeln!(
            out,
            "  #{} {} {}: {}",
            f.attempt,
            when(f.at),
            shown(&f.class),
            shown(&f.error)
        );
    }
    let _ = writeln!(out, "headers");
    for (name, value) in &l.headers {
        let _ = writeln!(out, "  {}: {}", shown(name), shown(value));
    }
    match (&l.body, &l.body_hex) {
        (_, Some(hex)) => {
            let _ = writeln!(out, "body ({} bytes, not text; in hex)\n{hex}", hex.len() / 2);
        }
        (serde_json::Value::String(text), None) => {
            let _ = writeln!(out, "body\n{text}");
        }
        (json, None) => {
            let pretty = serde_json::to_string_pretty(json).unwrap_or_default();
            let _ = writeln!(out, "body\n{pretty}");
        }
    }
    if !l.masked.is_empty() {
        let _ = writeln!(out, "masked        {}", l.masked.join("; "));
    }
    out
}
