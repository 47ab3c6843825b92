//! `tidings demo payments`, `upload` and `clicks` end to end, as a user
//! runs them: the real binary, a real SQLite file or the real PostgreSQL
//! with NATS, RabbitMQ or Kafka, their JSON summaries checked; for payments,
//! webhooks over real HTTP, and deliveries posted by curl, signed by
//! openssl, to `--webhook-listen`.

use std::io::{BufRead as _, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;
use tidings_testkit::services::PgTestDb;

mod common;

use common::{n, summary_of};

fn tidings() -> Command {
    let mut c = common::tidings();
    c.env("RUST_LOG", "error");
    c
}

/// Runs the payments demo in `dir` with `args`; its JSON summary, which must say it held.
fn demo(dir: &Path, args: &[&str]) -> Value {
    shape(dir, "payments", args)
}

/// Runs the demo of `shape` in `dir` with `args`; its JSON summary, which must say it held.
fn shape(dir: &Path, shape: &str, args: &[&str]) -> Value {
    let out = tidings()
        .current_dir(dir)
        .args(["demo", shape, "--json", "--timeout", "240"])
        .args(args)
        .output()
        .expect("running tidings");
    summary_of(&out)
}

/// Runs the demo of `shape` in a fresh directory on `database` over
/// `broker` with `args`, off the async threads; its JSON summary, which
/// must say it held.
async fn shape_on(shape_name: &str, database: &str, broker: &str, args: &[&str]) -> Value {
    let all: Vec<String> = ["--database", database, "--broker", broker]
        .iter()
        .chain(args)
        .map(|a| (*a).to_owned())
        .collect();
    let shape_name = shape_name.to_owned();
    tokio::task::spawn_blocking(move || {
        let dir = tempdir();
        let args: Vec<&str> = all.iter().map(String::as_str).collect();
        let s = shape(&dir, &shape_name, &args);
        std::fs::remove_dir_all(dir).unwrap();
        s
    })
    .await
    .unwrap()
}

/// The invariants every run shows, checked again from the figures.
fn assert_sound(s: &Value) {
    assert!(s["broken"].as_array().unwrap().is_empty(), "{s:#}");
    assert_eq!(s["drained"], true, "{s:#}");
    assert_eq!(n(s, "lost"), 0, "{s:#}");
    assert_eq!(n(s, "order_violations"), 0, "{s:#}");
    assert_eq!(n(s, "duplicated_effects"), 0, "{s:#}");
    assert!(s["replay_changed"].as_array().unwrap().is_empty(), "{s:#}");
    // Double entry: each currency's balances sum to zero.
    let balances = &s["balances"];
    for currency in ["eur", "gbp", "usd"] {
        let sum: i64 = ["provider_balance", "sales", "refunds"]
            .iter()
            .map(|a| balances[a][currency].as_i64().unwrap_or(0))
            .sum();
        assert_eq!(sum, 0, "{currency}: {s:#}");
    }
    // One notification per payment event.
    assert_eq!(n(s, "notifications"), n(s, "payment_events"), "{s:#}");
}

/// Checks what the simulated provider did against what the system recorded.
fn assert_provider_truth(s: &Value) {
    let p = &s["provider"];
    assert_eq!(
        n(s, "stripe_events"),
        n(p, "events"),
        "each event taken once: {s:#}"
    );
    assert_eq!(n(p, "forged"), n(p, "forged_refused"), "{s:#}");
    assert_eq!(n(p, "rejected"), 0, "{s:#}");
    assert_eq!(n(s, "captured_payments"), n(p, "payments"), "{s:#}");
    assert_eq!(n(s, "refunded_payments"), n(p, "refunded_payments"), "{s:#}");
    let poisoned = n(p, "poisoned_payments");
    for currency in ["eur", "gbp", "usd"] {
        let captured = p["captured"][currency].as_i64().unwrap_or(0);
        let refunded = p["refunded"][currency].as_i64().unwrap_or(0);
        assert_eq!(
            s["balances"]["provider_balance"][currency].as_i64().unwrap_or(0),
            captured - refunded,
            "{currency}: {s:#}"
        );
    }
    // Only the ledger fails, on each payment in a currency it lacks; the
    // payment's refunds wait behind it.
    let dead = |c: &str| s["dead_lettered"][c].as_i64().unwrap_or(0);
    assert_eq!(dead("ledger"), poisoned, "{s:#}");
    assert_eq!(dead("intake") + dead("notify"), 0, "{s:#}");
    // Every replayed event already handled is suppressed; the poisoned ones fail again.
    for consumer in ["ledger", "notify"] {
        let r = &s["replay"][consumer];
        assert_eq!(n(r, "delivered"), n(s, "payment_events"), "{consumer}: {s:#}");
        assert_eq!(n(r, "handled"), 0, "{consumer}: {s:#}");
    }
}

#[test]
fn payments_on_the_embedded_default() {
    let dir = tempdir();
    let s = demo(&dir, &["--payments", "150"]);
    assert_sound(&s);
    assert_provider_truth(&s);
    assert!(
        n(&s["provider"], "redeliveries") > 0,
        "the provider sent deliveries twice: {s:#}"
    );
    assert!(
        s["database"].as_str().unwrap().contains("tidings-demo.db"),
        "{s:#}"
    );
    assert_eq!(s["transport"], "the database log");
    // A second run on the same database sums up its own run.
    let again = demo(&dir, &["--payments", "50"]);
    assert_sound(&again);
    assert_provider_truth(&again);
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payments_on_postgres_over_nats_with_duplicates_and_poison() {
    let pg = PgTestDb::new().await;
    let nats = tidings_testkit::nats::nats_url();
    let args = [
        "--payments",
        "300",
        "--duplicate-rate",
        "0.2",
        "--poison-rate",
        "0.01",
    ];
    let s = shape_on("payments", &pg.url, &nats, &args).await;
    assert_sound(&s);
    assert_provider_truth(&s);
    assert!(
        s["transport"].as_str().unwrap().starts_with("NATS JetStream"),
        "{s:#}"
    );
    assert!(n(&s, "duplicates_delivered") > 0, "{s:#}");
    // The run's streams belong to its database, which is dropped: drop them too.
    let namespace = s["broker_namespace"]
        .as_str()
        .expect("a broker namespace")
        .to_owned();
    let options = tidings_broker_nats::NatsOptions::default().stream_prefix(&namespace);
    let transport = tidings_broker_nats::NatsTransport::connect_with(&nats, options)
        .await
        .unwrap();
    for topic in ["payments", "stripe"] {
        transport.delete_topic(topic).await.unwrap();
    }
    pg.drop_schema().await;
}

/// A Stripe event's body, as Stripe writes it (fields Tidings does not read included).
fn stripe_event(id: &str, kind: &str, object: Value) -> String {
    serde_json::json!({
        "id": id, "object": "event", "api_version": "2024-06-20", "created": 1_764_806_400,
        "type": kind, "livemode": false, "pending_webhooks": 1,
        "request": {"id": null, "idempotency_key": null},
        "data": {"object": object},
    })
    .to_string()
}

/// `t=...,v1=...` for `body`, signed by openssl as Stripe documents it:
/// HMAC-SHA256 of `<t>.<body>` with the endpoint's secret, in hex.
fn openssl_signature(secret: &str, body: &str) -> String {
    let t = chrono::Utc::now().timestamp();
    let mut openssl = Command::new("openssl")
        .args(["dgst", "-sha256", "-hmac", secret])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("openssl, to sign the deliveries, is not installed");
    openssl
        .stdin
        .take()
        .unwrap()
        .write_all(format!("{t}.{body}").as_bytes())
        .unwrap();
    let out = openssl.wait_with_output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let hex = text.trim().rsplit(' ').next().unwrap().to_owned();
    format!("t={t},v1={hex}")
}

/// Posts `body` with curl; the HTTP status.
fn curl(url: &str, signature: &str, body: &str) -> u16 {
    let out = Command::new("curl")
        .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST", url])
        .args(["-H", "content-type: application/json"])
        .args(["-H", &format!("Stripe-Signature: {signature}")])
        .args(["--data-binary", body])
        .output()
        .expect("curl, to post the deliveries, is not installed");
    String::from_utf8_lossy(&out.stdout).parse().unwrap_or(0)
}

#[test]
fn the_same_signed_delivery_posted_five_times_with_curl_books_once() {
    let dir = tempdir();
    let secret = "whsec_curl_test_0123456789abcdef";
    let secret_file = dir.join("stripe-secret");
    std::fs::write(&secret_file, format!("{secret}\n")).unwrap();
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let listen = format!("127.0.0.1:{port}");
    let mut child = tidings()
        .current_dir(&dir)
        .env("RUST_LOG", "info")
        .args([
            "demo",
            "payments",
            "--json",
            "--payments",
            "0",
            "--timeout",
            "120",
        ])
        .args(["--webhook-listen", &listen])
        .args(["--webhook-secret-file", secret_file.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let mut lines = BufReader::new(stderr).lines();
    loop {
        let line = lines
            .next()
            .unwrap_or_else(|| panic!("the demo ended before it listened"))
            .unwrap();
        if line.contains("webhooks: POST") {
            break;
        }
    }
    // Drain stderr so that the demo never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));

    let url = format!("http://{listen}/stripe");
    let (intent, charge) = ("pi_3QcurlTest000001", "ch_3QcurlTest000001");
    // The refund first: Stripe does not promise order.
    let refund = stripe_event(
        "evt_curl_refund_1",
        "charge.refunded",
        serde_json::json!({"id": charge, "object": "charge", "payment_intent": intent,
            "amount": 4200, "amount_refunded": 1200, "currency": "eur", "refunded": false}),
    );
    let capture = stripe_event(
        "evt_curl_capture_1",
        "payment_intent.succeeded",
        serde_json::json!({"id": intent, "object": "payment_intent", "amount": 4200, "currency": "eur",
            "customer": "cus_curl", "latest_charge": charge, "status": "succeeded"}),
    );
    for body in [&refund, &capture] {
        for _ in 0..5 {
            assert_eq!(curl(&url, &openssl_signature(secret, body), body), 200);
        }
    }
    // A forged one: signed with another secret.
    let forged = capture.replace("4200", "9999999");
    assert_eq!(
        curl(&url, &openssl_signature("whsec_someone_else", &forged), &forged),
        401
    );

    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let out = child.wait_with_output().unwrap();
    let s = summary_of(&out);
    assert_sound(&s);
    assert_eq!(n(&s, "stripe_events"), 2, "ten deliveries, two events: {s:#}");
    assert_eq!(n(&s, "payment_events"), 2, "{s:#}");
    // (Whether the refund waited depends on which the intake took first:
    // they have different keys. The books are the same either way.)
    assert_eq!(
        n(&s, "ledger_entries"),
        4,
        "two balanced entries per event: {s:#}"
    );
    let balance = |account: &str| s["balances"][account]["eur"].as_i64().unwrap();
    assert_eq!(balance("provider_balance"), 4200 - 1200, "{s:#}");
    assert_eq!(balance("sales"), -4200, "{s:#}");
    assert_eq!(balance("refunds"), 1200, "{s:#}");
    assert_eq!(n(&s, "notifications"), 2, "a receipt and a refund notice: {s:#}");
    for consumer in ["ledger", "notify"] {
        assert_eq!(n(&s["replay"][consumer], "delivered"), 2, "{s:#}");
        assert_eq!(n(&s["replay"][consumer], "suppressed"), 2, "{s:#}");
    }
    std::fs::remove_dir_all(dir).unwrap();
}

fn tempdir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tidings-payments-test-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The upload pipeline's invariants, checked again from the figures.
fn assert_upload_sound(s: &Value) {
    assert!(s["broken"].as_array().unwrap().is_empty(), "{s:#}");
    assert_eq!(s["drained"], true, "{s:#}");
    assert_eq!(n(s, "lost"), 0, "{s:#}");
    assert_eq!(n(s, "order_violations"), 0, "{s:#}");
    assert_eq!(n(s, "duplicated_effects"), 0, "{s:#}");
    assert_eq!(n(s, "infected_thumbnails"), 0, "{s:#}");
    let (uploads, infected, corrupt) = (n(s, "uploads"), n(s, "infected"), n(s, "corrupt"));
    assert_eq!(n(s, "scanned"), uploads, "{s:#}");
    assert_eq!(n(s, "quarantined"), infected, "{s:#}");
    assert_eq!(n(s, "thumbnails"), uploads - infected - corrupt, "{s:#}");
    assert_eq!(n(s, "indexed"), uploads - infected - corrupt, "{s:#}");
    // The fragile search API failed and timed out: calls were repeated
    // with the same key, and indexed nothing twice.
    assert!(n(s, "search_calls") >= n(s, "indexed"), "{s:#}");
    assert_eq!(
        s["dead_lettered"]["thumbnailer"].as_i64().unwrap_or(0),
        corrupt,
        "{s:#}"
    );
    for stage in ["antivirus", "thumbnailer", "indexer"] {
        assert!(s["max_backlog"][stage].as_i64().is_some(), "{stage}: {s:#}");
        // No handling committed after its stage's timeout.
        let (slowest, timeout) = (&s["slowest_ms"][stage][0], &s["slowest_ms"][stage][1]);
        assert!(
            slowest.as_i64().unwrap() <= timeout.as_i64().unwrap(),
            "{stage}: {s:#}"
        );
    }
}

#[test]
fn upload_on_the_embedded_default() {
    let dir = tempdir();
    let s = shape(&dir, "upload", &["--uploads", "120"]);
    assert_upload_sound(&s);
    assert_eq!(n(&s, "uploads"), 120, "{s:#}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upload_on_postgres_over_rabbitmq_with_duplicates_and_poison() {
    let pg = PgTestDb::new().await;
    let amqp = tidings_testkit::rabbitmq::amqp_url();
    let args = [
        "--uploads",
        "300",
        "--duplicate-rate",
        "0.2",
        "--poison-rate",
        "0.01",
    ];
    let s = shape_on("upload", &pg.url, &amqp, &args).await;
    assert_upload_sound(&s);
    assert!(s["transport"].as_str().unwrap().starts_with("RabbitMQ"), "{s:#}");
    assert!(n(&s, "duplicates_delivered") > 0, "{s:#}");
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
    for (topic, group) in [
        ("uploads", "catalog"),
        ("jobs.scan", "antivirus"),
        ("jobs.thumbnail", "thumbnailer"),
        ("jobs.index", "indexer"),
    ] {
        rabbit.delete_group(topic, group).await.unwrap();
        rabbit
            .delete_exchange(&format!("{namespace}.{topic}"))
            .await
            .unwrap();
    }
    pg.drop_schema().await;
}

/// The click stream's invariants, checked again from the figures.
fn assert_clicks_sound(s: &Value) {
    assert!(s["broken"].as_array().unwrap().is_empty(), "{s:#}");
    assert_eq!(s["drained"], true, "{s:#}");
    assert_eq!(n(s, "lost"), 0, "{s:#}");
    assert_eq!(n(s, "order_violations"), 0, "{s:#}");
    assert_eq!(n(s, "duplicated_effects"), 0, "{s:#}");
    assert_eq!(n(s, "feature_mismatches"), 0, "{s:#}");
    assert!(s["scored_per_s"].as_f64().unwrap() > 0.0, "{s:#}");
    assert!(!s["waiting_over_time"].as_array().unwrap().is_empty(), "{s:#}");
}

#[test]
fn clicks_on_the_embedded_default() {
    let dir = tempdir();
    let s = shape(&dir, "clicks", &["--clicks", "2000"]);
    assert_clicks_sound(&s);
    assert_eq!(n(&s, "produced"), 2000, "{s:#}");
    assert_eq!(n(&s, "scored"), 2000, "{s:#}");
    assert_eq!(s["path"], "through the outbox", "{s:#}");
    std::fs::remove_dir_all(dir).unwrap();
}

/// Deletes the topics of a clicks run over Kafka: its own, or only its
/// dead-letter topic where it read another team's `external` topic.
async fn delete_click_topics(s: &Value, external: Option<&str>) {
    let namespace = s["broker_namespace"].as_str().expect("a broker namespace");
    let mut options = tidings_broker_kafka::KafkaOptions::default().prefix(namespace);
    if let Some(topic) = external {
        options = options.foreign("clicks", topic);
    }
    let kafka =
        tidings_broker_kafka::KafkaTransport::connect_with(&tidings_testkit::kafka::kafka_url(), options)
            .await
            .unwrap();
    kafka.delete_topic("clicks").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clicks_on_postgres_over_kafka_from_a_plain_producer_with_duplicates_and_poison() {
    let pg = PgTestDb::new().await;
    let args = [
        "--clicks",
        "4000",
        "--duplicate-rate",
        "0.2",
        "--poison-rate",
        "0.01",
    ];
    let s = shape_on("clicks", &pg.url, &tidings_testkit::kafka::kafka_url(), &args).await;
    assert_clicks_sound(&s);
    assert!(s["transport"].as_str().unwrap().starts_with("Kafka"), "{s:#}");
    assert!(s["path"].as_str().unwrap().contains("plain producer"), "{s:#}");
    // Read back from the topic: every click the producer wrote is there.
    assert_eq!(n(&s, "records_in_topic"), 4000, "{s:#}");
    assert!(n(&s, "duplicates_delivered") > 0, "{s:#}");
    // Each malformed click is dead-lettered or parked behind one of its session's.
    let malformed = n(&s, "malformed");
    assert!(malformed > 0, "{s:#}");
    assert!(
        n(&s, "dead_lettered") > 0 && n(&s, "dead_lettered") <= malformed,
        "{s:#}"
    );
    assert_eq!(
        n(&s, "scored") + n(&s, "dead_lettered") + n(&s, "parked"),
        4000,
        "{s:#}"
    );
    delete_click_topics(&s, None).await;
    pg.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clicks_from_another_teams_six_partition_topic_are_each_scored_once() {
    const CLICKS: usize = 3000;
    let topic = format!("web.clicks-{}", uuid::Uuid::new_v4().simple());
    let broker = tidings_testkit::kafka::kafka_url();
    let placed = tidings_testkit::conformance::foreign_kafka_clicks(&broker, &topic, CLICKS, 6).await;
    assert_eq!(placed.values().sum::<usize>(), CLICKS);
    assert!(placed.len() > 1, "one partition used: {placed:?}");
    let pg = PgTestDb::new().await;
    let args = [
        "--clicks",
        "0",
        "--external-topic",
        &topic,
        "--duplicate-rate",
        "0.2",
    ];
    let s = shape_on("clicks", &pg.url, &broker, &args).await;
    assert_clicks_sound(&s);
    assert_eq!(n(&s, "produced"), 0, "{s:#}");
    assert_eq!(n(&s, "records_in_topic"), CLICKS as i64, "{s:#}");
    assert_eq!(n(&s, "scored"), CLICKS as i64, "every click once: {s:#}");
    assert_eq!(n(&s, "dead_lettered"), 0, "{s:#}");
    // The Python producer's bots (a session in ten clicks every 120 ms) are flagged.
    assert!(n(&s, "flagged") > 0, "{s:#}");
    delete_click_topics(&s, Some(&topic)).await;
    let theirs = tidings_broker_kafka::KafkaTransport::connect(&tidings_testkit::kafka::kafka_url())
        .await
        .unwrap();
    theirs.delete_topic(&topic).await.unwrap();
    pg.drop_schema().await;
}
