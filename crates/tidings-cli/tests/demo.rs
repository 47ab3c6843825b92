//! `tidings demo checkout` end to end, as a user runs it: the real binary,
//! a real SQLite file or the real PostgreSQL, its JSON summary checked.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use tidings_testkit::services::PgTestDb;

mod common;

use common::{n, summary_of};

fn tidings() -> Command {
    let mut c = common::tidings();
    c.env("RUST_LOG", "error");
    // moto takes any key; SNS and SQS are told the region by the URL.
    c.env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test");
    c
}

fn demo(database: &str, extra: &[&str]) -> Value {
    let out = tidings()
        .args([
            "demo",
            "checkout",
            "--json",
            "--timeout",
            "240",
            "--database",
            database,
        ])
        .args(extra)
        .output()
        .expect("running tidings");
    summary_of(&out)
}

/// The invariants every run must show.
fn assert_sound(s: &Value) {
    assert_eq!(s["drained"], true, "{s:#}");
    assert_eq!(n(s, "lost"), 0, "{s:#}");
    assert_eq!(n(s, "order_violations"), 0, "{s:#}");
    assert_eq!(n(s, "duplicated_effects"), 0, "{s:#}");
    assert!(s["state_mismatches"].as_array().unwrap().is_empty(), "{s:#}");
    let events = n(s, "events_committed");
    let commands = n(s, "commands_committed");
    assert!(events > 0 && commands > 0);
    let dead = |c: &str| s["dead_lettered"][c].as_i64().unwrap_or(0);
    let parked = |c: &str| s["parked"][c].as_i64().unwrap_or(0);
    assert_eq!(
        s["handled"]["checkout"].as_i64().unwrap() + dead("checkout") + parked("checkout"),
        commands,
        "{s:#}"
    );
    for consumer in ["inventory", "email", "analytics", "loyalty"] {
        assert_eq!(
            s["handled"][consumer].as_i64().unwrap() + dead(consumer) + parked(consumer),
            events,
            "{consumer}: {s:#}"
        );
    }
    // Only inventory fails, and only on poisoned orders' OrderPlaced; the
    // order's later events (two, once the order is complete) wait behind it.
    assert_eq!(dead("inventory"), n(s, "poisoned_orders"), "{s:#}");
    assert!(parked("inventory") <= 2 * n(s, "poisoned_orders"), "{s:#}");
    assert!(
        s["parked"].as_object().unwrap().keys().all(|c| c == "inventory"),
        "only inventory parks: {s:#}"
    );
}

struct TempDb(PathBuf);

impl TempDb {
    fn new() -> Self {
        TempDb(std::env::temp_dir().join(format!("tidings-demo-test-{}.db", uuid::Uuid::new_v4().simple())))
    }
    fn url(&self) -> String {
        format!("sqlite://{}", self.0.display())
    }
}

impl Drop for TempDb {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm", ".provider", ".provider-wal", ".provider-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", self.0.display()));
        }
    }
}

#[test]
fn checkout_on_sqlite_with_duplicates_and_poison() {
    let db = TempDb::new();
    let s = demo(&db.url(), &FAULTY);
    assert_sound(&s);
    assert_eq!(n(&s, "orders_total"), 300);
    assert!(n(&s, "poisoned_orders") > 0, "{s:#}");
    assert_eq!(
        s["parked"]["inventory"].as_i64().unwrap(),
        2 * n(&s, "poisoned_orders"),
        "{s:#}"
    );
    // Every suppressed duplicate was an injected one; duplicates of poisoned
    // events fail again (they have no processed marker) and one injected
    // just before shutdown may still be queued, so not all are suppressed.
    let (delivered, suppressed) = (
        s["duplicates_delivered"].as_u64().unwrap(),
        s["duplicates_suppressed"].as_u64().unwrap(),
    );
    assert!(
        delivered > 0 && suppressed > 0 && suppressed <= delivered,
        "{s:#}"
    );
}

/// 300 orders with a fifth of deliveries duplicated and one order in twenty poisoned.
const FAULTY: [&str; 6] = [
    "--orders",
    "300",
    "--duplicate-rate",
    "0.2",
    "--poison-rate",
    "0.05",
];

