//! `tidings run` against the checkout system on PostgreSQL: the daemon
//! relays what the demo's producer commits, its `/metrics` and the
//! consumers' show the figures moving and settling on what the database
//! holds, SIGTERM stops it cleanly; and a bad configuration or an
//! unreachable database is one clear line and a non-zero exit.

mod common;

use std::time::{Duration, Instant};

use common::{
    free_port, produce, sample, scrape, start_consumers, start_consumers_with, start_daemon, tidings, total,
    wait_for_endpoint,
};
use tidings_testkit::services::PgTestDb;

async fn count(db: &PgTestDb, sql: &str) -> f64 {
    sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(sql.to_owned()))
        .fetch_one(db.store.pool())
        .await
        .unwrap() as f64
}

#[tokio::test(flavor = "multi_thread")]
async fn the_daemon_relays_the_checkout_system_and_its_metrics_move() {
    let db = PgTestDb::new().await;
    let (daemon_port, consumers_port) = (free_port(), free_port());
    let mut daemon = start_daemon(
        &db.url,
        &[("TIDINGS_METRICS__LISTEN", format!("127.0.0.1:{daemon_port}"))],
    );
    let before = wait_for_endpoint(daemon_port, &mut daemon);
    assert_eq!(sample(&before, "tidings_relay_published_total"), 0.0);

    let metrics = format!("127.0.0.1:{consumers_port}");
    let mut consumers = start_consumers(&db.url, &["--metrics", &metrics]);
    let idle = wait_for_endpoint(consumers_port, &mut consumers);
    assert_eq!(total(&idle, "tidings_consumer_handled_total"), 0.0);

    produce(&db.url, 200, 0.05);

    // Scrape both until the system has drained: everything relayed, every group caught up.
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut published_seen = Vec::new();
    let (relayed, handled) = loop {
        let relayed = scrape(daemon_port).expect("the daemon still serves");
        let handled = scrape(consumers_port).expect("the consumers still serve");
        published_seen.push(sample(&relayed, "tidings_relay_published_total"));
        let outbox = count(&db, "SELECT count(*) FROM tidings_outbox").await;
        let logged = count(&db, "SELECT count(*) FROM tidings_log").await;
        let groups_seen = relayed.matches("tidings_consumer_lag_messages{").count();
        if outbox == 0.0
            && sample(&relayed, "tidings_relay_published_total") == logged
            && sample(&relayed, "tidings_outbox_pending") == 0.0
            && groups_seen >= 5
            && total(&relayed, "tidings_consumer_lag_messages") == 0.0
            && total(&handled, "tidings_consumer_handled_total") > 0.0
        {
            break (relayed, handled);
        }
        assert!(
            Instant::now() < deadline,
            "not drained after 120 s:\n{relayed}\n{}\n{}",
            daemon.stderr(),
            consumers.stderr()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // Let the consumers' last counts and the last lag sample land.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let handled = scrape(consumers_port).unwrap_or(handled);
    let relayed = scrape(daemon_port).unwrap_or(relayed);

    // The relay's figures: every record the producer committed, in batches.
    let logged = count(&db, "SELECT count(*) FROM tidings_log").await;
    assert!(
        logged >= 600.0,
        "200 orders make at least 600 records, got {logged}"
    );
    assert_eq!(sample(&relayed, "tidings_relay_published_total"), logged);
    let batches = sample(&relayed, "tidings_relay_batches_total");
    assert!(batches >= 1.0);
    assert_eq!(sample(&relayed, "tidings_relay_batch_size_count"), batches);
    assert_eq!(sample(&relayed, "tidings_relay_batch_size_sum"), logged);
    assert_eq!(
        sample(&relayed, "tidings_relay_publish_duration_seconds_count"),
        batches
    );
    assert_eq!(sample(&relayed, "tidings_relay_publish_errors_total"), 0.0);
    assert_eq!(sample(&relayed, "tidings_outbox_pending"), 0.0);
    assert_eq!(sample(&relayed, "tidings_outbox_oldest_unsent_age_seconds"), 0.0);
    assert!(
        published_seen.windows(2).all(|w| w[0] <= w[1]),
        "a counter went down: {published_seen:?}"
    );
    // Dead letters: the poisoned orders, as the database has them.
    let dead = count(
        &db,
        "SELECT count(*) FROM tidings_dead_letters WHERE consumer = 'inventory'",
    )
    .await;
    assert!(dead >= 1.0, "5% of 200 orders poisoned, none dead-lettered");
    assert_eq!(
        sample(&relayed, "tidings_dead_letters{consumer=\"inventory\"}"),
        dead
    );
    assert!(
        sample(
            &relayed,
            "tidings_dead_letter_oldest_age_seconds{consumer=\"inventory\"}"
        ) > 0.0
    );

    // The consumers' figures, against the processed markers they wrote.
    for consumer in ["checkout", "inventory", "email", "analytics", "loyalty"] {
        let processed = count(
            &db,
            &format!("SELECT count(*) FROM tidings_processed WHERE consumer = '{consumer}'"),
        )
        .await;
        let label = format!("{{consumer=\"{consumer}\"}}");
        assert_eq!(
            sample(&handled, &format!("tidings_consumer_handled_total{label}")),
            processed,
            "{consumer}"
        );
        assert!(
            sample(
                &handled,
                &format!("tidings_consumer_handler_duration_seconds_count{label}")
            ) >= processed,
            "{consumer}"
        );
    }
    assert_eq!(
        sample(
            &handled,
            "tidings_consumer_dead_lettered_total{consumer=\"inventory\"}"
        ),
        dead
    );
    assert!(sample(&handled, "tidings_consumer_failed_total{consumer=\"inventory\"}") >= dead);
    assert!(sample(&handled, "tidings_consumer_retried_total{consumer=\"inventory\"}") > 0.0);

    // Every metric the shipped alert rules use is served by a real
    // deployment (the inbox's, by one with an inbox: tests/inbox.rs; the
    // CDC slot's, by one in CDC mode: tests/cdc.rs).
    for name in tidings_prometheus::metrics_named_in(tidings_prometheus::ALERT_RULES)
        .into_iter()
        .filter(|name| !name.starts_with("tidings_inbox_") && !name.starts_with("tidings_cdc_"))
    {
        assert!(
            relayed.contains(&format!("\n{name}")) || handled.contains(&format!("\n{name}")),
            "the alert rules use {name}, which neither endpoint serves"
        );
    }

    // SIGTERM: both stop cleanly.
    let status = daemon.terminate();
    assert!(status.success(), "daemon exited {status}:\n{}", daemon.stderr());
    assert!(daemon.stderr().contains("tidings stopped"), "{}", daemon.stderr());
    let status = consumers.terminate();
    assert!(
        status.success(),
        "consumers exited {status}:\n{}",
        consumers.stderr()
    );
    db.drop_schema().await;
}

/// Runs `tidings run` with `config` as its file (if any) and `env`, expecting a refusal;
/// returns its one line of stderr.
fn refused(config: Option<&str>, env: &[(&str, &str)]) -> String {
    let file = std::env::temp_dir().join(format!("tidings-bad-{}.toml", uuid::Uuid::new_v4().simple()));
    let mut command = tidings();
    command.arg("run").env("TIDINGS_METRICS__LISTEN", "");
    if let Some(text) = config {
        std::fs::write(&file, text).unwrap();
        command.args(["--config", file.to_str().unwrap()]);
    }
    command.envs(env.iter().copied());
    let started = Instant::now();
    let out = command.output().unwrap();
    let _ = std::fs::remove_file(&file);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "accepted: {stderr}");
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "slow to refuse: {stderr}"
    );
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line, not:\n{stderr}");
    assert!(lines[0].starts_with("error: "), "{stderr}");
    lines[0].to_owned()
}

