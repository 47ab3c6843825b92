//! The console against real databases (PostgreSQL, MySQL, SQLite): the
//! overview says what the database says, dead letters group by cause on
//! the page and in the API, a letter's likely secrets never reach the page,
//! every write is refused without an operator's token and changes nothing,
//! an operator's redrive, skip and purge do what the CLI's do, and an
//! edited redrive is checked against its schema before it is sent, once.

use std::net::SocketAddr;

use chrono::Utc;
use reqwest::StatusCode;
use serde_json::{Value, json};
use tidings_console::triage::{self, Selection};
use tidings_console::{Access, Console, ConsoleStore, Schemas};
use tidings_core::{ConsumerStore, DeadLetter, EDIT_HEADER, Failure, FailureStore, LagSource, cloudevents};
use tidings_testkit::services::{MySqlTestDb, PgTestDb, SqliteTestDb};
use tidings_testkit::store_conformance::fixtures::{StoreExt, message};
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
    serve_with(store, access, None).await
}

/// [`serve`], with the schemas edits are checked against.
async fn serve_with<S: ConsoleStore>(store: S, access: Access, schemas: Option<Schemas>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    let mut console = Console::new(store, access);
    if let Some(schemas) = schemas {
        console = console.schemas(schemas);
    }
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
        "card declined (api_key=sk_live_of_the_gateway)",
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
    let mut grouped = triage::by_cause(&pending(&store).await);
    for g in &mut grouped {
        g.example = tidings_console::letter::mask_words(&g.example).0;
    }
    let expected = serde_json::to_value(grouped).unwrap();
    assert_eq!(
        causes, expected,
        "the API groups as the CLI does, its examples masked"
    );
    assert!(
        !causes.to_string().contains("sk_live_of_the_gateway"),
        "a cause's shape holds no secret: {causes}"
    );
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
    // Its error too, by key and by id.
    for path in [
        "/api/keys/order-7".to_owned(),
        format!("/api/messages/{}", secret.message_id.unwrap()),
        "/keys/order-7".to_owned(),
    ] {
        let story = get(&path).await.unwrap().text().await.unwrap();
        assert!(story.contains("card declined"), "{path}: {story}");
        assert!(
            !story.contains("sk_live_of_the_gateway"),
            "{path}: a secret in {story}"
        );
    }
    let empty: Value = get("/api/keys/no-such-order")
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(empty, json!([]));
    let unknown = get(&format!("/api/messages/{}", Uuid::new_v4())).await.unwrap();
    assert_eq!(unknown.status(), StatusCode::NOT_FOUND);
    // A wrong method is refused in JSON too.
    let wrong = get("/api/redrive").await.unwrap();
    assert_eq!(wrong.status(), StatusCode::METHOD_NOT_ALLOWED);
    let wrong: Value = wrong.json().await.unwrap();
    assert!(
        wrong["error"].as_str().unwrap().contains("openapi.json"),
        "{wrong}"
    );
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
    // What axum's extractors refuse is answered in the API's JSON too, with
    // the status they chose, and changes nothing.
    let garbled = http
        .post(format!("{base}/api/redrive"))
        .bearer_auth(OPERATOR)
        .header("content-type", "application/json")
        .body("{\"all\": tru")
        .send()
        .await
        .unwrap();
    let bad_id = http
        .get(format!("{base}/api/dead-letters/not-a-uuid"))
        .bearer_auth(OPERATOR)
        .send()
        .await
        .unwrap();
    let bad_query = http
        .get(format!("{base}/api/audit?limit=many"))
        .bearer_auth(OPERATOR)
        .send()
        .await
        .unwrap();
    let not_json = http
        .post(format!("{base}/api/redrive"))
        .bearer_auth(OPERATOR)
        .body("{\"all\": true}")
        .send()
        .await
        .unwrap();
    let misfit = http
        .post(format!("{base}/api/redrive"))
        .bearer_auth(OPERATOR)
        .json(&json!({ "all": "yes" }))
        .send()
        .await
        .unwrap();
    for (response, status, names) in [
        (garbled, StatusCode::BAD_REQUEST, "body"),
        (bad_id, StatusCode::BAD_REQUEST, "path"),
        (bad_query, StatusCode::BAD_REQUEST, "query"),
        (not_json, StatusCode::UNSUPPORTED_MEDIA_TYPE, "body"),
        (misfit, StatusCode::UNPROCESSABLE_ENTITY, "body"),
    ] {
        assert_eq!(response.status(), status);
        let said: Value = response.json().await.unwrap();
        assert!(
            said["error"].as_str().is_some_and(|e| e.contains(names)),
            "{said}"
        );
    }
    assert_eq!(pending(&store).await, before, "refused requests changed nothing");

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
    // A page of another site may not sign a browser in or out; the console's
    // own page, reached over https, gets a `Secure` cookie.
    let forged = browser
        .post(format!("{base}/login"))
        .header("origin", "http://evil.example")
        .form(&[("token", OPERATOR)])
        .send()
        .await
        .unwrap();
    assert_eq!(forged.status(), StatusCode::FORBIDDEN);
    assert!(forged.headers().get("set-cookie").is_none());
    assert!(forged.text().await.unwrap().contains("evil.example"));
    let own = browser
        .post(format!("{base}/login"))
        .header("origin", base.replacen("http://", "https://", 1))
        .form(&[("token", READER)])
        .send()
        .await
        .unwrap();
    assert_eq!(own.status(), StatusCode::SEE_OTHER);
    let cookie = own.headers()["set-cookie"].to_str().unwrap();
    assert!(cookie.contains("; Secure"), "{cookie}");
    let reader = sign_in(&browser, &base, READER).await;
    let forged_out = browser
        .post(format!("{base}/logout"))
        .header("origin", "https://evil.example")
        .header("cookie", &reader)
        .form(&[("csrf", csrf_of_session(&browser, &base, &reader).await)])
        .send()
        .await
        .unwrap();
    assert_eq!(forged_out.status(), StatusCode::FORBIDDEN);
    assert!(forged_out.headers().get("set-cookie").is_none());
    assert!(
        page_as(&browser, &base, "/", &reader)
            .await
            .contains("grafana (reader)"),
        "the session stays open"
    );
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

/// A schema registry directory holding the test event's schema (`key`
/// text, `seq` a whole number from 0), written as `tidings schema
/// generate` writes one.
fn registry() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("tidings-console-schemas-{}", Uuid::now_v7()));
    std::fs::create_dir_all(&dir).unwrap();
    let schema = json!({
        "$id": "urn:tidings:schema:TestEvent:v1",
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "TestEvent",
        "type": "object",
        "properties": {
            "key": { "type": "string" },
            "seq": { "type": "integer", "minimum": 0 }
        },
        "required": ["key", "seq"],
        "x-tidings": {
            "type": "TestEvent",
            "version": 1,
            "kind": "event",
            "topic": "test.events",
            "aggregate": "test"
        }
    });
    std::fs::write(
        dir.join("TestEvent.v1.json"),
        serde_json::to_string_pretty(&schema).unwrap(),
    )
    .unwrap();
    dir
}

