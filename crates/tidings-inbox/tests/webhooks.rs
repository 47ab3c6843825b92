//! The webhook inbox over real HTTP, on PostgreSQL, MySQL and SQLite:
//! deliveries signed as Stripe, GitHub and a generic provider sign them,
//! posted by an HTTP client to the router served on a socket.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use base64::Engine;
use chrono::Utc;
use reqwest::StatusCode;
use serde_json::{Value, json};
use tidings_core::InboxStore;
use tidings_core::cloudevents::foreign_id;
use tidings_core::secret::Secret;
use tidings_inbox::signature::{sign_hex, stripe_header};
use tidings_inbox::{Encoding, Field, Inbox, Provider};
use tidings_sql::{SqlStore, StoreOptions};
use tidings_testkit::services::{MySqlTestDb, PgTestDb, SqliteTestDb, TestDb};
use tidings_testkit::store_conformance::fixtures::StoreExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

const STRIPE_SECRET: &str = "whsec_inbox_test";
const GITHUB_SECRET: &str = "github-inbox-test";
const ACME_SECRET: &str = "acme-inbox-test";

/// The router with Stripe (to `payments`), GitHub and a generic `acme`
/// provider (base64 in `X-Acme-Signature`, id in `X-Acme-Delivery`),
/// served on a free port. Returns its base URL.
async fn serve<S: InboxStore + Clone>(store: S, timeout: Duration) -> (String, JoinHandle<()>) {
    let router = Inbox::new(store)
        .provider(Provider::stripe(Secret::new(STRIPE_SECRET)).topic("payments"))
        .provider(Provider::github(Secret::new(GITHUB_SECRET)))
        .provider(
            Provider::hmac("acme", "X-Acme-Signature", Secret::new(ACME_SECRET))
                .encoding(Encoding::Base64)
                .event_id(Field::header("X-Acme-Delivery"))
                .message_type(Field::json("/kind"))
                .key(Some(Field::json("/account"))),
        )
        .body_limit(64 * 1024)
        .timeout(timeout)
        .router()
        .expect("a valid inbox");
    let app = axum::Router::new().nest("/webhooks", router);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    (format!("http://{addr}/webhooks"), server)
}

fn stripe_event(id: &str, payment: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "id": id,
        "object": "event",
        "type": "payment_intent.succeeded",
        "created": 1_700_000_000,
        "data": {"object": {"id": payment, "object": "payment_intent", "amount": 4200, "currency": "eur"}}
    }))
    .unwrap()
}

/// Posts `body` to Stripe's route, signed at `timestamp` with `secret`.
async fn post_stripe(
    http: &reqwest::Client,
    base: &str,
    body: &[u8],
    timestamp: i64,
    secret: &str,
) -> (StatusCode, Value) {
    let signature = stripe_header(&Secret::new(secret), timestamp, body);
    let response = http
        .post(format!("{base}/stripe"))
        .header("content-type", "application/json; charset=utf-8")
        .header("stripe-signature", signature)
        .body(body.to_vec())
        .send()
        .await
        .expect("the inbox answers");
    read(response).await
}

async fn read(response: reqwest::Response) -> (StatusCode, Value) {
    let status = response.status();
    let text = response.text().await.unwrap();
    let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, value)
}

async fn counts<D: tidings_sql::Dialect>(store: &SqlStore<D>) -> (i64, i64) {
    (
        store.count("SELECT count(*) FROM tidings_inbox").await,
        store.count("SELECT count(*) FROM tidings_outbox").await,
    )
}

