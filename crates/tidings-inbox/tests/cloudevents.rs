//! CloudEvents over HTTP, posted by another team's service written with
//! the official CloudEvents SDK for Python (its HTTP binding), to the
//! inbox served on a socket, on PostgreSQL, MySQL and SQLite: binary and
//! structured mode and a batch are each taken once per (`source`, `id`),
//! as their producer wrote them; a retry changes nothing; what is not
//! authenticated, not a CloudEvent or a batch with one bad event is
//! refused with nothing stored.

use std::collections::BTreeMap;

use serde_json::Value;
use tidings_core::InboxStore;
use tidings_core::cloudevents::from_json;
use tidings_core::secret::Secret;
use tidings_inbox::{Inbox, Provider};
use tidings_sql::SqlStore;
use tidings_testkit::conformance::run_client;
use tidings_testkit::services::{MySqlTestDb, PgTestDb, SqliteTestDb, TestDb};
use tidings_testkit::store_conformance::fixtures::StoreExt;
use tokio::net::TcpListener;

const TOKEN: &str = "billing-events-token";
const SOURCE: &str = "https://pay.example/hooks";
const OTHER_SOURCE: &str = "https://billing.example";

/// The inbox with one CloudEvents provider, `billing`, to the topic
/// `invoices`, served on a free port. Returns the provider's URL.
async fn serve<S: InboxStore + Clone>(store: S) -> (String, tokio::task::JoinHandle<()>) {
    let router = Inbox::new(store)
        .provider(Provider::cloudevents("billing", Secret::new(TOKEN)).topic("invoices"))
        .router()
        .expect("a valid inbox");
    let app = axum::Router::new().nest("/events", router);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    (format!("http://{addr}/events/billing"), server)
}

async fn every_mode_is_taken_once<T: TestDb>() {
    let db = T::create().await;
    let store: SqlStore<T::Dialect> = db.store().clone();
    let (url, server) = serve(store.clone()).await;

    let printed = run_client(
        "the Python CloudEvents SDK posting over HTTP",
        &["post-http", &url, TOKEN],
    )
    .await;
    let answers: BTreeMap<String, (u64, Value)> = String::from_utf8_lossy(&printed)
        .lines()
        .map(|line| {
            let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{line:?}: {e}"));
            (
                v["what"].as_str().unwrap().to_owned(),
                (v["status"].as_u64().unwrap(), v["answer"].clone()),
            )
        })
        .collect();
    let status = |what: &str| {
        let (status, answer) = &answers[what];
        (*status, answer["status"].as_str().unwrap_or("").to_owned())
    };
    assert_eq!(status("binary"), (200, "accepted".into()), "{answers:#?}");
    assert_eq!(status("structured"), (200, "accepted".into()));
    assert_eq!(
        status("retry"),
        (200, "duplicate".into()),
        "a retry changes nothing"
    );
    assert_eq!(
        answers["retry"].1["message_id"], answers["binary"].1["message_id"],
        "the retry is the same event"
    );
    let batch: Vec<&str> = answers["batch"].1["events"]
        .as_array()
        .expect("a batch answers per event")
        .iter()
        .map(|e| e["status"].as_str().unwrap())
        .collect();
    assert_eq!(
        batch,
        ["accepted", "accepted", "duplicate"],
        "a new event, the same id from another source, and the structured one again"
    );
    assert_eq!(status("unicode"), (200, "accepted".into()));
    for refused in ["no-token", "wrong-token"] {
        assert_eq!(answers[refused].0, 401, "{refused}: {:?}", answers[refused]);
    }
    assert_eq!(
        answers["not-cloudevents"].0, 415,
        "{:?}",
        answers["not-cloudevents"]
    );
    let bad = &answers["bad-batch"];
    assert_eq!(bad.0, 400, "{bad:?}");
    assert!(
        bad.1["error"].as_str().unwrap().contains("event 2 of the batch"),
        "the reason names the event: {bad:?}"
    );
    assert_eq!(answers["empty-batch"].0, 400);

    // Five events, each once; nothing of what was refused.
    assert_eq!(store.count("SELECT count(*) FROM tidings_inbox").await, 5);
    let events: Vec<_> = store
        .outbox_bodies()
        .await
        .iter()
        .map(|body| from_json(body).expect("the outbox holds CloudEvents"))
        .collect();
    let mut seen: Vec<(String, String, String)> = events
        .iter()
        .map(|e| (e.source.clone(), e.event_id(), e.aggregate_key.clone()))
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        [
            (OTHER_SOURCE.into(), "evt_http_A".into(), "inv-3".into()),
            (SOURCE.into(), "evt_http_A".into(), "inv-1".into()),
            (SOURCE.into(), "evt_http_B".into(), "inv-1".into()),
            (SOURCE.into(), "evt_http_C".into(), "inv-2".into()),
            (SOURCE.into(), "evt_http_D".into(), "cliente-ñ".into()),
        ]
    );
    for e in &events {
        assert_eq!(e.message_type, "invoice.paid");
        assert_eq!(e.headers.get("tenant").map(String::as_str), Some("acme"), "{e:?}");
        assert!(
            !e.headers.contains_key("authorization"),
            "the token is not the event's: {e:?}"
        );
        let data: Value = serde_json::from_slice(&e.payload).unwrap();
        assert_eq!(data["event"], e.event_id().as_str());
    }
    let d = events.iter().find(|e| e.event_id() == "evt_http_D").unwrap();
    assert_eq!(
        d.headers.get("subject").map(String::as_str),
        Some("café ☕ 100%"),
        "binary-mode values are percent-decoded"
    );

    server.abort();
    db.teardown().await;
}

