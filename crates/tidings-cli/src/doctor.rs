//! `tidings doctor`: a live deployment against the production checklist,
//! each item pass, warn or fail with its evidence.

use std::collections::BTreeSet;
use std::fmt;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use serde::Serialize;
use tidings_core::inspect::Inspect;
use tidings_core::replay::{ReplaySource, ReplayStore};
use tidings_core::{ConsumerStore, DeadLetterFilter, FailureStore, LagReport, RELAY_LETTERS};

use crate::outbox::age;
use tidings::duration::parse as parse_duration;

#[derive(Debug, Args)]
pub(crate) struct DoctorArgs {
    /// The oldest unsent outbox record may be this old.
    #[arg(long, default_value = "1m", value_parser = parse_duration)]
    max_oldest_unsent: Duration,
    /// A consumer group may be this many messages behind (database-log transport).
    #[arg(long, default_value_t = 10_000)]
    max_consumer_lag: u64,
    /// A dead letter may wait this long for a decision (redrive or skip).
    #[arg(long, default_value = "1h", value_parser = parse_duration)]
    max_dead_letter_age: Duration,
    /// A replication slot may hold this many MiB of write-ahead log.
    #[arg(long, default_value_t = 1024)]
    max_retained_wal_mib: u64,
    /// Where Prometheus answers (`http://host:9090`): checks that it has
    /// loaded Tidings' alert rules.
    #[arg(long, value_name = "URL")]
    prometheus: Option<String>,
    /// The schema registry directory: checks that it loads and holds schemas.
    #[arg(long, value_name = "DIR")]
    schemas: Option<PathBuf>,
    /// Print as JSON on stdout.
    #[arg(long)]
    json: bool,
    /// How the relays run (`relay.mode`): with `cdc`, checks that
    /// PostgreSQL decodes its log (`wal_level = logical`) and that a relay
    /// streams the group's slot.
    #[arg(long, value_enum, env = "TIDINGS_RELAY__MODE", default_value = "poll")]
    relay_mode: crate::demo::RelayModeArg,
    /// The CDC relay group (`relay.group`): its slot is `tidings_<group>`.
    #[arg(long, env = "TIDINGS_RELAY__GROUP", default_value = "relay")]
    relay_group: String,
}

/// With `--relay-mode cdc`: the server decodes its log, and a relay
/// streams the group's slot.
pub(crate) async fn cdc(store: &tidings::AnyStore, args: &DoctorArgs) -> anyhow::Result<Option<Check>> {
    use tidings_cdc_postgres::slot::{self, SlotName};
    if args.relay_mode != crate::demo::RelayModeArg::Cdc {
        return Ok(None);
    }
    let tidings::AnyStore::Postgres(pg) = store else {
        return Ok(Some(check(
            "cdc",
            Verdict::Fail,
            "relay.mode = \"cdc\" reads PostgreSQL's logical replication, and this database is not PostgreSQL",
        )));
    };
    if let Err(e) = slot::check_wal_level(pg.pool()).await {
        return Ok(Some(check("cdc", Verdict::Fail, e.to_string())));
    }
    let name = SlotName::of_group(&args.relay_group)?;
    Ok(Some(match slot::status(pg.pool(), &name).await? {
        None => check(
            "cdc",
            Verdict::Warn,
            format!("wal_level = logical; no slot {name} yet: the CDC relay makes it at start"),
        ),
        Some(s) if !s.active => check(
            "cdc",
            Verdict::Fail,
            format!(
                "no relay streams the slot {name}, which keeps {} MiB of log: start the CDC relay",
                s.retained_bytes / (1024 * 1024)
            ),
        ),
        Some(s) => check(
            "cdc",
            Verdict::Pass,
            format!(
                "wal_level = logical; a relay streams {name} ({} MiB of log kept)",
                s.retained_bytes / (1024 * 1024)
            ),
        ),
    }))
}

/// An item's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Verdict {
    Pass,
    Warn,
    Fail,
}

/// One item of the checklist.
#[derive(Debug, Serialize)]
pub(crate) struct Check {
    item: &'static str,
    verdict: Verdict,
    evidence: String,
}