#[test]
fn a_bad_config_and_an_unreachable_database_are_one_line_errors() {
    let db = [("TIDINGS_DATABASE__URL", "sqlite://unused.db")];
    let line = refused(Some("[relay]\nbatch_size = 0\n"), &db);
    assert!(
        line.contains("relay.batch_size: 0 is out of range (1 to 100000)"),
        "{line}"
    );
    let line = refused(Some("[relay]\nbatchsize = 100\n"), &db);
    assert!(line.contains("relay.batchsize: unknown field"), "{line}");
    let line = refused(Some("[relay]\npoll_interval = 5\n"), &db);
    assert!(line.contains("relay.poll_interval: invalid type"), "{line}");
    let line = refused(Some("[relay\nbatch_size = 1\n"), &db);
    assert!(line.contains("line 1, column"), "{line}");
    let line = refused(None, &[("TIDINGS_RELAY__PARTITIONS", "0"), db[0]]);
    assert!(line.contains("relay.partitions: 0 is out of range"), "{line}");
    let line = refused(
        Some("[database]\nurl = \"postgres://app:hunter2@127.0.0.1/shop\"\n"),
        &[],
    );
    assert!(
        line.contains("database.url: holds a password") && !line.contains("hunter2"),
        "{line}"
    );
    let line = refused(None, &[]);
    assert!(line.contains("database.url: no database"), "{line}");
    let line = refused(
        None,
        &[(
            "TIDINGS_DATABASE__URL",
            "postgres://tidings:hunter2@127.0.0.1:1/shop",
        )],
    );
    assert!(
        line.contains("connecting to PostgreSQL at postgres://tidings@127.0.0.1:1/shop")
            && !line.contains("hunter2"),
        "{line}"
    );
    let file = std::env::temp_dir().join(format!("tidings-missing-{}.toml", uuid::Uuid::new_v4().simple()));
    let line = refused(None, &[("TIDINGS_CONFIG", file.to_str().unwrap())]);
    assert!(line.contains("cannot read it"), "{line}");

    // A good file passes the check, and says what it would run.
    let good = std::env::temp_dir().join(format!("tidings-good-{}.toml", uuid::Uuid::new_v4().simple()));
    std::fs::write(&good, include_str!("../../../docs/tidings.toml")).unwrap();
    let out = tidings()
        .args(["run", "--check", "--config", good.to_str().unwrap()])
        .env(
            "TIDINGS_DATABASE__URL",
            "postgres://tidings:hunter2@127.0.0.1/shop",
        )
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&good);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(
        stdout.trim(),
        "configuration ok: database postgres://tidings@127.0.0.1/shop, broker log, relay on, metrics on 127.0.0.1:9464, inbox off, console off"
    );
}