#[tokio::test]
async fn postgres_every_mode_is_taken_once() {
    every_mode_is_taken_once::<PgTestDb>().await;
}

#[tokio::test]
async fn mysql_every_mode_is_taken_once() {
    every_mode_is_taken_once::<MySqlTestDb>().await;
}

#[tokio::test]
async fn sqlite_every_mode_is_taken_once() {
    every_mode_is_taken_once::<SqliteTestDb>().await;
}

/// A structured CloudEvent with `id` from `source`.
fn structured(id: &str, source: &str) -> String {
    serde_json::json!({
        "specversion": "1.0", "id": id, "source": source, "type": "invoice.paid",
        "datacontenttype": "application/json", "data": {"invoice": "inv-7"}
    })
    .to_string()
}

/// Posts `body` as `content_type` with the token; the status and answer.
async fn post(url: &str, content_type: &str, body: String) -> (u16, Value) {
    let response = reqwest::Client::new()
        .post(url)
        .header("content-type", content_type)
        .header("authorization", format!("Bearer {TOKEN}"))
        .body(body)
        .send()
        .await
        .expect("the inbox answers");
    let status = response.status().as_u16();
    let text = response.text().await.unwrap_or_default();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// A UUID id is the message id consumers deduplicate on: taken under one
/// source, refused (409) under another instead of lost downstream. A batch
/// past the limit is refused whole (413).
#[tokio::test]
async fn a_uuid_id_belongs_to_one_source_and_batches_are_bounded() {
    let db = SqliteTestDb::create().await;
    let store = db.store().clone();
    let (url, server) = serve(store.clone()).await;
    let ce = "application/cloudevents+json";
    let id = "0193a5c4-7d1e-7b3a-9f00-5e1f2a3b4c5d";
    let (status, answer) = post(&url, ce, structured(id, SOURCE)).await;
    assert_eq!(
        (status, answer["status"].as_str()),
        (200, Some("accepted")),
        "{answer}"
    );
    assert_eq!(answer["message_id"], id, "a UUID id is the message id");
    let (status, answer) = post(&url, ce, structured(id, OTHER_SOURCE)).await;
    assert_eq!(status, 409, "{answer}");
    assert!(
        answer["error"].as_str().unwrap().contains("another source"),
        "{answer}"
    );
    let (status, answer) = post(&url, ce, structured(id, SOURCE)).await;
    assert_eq!(
        (status, answer["status"].as_str()),
        (200, Some("duplicate")),
        "{answer}"
    );

    let events: Vec<String> = (0..=tidings_inbox::MAX_BATCH_EVENTS)
        .map(|n| structured(&format!("evt_{n}"), SOURCE))
        .collect();
    let (status, answer) = post(
        &url,
        "application/cloudevents-batch+json",
        format!("[{}]", events.join(",")),
    )
    .await;
    assert_eq!(status, 413, "{answer}");
    assert_eq!(store.count("SELECT count(*) FROM tidings_outbox").await, 1);

    server.abort();
    db.teardown().await;
}