fn check(item: &'static str, verdict: Verdict, evidence: impl Into<String>) -> Check {
    Check {
        item,
        verdict,
        evidence: evidence.into(),
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

/// Runs the checklist; `Ok(true)` if nothing failed.
pub(crate) async fn run<S: Inspect + FailureStore + ReplayStore + ConsumerStore>(
    store: &S,
    args: DoctorArgs,
    cdc: Option<Check>,
) -> anyhow::Result<bool> {
    let mut checks = checks(store, &args).await?;
    checks.extend(cdc);
    if args.json {
        say!("{}", serde_json::to_string(&checks)?);
    } else {
        for c in &checks {
            say!("{c}");
        }
        let failed = checks.iter().filter(|c| c.verdict == Verdict::Fail).count();
        let warned = checks.iter().filter(|c| c.verdict == Verdict::Warn).count();
        say!("{failed} failed, {warned} warnings, {} checks", checks.len());
    }
    Ok(checks.iter().all(|c| c.verdict != Verdict::Fail))
}

async fn checks<S: Inspect + FailureStore + ReplayStore + ConsumerStore>(
    store: &S,
    args: &DoctorArgs,
) -> anyhow::Result<Vec<Check>> {
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
        return Ok(vec![check("tables", Verdict::Fail, evidence)]);
    }
    let mut checks = vec![check(
        "tables",
        Verdict::Pass,
        format!("migrations 1 to {} applied", version.applied),
    )];
    let lag = store.lag().await?;
    let members = store.members().await?;
    checks.push(relay(&lag, &members));
    checks.push(outbox_age(&lag, args));
    checks.push(consumer_lag(&lag, args));
    checks.push(relay_holds(store).await?);
    checks.push(dead_letters(&lag, args));
    let consumers = known_consumers(&lag, &members);
    checks.push(dead_letter_path(store, &consumers).await?);
    checks.push(idempotency(store, &consumers).await?);
    checks.push(dedupe_horizon(store, &lag, &members).await?);
    checks.push(schemas(args));
    checks.push(alert_rules(args));
    checks.push(replication_slots(store, args, &members).await?);
    Ok(checks)
}

fn relay(lag: &LagReport, members: &[tidings_core::inspect::MemberStatus]) -> Check {
    let relays: Vec<_> = members
        .iter()
        .filter(|m| m.scope == tidings_relay::SCOPE)
        .collect();
    let publishing = relays.iter().filter(|r| !r.leases.is_empty()).count();
    match (publishing, lag.outbox_pending) {
        (0, 0) => check(
            "relay",
            Verdict::Warn,
            "no relay is running (nothing waits in the outbox)",
        ),
        (0, pending) => check(
            "relay",
            Verdict::Fail,
            format!(
                "no relay is running and {pending} records wait in the outbox (oldest {}): start `tidings run`",
                age(lag.oldest_unsent_age)
            ),
        ),
        (n, _) => {
            let held: usize = relays.iter().map(|r| r.leases.len()).sum();
            check(
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

fn outbox_age(lag: &LagReport, args: &DoctorArgs) -> Check {
    let oldest = lag.oldest_unsent_age.unwrap_or_default();
    let evidence = format!(
        "{} pending, oldest unsent {} (threshold {:.0} s)",
        lag.outbox_pending,
        age(lag.oldest_unsent_age),
        args.max_oldest_unsent.as_secs_f64()
    );
    let verdict = if oldest > args.max_oldest_unsent {
        Verdict::Fail
    } else {
        Verdict::Pass
    };
    check("outbox lag", verdict, evidence)
}

fn consumer_lag(lag: &LagReport, args: &DoctorArgs) -> Check {
    if lag.consumers.is_empty() {
        return check(
            "consumer lag",
            Verdict::Pass,
            "no group reads the database log (a broker's own lag is read from the broker)",
        );
    }
    let behind: Vec<String> = lag
        .consumers
        .iter()
        .filter(|c| c.pending > args.max_consumer_lag)
        .map(|c| format!("{} on {}: {} behind", c.consumer, c.topic, c.pending))
        .collect();
    if behind.is_empty() {
        let worst = lag.consumers.iter().map(|c| c.pending).max().unwrap_or(0);
        check(
            "consumer lag",
            Verdict::Pass,
            format!(
                "{} group(s) on the log, at most {worst} behind (threshold {})",
                lag.consumers.len(),
                args.max_consumer_lag
            ),
        )
    } else {
        check(
            "consumer lag",
            Verdict::Fail,
            format!("{} (threshold {})", behind.join("; "), args.max_consumer_lag),
        )
    }
}

/// Records the relay set aside, each holding its key: named, with why.
async fn relay_holds<S: Inspect + FailureStore>(store: &S) -> anyhow::Result<Check> {
    let holds = store.relay_holds().await?;
    if holds.is_empty() {
        return Ok(check("relay holds", Verdict::Pass, "no outbox record set aside"));
    }
    let letters = store
        .dead_letters(&DeadLetterFilter::default().consumer(RELAY_LETTERS))
        .await?;
    let named: Vec<String> = holds
        .iter()
        .map(|h| {
            let letter = letters.iter().find(|l| l.message_id == Some(h.message_id));
            let reason = letter
                .and_then(|l| l.errors.last())
                .map_or("no dead letter", |f| f.error.as_str());
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
    Ok(check(
        "relay holds",
        Verdict::Fail,
        format!(
            "{}: fix and `tidings dlq redrive ID`, or `tidings dlq skip ID`",
            named.join("; ")
        ),
    ))
}

fn dead_letters(lag: &LagReport, args: &DoctorArgs) -> Check {
    // The relay's own are the item "relay holds".
    let waiting: Vec<_> = lag
        .dead_letters
        .iter()
        .filter(|d| d.pending > 0 && d.consumer != RELAY_LETTERS)
        .collect();
    if waiting.is_empty() {
        return check("dead letters", Verdict::Pass, "none waiting for a decision");
    }
    let describe = |d: &&tidings_core::DeadLetterLag| {
        format!(
            "{}: {} waiting, oldest {}",
            d.consumer,
            d.pending,
            age(d.oldest_age)
        )
    };
    let old: Vec<String> = waiting
        .iter()
        .filter(|d| d.oldest_age.unwrap_or_default() > args.max_dead_letter_age)
        .map(describe)
        .collect();
    let threshold = format!("threshold {:.0} s", args.max_dead_letter_age.as_secs_f64());
    if old.is_empty() {
        let all: Vec<String> = waiting.iter().map(describe).collect();
        check(
            "dead letters",
            Verdict::Warn,
            format!("{} ({threshold}): `tidings dlq list`", all.join("; ")),
        )
    } else {
        check(
            "dead letters",
            Verdict::Fail,
            format!("{} ({threshold}): `tidings dlq list`", old.join("; ")),
        )
    }
}

/// Consumers the database knows of: live group members, log readers, dead letters.
fn known_consumers(lag: &LagReport, members: &[tidings_core::inspect::MemberStatus]) -> BTreeSet<String> {
    members
        .iter()
        .filter_map(|m| m.group_and_topic().map(|(group, _)| group.to_owned()))
        .chain(lag.consumers.iter().map(|c| c.consumer.clone()))
        .chain(lag.dead_letters.iter().map(|d| d.consumer.clone()))
        .filter(|c| c != RELAY_LETTERS)
        .collect()
}

async fn dead_letter_path<S: FailureStore>(store: &S, consumers: &BTreeSet<String>) -> anyhow::Result<Check> {
    if consumers.is_empty() {
        return Ok(check(
            "dead-letter path",
            Verdict::Warn,
            "no consumer seen (none running, none reading the log, no dead letters)",
        ));
    }
    // The failure store answers: every consumer of Tidings' runtime dead-letters there.
    store
        .dead_letters(&DeadLetterFilter::default().include_redriven())
        .await?;
    Ok(check(
        "dead-letter path",
        Verdict::Pass,
        format!(
            "the failure store answers for {} consumer(s): {}",
            consumers.len(),
            consumers.iter().cloned().collect::<Vec<_>>().join(", ")
        ),
    ))
}

async fn idempotency<S: Inspect>(store: &S, consumers: &BTreeSet<String>) -> anyhow::Result<Check> {
    let mut without = Vec::new();
    for consumer in consumers {
        if !store.has_processed(consumer).await? {
            without.push(consumer.clone());
        }
    }
    Ok(if consumers.is_empty() {
        check("idempotency", Verdict::Warn, "no consumer seen")
    } else if without.is_empty() {
        check(
            "idempotency",
            Verdict::Pass,
            format!(
                "processed markers recorded by all {} consumer(s)",
                consumers.len()
            ),
        )
    } else {
        check(
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
async fn dedupe_horizon<S: ReplayStore + ConsumerStore>(
    store: &S,
    lag: &LagReport,
    members: &[tidings_core::inspect::MemberStatus],
) -> anyhow::Result<Check> {
    const ITEM: &str = "dedupe horizon";
    let Some(horizon) = store.dedupe_horizon().await? else {
        return Ok(check(ITEM, Verdict::Pass, "processed markers were never deleted"));
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
            return Ok(check(
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
    Ok(check(
        ITEM,
        Verdict::Pass,
        format!("processed markers kept since {horizon}; nothing retained is older"),
    ))
}

fn schemas(args: &DoctorArgs) -> Check {
    let Some(dir) = &args.schemas else {
        return check(
            "schemas",
            Verdict::Warn,
            "not checked: give the schema registry's directory with --schemas DIR",
        );
    };
    match tidings_schema::Registry::load(dir) {
        Err(e) => check(
            "schemas",
            Verdict::Fail,
            format!("the registry does not load: {e}"),
        ),
        Ok(registry) if registry.docs().next().is_none() => check(
            "schemas",
            Verdict::Fail,
            format!(
                "no schema in {} (tidings schema generate writes them)",
                dir.display()
            ),
        ),
        Ok(registry) => {
            let types: std::collections::BTreeSet<&str> =
                registry.docs().map(|d| d.meta.message_type.as_str()).collect();
            check(
                "schemas",
                Verdict::Pass,
                format!(
                    "{} type(s), {} schema version(s) in {}",
                    types.len(),
                    registry.docs().count(),
                    dir.display()
                ),
            )
        }
    }
}

fn alert_rules(args: &DoctorArgs) -> Check {
    let Some(url) = &args.prometheus else {
        return check(
            "alert rules",
            Verdict::Warn,
            "not checked: give Prometheus' address with --prometheus URL",
        );
    };
    let loaded = match loaded_alerts(url) {
        Ok(loaded) => loaded,
        Err(e) => {
            return check(
                "alert rules",
                Verdict::Fail,
                format!("asking Prometheus at {url}: {e}"),
            );
        }
    };
    let shipped = tidings_prometheus::alert_names(tidings_prometheus::ALERT_RULES);
    let missing: Vec<&str> = shipped.iter().copied().filter(|a| !loaded.contains(*a)).collect();
    if missing.is_empty() {
        check(
            "alert rules",
            Verdict::Pass,
            format!(
                "Prometheus at {url} has all {} Tidings alerts loaded",
                shipped.len()
            ),
        )
    } else {
        check(
            "alert rules",
            Verdict::Fail,
            format!(
                "Prometheus at {url} lacks {} (load deploy/prometheus/tidings-alerts.yml)",
                missing.join(", ")
            ),
        )
    }
}

/// The alerting rule names Prometheus has loaded (`GET /api/v1/rules`).
fn loaded_alerts(url: &str) -> anyhow::Result<BTreeSet<String>> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| anyhow::anyhow!("only http:// addresses are supported"))?;
    let (authority, base) = rest.split_once('/').map_or((rest, ""), |(a, p)| (a, p));
    let mut stream = std::net::TcpStream::connect(authority)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let path = format!(
        "/{}api/v1/rules?type=alert",
        if base.is_empty() {
            String::new()
        } else {
            format!("{}/", base.trim_end_matches('/'))
        }
    );
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {authority}\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow::anyhow!("not an HTTP response"))?;
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        anyhow::bail!("{}", head.lines().next().unwrap_or("no status"));
    }
    let json: serde_json::Value = serde_json::from_str(body)?;
    Ok(json["data"]["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_array().into_iter().flatten())
        .filter(|r| r["type"] == "alerting")
        .filter_map(|r| r["name"].as_str().map(str::to_owned))
        .collect())
}

/// Every replication slot keeps write-ahead log until its reader confirms:
/// a slot past the cap fails (read or not), and so does a CDC relay's slot
/// (`tidings_<group>`) that no relay streams while no relay runs at all.
async fn replication_slots<S: Inspect>(
    store: &S,
    args: &DoctorArgs,
    members: &[tidings_core::inspect::MemberStatus],
) -> anyhow::Result<Check> {
    let slots = store.replication_slots().await?;
    if slots.is_empty() {
        return Ok(check(
            "replication slots",
            Verdict::Pass,
            "none (nothing retains write-ahead log)",
        ));
    }
    let limit = args.max_retained_wal_mib * 1024 * 1024;
    let relays = members.iter().filter(|m| m.scope == tidings_relay::SCOPE).count();
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
        check(
            "replication slots",
            Verdict::Pass,
            format!(
                "{} slot(s), {} with a reader; none retains over {} MiB",
                slots.len(),
                slots.iter().filter(|s| s.active).count(),
                args.max_retained_wal_mib
            ),
        )
    } else {
        check(
            "replication slots",
            Verdict::Fail,
            format!("{} (drop the slot or start its reader)", wrong.join("; ")),
        )
    })
}
