//! `tidings run` with `relay.mode = "cdc"` on PostgreSQL: the daemon makes
//! its slot and publication, relays what the checkout producer commits by
//! reading the outbox's inserts from logical replication (to the database
//! log, where the consumers read it), and stops cleanly; `tidings cdc
//! status` shows the slot streamed (from the database, and through the
//! daemon's console), then `tidings cdc drop` removes it.

mod common;

use std::time::{Duration, Instant};

use common::{free_port, produce, sample, scrape, start_consumers, start_daemon, tidings, wait_for_endpoint};
use tidings_testkit::services::PgTestDb;

async fn count(db: &PgTestDb, sql: &str) -> i64 {
    sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(sql.to_owned()))
        .fetch_one(db.store.pool())
        .await
        .unwrap()
}

fn cdc(db: &PgTestDb, args: &[&str]) -> String {
    cdc_from(&["--database", &db.url], args)
}

/// `tidings cdc args`, reading from `source` (`--database URL`, `--daemon URL`).
fn cdc_from(source: &[&str], args: &[&str]) -> String {
    let out = tidings()
        .arg("cdc")
        .args(args)
        .args(source)
        .output()
        .expect("running tidings cdc");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "tidings cdc {args:?}: {stdout}{stderr}");
    stdout
}

/// The line of `tidings doctor` about `item`, for a CDC relay of `group`.
fn doctor(database: &str, item: &str, group: &str) -> String {
    doctor_from(&["--database", database], item, group)
}

/// The same, reading from `source` (`--database URL`, `--daemon URL`).
fn doctor_from(source: &[&str], item: &str, group: &str) -> String {
    let out = tidings()
        .arg("doctor")
        .args(source)
        .env("TIDINGS_RELAY__MODE", "cdc")
        .env("TIDINGS_RELAY__GROUP", group)
        .output()
        .expect("running tidings doctor");
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout
        .lines()
        .find(|l| l.get(6..).is_some_and(|rest| rest.starts_with(item)))
        .unwrap_or_else(|| panic!("no {item} line:\n{stdout}"))
        .to_owned()
}