async fn a_stripe_delivery_posted_three_times_is_enqueued_once<T: TestDb>() {
    let db = T::create().await;
    let store = db.store().clone();
    let (base, server) = serve(store.clone(), Duration::from_secs(10)).await;
    let http = reqwest::Client::new();
    let body = stripe_event("evt_1PqR2sT3uV", "pi_3MtwBw");
    let expected = foreign_id("inbox/stripe", "evt_1PqR2sT3uV").to_string();

    // Stripe signs each attempt anew, with the time of the attempt.
    let mut outcomes = Vec::new();
    for _ in 0..3 {
        let (status, answer) = post_stripe(&http, &base, &body, Utc::now().timestamp(), STRIPE_SECRET).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        assert_eq!(answer["message_id"], expected.as_str());
        outcomes.push(answer["status"].as_str().unwrap().to_owned());
    }
    assert_eq!(outcomes, ["accepted", "duplicate", "duplicate"]);
    assert_eq!(counts(&store).await, (1, 1));
    assert_eq!(
        store
            .count(
                "SELECT count(*) FROM tidings_outbox WHERE topic = 'payments'
                 AND message_type = 'payment_intent.succeeded' AND aggregate_key = 'pi_3MtwBw'"
            )
            .await,
        1,
        "the event's topic, type and key come from the provider's settings and the body"
    );

    // Five copies of another event at once: one is taken, four wait for it
    // and are acknowledged as duplicates.
    let body = stripe_event("evt_concurrent", "pi_other");
    let posts = (0..5).map(|_| post_stripe(&http, &base, &body, Utc::now().timestamp(), STRIPE_SECRET));
    let answers = futures::future::join_all(posts).await;
    let accepted = answers.iter().filter(|(_, a)| a["status"] == "accepted").count();
    let duplicates = answers.iter().filter(|(_, a)| a["status"] == "duplicate").count();
    assert!(answers.iter().all(|(s, _)| *s == StatusCode::OK), "{answers:?}");
    assert_eq!((accepted, duplicates), (1, 4), "{answers:?}");
    assert_eq!(counts(&store).await, (2, 2));

    // Ids that differ by a trailing space are two events, on every database.
    for id in ["evt_space", "evt_space "] {
        let (status, answer) = post_stripe(
            &http,
            &base,
            &stripe_event(id, "pi_s"),
            Utc::now().timestamp(),
            STRIPE_SECRET,
        )
        .await;
        assert_eq!(
            (status, answer["status"].as_str()),
            (StatusCode::OK, Some("accepted")),
            "{id:?}: {answer}"
        );
    }
    assert_eq!(counts(&store).await, (4, 4));

    server.abort();
    db.teardown().await;
}