/// Waits until `check` holds for the daemon's metrics; returns them.
async fn scrape_until(
    daemon: &common::Process,
    port: u16,
    what: &str,
    check: impl Fn(&str) -> bool,
) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let text = scrape(port).expect("the daemon serves");
        if check(&text) {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "{what} did not happen within 60 s:\n{text}\n{}",
            daemon.stderr()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_daemon_measures_consumer_lag_on_nats() {
    let nats = std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into());
    consumer_lag_on_the_broker(
        &nats,
        |system| format!("TIDINGS_DEMO_{}", system.to_uppercase()),
        &[],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_daemon_measures_consumer_lag_on_rabbitmq() {
    let amqp = std::env::var("AMQP_URL").unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into());
    consumer_lag_on_the_broker(&amqp, |system| format!("tidings-demo-{system}"), &[]).await;
}

/// SQS counts a queue's messages (approximately; moto exactly).
#[tokio::test(flavor = "multi_thread")]
async fn the_daemon_measures_consumer_lag_on_sqs() {
    let credentials = [
        ("AWS_ACCESS_KEY_ID", "test".to_owned()),
        ("AWS_SECRET_ACCESS_KEY", "test".to_owned()),
    ];
    consumer_lag_on_the_broker(
        &tidings_testkit::sqs::sqs_url(),
        |system| format!("tidings-demo-{system}"),
        &credentials,
    )
    .await;
}

/// The demo's consumers on `broker`, the daemon relaying to it: the daemon's
/// lag gauges read 0, grow to every command while the consumers are down,
/// and return to 0 once they are back; the console's overview shows the
/// same counts, from the broker, for groups with no member running, and
/// their last hour. `prefix` names the demo's resources
/// on the broker after its system id; `env` is what the processes need to
/// reach it (credentials).
async fn consumer_lag_on_the_broker(broker: &str, prefix: impl Fn(&str) -> String, env: &[(&str, String)]) {
    let nats = broker.to_owned();
    let db = PgTestDb::new().await;
    let mut consumers = start_consumers_with(&db.url, &["--broker", &nats], env);
    // The demo names its streams after the system it runs.
    let system: String = sqlx::query_scalar("SELECT id FROM demo_systems WHERE system = 'checkout'")
        .fetch_one(db.store.pool())
        .await
        .unwrap();
    let port = free_port();
    let console = format!("http://127.0.0.1:{}", free_port());
    let mut daemon_env = vec![
        ("TIDINGS_METRICS__LISTEN", format!("127.0.0.1:{port}")),
        ("TIDINGS_CONSOLE__LISTEN", console["http://".len()..].to_owned()),
        ("TIDINGS_BROKER__URL", nats.clone()),
        ("TIDINGS_BROKER__PREFIX", prefix(&system)),
        ("TIDINGS_BROKER__PARTITIONS", "4".into()),
    ];
    daemon_env.extend(env.iter().cloned());
    let mut daemon = start_daemon(&db.url, &daemon_env);
    wait_for_endpoint(port, &mut daemon);
    // `tidings console` alone, told where the broker is, counts there too.
    let alone = free_port();
    let mut command = tidings();
    command
        .args(["console", "--database", &db.url, "--broker", &nats])
        .args(["--broker-prefix", &prefix(&system), "--broker-partitions", "4"])
        .args(["--listen", &format!("127.0.0.1:{alone}")])
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())));
    let mut alone_process = common::Process::start(command, "console");
    let listening = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", alone)).is_err() {
        assert!(
            Instant::now() < listening && alone_process.child.try_wait().unwrap().is_none(),
            "tidings console --broker did not listen: {}",
            alone_process.stderr()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let alone = format!("http://127.0.0.1:{alone}");
    let series = "tidings_consumer_lag_messages{consumer=\"checkout\",topic=\"checkout.commands\"}";
    scrape_until(&daemon, port, "the groups seen at 0", |t| {
        t.contains(series)
            && sample(
                t,
                "tidings_consumer_lag_messages{consumer=\"loyalty\",topic=\"orders\"}",
            ) == 0.0
    })
    .await;

    // The console alone has counted the group on the broker (once its
    // members are gone, it learns of no new group).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let by_itself = get_json(&format!("{alone}/api/overview")).await;
        let counted = by_itself["groups"].as_array().unwrap().iter().any(|g| {
            g["group"] == "checkout" && g["topic"] == "checkout.commands" && g["pending_from"] == "broker"
        });
        if counted {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "tidings console --broker does not count checkout: {by_itself:#}\n{}",
            alone_process.stderr()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The consumers stop; orders keep coming: the checkout group's lag grows to every command.
    assert!(consumers.terminate().success(), "{}", consumers.stderr());
    produce(&db.url, 40, 0.0);
    // The relay keeps publishing (the outbox empties) while the group's lag grows.
    scrape_until(&daemon, port, "checkout 120 commands behind", |t| {
        sample(t, series) == 120.0 && sample(t, "tidings_outbox_pending") == 0.0
    })
    .await;
    // The console shows the broker's count, though no member of the group
    // runs, and keeps it in its last hour.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let overview = get_json(&format!("{console}/api/overview")).await;
        let history = get_json(&format!("{console}/api/history")).await;
        let by_itself = get_json(&format!("{alone}/api/overview")).await;
        let counted_alone = by_itself["groups"].as_array().unwrap().iter().any(|g| {
            g["group"] == "checkout"
                && g["topic"] == "checkout.commands"
                && g["pending"] == 120
                && g["pending_from"] == "broker"
        });
        let row = overview["groups"]
            .as_array()
            .unwrap()
            .iter()
            .find(|g| g["group"] == "checkout" && g["topic"] == "checkout.commands")
            .cloned();
        let charted = history
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["groups"]["checkout@checkout.commands"] == 120);
        if let Some(row) = row.filter(|r| r["pending"] == 120 && charted && counted_alone) {
            assert_eq!(row["pending_from"], "broker", "{row:#}");
            assert!(row["counted_seconds_ago"].as_f64().unwrap() < 30.0, "{row:#}");
            assert!(row["members"].as_array().unwrap().is_empty(), "{row:#}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the console does not show checkout 120 commands behind: {overview:#}\n{history:#}\n\
             by itself: {by_itself:#}\n{}",
            daemon.stderr()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // They come back and catch up.
    let mut consumers = start_consumers_with(&db.url, &["--broker", &nats], env);
    scrape_until(&daemon, port, "every group caught up", |t| {
        t.matches("tidings_consumer_lag_messages{").count() >= 5
            && total(t, "tidings_consumer_lag_messages") == 0.0
    })
    .await;
    assert!(consumers.terminate().success(), "{}", consumers.stderr());
    assert!(daemon.terminate().success(), "{}", daemon.stderr());
    db.drop_schema().await;
}

/// The dedupe retention, short here: the daemon deletes processed markers
/// and effects records once older than it, keeps newer ones, and moves the
/// horizon; `tidings replay` and `tidings dlq redrive` then refuse to reach
/// back past it, unless forced.
#[tokio::test(flavor = "multi_thread")]
async fn the_daemon_forgets_markers_past_the_dedupe_retention_and_replays_stop_there() {
    use tidings_core::ConsumerStore;
    let db = PgTestDb::new().await;
    let mark = |id: uuid::Uuid| {
        let store = db.store.clone();
        async move {
            let mut tx = store.begin().await.unwrap();
            store.mark_processed(&mut *tx, "billing", id).await.unwrap();
            store
                .record_effect(&mut *tx, "billing", id, "charge", "k")
                .await
                .unwrap();
            tx.commit().await.unwrap();
        }
    };
    let old = uuid::Uuid::now_v7();
    mark(old).await;
    let metrics = free_port();
    let mut daemon = start_daemon(
        &db.url,
        &[
            ("TIDINGS_METRICS__LISTEN", format!("127.0.0.1:{metrics}")),
            ("TIDINGS_LOG__RETENTION", "2s".into()),
            ("TIDINGS_CONSUMER__DEDUPE_RETENTION", "2s".into()),
            ("TIDINGS_CONSUMER__CLEANUP_INTERVAL", "100ms".into()),
        ],
    );
    wait_for_endpoint(metrics, &mut daemon);
    // A marker written now outlives the old one by the retention.
    let fresh = uuid::Uuid::now_v7();
    mark(fresh).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while count(
        &db,
        &format!("SELECT count(*) FROM tidings_processed WHERE message_id = '{old}'"),
    )
    .await
        > 0.0
    {
        assert!(
            Instant::now() < deadline,
            "the old marker was not deleted:\n{}",
            daemon.stderr()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        count(
            &db,
            &format!("SELECT count(*) FROM tidings_effects WHERE message_id = '{old}'")
        )
        .await,
        0.0
    );
    assert_eq!(
        count(
            &db,
            &format!("SELECT count(*) FROM tidings_processed WHERE message_id = '{fresh}'")
        )
        .await,
        1.0,
        "a marker younger than the retention was deleted"
    );
    let status = daemon.terminate();
    assert!(status.success(), "daemon exited {status}:\n{}", daemon.stderr());
    let horizon = db.store.dedupe_horizon().await.unwrap().expect("a horizon");

    // A replay from before the horizon is refused, one after it is not.
    let replay = |since: &str, extra: &[&str]| {
        tidings()
            .args([
                "replay",
                "--consumer",
                "billing",
                "--topic",
                "orders",
                "--no-wait",
            ])
            .args(["--since", since, "--database", &db.url])
            .args(extra)
            .output()
            .unwrap()
    };
    let out = replay("1h", &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("past the dedupe horizon"), "{stderr}");
    assert!(stderr.contains("--force"), "{stderr}");
    let after = (horizon + chrono::Duration::milliseconds(10)).to_rfc3339();
    let out = replay(&after, &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = replay("1h", &["--force"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("will be handled again"), "{stderr}");
    db.drop_schema().await;
}

/// A JSON answer of the console, read without a token (on the loopback interface).
async fn get_json(url: &str) -> serde_json::Value {
    let response = reqwest::get(url).await.unwrap_or_else(|e| panic!("{url}: {e}"));
    assert!(response.status().is_success(), "{url}: {}", response.status());
    response.json().await.unwrap()
}
