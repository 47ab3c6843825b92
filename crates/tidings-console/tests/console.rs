//! The console against real databases (PostgreSQL, MySQL, SQLite): the
//! overview says what the database says, dead letters group by cause on
//! the page and in the API, a letter's likely secrets never reach the page,
//! every write is refused without an operator's token and changes nothing,
//! and an operator's redrive, skip and purge do what the CLI's do.

use std::net::SocketAddr;

use chrono::Utc;
use reqwest::StatusCode;
use serde_json::{Value, json};
use tidings_console::triage::{self, Selection};
use tidings_console::{Access, Console, ConsoleStore};
use tidings_core::{DeadLetter, Failure, FailureStore, LagSource, cloudevents};
use tidings_testkit::services::{MySqlTestDb, PgTestDb, SqliteTestDb};
use tidings_testkit::store_conformance::fixtures::message;
use uuid::Uuid;

const OPERATOR: &str = "op-0123456789abcdef0123456789";
const READER: &str = "rd-0123456789abcdef0123456789";
const CARD: &str = "4111111111111111";

fn access() -> Access {
    Access::parse(
        &format!("operator:alice:{OPERATOR}\nreader:grafana:{READER}"),
        "test",
    )
    .unwrap()
}

/// Serves a console over `store` on a free port, until the test ends.
async fn serve<S: ConsoleStore>(store: S, access: Access) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    let console = Console::new(store, access);
    tokio::spawn(console.sample(std::time::Duration::from_millis(50), std::future::pending()));
    tokio::spawn(tidings_console::serve(
        listener,
        console.router(),
        std::future::pending(),
    ));
    format!("http://{addr}")
}

/// A dead letter of `consumer` whose body is an envelope of key `key`,
/// its last error `error`; `extra` is added to the envelope's data.
fn letter(consumer: &str, key: &str, error: &str, extra: Option<(&str, Value)>) -> DeadLetter {
    let envelope = message(key, 1).envelope;
    let mut body: Value = serde_json::from_slice(&cloudevents::to_json(&envelope)).unwrap();
    if let Some((field, value)) = extra {
        body["data"][field] = value;
    }
    DeadLetter {
        id: Uuid::now_v7(),
        consumer: consumer.into(),
        topic: "test.events".into(),
        message_id: Some(envelope.id),
        message_type: Some(envelope.message_type.clone()),
        aggregate_key: Some(key.into()),
        headers: [(
            "authorization".to_owned(),
            "Bearer secret-of-the-producer".to_owned(),
        )]
        .into(),
        body: serde_json::to_vec(&body).unwrap(),
        attempts: 3,
        errors: (1..=3)
            .map(|attempt| Failure {
                attempt,
                at: Utc::now(),
                class: "transient".into(),
                error: error.into(),
            })
            .collect(),
        created_at: Utc::now(),
        redrives: 0,
        redriven_at: None,
        skipped_at: None,
    }
}

async fn pending<S: FailureStore>(store: &S) -> Vec<DeadLetter> {
    Selection::default().letters(store).await.unwrap()
}

/// `figure`'s value on the overview page.
fn figure(page: &str, name: &str) -> String {
    let at = page
        .find(&format!("data-figure=\"{name}\""))
        .unwrap_or_else(|| panic!("no figure {name} on the page"));
    let value = &page[at..];
    let start = value.find("class=\"value\">").unwrap() + "class=\"value\">".len();
    let text = &value[start..];
    let text = text.strip_prefix("<a href=\"/dead-letters\">").unwrap_or(text);
    text[..text.find('<').unwrap()].to_owned()
}

