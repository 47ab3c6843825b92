//! `tidings doctor` and `tidings outbox status` on the checkout system on
//! PostgreSQL, with a real Prometheus: the doctor passes a healthy
//! deployment, and fails naming the item when the alert rules are not
//! loaded, when a dead letter has waited past the threshold, and when the
//! relay is stopped with a backlog.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Process, free_port, produce, start_consumers, start_daemon, tidings, wait_drained};
use serde_json::Value;
use tidings_testkit::services::PgTestDb;

/// A Prometheus server of its own on a free port, with `rules` loaded (or none).
fn start_prometheus(rules: Option<&Path>) -> (Process, String) {
    let dir = std::env::temp_dir().join(format!("tidings-prometheus-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut config = "global:\n  evaluation_interval: 1s\n".to_owned();
    if let Some(rules) = rules {
        config.push_str(&format!("rule_files:\n  - {}\n", rules.display()));
    }
    std::fs::write(dir.join("prometheus.yml"), config).unwrap();
    let port = free_port();
    let mut command = Command::new("prometheus");
    command.args([
        &format!("--config.file={}", dir.join("prometheus.yml").display()),
        &format!("--web.listen-address=127.0.0.1:{port}"),
        &format!("--storage.tsdb.path={}", dir.join("data").display()),
    ]);
    let mut process = Process::start(command, "prometheus");
    let url = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Some(status) = process.child.try_wait().unwrap() {
            panic!(
                "prometheus exited ({status}); it comes with Debian's prometheus package (scripts/test installs it):\n{}",
                process.stderr()
            );
        }
        assert!(
            Instant::now() < deadline,
            "Prometheus did not listen on {port}:\n{}",
            process.stderr()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    (process, url)
}

fn rules_file() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy/prometheus/tidings-alerts.yml")
}

/// `tidings doctor --json ...`: (exit code, checks by item).
fn doctor(database: &str, args: &[&str]) -> (i32, Vec<Value>) {
    let out = tidings()
        .args(["doctor", "--json", "--database", database])
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let checks: Vec<Value> = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}{}", String::from_utf8_lossy(&out.stderr)));
    (out.status.code().unwrap(), checks)
}

fn item<'a>(checks: &'a [Value], name: &str) -> &'a Value {
    checks
        .iter()
        .find(|c| c["item"] == name)
        .unwrap_or_else(|| panic!("no {name} in {checks:#?}"))
}

