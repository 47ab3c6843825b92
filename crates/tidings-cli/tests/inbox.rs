//! `tidings run` serving the webhook inbox from its configuration: a
//! Stripe delivery posted over HTTP is taken once, relayed to the database
//! log and counted in the metrics; a provider whose secret is missing stops
//! the daemon at start with one line naming the variable.

mod common;

use std::time::{Duration, Instant};

use common::{Process, free_port, sample, scrape, tidings, wait_for_endpoint};
use tidings_core::secret::Secret;
use tidings_inbox::signature::stripe_header;

const SECRET: &str = "whsec_daemon_test";

fn config(inbox_port: u16) -> String {
    format!(
        "[inbox]\nlisten = \"127.0.0.1:{inbox_port}\"\npath = \"/hooks\"\n\n\
         [[inbox.providers]]\nname = \"stripe\"\nscheme = \"stripe\"\n\
         secret_env = \"TEST_STRIPE_WEBHOOK_SECRET\"\ntopic = \"payments\"\n"
    )
}

async fn post(port: u16, body: &[u8]) -> (u16, serde_json::Value) {
    let signature = stripe_header(&Secret::new(SECRET), chrono::Utc::now().timestamp(), body);
    let response = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{port}/hooks/stripe"))
        .header("stripe-signature", signature)
        .body(body.to_vec())
        .send()
        .await
        .expect("the inbox answers");
    (response.status().as_u16(), response.json().await.unwrap())
}

#[tokio::test(flavor = "multi_thread")]
async fn the_daemon_serves_the_inbox_and_relays_what_it_takes() {
    let path = std::env::temp_dir().join(format!("tidings-inbox-{}.db", uuid::Uuid::new_v4().simple()));
    let database = format!("sqlite://{}", path.display());
    let file = path.with_extension("toml");
    let (inbox_port, metrics_port) = (free_port(), free_port());
    std::fs::write(&file, config(inbox_port)).unwrap();
    let mut command = tidings();
    command
        .args(["run", "--config", file.to_str().unwrap()])
        .env("TIDINGS_DATABASE__URL", &database)
        .env("TIDINGS_RELAY__POLL_INTERVAL", "100ms")
        .env("TIDINGS_METRICS__LISTEN", format!("127.0.0.1:{metrics_port}"))
        .env("TEST_STRIPE_WEBHOOK_SECRET", SECRET);
    let mut daemon = Process::start(command, "inbox-daemon");
    let started = wait_for_endpoint(metrics_port, &mut daemon);
    // Counted from zero: the alert rules see the first failure as an increase.
    for name in tidings_prometheus::metrics_named_in(tidings_prometheus::ALERT_RULES)
        .into_iter()
        .filter(|name| name.starts_with("tidings_inbox_"))
    {
        let failed = format!("{name}{{provider=\"stripe\",outcome=\"failed\"}}");
        assert!(
            started.lines().any(|l| l == format!("{failed} 0")),
            "{failed} is served at 0 before any delivery:\n{started}"
        );
    }

    let body = serde_json::to_vec(&serde_json::json!({
        "id": "evt_daemon_1", "type": "checkout.session.completed",
        "data": {"object": {"id": "cs_1"}}
    }))
    .unwrap();
    for expected in ["accepted", "duplicate", "duplicate"] {
        let (status, answer) = post(inbox_port, &body).await;
        assert_eq!(
            (status, answer["status"].as_str()),
            (200, Some(expected)),
            "{answer}\n{}",
            daemon.stderr()
        );
    }

    // The relay publishes it to the database log, once.
    let store = tidings::sqlite::SqliteStore::connect(&database).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let logged = common::count(
            &store,
            "SELECT count(*) FROM tidings_log WHERE topic = 'payments'",
        )
        .await;
        let pending = common::count(
            &store,
            "SELECT count(*) FROM tidings_outbox WHERE published_at IS NULL",
        )
        .await;
        if logged == 1 && pending == 0 {
            break;
        }
        assert!(logged <= 1, "relayed {logged} times");
        assert!(
            Instant::now() < deadline,
            "not relayed after 30 s:\n{}",
            daemon.stderr()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let metrics = scrape(metrics_port).unwrap();
    for (outcome, n) in [("accepted", 1.0), ("duplicate", 2.0)] {
        let series = format!("tidings_inbox_deliveries_total{{provider=\"stripe\",outcome=\"{outcome}\"}}");
        assert_eq!(sample(&metrics, &series), n, "{series}\n{metrics}");
    }
    let log = daemon.stderr();
    assert!(log.contains("webhook inbox at http://127.0.0.1"), "{log}");
    assert!(!log.contains(SECRET), "the secret is never logged");
    assert!(!log.contains("v1="), "nor a signature");

    let status = daemon.terminate();
    assert!(status.success(), "exited {status}:\n{}", daemon.stderr());
    store.pool().close().await;
    for p in [
        path.clone(),
        file,
        path.with_extension("db-wal"),
        path.with_extension("db-shm"),
    ] {
        let _ = std::fs::remove_file(p);
    }
}

#[test]
fn a_missing_secret_stops_the_daemon_at_start_naming_it() {
    let file = std::env::temp_dir().join(format!("tidings-inbox-{}.toml", uuid::Uuid::new_v4().simple()));
    std::fs::write(&file, config(free_port())).unwrap();
    let out = tidings()
        .args(["run", "--config", file.to_str().unwrap()])
        .env("TIDINGS_DATABASE__URL", "sqlite://unused-inbox.db")
        .env("TIDINGS_METRICS__LISTEN", "")
        .env_remove("TEST_STRIPE_WEBHOOK_SECRET")
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&file);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line, not:\n{stderr}");
    assert!(
        lines[0].contains("TEST_STRIPE_WEBHOOK_SECRET") && lines[0].contains("not set"),
        "{stderr}"
    );
}