async fn the_console_shows_and_acts<S: ConsoleStore + LagSource + Clone>(store: S) {
    let poison: Vec<DeadLetter> = (0..3)
        .map(|i| {
            letter(
                "inventory",
                &format!("order-{i}"),
                &format!("warehouse rejected sku POISON-{i} for order {}", Uuid::new_v4()),
                None,
            )
        })
        .collect();
    let slow = letter("email", "order-9", "smtp timeout after 30s", None);
    let secret = letter(
        "billing",
        "order-7",
        "card declined",
        Some(("card_number", json!(CARD))),
    );
    for l in poison.iter().chain([&slow, &secret]) {
        store.dead_letter(l).await.unwrap();
    }
    let base = serve(store.clone(), access()).await;
    let http = reqwest::Client::new();
    let get = |path: &str| http.get(format!("{base}{path}")).send();

    // The overview says what the database says, with the last hour's
    // figures as small charts once sampled; every answer keeps the page to
    // its own origin.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let answer = get("/").await.unwrap();
    let policy = answer.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        policy.contains("script-src 'self'") && policy.contains("frame-ancestors 'none'"),
        "{policy}"
    );
    assert_eq!(answer.headers()["x-content-type-options"], "nosniff");
    let page = answer.text().await.unwrap();
    assert!(
        page.contains("<svg class=\"spark\""),
        "the charts of the last samples"
    );
    let history: Value = get("/api/history").await.unwrap().json().await.unwrap();
    let samples = history.as_array().unwrap();
    assert!(samples.len() >= 2, "{history}");
    assert_eq!(samples.last().unwrap()["dead_letters"], 5);
    let lag = store.lag().await.unwrap();
    assert_eq!(
        figure(&page, "dead-letters"),
        lag.dead_letters_pending().to_string()
    );
    assert_eq!(figure(&page, "dead-letters"), "5");
    assert_eq!(figure(&page, "outbox-pending"), lag.outbox_pending.to_string());
    let overview: Value = get("/api/overview").await.unwrap().json().await.unwrap();
    assert_eq!(overview["outbox_pending"], lag.outbox_pending);
    let waiting: u64 = overview["dead_letters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["pending"].as_u64().unwrap())
        .sum();
    assert_eq!(waiting, 5);

    // One bug is one cause with its count, on the page and in the API.
    let fingerprint = triage::Cause::of(&poison[0]).fingerprint();
    let causes: Value = get("/api/causes").await.unwrap().json().await.unwrap();
    let expected = serde_json::to_value(triage::by_cause(&pending(&store).await)).unwrap();
    assert_eq!(causes, expected, "the API groups as the CLI does");
    assert_eq!(causes[0]["fingerprint"], fingerprint.as_str());
    assert_eq!(causes[0]["count"], 3);
    let page = get("/dead-letters").await.unwrap().text().await.unwrap();
    let row = &page[page
        .find(&format!("data-fingerprint=\"{fingerprint}\""))
        .expect("the cause's row")..];
    assert!(
        row.starts_with(&format!(
            "data-fingerprint=\"{fingerprint}\"><td class=\"num count\">3</td>"
        )),
        "{row:.200}"
    );
    assert!(page.contains("warehouse rejected sku POISON-&lt;n&gt; for order &lt;id&gt;"));
    let filtered = get(&format!(
        "/dead-letters?cause={fingerprint}&consumer=&type=&since="
    ))
    .await
    .unwrap()
    .text()
    .await
    .unwrap();
    for l in &poison {
        assert!(
            filtered.contains(&format!("/dead-letters/{}", l.id)),
            "each letter of the cause is listed"
        );
    }
    assert!(!filtered.contains(&format!("/dead-letters/{}", slow.id)));
    let bad_filter = get("/dead-letters?since=yesterday").await.unwrap();
    assert_eq!(bad_filter.status(), StatusCode::BAD_REQUEST);

    // A letter in full, its likely secrets masked on the page and in the API.
    let one = get(&format!("/dead-letters/{}", secret.id))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(one.contains("card declined") && one.contains("order-7"));
    assert!(
        !one.contains(CARD) && !one.contains("secret-of-the-producer"),
        "a secret reached the page"
    );
    assert!(one.contains("data.card_number"), "the page says what it masked");
    let json = get(&format!("/api/dead-letters/{}", secret.id))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(!json.contains(CARD) && !json.contains("secret-of-the-producer"));
    let missing = get(&format!("/dead-letters/{}", Uuid::new_v4())).await.unwrap();
    assert_eq!(missing.status(), StatusCode::NOT_FOUND);

    // A message's story, by key and by id: dead-lettered, and where.
    let story: Value = get("/api/keys/order-0").await.unwrap().json().await.unwrap();
    assert_eq!(story.as_array().unwrap().len(), 1, "{story}");
    assert_eq!(story[0]["message_id"], poison[0].message_id.unwrap().to_string());
    assert_eq!(story[0]["dead_letters"][0]["consumer"], "inventory");
    assert_eq!(story[0]["dead_letters"][0]["state"], "pending");
    let page = get("/keys/order-0").await.unwrap().text().await.unwrap();
    assert!(page.contains("dead-lettered by inventory"), "{page}");
    let empty: Value = get("/api/keys/no-such-order")
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(empty, json!([]));
    let unknown = get(&format!("/api/messages/{}", Uuid::new_v4())).await.unwrap();
    assert_eq!(unknown.status(), StatusCode::NOT_FOUND);
    let no_redirect = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    for (q, to) in [
        (
            poison[1].message_id.unwrap().to_string(),
            format!("/messages/{}", poison[1].message_id.unwrap()),
        ),
        ("order 7/x".to_owned(), "/keys/order%207%2Fx".to_owned()),
    ] {
        let found = no_redirect
            .get(format!("{base}/find"))
            .query(&[("q", &q)])
            .send()
            .await
            .unwrap();
        assert_eq!(found.headers()["location"], to.as_str());
    }

    // Every write needs an operator's token, and a refused one changes nothing.
    let before = pending(&store).await;
    let writes = [
        ("/api/redrive", json!({ "selection": { "cause": fingerprint } })),
        ("/api/redrive", json!({ "all": true })),
        (&*format!("/api/dead-letters/{}/skip", slow.id), json!({})),
        ("/api/purge", json!({ "all": true })),
    ];
    for (path, body) in &writes {
        for (token, status) in [
            (None, StatusCode::UNAUTHORIZED),
            (
                Some("not-a-token-of-this-console-at-all"),
                StatusCode::UNAUTHORIZED,
            ),
            (Some(READER), StatusCode::FORBIDDEN),
        ] {
            let mut request = http.post(format!("{base}{path}")).json(body);
            if let Some(token) = token {
                request = request.bearer_auth(token);
            }
            let response = request.send().await.unwrap();
            assert_eq!(response.status(), status, "{path} with {token:?}");
            if status == StatusCode::UNAUTHORIZED {
                assert_eq!(response.headers()["www-authenticate"], "Bearer");
            }
            let said: Value = response.json().await.unwrap();
            assert!(
                said["error"].as_str().is_some_and(|e| !e.contains(READER)),
                "{said}"
            );
        }
    }
    assert_eq!(pending(&store).await, before, "refused writes changed nothing");
    let too_big = http
        .post(format!("{base}/api/redrive"))
        .bearer_auth(OPERATOR)
        .header("content-type", "application/json")
        .body(vec![b' '; tidings_console::BODY_LIMIT + 1])
        .send()
        .await
        .unwrap();
    assert_eq!(too_big.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let unsaid = http
        .post(format!("{base}/api/redrive"))
        .bearer_auth(OPERATOR)
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        unsaid.status(),
        StatusCode::BAD_REQUEST,
        "no selection redrives nothing"
    );

    // Signed in through the page: a reader sees no action and may take none;
    // an operator's forms carry the session's anti-forgery token, and a
    // request without it is refused.
    let browser = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let wrong = browser
        .post(format!("{base}/login"))
        .form(&[("token", "not-a-token-of-this-console-at-all")])
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED);
    let reader = sign_in(&browser, &base, READER).await;
    let page = page_as(&browser, &base, "/dead-letters", &reader).await;
    assert!(
        page.contains("grafana (reader)") && !page.contains("action=\"/dead-letters/redrive\""),
        "a reader gets no redrive form"
    );
    let operator = sign_in(&browser, &base, OPERATOR).await;
    let page = page_as(&browser, &base, "/dead-letters", &operator).await;
    let csrf = csrf_of(&page);
    let filtered = page_as(&browser, &base, "/dead-letters?consumer=inventory", &operator).await;
    assert!(
        filtered.contains("name=\"consumer\" value=\"inventory\""),
        "a cause's button redrives under the filters its count was made with"
    );
    assert!(
        page.contains(&format!("name=\"cause\" value=\"{fingerprint}\"")),
        "a redrive form per cause"
    );
    let form = |csrf: &str| [("csrf", csrf.to_owned()), ("cause", fingerprint.clone())];
    for (cookie, token, status) in [
        (
            &reader,
            csrf_of_session(&browser, &base, &reader).await,
            StatusCode::FORBIDDEN,
        ),
        (&operator, "0".repeat(64), StatusCode::FORBIDDEN),
        (&operator, String::new(), StatusCode::FORBIDDEN),
    ] {
        let refused = browser
            .post(format!("{base}/dead-letters/redrive"))
            .header("cookie", cookie)
            .form(&form(&token))
            .send()
            .await
            .unwrap();
        assert_eq!(refused.status(), status);
    }
    let unsigned = browser
        .post(format!("{base}/dead-letters/redrive"))
        .form(&form(&csrf))
        .send()
        .await
        .unwrap();
    assert_eq!(
        unsigned.status(),
        StatusCode::UNAUTHORIZED,
        "the token without the session"
    );
    let no_header = browser
        .post(format!("{base}/api/redrive"))
        .header("cookie", &operator)
        .json(&json!({ "all": true }))
        .send()
        .await
        .unwrap();
    assert_eq!(
        no_header.status(),
        StatusCode::FORBIDDEN,
        "the API from a session needs the token in a header"
    );
    assert_eq!(pending(&store).await, before, "refused writes changed nothing");
    assert!(
        store.audit_trail(None, 100).await.unwrap().is_empty(),
        "and recorded nothing"
    );

    // An operator redrives a cause from the page, skips one letter and
    // purges what is settled through the API.
    let outbox_before = store.lag().await.unwrap().outbox_pending;
    let done = browser
        .post(format!("{base}/dead-letters/redrive"))
        .header("cookie", &operator)
        .form(&form(&csrf))
        .send()
        .await
        .unwrap();
    assert_eq!(done.status(), StatusCode::OK);
    let done = done.text().await.unwrap();
    assert!(done.contains("3 of 3 dead letter(s) redriven"), "{done}");
    assert_eq!(store.lag().await.unwrap().outbox_pending, outbox_before + 3);
    for l in &poison {
        let after = triage::find(&store, l.id).await.unwrap().unwrap();
        assert_eq!((triage::state(&after), after.redrives), ("redriven", 1));
        let trail = store.audit_trail(Some(&l.id.to_string()), 10).await.unwrap();
        assert_eq!(trail.len(), 1, "{trail:?}");
        assert_eq!(
            (trail[0].actor.as_str(), trail[0].action.as_str()),
            ("alice", "redrive")
        );
        assert_eq!(trail[0].detail["outcome"], "enqueued");
        assert_eq!(trail[0].detail["role"], "operator");
    }
    let page = get(&format!("/dead-letters/{}", poison[0].id))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        page.contains("What was done") && page.contains("<td>alice</td>"),
        "the letter shows its history"
    );
    let message = poison[0].message_id.unwrap();
    let story: Value = get(&format!("/api/messages/{message}"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(
        story["outbox"]["seq"].is_i64() && story["outbox"]["published_at"].is_null(),
        "{story}"
    );
    assert_eq!(story["dead_letters"][0]["state"], "redriven");
    let page = get(&format!("/messages/{message}"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains("waiting in the outbox for the relay"), "{page}");
    let report: Value = http
        .post(format!("{base}/api/redrive"))
        .bearer_auth(OPERATOR)
        .json(&json!({ "selection": { "cause": fingerprint } }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(
        report["error"]
            .as_str()
            .unwrap()
            .contains("no pending dead letter matches"),
        "{report}"
    );
    let left: Vec<Uuid> = pending(&store).await.iter().map(|l| l.id).collect();
    assert_eq!(left.len(), 2);
    assert!(left.contains(&slow.id) && left.contains(&secret.id));
    let skipped = http
        .post(format!("{base}/api/dead-letters/{}/skip", slow.id))
        .bearer_auth(OPERATOR)
        .send()
        .await
        .unwrap();
    assert_eq!(skipped.status(), StatusCode::OK);
    let after = triage::find(&store, slow.id).await.unwrap().unwrap();
    assert_eq!(triage::state(&after), "skipped");
    let purged: Value = http
        .post(format!("{base}/api/purge"))
        .bearer_auth(OPERATOR)
        .json(&json!({ "all": true }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        purged["purged"], 4,
        "three redriven and one skipped go; the pending one stays"
    );
    let every = Selection {
        include_settled: true,
        ..Selection::default()
    };
    let kept: Vec<Uuid> = every
        .letters(&store)
        .await
        .unwrap()
        .iter()
        .map(|l| l.id)
        .collect();
    assert_eq!(kept, [secret.id]);

    // Read without a token, the console answers only for loopback names: a
    // page of another site rebinding its name to 127.0.0.1 reads nothing.
    let rebound = http
        .get(format!("{base}/api/overview"))
        .header("host", "evil.example:9470")
        .send()
        .await
        .unwrap();
    assert_eq!(rebound.status(), StatusCode::MISDIRECTED_REQUEST);

    // Where reading needs a token, a reader's will do and none will not.
    let closed = serve(store.clone(), access().reads_need_token(true)).await;
    for path in ["/", "/api/overview", "/dead-letters", "/api/causes"] {
        let none = http.get(format!("{closed}{path}")).send().await.unwrap();
        assert_eq!(none.status(), StatusCode::UNAUTHORIZED, "{path}");
        let read = http
            .get(format!("{closed}{path}"))
            .bearer_auth(READER)
            .send()
            .await
            .unwrap();
        assert_eq!(read.status(), StatusCode::OK, "{path}");
    }
}

#[tokio::test]
async fn on_postgres() {
    let db = PgTestDb::new().await;
    the_console_shows_and_acts(db.store.clone()).await;
    db.drop_schema().await;
}

#[tokio::test]
async fn on_mysql() {
    let db = MySqlTestDb::new().await;
    the_console_shows_and_acts(db.store.clone()).await;
    db.drop_database().await;
}

#[tokio::test]
async fn on_sqlite() {
    let db = SqliteTestDb::new().await;
    the_console_shows_and_acts(db.store.clone()).await;
}

/// Signs in with `token` through the page; the session's cookie.
async fn sign_in(browser: &reqwest::Client, base: &str, token: &str) -> String {
    let response = browser
        .post(format!("{base}/login"))
        .form(&[("token", token)])
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    let cookie = response.headers()["set-cookie"].to_str().unwrap().to_owned();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    assert!(!cookie.contains(token), "the cookie is not the token");
    cookie.split(';').next().unwrap().to_owned()
}

/// The anti-forgery token in a page's forms.
fn csrf_of(page: &str) -> String {
    let mark = "name=\"csrf\" value=\"";
    let at = page.find(mark).expect("a form with an anti-forgery token") + mark.len();
    page[at..at + page[at..].find('"').unwrap()].to_owned()
}

/// The anti-forgery token of a session that gets no form (a reader's), as
/// its sign-out form shows it.
async fn csrf_of_session(browser: &reqwest::Client, base: &str, cookie: &str) -> String {
    csrf_of(&page_as(browser, base, "/", cookie).await)
}

/// The page at `path` as the session of `cookie` sees it.
async fn page_as(browser: &reqwest::Client, base: &str, path: &str, cookie: &str) -> String {
    let answer = browser
        .get(format!("{base}{path}"))
        .header("cookie", cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::OK, "{path}");
    answer.text().await.unwrap()
}