/// The outbox's copies of `message_id`, as envelopes.
async fn copies<S: StoreExt>(store: &S, message_id: Uuid) -> Vec<tidings_core::Envelope> {
    store
        .outbox_bodies()
        .await
        .iter()
        .filter_map(|body| cloudevents::from_json(body).ok())
        .filter(|e| e.id == message_id)
        .collect()
}

/// An edit is refused without an operator's token, without a registry,
/// for a type the registry does not know and for a payload its schema
/// refuses, each time changing nothing; an operator's valid edit sends the
/// message once with the edited payload and the edit's header, is audited,
/// and is shown with the original, masked, on the page and in the API. A
/// second edit finds the letter settled. The page's forms answer with a
/// redirect to the letter; only an operator sees the payload unmasked.
async fn an_edit_is_checked_then_redriven_once<S: ConsoleStore + LagSource + StoreExt + Clone>(store: S) {
    let dir = registry();
    let fixable = letter("inventory", "order-e1", "warehouse rejected order-e1", None);
    let mut other = letter("inventory", "order-e2", "warehouse rejected order-e2", None);
    let mut body: Value = serde_json::from_slice(&other.body).unwrap();
    body["type"] = json!("UnknownEvent");
    other.body = serde_json::to_vec(&body).unwrap();
    other.message_type = Some("UnknownEvent".into());
    let secret = letter(
        "billing",
        "order-e3",
        "card declined",
        Some(("card_number", json!(CARD))),
    );
    let by_form = letter("billing", "order-e4", "card declined", None);
    let redriven_by_form = letter("billing", "order-e5", "card declined", None);
    for l in [&fixable, &other, &secret, &by_form, &redriven_by_form] {
        store.dead_letter(l).await.unwrap();
    }
    let bare = serve(store.clone(), access()).await;
    let base = serve_with(store.clone(), access(), Some(Schemas::load(&dir).unwrap())).await;
    assert!(
        Schemas::load(&dir.join("missing")).is_err(),
        "a registry that cannot be read is refused"
    );
    let http = reqwest::Client::new();
    let edit = |base: &str, id: Uuid, data: Value, token: Option<&str>| {
        let mut request = http
            .post(format!("{base}/api/dead-letters/{id}/edit"))
            .json(&json!({ "data": data }));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        request.send()
    };
    let (id, message_id) = (fixable.id, fixable.message_id.unwrap());
    let unchanged = |what: &'static str| {
        let store = store.clone();
        async move {
            let now = store.letter(id).await.unwrap().unwrap();
            assert!(now.is_pending(), "{what}: the letter is still pending");
            assert!(store.edits(id).await.unwrap().is_empty(), "{what}: no edit kept");
            assert!(
                copies(&store, message_id).await.is_empty(),
                "{what}: nothing sent"
            );
        }
    };
    let good = json!({ "key": "order-e1", "seq": 7 });

    // Refused, changing nothing: without a token, with a reader's, on a
    // console without a registry, for a type it does not know, and for a
    // payload its schema refuses.
    for (token, status) in [
        (None, StatusCode::UNAUTHORIZED),
        (Some(READER), StatusCode::FORBIDDEN),
    ] {
        let refused = edit(&base, fixable.id, good.clone(), token).await.unwrap();
        assert_eq!(refused.status(), status, "{token:?}");
    }
    unchanged("without an operator's token").await;
    let refused = edit(&bare, fixable.id, good.clone(), Some(OPERATOR))
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let said: Value = refused.json().await.unwrap();
    assert!(
        said["error"].as_str().unwrap().contains("--schemas"),
        "says what to do: {said}"
    );
    let refused = edit(
        &base,
        other.id,
        json!({ "key": "order-e2", "seq": 1 }),
        Some(OPERATOR),
    )
    .await
    .unwrap();
    assert_eq!(refused.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let said: Value = refused.json().await.unwrap();
    let said = said["error"].as_str().unwrap();
    assert!(
        said.contains("no schema of UnknownEvent v1") && said.contains("tidings schema generate"),
        "{said}"
    );
    assert!(store.letter(other.id).await.unwrap().unwrap().is_pending());
    for (data, names) in [
        (json!({ "key": "order-e1", "seq": "seven" }), "/seq"),
        (json!({ "key": "order-e1", "seq": -1 }), "/seq"),
        (json!({ "key": "order-e1" }), "seq"),
    ] {
        let refused = edit(&base, fixable.id, data.clone(), Some(OPERATOR))
            .await
            .unwrap();
        assert_eq!(refused.status(), StatusCode::UNPROCESSABLE_ENTITY, "{data}");
        let said: Value = refused.json().await.unwrap();
        let said = said["error"].as_str().unwrap();
        assert!(
            said.contains("TestEvent v1") && said.contains(names),
            "names the first error: {said}"
        );
    }
    unchanged("a payload the schema refuses").await;
    assert!(
        store
            .audit_trail(Some(&fixable.id.to_string()), 10)
            .await
            .unwrap()
            .is_empty()
    );

    // An operator's edit goes out once, as edited.
    let done = edit(&base, fixable.id, good.clone(), Some(OPERATOR))
        .await
        .unwrap();
    assert_eq!(done.status(), StatusCode::OK);
    let done: Value = done.json().await.unwrap();
    assert_eq!(done["message_id"], fixable.message_id.unwrap().to_string());
    assert_eq!(done["redrive"], 1);
    let edit_id = done["edit"].as_str().unwrap().to_owned();
    let sent = copies(&store, fixable.message_id.unwrap()).await;
    assert_eq!(sent.len(), 1);
    assert_eq!(serde_json::from_slice::<Value>(&sent[0].payload).unwrap(), good);
    assert_eq!(sent[0].headers.get(EDIT_HEADER), Some(&edit_id));
    let trail = store
        .audit_trail(Some(&fixable.id.to_string()), 10)
        .await
        .unwrap();
    assert_eq!(trail.len(), 1, "{trail:?}");
    assert_eq!(
        (trail[0].actor.as_str(), trail[0].action.as_str()),
        ("alice", "edit-redrive")
    );
    assert_eq!(trail[0].detail["edit"], edit_id.as_str());
    assert_eq!(trail[0].detail["message_id"], done["message_id"]);
    assert_eq!(trail[0].detail["dead_letter"], fixable.id.to_string());

    // Twice is once: the second finds the letter settled.
    let again = edit(
        &base,
        fixable.id,
        json!({ "key": "order-e1", "seq": 8 }),
        Some(OPERATOR),
    )
    .await
    .unwrap();
    assert_eq!(again.status(), StatusCode::CONFLICT);
    assert_eq!(copies(&store, fixable.message_id.unwrap()).await.len(), 1);
    assert_eq!(store.edits(fixable.id).await.unwrap().len(), 1);

    // The edit beside the original, on the page and in the API.
    let shown: Value = http
        .get(format!("{base}/api/dead-letters/{}", fixable.id))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(shown["state"], "redriven");
    let edits = shown["edits"].as_array().unwrap();
    assert_eq!(edits.len(), 1, "{shown}");
    assert_eq!(edits[0]["id"], edit_id.as_str());
    assert_eq!(edits[0]["by"], "alice");
    assert_eq!(edits[0]["original"], json!({ "key": "order-e1", "seq": 1 }));
    assert_eq!(edits[0]["edited"], good);
    let page = http
        .get(format!("{base}/dead-letters/{}", fixable.id))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        page.contains("id=\"edits\"") && page.contains(&format!("data-edit=\"{edit_id}\"")),
        "the page shows the edit"
    );
    assert!(page.contains("edit-redrive"), "and its audit entry");

    // Signed in, only an operator gets the form, with the payload unmasked;
    // a reader sees it masked.
    let browser = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let reader = sign_in(&browser, &base, READER).await;
    let page = page_as(&browser, &base, &format!("/dead-letters/{}", secret.id), &reader).await;
    assert!(
        !page.contains("<textarea") && !page.contains(CARD),
        "a reader sees no form and no secret"
    );
    let operator = sign_in(&browser, &base, OPERATOR).await;
    let page = page_as(
        &browser,
        &base,
        &format!("/dead-letters/{}", secret.id),
        &operator,
    )
    .await;
    assert!(
        page.contains("<textarea") && page.contains(CARD),
        "an operator edits the payload as stored"
    );
    let csrf = csrf_of(&page);
    // A likely secret in the payload is refused like a schema's error.
    let form = |csrf: &str, data: &str| [("csrf", csrf.to_owned()), ("data", data.to_owned())];
    let refused = browser
        .post(format!("{base}/dead-letters/{}/edit", secret.id))
        .header("cookie", &operator)
        .form(&form(
            &csrf,
            &json!({ "key": "order-e3", "seq": 1, "card_number": CARD }).to_string(),
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert!(store.letter(secret.id).await.unwrap().unwrap().is_pending());

    // The form: without its token refused; not JSON refused; then a redirect.
    for (cookie, token, status) in [
        (&operator, "0".repeat(64), StatusCode::FORBIDDEN),
        (
            &reader,
            csrf_of_session(&browser, &base, &reader).await,
            StatusCode::FORBIDDEN,
        ),
        (&operator, csrf.clone(), StatusCode::UNPROCESSABLE_ENTITY),
    ] {
        let refused = browser
            .post(format!("{base}/dead-letters/{}/edit", by_form.id))
            .header("cookie", cookie)
            .form(&form(&token, "{\"key\": \"order-e4\", "))
            .send()
            .await
            .unwrap();
        assert_eq!(refused.status(), status);
    }
    assert!(store.letter(by_form.id).await.unwrap().unwrap().is_pending());
    // An edit may be larger than other requests, up to its own limit: this
    // one is read (and refused for its type, which has no schema).
    for (size, status) in [
        (100 * 1024, StatusCode::UNPROCESSABLE_ENTITY),
        (tidings_console::EDIT_BODY_LIMIT, StatusCode::PAYLOAD_TOO_LARGE),
    ] {
        let big = json!({ "key": "order-e2", "note": "x".repeat(size) }).to_string();
        let refused = browser
            .post(format!("{base}/dead-letters/{}/edit", other.id))
            .header("cookie", &operator)
            .form(&form(&csrf, &big))
            .send()
            .await
            .unwrap();
        assert_eq!(refused.status(), status, "{size} bytes");
    }
    assert!(store.letter(other.id).await.unwrap().unwrap().is_pending());
    let done = browser
        .post(format!("{base}/dead-letters/{}/edit", by_form.id))
        .header("cookie", &operator)
        .form(&form(&csrf, "{\"key\": \"order-e4\", \"seq\": 2}"))
        .send()
        .await
        .unwrap();
    assert_eq!(done.status(), StatusCode::SEE_OTHER);
    assert_eq!(
        done.headers()["location"],
        format!("/dead-letters/{}", by_form.id).as_str()
    );
    let kept = store.edits(by_form.id).await.unwrap();
    assert_eq!((kept.len(), kept[0].by.as_str()), (1, "alice"));
    // The page's Redrive button answers with a redirect too.
    let done = browser
        .post(format!("{base}/dead-letters/redrive"))
        .header("cookie", &operator)
        .form(&[("csrf", csrf.clone()), ("id", redriven_by_form.id.to_string())])
        .send()
        .await
        .unwrap();
    assert_eq!(done.status(), StatusCode::SEE_OTHER);
    assert_eq!(
        done.headers()["location"],
        format!("/dead-letters/{}", redriven_by_form.id).as_str()
    );
    assert!(
        !store
            .letter(redriven_by_form.id)
            .await
            .unwrap()
            .unwrap()
            .is_pending()
    );
    let again = browser
        .post(format!("{base}/dead-letters/redrive"))
        .header("cookie", &operator)
        .form(&[("csrf", csrf.clone()), ("id", redriven_by_form.id.to_string())])
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), StatusCode::CONFLICT, "settled already");
    assert_eq!(
        copies(&store, redriven_by_form.message_id.unwrap()).await.len(),
        1
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn on_postgres() {
    let db = PgTestDb::new().await;
    the_console_shows_and_acts(db.store.clone()).await;
    an_edit_is_checked_then_redriven_once(db.store.clone()).await;
    db.drop_schema().await;
}

#[tokio::test]
async fn on_mysql() {
    let db = MySqlTestDb::new().await;
    the_console_shows_and_acts(db.store.clone()).await;
    an_edit_is_checked_then_redriven_once(db.store.clone()).await;
    db.drop_database().await;
}

#[tokio::test]
async fn on_sqlite() {
    let db = SqliteTestDb::new().await;
    the_console_shows_and_acts(db.store.clone()).await;
    an_edit_is_checked_then_redriven_once(db.store.clone()).await;
}

/// A letter older than the dedupe horizon (its groups' markers may be
/// gone) is redriven from its page only with the box ticked: without it,
/// 409 and nothing changed.
#[tokio::test]
async fn a_redrive_past_the_dedupe_horizon_needs_its_box_ticked() {
    let db = SqliteTestDb::new().await;
    let store = db.store.clone();
    let old = DeadLetter {
        created_at: Utc::now() - chrono::Duration::hours(1),
        ..letter("inventory", "order-h1", "warehouse rejected order-h1", None)
    };
    store.dead_letter(&old).await.unwrap();
    store
        .forget_processed(std::time::Duration::from_secs(60), 100)
        .await
        .unwrap();
    let base = serve(store.clone(), access()).await;
    let browser = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let operator = sign_in(&browser, &base, OPERATOR).await;
    let page = page_as(&browser, &base, &format!("/dead-letters/{}", old.id), &operator).await;
    assert!(page.contains(r#"name="force""#), "the page offers the box");
    let csrf = csrf_of(&page);
    let redrive = |force: Option<&str>| {
        let mut form = vec![("csrf", csrf.clone()), ("id", old.id.to_string())];
        form.extend(force.map(|f| ("force", f.to_owned())));
        browser
            .post(format!("{base}/dead-letters/redrive"))
            .header("cookie", &operator)
            .form(&form)
            .send()
    };
    let refused = redrive(None).await.unwrap();
    assert_eq!(refused.status(), StatusCode::CONFLICT);
    let said = refused.text().await.unwrap();
    assert!(said.contains("dedupe horizon"), "{said}");
    assert!(store.letter(old.id).await.unwrap().unwrap().is_pending());
    let done = redrive(Some("on")).await.unwrap();
    assert_eq!(done.status(), StatusCode::SEE_OTHER);
    let after = store.letter(old.id).await.unwrap().unwrap();
    assert_eq!((after.is_pending(), after.redrives), (false, 1));
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

/// Every `$ref` under `value`.
fn references(value: &Value, found: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            if let Some(Value::String(r)) = map.get("$ref") {
                found.push(r.clone());
            }
            map.values().for_each(|v| references(v, found));
        }
        Value::Array(items) => items.iter().for_each(|v| references(v, found)),
        _ => {}
    }
}

/// The OpenAPI document describes what the router serves: each operation
/// it lists answers (an operator's ones refuse a caller without a token),
/// each of the API's paths is in it, its references resolve, and another
/// team's validator (openapi-spec-validator, in Python) accepts it.
#[tokio::test]
async fn the_api_is_what_its_openapi_document_says() {
    let db = SqliteTestDb::new().await;
    let base = serve(db.store.clone(), access()).await;
    let http = reqwest::Client::new();
    let response = http.get(format!("{base}/api/openapi.json")).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let doc: Value = response.json().await.unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
    let paths = doc["paths"].as_object().unwrap();
    let operator_only = json!([{ "bearer": [] }, { "session": [], "csrf": [] }]);
    for (path, item) in paths {
        for (method, operation) in item.as_object().unwrap() {
            let url = format!(
                "{base}{}",
                path.replace("{id}", &Uuid::new_v4().to_string())
                    .replace("{key}", "ord-no-such-key")
            );
            let request = match method.as_str() {
                "get" => http.get(&url),
                "post" => http.post(&url).json(&json!({})),
                other => panic!("{other} {path}: a method the API does not use"),
            };
            let response = request.send().await.unwrap();
            let status = response.status();
            let body: Value = response.json().await.unwrap_or(Value::Null);
            assert_ne!(
                body["error"], "no such API path",
                "{method} {path} is documented, not served"
            );
            if operation["security"] == operator_only {
                assert_eq!(status, StatusCode::UNAUTHORIZED, "{method} {path}: {body}");
            } else {
                assert!(
                    status == StatusCode::OK || status == StatusCode::NOT_FOUND,
                    "{method} {path}: {status} {body}"
                );
            }
            assert!(
                operation["responses"]["200"]["content"]["application/json"]["schema"].is_object(),
                "{method} {path} says what it answers"
            );
        }
    }
    for path in [
        "/api/overview",
        "/api/lag",
        "/api/outbox",
        "/api/causes",
        "/api/dead-letters",
        "/api/dead-letters/{id}",
        "/api/dead-letters/{id}/skip",
        "/api/dead-letters/{id}/edit",
        "/api/redrive",
        "/api/purge",
        "/api/audit",
        "/api/messages/{id}",
        "/api/keys/{key}",
        "/api/replays",
        "/api/replays/{id}",
        "/api/replays/{id}/cancel",
        "/api/doctor",
        "/api/slots",
        "/api/history",
    ] {
        assert!(paths.contains_key(path), "{path} is not in the document");
    }
    // The selection's fields are the query parameters of the causes.
    let parameters: Vec<&str> = doc["paths"]["/api/causes"]["get"]["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    for name in [
        "consumer",
        "type",
        "error",
        "cause",
        "since",
        "until",
        "include_settled",
    ] {
        assert!(parameters.contains(&name), "{name} in {parameters:?}");
    }
    let schemas = doc["components"]["schemas"].as_object().unwrap();
    assert!(
        schemas["LetterView"]["properties"]["edits"].is_object(),
        "{:#}",
        schemas["LetterView"]
    );
    let mut found = Vec::new();
    references(&doc, &mut found);
    assert!(found.len() > 10, "{found:?}");
    for r in &found {
        let name = r
            .strip_prefix("#/components/schemas/")
            .unwrap_or_else(|| panic!("{r} points outside the document's schemas"));
        assert!(schemas.contains_key(name), "{r} does not resolve");
    }

    let file = std::env::temp_dir().join(format!("tidings-openapi-{}.json", Uuid::new_v4().simple()));
    std::fs::write(&file, serde_json::to_vec_pretty(&doc).unwrap()).unwrap();
    let checked = std::process::Command::new(tidings_testkit::conformance::foreign_python())
        .args(["-m", "openapi_spec_validator"])
        .arg(&file)
        .output()
        .expect("running openapi-spec-validator");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );
    assert!(
        checked.status.success(),
        "openapi-spec-validator refuses the document:\n{said}"
    );
    assert!(said.contains("OK"), "{said}");
    std::fs::remove_file(&file).unwrap();
}

/// `POST /api/replays` refuses what it cannot do, saying why, and records
/// nothing: a rate that is not one, a range that ends before it starts, a
/// consumer whose topics it cannot tell, a range past the dedupe horizon
/// (unless forced); an empty range is answered with a note and no replay.
#[tokio::test]
async fn a_replay_asked_of_the_api_is_refused_with_its_reason_and_records_nothing() {
    use tidings_core::AuditStore;
    let db = SqliteTestDb::new().await;
    let store = db.store.clone();
    let base = serve(store.clone(), access()).await;
    let http = reqwest::Client::new();
    let ask = |body: Value| {
        http.post(format!("{base}/api/replays"))
            .bearer_auth(OPERATOR)
            .json(&body)
            .send()
    };
    let since = (Utc::now() - chrono::Duration::minutes(10)).to_rfc3339();
    let until = (Utc::now() - chrono::Duration::minutes(20)).to_rfc3339();
    for (body, status, says) in [
        (
            json!({"consumer": "loyalty", "since": since, "topics": ["orders"], "rate": -1.0}),
            StatusCode::BAD_REQUEST,
            "rate",
        ),
        (
            json!({"consumer": "loyalty", "since": since, "until": until, "topics": ["orders"]}),
            StatusCode::BAD_REQUEST,
            "must be before",
        ),
        (
            json!({"consumer": "", "since": since, "topics": ["orders"]}),
            StatusCode::BAD_REQUEST,
            "consumer",
        ),
        (
            json!({"consumer": "loyalty", "since": since}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "cannot tell which topics",
        ),
    ] {
        let response = ask(body.clone()).await.unwrap();
        assert_eq!(response.status(), status, "{body}");
        let said: Value = response.json().await.unwrap();
        assert!(said["error"].as_str().unwrap().contains(says), "{body}: {said}");
    }

    // Nothing retained: answered, with a note, and no replay.
    let empty = json!({"consumer": "loyalty", "since": since, "topics": ["orders"], "source": "log"});
    let answer: Value = ask(empty.clone()).await.unwrap().json().await.unwrap();
    assert_eq!(answer["id"], Value::Null, "{answer:#}");
    assert_eq!(answer["request"]["total"], 0, "{answer:#}");
    assert!(
        answer["notes"][0].as_str().unwrap().contains("nothing retained"),
        "{answer:#}"
    );

    // Past the dedupe horizon: 409 unless forced.
    store
        .forget_processed(std::time::Duration::from_secs(60), 100)
        .await
        .unwrap();
    let refused = ask(empty.clone()).await.unwrap();
    assert_eq!(refused.status(), StatusCode::CONFLICT);
    let said: Value = refused.json().await.unwrap();
    assert!(
        said["error"]
            .as_str()
            .unwrap()
            .contains("past the dedupe horizon"),
        "{said}"
    );
    let mut forced = empty;
    forced["force"] = json!(true);
    let answer: Value = ask(forced).await.unwrap().json().await.unwrap();
    assert!(
        answer["notes"][0]
            .as_str()
            .unwrap()
            .contains("will be handled again"),
        "{answer:#}"
    );
    let trail = store.audit_trail(None, 100).await.unwrap();
    assert!(
        trail.is_empty(),
        "nothing was recorded, nothing audited: {trail:?}"
    );
}