/// Runs the faulty demo on a fresh PostgreSQL schema, over `broker` if
/// given, with `scale` relays and `scale` members per consumer group, and
/// checks the invariants; the caller drops the schema.
async fn faulty_demo_on_postgres(broker: Option<String>, scale: u32) -> (Value, PgTestDb) {
    let pg = PgTestDb::new().await;
    let url = pg.url.clone();
    let s = tokio::task::spawn_blocking(move || {
        let scale = scale.to_string();
        let mut args = FAULTY.to_vec();
        args.extend(["--members", scale.as_str(), "--relays", scale.as_str()]);
        if let Some(broker) = &broker {
            args.extend(["--broker", broker.as_str()]);
        }
        demo(&url, &args)
    })
    .await
    .unwrap();
    assert_sound(&s);
    assert_eq!(n(&s, "orders_total"), 300);
    if s["broker_namespace"].is_string() {
        assert_eq!(
            s["published"].as_i64().unwrap(),
            n(&s, "commands_committed") + n(&s, "events_committed")
        );
    }
    (s, pg)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkout_on_postgres_with_duplicates_and_poison() {
    let (s, pg) = faulty_demo_on_postgres(None, 1).await;
    assert!(s["database"].as_str().unwrap().starts_with("postgres"));
    assert_eq!(s["transport"], "the database log");
    pg.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkout_on_postgres_over_nats_with_two_relays_two_members_duplicates_and_poison() {
    let nats = tidings_testkit::nats::nats_url();
    let (s, pg) = faulty_demo_on_postgres(Some(nats.clone()), 2).await;
    assert_eq!(
        (n(&s, "relays"), n(&s, "members"), n(&s, "partitions")),
        (2, 2, 4),
        "{s:#}"
    );
    assert!(
        s["transport"].as_str().unwrap().starts_with("NATS JetStream"),
        "{s:#}"
    );
    // The run's streams belong to its database, which is dropped: drop them too.
    let namespace = s["broker_namespace"]
        .as_str()
        .expect("a broker namespace")
        .to_owned();
    let options = tidings_broker_nats::NatsOptions::default().stream_prefix(&namespace);
    let transport = tidings_broker_nats::NatsTransport::connect_with(&nats, options)
        .await
        .unwrap();
    for topic in ["orders", "checkout.commands"] {
        transport.delete_topic(topic).await.unwrap();
    }
    pg.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkout_on_postgres_over_rabbitmq_with_two_relays_two_members_duplicates_and_poison() {
    let amqp = tidings_testkit::rabbitmq::amqp_url();
    let (s, pg) = faulty_demo_on_postgres(Some(amqp.clone()), 2).await;
    assert_eq!(
        (n(&s, "relays"), n(&s, "members"), n(&s, "partitions")),
        (2, 2, 4),
        "{s:#}"
    );
    assert!(s["transport"].as_str().unwrap().starts_with("RabbitMQ"), "{s:#}");
    // The run's queues and exchanges belong to its database, which is dropped: drop them too.
    let namespace = s["broker_namespace"]
        .as_str()
        .expect("a broker namespace")
        .to_owned();
    let options = tidings_broker_rabbitmq::RabbitOptions::default()
        .prefix(&namespace)
        .partitions(4);
    let rabbit = tidings_broker_rabbitmq::RabbitTransport::connect_with(&amqp, options)
        .await
        .unwrap();
    for (topic, groups) in [
        ("checkout.commands", &["checkout"][..]),
        ("orders", &["inventory", "email", "analytics", "loyalty"][..]),
    ] {
        for group in groups {
            rabbit.delete_group(topic, group).await.unwrap();
        }
        rabbit
            .delete_exchange(&format!("{namespace}.{topic}"))
            .await
            .unwrap();
    }
    pg.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkout_on_postgres_over_kafka_with_two_relays_two_members_duplicates_and_poison() {
    let kafka_url = tidings_testkit::kafka::kafka_url();
    let (s, pg) = faulty_demo_on_postgres(Some(kafka_url.clone()), 2).await;
    assert_eq!(
        (n(&s, "relays"), n(&s, "members"), n(&s, "partitions")),
        (2, 2, 4),
        "{s:#}"
    );
    assert!(s["transport"].as_str().unwrap().starts_with("Kafka"), "{s:#}");
    let namespace = s["broker_namespace"]
        .as_str()
        .expect("a broker namespace")
        .to_owned();
    let options = tidings_broker_kafka::KafkaOptions::default()
        .prefix(&namespace)
        .partitions(4);
    let kafka = tidings_broker_kafka::KafkaTransport::connect_with(&kafka_url, options)
        .await
        .unwrap();
    // The poisoned events are in the dead-letter topic, and the dead-letter
    // API lists the same ones.
    let in_topic: std::collections::BTreeSet<String> = kafka
        .dead_letter_records("orders")
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.headers["ce_id"].clone())
        .collect();
    let listed: std::collections::BTreeSet<String> = tidings_core::FailureStore::dead_letters(
        &pg.store,
        &tidings_core::DeadLetterFilter::default().consumer("inventory"),
    )
    .await
    .unwrap()
    .into_iter()
    .map(|l| l.message_id.expect("a decoded dead letter").to_string())
    .collect();
    assert!(!listed.is_empty(), "the run dead-lettered poison: {s:#}");
    assert_eq!(in_topic, listed);
    for topic in ["orders", "checkout.commands"] {
        kafka.delete_topic(topic).await.unwrap();
    }
    pg.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkout_on_postgres_over_sqs_with_duplicates_and_poison() {
    // One relay and one member per group: moto's server, one Python
    // process, is the bottleneck here long before Tidings is (with two of
    // each it spends a core on polling alone).
    let endpoint = tidings_testkit::sqs::sqs_endpoint();
    let (s, pg) = faulty_demo_on_postgres(Some(tidings_testkit::sqs::sqs_url()), 1).await;
    assert_eq!(
        (n(&s, "relays"), n(&s, "members"), n(&s, "partitions")),
        (1, 1, 4),
        "{s:#}"
    );
    assert!(
        s["transport"].as_str().unwrap().starts_with("SNS and SQS"),
        "{s:#}"
    );
    let namespace = s["broker_namespace"]
        .as_str()
        .expect("a broker namespace")
        .to_owned();
    let options = tidings_broker_sqs::SqsOptions::default()
        .prefix(&namespace)
        .partitions(4)
        .static_credentials("test", "test");
    let sqs = tidings_broker_sqs::SqsTransport::connect_with(&tidings_testkit::sqs::sqs_url(), options)
        .await
        .unwrap_or_else(|e| panic!("moto at {endpoint}: {e}"));
    // Each poisoned event was copied to the group's dead-letter queue.
    let listed = tidings_core::FailureStore::dead_letters(
        &pg.store,
        &tidings_core::DeadLetterFilter::default().consumer("inventory"),
    )
    .await
    .unwrap()
    .len() as u64;
    assert!(listed > 0, "the run dead-lettered poison: {s:#}");
    let in_queue = sqs
        .queue_depth(&sqs.dead_letter_queue("orders", "inventory"))
        .await
        .unwrap();
    assert_eq!(in_queue, Some(listed), "{s:#}");
    // The run's queues and topics belong to its database, which is dropped: drop them too.
    for (topic, groups) in [
        ("checkout.commands", &["checkout"][..]),
        ("orders", &["inventory", "email", "analytics", "loyalty"][..]),
    ] {
        for group in groups {
            sqs.delete_group(topic, group).await.unwrap();
        }
        sqs.delete_topic_of(topic).await.unwrap();
    }
    pg.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkout_on_postgres_over_pubsub_with_duplicates_and_poison() {
    // One relay and one member per group, as over SQS: the emulator is one
    // Java process on a 2-core machine.
    let url = tidings_testkit::pubsub::pubsub_url();
    let (s, pg) = faulty_demo_on_postgres(Some(url.clone()), 1).await;
    assert_eq!(
        (n(&s, "relays"), n(&s, "members"), n(&s, "partitions")),
        (1, 1, 4),
        "{s:#}"
    );
    assert!(s["transport"].as_str().unwrap().starts_with("Pub/Sub"), "{s:#}");
    let namespace = s["broker_namespace"]
        .as_str()
        .expect("a broker namespace")
        .to_owned();
    let options = tidings_broker_pubsub::PubSubOptions::default()
        .prefix(&namespace)
        .partitions(4);
    let pubsub = tidings_broker_pubsub::PubSubTransport::connect_with(&url, options)
        .await
        .unwrap_or_else(|e| panic!("the Pub/Sub emulator at {url}: {e}"));
    // Each poisoned event was copied to the group's dead-letter topic.
    let listed = tidings_core::FailureStore::dead_letters(
        &pg.store,
        &tidings_core::DeadLetterFilter::default().consumer("inventory"),
    )
    .await
    .unwrap()
    .len();
    assert!(listed > 0, "the run dead-lettered poison: {s:#}");
    let copies = pubsub
        .peek_dead_letters("orders", "inventory", 1000)
        .await
        .unwrap();
    let ids: std::collections::BTreeSet<_> = copies
        .iter()
        .filter_map(|m| m.headers.get("ce-id").cloned())
        .collect();
    assert_eq!(ids.len(), listed, "{s:#}");
    // The run's subscriptions and topics belong to its database, which is dropped: drop them too.
    for (topic, groups) in [
        ("checkout.commands", &["checkout"][..]),
        ("orders", &["inventory", "email", "analytics", "loyalty"][..]),
    ] {
        for group in groups {
            pubsub.delete_group(topic, group).await.unwrap();
        }
        pubsub.delete_topic_of(topic).await.unwrap();
    }
    pg.drop_schema().await;
}

/// Kills a demo on `database` midway without warning, then runs it again
/// over the same database: nothing lost, no effect twice.
fn a_killed_demo_resumes(database: &str) {
    let mut child = tidings()
        .args([
            "demo",
            "checkout",
            "--orders",
            "5000",
            "--duplicate-rate",
            "0.1",
            "--poison-rate",
            "0.02",
        ])
        .args(["--database", database])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Let it get well into its work, then kill it without warning.
    std::thread::sleep(Duration::from_secs(4));
    assert!(
        child.try_wait().unwrap().is_none(),
        "the first run should still be running when killed"
    );
    child.kill().unwrap();
    child.wait().unwrap();

    let s = demo(database, &["--orders", "50"]);
    assert_sound(&s);
    assert!(n(&s, "orders_total") > 50, "the killed run placed orders: {s:#}");
}

#[test]
fn a_killed_demo_resumes_without_loss_or_duplicated_effects() {
    let db = TempDb::new();
    a_killed_demo_resumes(&db.url());
}

/// The checkout system on MySQL (MariaDB here), over NATS, with two relays,
/// two members per group, duplicates and poison; then killed midway and run
/// again over the same database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkout_on_mysql_over_nats_with_two_relays_two_members_then_killed_and_resumed() {
    let db = tidings_testkit::services::MySqlTestDb::new().await;
    let url = db.url.clone();
    let nats = tidings_testkit::nats::nats_url();
    let s = tokio::task::spawn_blocking(move || {
        let mut args = FAULTY.to_vec();
        args.extend(["--members", "2", "--relays", "2", "--broker", nats.as_str()]);
        let s = demo(&url, &args);
        a_killed_demo_resumes(&url);
        s
    })
    .await
    .unwrap();
    assert_sound(&s);
    assert!(s["database"].as_str().unwrap().starts_with("mysql"), "{s:#}");
    assert_eq!(n(&s, "orders_total"), 300);
    assert_eq!(
        s["published"].as_i64().unwrap(),
        n(&s, "commands_committed") + n(&s, "events_committed")
    );
    db.drop_database().await;
}

#[test]
fn bad_arguments_and_unreachable_databases_fail_with_one_clear_line() {
    let out = tidings()
        .args(["demo", "checkout", "--poison-rate", "2"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not between 0 and 1"));

    let out = tidings()
        .args([
            "lag",
            "--database",
            "postgres://nobody:secret-password@127.0.0.1:1/none",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("PostgreSQL"), "{stderr}");
    assert!(!stderr.contains("secret-password"), "a password leaked: {stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_never_reach_the_output_or_the_logs() {
    let pg = PgTestDb::new().await;
    // Local connections are trusted: the password is accepted and ignored.
    let database = pg.url.replacen("://postgres@", "://postgres:pg-s3cret-pw@", 1);
    assert!(
        database.contains("pg-s3cret-pw"),
        "DATABASE_URL should be postgres://postgres@...: {database}"
    );
    let nats = tidings_testkit::nats::nats_url();
    let nats_broker = nats.replacen("nats://", "nats://someone:nats-s3cret-pw@", 1);
    // RabbitMQ refuses a wrong password, so its real one stands for the secret.
    let amqp = tidings_testkit::rabbitmq::amqp_url();
    let amqp_secret = amqp
        .split("://")
        .nth(1)
        .and_then(|rest| rest.split('@').next())
        .and_then(|userinfo| userinfo.split_once(':'))
        .map(|(_, pw)| format!(":{pw}@"))
        .expect("AMQP_URL carries a password");
    for broker in [nats_broker.clone(), amqp.clone()] {
        let database = database.clone();
        let out = tokio::task::spawn_blocking(move || {
            Command::new(env!("CARGO_BIN_EXE_tidings"))
                .env("RUST_LOG", "debug")
                .args([
                    "demo",
                    "checkout",
                    "--orders",
                    "5",
                    "--database",
                    &database,
                    "--broker",
                    &broker,
                ])
                .output()
                .expect("running tidings")
        })
        .await
        .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stdout}\n{stderr}");
        assert!(
            stdout.contains("postgres://postgres@"),
            "the summary names the database: {stdout}"
        );
        for secret in ["pg-s3cret-pw", "nats-s3cret-pw", amqp_secret.as_str()] {
            assert!(!stdout.contains(secret), "{secret} in the output:\n{stdout}");
            assert!(!stderr.contains(secret), "{secret} in the logs:\n{stderr}");
        }
    }
    // And in Debug output of the stores and transports.
    let store = tidings_store_postgres::PgStore::connect(&database).await.unwrap();
    let transport = tidings_broker_nats::NatsTransport::connect(&nats_broker)
        .await
        .unwrap();
    let rabbit = tidings_broker_rabbitmq::RabbitTransport::connect(&amqp)
        .await
        .unwrap();
    let debug = format!("{store:?} {transport:?} {rabbit:?}");
    assert!(
        !debug.contains("s3cret") && !debug.contains(&amqp_secret),
        "{debug}"
    );
    store.pool().close().await;
    pg.drop_schema().await;
}