/// A server that does not decode its log cannot serve a CDC relay: the
/// doctor fails it, saying what to change.
#[tokio::test(flavor = "multi_thread")]
async fn the_doctor_fails_cdc_on_a_server_without_logical_decoding() {
    let server = tidings_testkit::postgres::PrivatePostgres::with_settings(&["wal_level=replica"]);
    let url = server.url();
    let migrated = tidings().args(["migrate", "--database", &url]).output().unwrap();
    assert!(
        migrated.status.success(),
        "{}",
        String::from_utf8_lossy(&migrated.stderr)
    );
    let line = doctor(&url, "cdc", "relay");
    assert!(line.starts_with("FAIL"), "{line}");
    assert!(
        line.contains("wal_level = logical, and this server runs with wal_level = replica"),
        "{line}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_daemon_relays_from_logical_replication_and_its_slot_is_dropped_by_command() {
    let db = PgTestDb::new().await;
    let group = format!("test_{}", uuid::Uuid::new_v4().simple());
    let (port, console) = (free_port(), free_port());
    let mut daemon = start_daemon(
        &db.url,
        &[
            ("TIDINGS_RELAY__MODE", "cdc".to_owned()),
            ("TIDINGS_RELAY__GROUP", group.clone()),
            ("TIDINGS_RELAY__PARTITIONS", "1".to_owned()),
            ("TIDINGS_METRICS__LISTEN", format!("127.0.0.1:{port}")),
            ("TIDINGS_CONSOLE__LISTEN", format!("127.0.0.1:{console}")),
        ],
    );
    wait_for_endpoint(port, &mut daemon);
    let mut consumers = start_consumers(&db.url, &[]);
    produce(&db.url, 100, 0.05);

    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let unsent = count(&db, "SELECT count(*) FROM tidings_outbox").await;
        let logged = count(&db, "SELECT count(*) FROM tidings_log").await;
        if unsent == 0 && logged >= 300 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "after 120 s: {unsent} unsent, {logged} logged\n{}",
            daemon.stderr()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let log = daemon.stderr();
    assert!(
        log.contains(&format!("relay (cdc, slot tidings_{group})")),
        "{log}"
    );
    let status = cdc(&db, &["status", "--group", &group]);
    assert!(
        status.contains(&format!("slot              tidings_{group}")),
        "{status}"
    );
    assert!(status.contains("streamed now      yes"), "{status}");
    // The daemon's console reads the same slot; dropping it is left to
    // whoever holds the database's credentials.
    let console = format!("http://127.0.0.1:{console}");
    let remote = cdc_from(&["--daemon", &console], &["status", "--group", &group]);
    assert_eq!(
        remote.lines().take(2).collect::<Vec<_>>(),
        status.lines().take(2).collect::<Vec<_>>(),
        "{remote}"
    );
    assert!(remote.contains("not confirmed"), "{remote}");
    let refused = tidings()
        .args(["cdc", "drop", "--group", &group, "--daemon", &console])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && stderr.contains("tidings cdc drop --database"),
        "{stderr}"
    );

    // The slot guard's figures, and every one the alert rules use.
    let slot = format!("{{slot=\"tidings_{group}\"}}");
    let deadline = Instant::now() + Duration::from_secs(20);
    let metrics = loop {
        let metrics = scrape(port).expect("the daemon serves its metrics");
        if sample(&metrics, &format!("tidings_cdc_slot_active{slot}")) == 1.0 {
            break metrics;
        }
        assert!(
            Instant::now() < deadline,
            "the slot is not seen streamed:\n{metrics}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(
        sample(&metrics, &format!("tidings_cdc_slot_retained_bytes{slot}")) > 0.0,
        "{metrics}"
    );
    assert!(
        sample(&metrics, &format!("tidings_cdc_slot_stalled_seconds{slot}")) < 60.0,
        "{metrics}"
    );
    for name in tidings_prometheus::metrics_named_in(tidings_prometheus::ALERT_RULES)
        .into_iter()
        .filter(|name| name.starts_with("tidings_cdc_"))
    {
        assert!(
            metrics.contains(&format!("\n{name}")),
            "the alert rules use {name}, not served"
        );
    }

    let line = doctor(&db.url, "cdc", &group);
    assert!(line.starts_with("pass"), "{line}");
    assert!(
        line.contains(&format!("a relay streams tidings_{group}")),
        "{line}"
    );
    // The daemon's console answers the same checklist, its CDC slot included.
    for item in ["cdc", "replication slots", "relay", "tables"] {
        let remote = doctor_from(&["--daemon", &console], item, &group);
        let local = doctor(&db.url, item, &group);
        assert_eq!(
            remote.get(..4),
            local.get(..4),
            "{item}: {remote} against {local}"
        );
    }
    let remote = doctor_from(&["--daemon", &console], "cdc", &group);
    assert!(
        remote.contains(&format!("a relay streams tidings_{group}")),
        "{remote}"
    );

    assert!(daemon.terminate().success(), "{}", daemon.stderr());
    consumers.terminate();
    // Each record went to the log once: one relay streamed through.
    let ids = count(&db, "SELECT count(DISTINCT md5(body)) FROM tidings_log").await;
    assert_eq!(ids, count(&db, "SELECT count(*) FROM tidings_log").await);

    // The daemon gone, its slot has no reader: the doctor says so, and how
    // to drop it.
    let cdc_line = doctor(&db.url, "cdc", &group);
    assert!(cdc_line.starts_with("FAIL"), "{cdc_line}");
    assert!(
        cdc_line.contains(&format!("no relay streams the slot tidings_{group}")),
        "{cdc_line}"
    );
    let line = doctor(&db.url, "replication slots", &group);
    assert!(line.starts_with("FAIL"), "{line}");
    assert!(
        line.contains(&format!("tidings_{group} has no reader and no relay runs")),
        "{line}"
    );
    assert!(
        line.contains(&format!("tidings cdc drop --group {group}")),
        "{line}"
    );

    let dropped = cdc(&db, &["drop", "--group", &group]);
    assert!(
        dropped.contains(&format!("dropped the slot and the publication tidings_{group}")),
        "{dropped}"
    );
    let status = cdc(&db, &["status", "--group", &group]);
    assert!(status.contains("no slot"), "{status}");
    let line = doctor(&db.url, "replication slots", &group);
    assert!(!line.contains(&format!("tidings_{group}")), "{line}");
    db.drop_schema().await;
}

/// `tidings demo checkout --relay-mode cdc` on PostgreSQL over the
/// database log, NATS, RabbitMQ and Kafka, with poisoned orders: nothing
/// lost, no order violated, no effect twice, and no slot left behind.
#[tokio::test(flavor = "multi_thread")]
async fn the_checkout_demo_relays_from_logical_replication_over_every_transport() {
    let brokers = [
        None,
        Some(tidings_testkit::nats::nats_url()),
        Some(tidings_testkit::rabbitmq::amqp_url()),
        Some(tidings_testkit::kafka::kafka_url()),
    ];
    for broker in brokers {
        let db = PgTestDb::new().await;
        let mut command = tidings();
        command
            .env("RUST_LOG", "error")
            .args(["demo", "checkout", "--json", "--relay-mode", "cdc"])
            .args(["--orders", "200", "--poison-rate", "0.05", "--timeout", "120"])
            .args(["--database", &db.url]);
        if let Some(broker) = &broker {
            command.args(["--broker", broker]);
        }
        let out = command.output().expect("running tidings demo");
        let s = common::summary_of(&out);
        let over = broker.as_deref().unwrap_or("the database log");
        assert_eq!(s["drained"], true, "{over}: {s:#}");
        for invariant in ["lost", "order_violations", "duplicated_effects"] {
            assert_eq!(common::n(&s, invariant), 0, "{over}: {invariant} in {s:#}");
        }
        assert_eq!(common::n(&s, "events_committed"), 600, "{over}: {s:#}");
        assert_eq!(
            s["dead_lettered"]["inventory"], s["poisoned_orders"],
            "{over}: each poisoned order is dead-lettered: {s:#}"
        );
        let slots = count(
            &db,
            "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'tidings_demo'",
        )
        .await;
        assert_eq!(slots, 0, "{over}: a whole run drops its slot");
        db.drop_schema().await;
    }
}