fn outbox_status(database: &str) -> Value {
    let out = tidings()
        .args([
            "outbox",
            "status",
            "--json",
            "--window",
            "300ms",
            "--database",
            database,
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn doctor_passes_a_healthy_deployment_and_names_what_fails() {
    let db = PgTestDb::new().await;
    let (_prometheus, with_rules) = start_prometheus(Some(&rules_file()));
    let (_bare, without_rules) = start_prometheus(None);
    let console = free_port();
    let mut daemon = start_daemon(
        &db.url,
        &[
            ("TIDINGS_METRICS__LISTEN", String::new()),
            ("TIDINGS_CONSOLE__LISTEN", format!("127.0.0.1:{console}")),
        ],
    );
    let console = format!("http://127.0.0.1:{console}");
    let mut consumers = start_consumers(&db.url, &[]);
    produce(&db.url, 100, 0.0);
    wait_drained(&db.url);

    // Healthy: everything passes, the checkout system's registry included.
    let schemas = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/checkout/schemas");
    let (code, checks) = doctor(&db.url, &["--prometheus", &with_rules, "--schemas", schemas]);
    assert_eq!(code, 0, "{checks:#?}");
    for c in &checks {
        assert_eq!(c["verdict"], "pass", "{c:#}");
    }
    assert!(
        item(&checks, "schemas")["evidence"]
            .as_str()
            .unwrap()
            .starts_with("8 type(s), 8 schema version(s)"),
        "{checks:#?}"
    );
    assert!(
        item(&checks, "relay")["evidence"]
            .as_str()
            .unwrap()
            .starts_with("1 relay(s) publishing, holding 4 partition(s)"),
        "{checks:#?}"
    );
    assert!(
        item(&checks, "dead-letter path")["evidence"]
            .as_str()
            .unwrap()
            .contains("loyalty"),
        "{checks:#?}"
    );
    let text = tidings()
        .args(["doctor", "--database", &db.url, "--prometheus", &with_rules])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("pass  relay") && text.contains("0 failed, 1 warnings"),
        "{text}"
    );

    // The outbox's status: empty, four partitions, all held by the one relay.
    let status = outbox_status(&db.url);
    assert_eq!(status["pending"], 0, "{status:#}");
    assert_eq!(status["partitions"].as_array().unwrap().len(), 4, "{status:#}");
    assert!(
        status["partitions"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["relay"].is_array()),
        "{status:#}"
    );
    assert_eq!(status["relays"].as_array().unwrap().len(), 1, "{status:#}");

    // Prometheus without Tidings' rules.
    let (code, checks) = doctor(&db.url, &["--prometheus", &without_rules]);
    assert_eq!(code, 1);
    let rules = item(&checks, "alert rules");
    assert_eq!(rules["verdict"], "fail");
    assert!(
        rules["evidence"]
            .as_str()
            .unwrap()
            .contains("TidingsRelayStalled"),
        "{rules:#}"
    );

    // Dead letters past the threshold.
    produce(&db.url, 60, 0.2);
    wait_drained(&db.url);
    let (code, checks) = doctor(&db.url, &[]);
    assert_eq!(code, 0, "young dead letters only warn: {checks:#?}");
    assert_eq!(item(&checks, "dead letters")["verdict"], "warn");
    std::thread::sleep(Duration::from_millis(1500));
    let (code, checks) = doctor(&db.url, &["--max-dead-letter-age", "1s"]);
    assert_eq!(code, 1);
    let dead = item(&checks, "dead letters");
    assert_eq!(dead["verdict"], "fail", "{dead:#}");
    assert!(
        dead["evidence"].as_str().unwrap().starts_with("inventory: "),
        "{dead:#}"
    );
    // The daemon's console answers the same checklist under the same
    // thresholds; the schema registry is checked where the command runs.
    let out = tidings()
        .args(["doctor", "--json", "--daemon", &console])
        .args(["--max-dead-letter-age", "1s", "--schemas", schemas])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let remote: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    for name in ["tables", "relay", "dead-letter path", "idempotency"] {
        assert_eq!(item(&remote, name), item(&checks, name), "{name}");
    }
    // Its evidence says how old the oldest is, which has grown meanwhile.
    let dead = item(&remote, "dead letters");
    assert_eq!(dead["verdict"], "fail", "{dead:#}");
    assert!(
        dead["evidence"].as_str().unwrap().starts_with("inventory: "),
        "{dead:#}"
    );
    assert_eq!(item(&remote, "schemas")["verdict"], "pass", "{remote:#?}");

    // The relay stopped, with a backlog.
    let status = daemon.terminate();
    assert!(status.success(), "{}", daemon.stderr());
    produce(&db.url, 20, 0.0);
    let (code, checks) = doctor(&db.url, &[]);
    assert_eq!(code, 1);
    let relay = item(&checks, "relay");
    assert_eq!(relay["verdict"], "fail", "{relay:#}");
    assert!(
        relay["evidence"]
            .as_str()
            .unwrap()
            .starts_with("no relay is running and "),
        "{relay:#}"
    );
    let status = outbox_status(&db.url);
    assert!(status["pending"].as_u64().unwrap() >= 20, "{status:#}");
    assert!(status["relays"].as_array().unwrap().is_empty(), "{status:#}");
    assert_eq!(status["published_per_second"], 0.0, "{status:#}");

    // Processed markers deleted while the log still holds their events
    // (a dedupe retention shorter than the log's): a replay would double.
    use tidings_core::ConsumerStore;
    db.store.forget_processed(Duration::ZERO, 100_000).await.unwrap();
    let (code, checks) = doctor(&db.url, &[]);
    assert_eq!(code, 1);
    let horizon = item(&checks, "dedupe horizon");
    assert_eq!(horizon["verdict"], "fail", "{horizon:#}");
    assert!(
        horizon["evidence"]
            .as_str()
            .unwrap()
            .contains("retained in the log are older than the dedupe horizon"),
        "{horizon:#}"
    );

    assert!(consumers.terminate().success(), "{}", consumers.stderr());
    db.drop_schema().await;
}

#[tokio::test]
async fn doctor_fails_on_a_database_without_tidings_tables() {
    let path = std::env::temp_dir().join(format!("tidings-empty-{}.db", uuid::Uuid::new_v4().simple()));
    let url = format!("sqlite://{}", path.display());
    // An empty file is an empty SQLite database (doctor creates none itself).
    std::fs::File::create(&path).unwrap();
    let (code, checks) = doctor(&url, &[]);
    assert_eq!(code, 1);
    assert_eq!(checks.len(), 1);
    assert_eq!(checks[0]["item"], "tables");
    assert!(
        checks[0]["evidence"]
            .as_str()
            .unwrap()
            .contains("run `tidings migrate`"),
        "{checks:#?}"
    );
    let _ = std::fs::remove_file(&path);
}

/// The operator commands run on MySQL (MariaDB here) like on the others: a
/// migrated database passes the table check, shows no backlog, and its
/// outbox status names the partition and no relay.
#[tokio::test]
async fn doctor_and_outbox_status_read_a_mysql_database() {
    let db = tidings_testkit::services::MySqlTestDb::new().await;
    let (_, checks) = doctor(&db.url, &[]);
    assert_eq!(item(&checks, "tables")["verdict"], "pass", "{checks:#?}");
    assert_eq!(item(&checks, "outbox lag")["verdict"], "pass", "{checks:#?}");
    let status = outbox_status(&db.url);
    assert_eq!(status["pending"], 0, "{status:#}");
    assert_eq!(status["relays"].as_array().unwrap().len(), 0, "{status:#}");
    let out = tidings().args(["lag", "--database", &db.url]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("outbox pending"));
    db.drop_database().await;
}

/// A record nobody can decode, written by hand into a running deployment's
/// outbox: the daemon sets it aside and goes on with every other key, and
/// with the same key's later records held; `dlq list` and `doctor` name
/// it; a skip lets its key go on.
#[tokio::test(flavor = "multi_thread")]
async fn a_record_the_relay_sets_aside_is_named_and_skipped() {
    use tidings_core::{DeadLetterFilter, FailureStore, RELAY_LETTERS};
    let db = PgTestDb::new().await;
    let mut daemon = start_daemon(&db.url, &[]);
    let mut consumers = start_consumers(&db.url, &[]);
    produce(&db.url, 10, 0.0);
    wait_drained(&db.url);
    let id = uuid::Uuid::new_v4();
    let insert = "INSERT INTO tidings_outbox (id, topic, aggregate_key, key_hash, message_type, body)
                  VALUES ($1, 'orders', $2, 7, 'OrderPlaced', $3)";
    let write = |id: uuid::Uuid, body: &'static [u8]| {
        sqlx::query(insert)
            .bind(id)
            .bind("order-poison")
            .bind(body)
            .execute(db.store.pool())
    };
    write(id, b"{not an envelope").await.unwrap();
    // A later record of the same key waits behind it (bad too, so that it
    // is set aside in its turn once the first is skipped).
    write(uuid::Uuid::new_v4(), b"{also not one").await.unwrap();
    produce(&db.url, 10, 0.0);
    let deadline = Instant::now() + Duration::from_secs(60);
    let letters = loop {
        let letters = db
            .store
            .dead_letters(&DeadLetterFilter::default().consumer(RELAY_LETTERS))
            .await
            .unwrap();
        if !letters.is_empty() {
            break letters;
        }
        assert!(
            Instant::now() < deadline,
            "no record set aside:\n{}",
            daemon.stderr()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(
        letters.len(),
        1,
        "only the first bad record is set aside, the second waits: {letters:#?}"
    );
    let letter = &letters[0];
    assert_eq!(letter.message_id, Some(id));
    assert_eq!(letter.body, b"{not an envelope");

    // Every other record went out: only the two of the held key wait.
    let deadline = Instant::now() + Duration::from_secs(60);
    while outbox_status(&db.url)["pending"] != 2 {
        assert!(Instant::now() < deadline, "{:#}", outbox_status(&db.url));
        std::thread::sleep(Duration::from_millis(100));
    }
    let (code, checks) = doctor(&db.url, &[]);
    assert_eq!(code, 1, "{checks:#?}");
    let holds = item(&checks, "relay holds");
    assert_eq!(holds["verdict"], "fail", "{holds:#}");
    let evidence = holds["evidence"].as_str().unwrap();
    for part in [
        id.to_string().as_str(),
        "key \"order-poison\" with 1 record(s) waiting behind it",
        "its body is not an envelope",
        &letter.id.to_string(),
    ] {
        assert!(evidence.contains(part), "{part:?} not in {evidence}");
    }
    assert_eq!(item(&checks, "dead letters")["verdict"], "pass", "{checks:#?}");
    let listed = tidings()
        .args(["dlq", "list", "--consumer", "@relay", "--database", &db.url])
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&listed.stdout);
    assert!(
        listed.contains("@relay") && listed.contains("1 cause(s)"),
        "{listed}"
    );

    // Skipped, the first goes; the second is set aside in its turn.
    let skipped = tidings()
        .args(["dlq", "skip", &letter.id.to_string(), "--database", &db.url])
        .output()
        .unwrap();
    assert!(
        skipped.status.success(),
        "{}",
        String::from_utf8_lossy(&skipped.stderr)
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let pending = db
            .store
            .dead_letters(&DeadLetterFilter::default().consumer(RELAY_LETTERS))
            .await
            .unwrap();
        if pending.len() == 1 && pending[0].message_id != Some(id) {
            break;
        }
        assert!(Instant::now() < deadline, "{pending:#?}\n{}", daemon.stderr());
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(outbox_status(&db.url)["pending"], 1);

    assert!(daemon.terminate().success());
    let log = daemon.stderr();
    assert!(
        log.contains("outbox record set aside") && log.contains(&id.to_string()),
        "the daemon's log names the record:\n{log}"
    );
    assert!(consumers.terminate().success(), "{}", consumers.stderr());
    db.drop_schema().await;
}