async fn refused_deliveries_store_nothing<T: TestDb>() {
    let db = T::create().await;
    let store = db.store().clone();
    let (base, server) = serve(store.clone(), Duration::from_secs(10)).await;
    let http = reqwest::Client::new();
    let now = Utc::now().timestamp();
    let body = stripe_event("evt_refused", "pi_1");

    // A body changed after signing.
    let signature = stripe_header(&Secret::new(STRIPE_SECRET), now, &body);
    let tampered = String::from_utf8(body.clone()).unwrap().replace("4200", "1");
    let (status, answer) = read(
        http.post(format!("{base}/stripe"))
            .header("stripe-signature", &signature)
            .body(tampered)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{answer}");
    assert!(
        answer["error"].as_str().unwrap().contains("no signature matches"),
        "{answer}"
    );
    let v1 = signature.split_once("v1=").unwrap().1;
    assert!(
        !answer.to_string().contains(v1),
        "the answer never repeats the signature"
    );

    // A stale timestamp (a replay an hour later), and one from the future.
    for at in [now - 3600, now + 3600] {
        let (status, answer) = post_stripe(&http, &base, &body, at, STRIPE_SECRET).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{answer}");
        assert!(
            answer["error"].as_str().unwrap().contains("tolerance"),
            "{answer}"
        );
    }
    // Another secret.
    let (status, _) = post_stripe(&http, &base, &body, now, "whsec_someone_else").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    // No signature at all.
    let (status, answer) = read(
        http.post(format!("{base}/stripe"))
            .body(body.clone())
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(
        answer["error"].as_str().unwrap().contains("stripe-signature"),
        "{answer}"
    );

    // Signed, but not JSON; JSON without an id.
    let (status, answer) = post_stripe(&http, &base, b"{\"id\": ", now, STRIPE_SECRET).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(answer["error"].as_str().unwrap().contains("not JSON"), "{answer}");
    let (status, answer) =
        post_stripe(&http, &base, br#"{"type":"charge.failed"}"#, now, STRIPE_SECRET).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        answer["error"]
            .as_str()
            .unwrap()
            .contains("no event id (the body's /id)"),
        "{answer}"
    );
    // An id or a key longer than the inbox keeps; control characters.
    for (id, key) in [
        ("e".repeat(300), "pi_1".to_owned()),
        ("evt_ok".to_owned(), "k".repeat(300)),
        ("evt\u{0}nul".to_owned(), "pi_1".to_owned()),
        ("evt_ok".to_owned(), "pi\n1".to_owned()),
    ] {
        let (status, answer) = post_stripe(&http, &base, &stripe_event(&id, &key), now, STRIPE_SECRET).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    }

    // Larger than the body limit: with its length declared, and streamed
    // without one.
    let huge = format!("{{\"id\":\"evt_huge\",\"pad\":\"{}\"}}", "x".repeat(100 * 1024));
    let (status, answer) = post_stripe(&http, &base, huge.as_bytes(), now, STRIPE_SECRET).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{answer}");
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> = (0..100).map(|_| Ok(vec![b' '; 1024])).collect();
    let streamed = reqwest::Body::wrap_stream(futures::stream::iter(chunks));
    let (status, _) = read(
        http.post(format!("{base}/stripe"))
            .header("stripe-signature", &signature)
            .body(streamed)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);

    // A provider that is not configured; a method that is not POST.
    let (status, _) = read(
        http.post(format!("{base}/paypal"))
            .body("{}")
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let status = http.get(format!("{base}/stripe")).send().await.unwrap().status();
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);

    assert_eq!(counts(&store).await, (0, 0), "nothing refused is stored");
    server.abort();
    db.teardown().await;
}

async fn github_and_generic_deliveries_are_taken_once<T: TestDb>() {
    let db = T::create().await;
    let store = db.store().clone();
    let (base, server) = serve(store.clone(), Duration::from_secs(10)).await;
    let http = reqwest::Client::new();

    let push =
        serde_json::to_vec(&json!({"ref": "refs/heads/main", "repository": {"full_name": "acme/shop"}}))
            .unwrap();
    let delivery = "72d3162e-cc78-11e3-81ab-4c9367dc0958";
    let signature = format!("sha256={}", sign_hex(&Secret::new(GITHUB_SECRET), &[&push]));
    for expected in ["accepted", "duplicate"] {
        let (status, answer) = read(
            http.post(format!("{base}/github"))
                .header("x-github-event", "push")
                .header("x-github-delivery", delivery)
                .header("x-hub-signature-256", &signature)
                .body(push.clone())
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(
            (status, answer["status"].as_str()),
            (StatusCode::OK, Some(expected)),
            "{answer}"
        );
    }
    assert_eq!(
        store
            .count("SELECT count(*) FROM tidings_outbox WHERE topic = 'github' AND message_type = 'push' AND aggregate_key = 'acme/shop'")
            .await,
        1
    );

    let first = serde_json::to_vec(&json!({"kind": "invoice.paid", "account": "acct_9", "n": 1})).unwrap();
    let second = serde_json::to_vec(&json!({"kind": "invoice.paid", "account": "acct_9", "n": 2})).unwrap();
    let signed = |body: &[u8]| {
        let mac = hex::decode(sign_hex(&Secret::new(ACME_SECRET), &[body])).unwrap();
        base64::engine::general_purpose::STANDARD.encode(mac)
    };
    // The id is a header the signature does not cover: the same signed
    // body under a new id is a replay, refused; another body is taken.
    for (delivery, body, expected) in [
        ("d-1", &first, StatusCode::OK),
        ("d-1", &first, StatusCode::OK),
        ("d-2", &first, StatusCode::CONFLICT),
        ("d-2", &second, StatusCode::OK),
    ] {
        let (status, answer) = read(
            http.post(format!("{base}/acme"))
                .header("x-acme-delivery", delivery)
                .header("x-acme-signature", signed(body))
                .body(body.clone())
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(status, expected, "{delivery}: {answer}");
    }
    let signature = signed(&first);
    let body = first;
    let (status, answer) = read(
        http.post(format!("{base}/acme"))
            .header("x-acme-signature", &signature)
            .body(body.clone())
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(
        status,
        StatusCode::BAD_REQUEST,
        "a delivery without its id header"
    );
    assert!(
        answer["error"].as_str().unwrap().contains("X-Acme-Delivery"),
        "{answer}"
    );
    assert_eq!(
        store
            .count("SELECT count(*) FROM tidings_outbox WHERE topic = 'acme' AND message_type = 'invoice.paid' AND aggregate_key = 'acct_9'")
            .await,
        2
    );
    // GitHub's delivery id is a header too: its body and its id are both
    // recorded, as are each acme delivery's.
    assert_eq!(counts(&store).await, (6, 3));

    // The retention deletes in batches of its limit.
    assert_eq!(
        store
            .forget_deliveries(Duration::from_secs(3600), 10)
            .await
            .unwrap(),
        0
    );
    assert_eq!(store.forget_deliveries(Duration::ZERO, 4).await.unwrap(), 4);
    assert_eq!(store.forget_deliveries(Duration::ZERO, 4).await.unwrap(), 2);
    assert_eq!(counts(&store).await, (0, 3), "the events stay in the outbox");
    server.abort();
    db.teardown().await;
}

/// A TCP proxy in front of a database server, which can be cut (every
/// connection closed, new ones refused) and restored.
struct Proxy {
    addr: SocketAddr,
    open: Arc<AtomicBool>,
    pipes: Arc<std::sync::Mutex<Vec<JoinHandle<()>>>>,
    accept: JoinHandle<()>,
}

impl Proxy {
    async fn start(upstream: String) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let open = Arc::new(AtomicBool::new(true));
        let pipes: Arc<std::sync::Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let accept = tokio::spawn({
            let (open, pipes) = (open.clone(), pipes.clone());
            async move {
                loop {
                    let Ok((mut client, _)) = listener.accept().await else {
                        return;
                    };
                    if !open.load(Ordering::SeqCst) {
                        continue; // dropped: the connection is closed at once
                    }
                    let upstream = upstream.clone();
                    pipes.lock().unwrap().push(tokio::spawn(async move {
                        if let Ok(mut server) = TcpStream::connect(&upstream).await {
                            let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                        }
                    }));
                }
            }
        });
        Proxy {
            addr,
            open,
            pipes,
            accept,
        }
    }

    fn cut(&self) {
        self.open.store(false, Ordering::SeqCst);
        for pipe in self.pipes.lock().unwrap().drain(..) {
            pipe.abort();
        }
    }

    fn restore(&self) {
        self.open.store(true, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.cut();
        self.accept.abort();
    }
}

/// `url` with its host and port replaced by `addr`, and the host and port
/// it named.
fn through(url: &str, addr: SocketAddr, default_port: u16) -> (String, String) {
    let rest = url.split_once("://").expect("a URL").1;
    let authority = rest.split(['/', '?']).next().unwrap();
    let host_port = authority.rsplit('@').next().unwrap();
    let upstream = if host_port.contains(':') {
        host_port.to_owned()
    } else {
        format!("{host_port}:{default_port}")
    };
    let at = url.find(authority).unwrap() + authority.len() - host_port.len();
    let mut proxied = url.to_owned();
    proxied.replace_range(at..at + host_port.len(), &addr.to_string());
    (proxied, upstream)
}

/// The database unreachable: `503` and nothing taken; back: the provider's
/// retry is taken, once.
async fn an_unreachable_database_gets_503_then_the_retry_is_taken<T: TestDb>(default_port: u16) {
    let db = T::create().await;
    let probe = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let placeholder = probe.local_addr().unwrap();
    drop(probe);
    let (_, upstream) = through(&db.url(), placeholder, default_port);
    let proxy = Proxy::start(upstream).await;
    let (url, _) = through(&db.url(), proxy.addr, default_port);
    let store = SqlStore::<T::Dialect>::connect_with(&url, StoreOptions::default())
        .await
        .expect("the store through the proxy");
    let (base, server) = serve(store, Duration::from_secs(2)).await;
    let http = reqwest::Client::new();
    let body = stripe_event("evt_outage", "pi_outage");

    let (status, answer) = post_stripe(&http, &base, &body, Utc::now().timestamp(), STRIPE_SECRET).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let body = stripe_event("evt_during_outage", "pi_outage");
    proxy.cut();
    let (status, answer) = post_stripe(&http, &base, &body, Utc::now().timestamp(), STRIPE_SECRET).await;
    assert!(status.is_server_error(), "{status} {answer}");
    assert_eq!(
        answer["error"], "the delivery could not be recorded now; deliver it again later",
        "the provider learns nothing of the database"
    );
    assert_eq!(
        counts(db.store()).await,
        (1, 1),
        "nothing of the failed delivery is stored"
    );

    proxy.restore();
    let (status, answer) = post_stripe(&http, &base, &body, Utc::now().timestamp(), STRIPE_SECRET).await;
    assert_eq!(
        (status, answer["status"].as_str()),
        (StatusCode::OK, Some("accepted")),
        "{answer}"
    );
    let (status, answer) = post_stripe(&http, &base, &body, Utc::now().timestamp(), STRIPE_SECRET).await;
    assert_eq!(
        (status, answer["status"].as_str()),
        (StatusCode::OK, Some("duplicate")),
        "{answer}"
    );
    assert_eq!(counts(db.store()).await, (2, 2));
    server.abort();
    db.teardown().await;
}

/// The checks every database passes, one module per database.
macro_rules! on_every_database {
    ($($module:ident: $db:ty;)*) => {$(
        mod $module {
            use super::*;

            #[tokio::test]
            async fn a_stripe_delivery_posted_three_times_is_enqueued_once() {
                super::a_stripe_delivery_posted_three_times_is_enqueued_once::<$db>().await;
            }

            #[tokio::test]
            async fn refused_deliveries_store_nothing() {
                super::refused_deliveries_store_nothing::<$db>().await;
            }

            #[tokio::test]
            async fn github_and_generic_deliveries_are_taken_once() {
                super::github_and_generic_deliveries_are_taken_once::<$db>().await;
            }
        }
    )*};
}

on_every_database! {
    postgres: PgTestDb;
    mysql: MySqlTestDb;
    sqlite: SqliteTestDb;
}

#[tokio::test]
async fn postgres_unreachable_gets_503_then_the_retry_is_taken() {
    an_unreachable_database_gets_503_then_the_retry_is_taken::<PgTestDb>(5432).await;
}

#[tokio::test]
async fn mysql_unreachable_gets_503_then_the_retry_is_taken() {
    an_unreachable_database_gets_503_then_the_retry_is_taken::<MySqlTestDb>(3306).await;
}

/// SQLite has no server to lose: its failure is a database another
/// process holds locked past the request timeout.
#[tokio::test]
async fn sqlite_locked_gets_503_then_the_retry_is_taken() {
    use sqlx::Connection;

    let db = SqliteTestDb::new().await;
    let (base, server) = serve(db.store.clone(), Duration::from_secs(1)).await;
    let http = reqwest::Client::new();
    let body = stripe_event("evt_locked", "pi_locked");

    let mut other = sqlx::SqliteConnection::connect(&db.url()).await.unwrap();
    sqlx::query("BEGIN IMMEDIATE").execute(&mut other).await.unwrap();
    let (status, answer) = post_stripe(&http, &base, &body, Utc::now().timestamp(), STRIPE_SECRET).await;
    assert!(status.is_server_error(), "{status} {answer}");
    sqlx::query("ROLLBACK").execute(&mut other).await.unwrap();
    other.close().await.unwrap();
    assert_eq!(counts(&db.store).await, (0, 0));

    let (status, answer) = post_stripe(&http, &base, &body, Utc::now().timestamp(), STRIPE_SECRET).await;
    assert_eq!(
        (status, answer["status"].as_str()),
        (StatusCode::OK, Some("accepted")),
        "{answer}"
    );
    assert_eq!(counts(&db.store).await, (1, 1));
    server.abort();
}

#[tokio::test]
async fn a_provider_that_cannot_serve_is_refused_at_start() {
    let db = SqliteTestDb::new().await;
    let empty = Inbox::new(db.store.clone())
        .provider(Provider::stripe(Secret::new("")))
        .router();
    assert!(empty.unwrap_err().to_string().contains("its secret is empty"));
    let twice = Inbox::new(db.store.clone())
        .provider(Provider::stripe(Secret::new("a")))
        .provider(Provider::stripe(Secret::new("b")))
        .router();
    assert!(
        twice
            .unwrap_err()
            .to_string()
            .contains("two providers have this name")
    );
    let path = Inbox::new(db.store.clone())
        .provider(Provider::stripe(Secret::new("a")).named("Stripe EU"))
        .router();
    assert!(path.unwrap_err().to_string().contains("path segment"));
}

/// A client that sends its headers and then too little of its body (a
/// slow-loris) is answered `408` once the timeout passes, and holds
/// nothing.
#[tokio::test]
async fn a_body_slower_than_the_timeout_gets_408() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let db = SqliteTestDb::new().await;
    let (base, server) = serve(db.store.clone(), Duration::from_millis(500)).await;
    let addr = base.trim_start_matches("http://").trim_end_matches("/webhooks");
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(
            b"POST /webhooks/stripe HTTP/1.1\r\nHost: inbox\r\nContent-Type: application/json\r\n\
              Stripe-Signature: t=1,v1=00\r\nContent-Length: 100\r\n\r\n{\"id\":",
        )
        .await
        .unwrap();
    let mut response = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut response)).await;
    let response = String::from_utf8_lossy(&response);
    assert!(read.is_ok(), "no answer within 10 s");
    assert!(response.starts_with("HTTP/1.1 408"), "{response}");
    assert_eq!(counts(&db.store).await, (0, 0));
    server.abort();
}
