//! `tidings doctor`: a live deployment against the production checklist,
//! each item pass, warn or fail with its evidence.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use tidings_console::doctor::{self, Check, Limits, Verdict};
use tidings_core::inspect::Inspect;
use tidings_core::replay::ReplayStore;
use tidings_core::{ConsumerStore, FailureStore};

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
    pub(crate) json: bool,
    /// How the relays run (`relay.mode`): with `cdc`, checks that
    /// PostgreSQL decodes its log (`wal_level = logical`) and that a relay
    /// streams the group's slot.
    #[arg(long, value_enum, env = "TIDINGS_RELAY__MODE", default_value = "poll")]
    relay_mode: crate::demo::RelayModeArg,
    /// The CDC relay group (`relay.group`): its slot is `tidings_<group>`.
    #[arg(long, env = "TIDINGS_RELAY__GROUP", default_value = "relay")]
    relay_group: String,
}

impl DoctorArgs {
    /// The thresholds given on the command line.
    pub(crate) fn limits(&self) -> Limits {
        Limits {
            max_oldest_unsent_ms: millis(self.max_oldest_unsent),
            max_consumer_lag: self.max_consumer_lag,
            max_dead_letter_age_ms: millis(self.max_dead_letter_age),
            max_retained_wal_mib: self.max_retained_wal_mib,
        }
    }
}

/// `d` in whole milliseconds (saturating).
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// With `--relay-mode cdc`: the server decodes its log, and a relay
/// streams the group's slot.
pub(crate) async fn cdc(store: &tidings::AnyStore, args: &DoctorArgs) -> anyhow::Result<Option<Check>> {
    use tidings_cdc_postgres::slot::{self, SlotName};
    if args.relay_mode != crate::demo::RelayModeArg::Cdc {
        return Ok(None);
    }
    let tidings::AnyStore::Postgres(pg) = store else {
        return Ok(Some(Check::new(
            "cdc",
            Verdict::Fail,
            "relay.mode = \"cdc\" reads PostgreSQL's logical replication, and this database is not PostgreSQL",
        )));
    };
    if let Err(e) = slot::check_wal_level(pg.pool()).await {
        return Ok(Some(Check::new("cdc", Verdict::Fail, e.to_string())));
    }
    // The group's name is checked as the relay checks it.
    SlotName::of_group(&args.relay_group)?;
    let mut check = doctor::cdc_slot(&pg.replication_slots().await?, &args.relay_group);
    if check.verdict != Verdict::Fail {
        check.evidence = format!("wal_level = logical; {}", check.evidence);
    }
    Ok(Some(check))
}

/// The checklist against `store`: the library's items, then (unless the
/// tables stopped it) the local ones ([`local_items`]), then `cdc`.
pub(crate) async fn local<S: Inspect + FailureStore + ReplayStore + ConsumerStore>(
    store: &S,
    args: &DoctorArgs,
    cdc: Option<Check>,
) -> anyhow::Result<Vec<Check>> {
    let mut checks = doctor::checklist(store, &args.limits()).await?;
    if !doctor::stopped_at_tables(&checks) {
        checks.extend(local_items(args));
    }
    checks.extend(cdc);
    Ok(checks)
}

/// The checklist as a running daemon answers it, then the local items.
pub(crate) async fn remote(
    daemon: &crate::daemon_client::Daemon,
    args: &DoctorArgs,
) -> anyhow::Result<Vec<Check>> {
    let mut checks: Vec<Check> = daemon.get("/doctor", &args.limits()).await?;
    if !doctor::stopped_at_tables(&checks) {
        checks.extend(local_items(args));
    }
    Ok(checks)
}

/// What only this machine can check: the schema registry's directory and
/// Prometheus' alert rules, as the command line names them.
pub(crate) fn local_items(args: &DoctorArgs) -> Vec<Check> {
    vec![schemas(args), alert_rules(args)]
}

/// Prints the checks (a JSON array with `--json`, else one line each and a
/// summary); `Ok(true)` if nothing failed.
pub(crate) fn print(checks: &[Check], json: bool) -> anyhow::Result<bool> {
    if json {
        say!("{}", serde_json::to_string(checks)?);
    } else {
        for c in checks {
            say!("{c}");
        }
        say!("{}", doctor::summary(checks));
    }
    Ok(doctor::healthy(checks))
}

fn schemas(args: &DoctorArgs) -> Check {
    let Some(dir) = &args.schemas else {
        return Check::new(
            "schemas",
            Verdict::Warn,
            "not checked: give the schema registry's directory with --schemas DIR",
        );
    };
    match tidings_schema::Registry::load(dir) {
        Err(e) => Check::new(
            "schemas",
            Verdict::Fail,
            format!("the registry does not load: {e}"),
        ),
        Ok(registry) if registry.docs().next().is_none() => Check::new(
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
            Check::new(
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
        return Check::new(
            "alert rules",
            Verdict::Warn,
            "not checked: give Prometheus' address with --prometheus URL",
        );
    };
    let loaded = match loaded_alerts(url) {
        Ok(loaded) => loaded,
        Err(e) => {
            return Check::new(
                "alert rules",
                Verdict::Fail,
                format!("asking Prometheus at {url}: {e}"),
            );
        }
    };
    let shipped = tidings_prometheus::alert_names(tidings_prometheus::ALERT_RULES);
    let missing: Vec<&str> = shipped.iter().copied().filter(|a| !loaded.contains(*a)).collect();
    if missing.is_empty() {
        Check::new(
            "alert rules",
            Verdict::Pass,
            format!(
                "Prometheus at {url} has all {} Tidings alerts loaded",
                shipped.len()
            ),
        )
    } else {
        Check::new(
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
