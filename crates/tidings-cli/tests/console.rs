//! The console in a real headless browser (Debian's chromium, driven by
//! playwright-core: `tests/browser/console.cjs`), served by the daemon over
//! PostgreSQL after a checkout run with poison: the overview shows the
//! database's figures, the dead-letter page the cause with its count; one
//! letter's payload is edited on its page (checked against the checkout's
//! committed schemas) and the rest of the cause redriven from the page;
//! with the fixed handler running, every order is handled once, the edited
//! one as edited, and no dead letter is left. Screenshots of each page are
//! saved under `target/console-screenshots/`.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;
use tidings::AuditStore as _;
use tidings_testkit::services::PgTestDb;

mod common;

use common::{free_port, start_daemon, summary_of, texts, tidings, wait_for_endpoint};

/// The checkout's committed schema registry, which edits are checked against.
const SCHEMAS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/checkout/schemas");

const TOKEN: &str = "oncall-0123456789abcdef0123";

/// What the browser saw in `step`.
fn browse(console: &str, step: &[&str]) -> Value {
    let modules = std::env::var("TIDINGS_BROWSER_MODULES").unwrap_or_else(|_| {
        panic!("TIDINGS_BROWSER_MODULES is not set: run scripts/test, which installs chromium and playwright-core (ensure_browser)")
    });
    let chromium = std::env::var("TIDINGS_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    assert!(
        std::path::Path::new(&chromium).exists(),
        "no chromium at {chromium}: run scripts/test, which installs it (ensure_browser)"
    );
    let shots = shots();
    let out = Command::new("node")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/browser/console.cjs"))
        .args(step)
        .env("NODE_PATH", modules)
        .env("TIDINGS_CHROMIUM", chromium)
        .env("TIDINGS_CONSOLE_URL", console)
        .env("TIDINGS_CONSOLE_TOKEN", TOKEN)
        .env("TIDINGS_SHOTS", &shots)
        .output()
        .expect("running node (the browser's driver)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the browser's step {step:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"))
}

/// Where the screenshots go.
fn shots() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../target")));
    let dir = target.join("console-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn json(database: &str, args: &[&str]) -> Value {
    let out = tidings()
        .args(args)
        .args(["--database", database])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "tidings {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[tokio::test]
async fn a_cause_redriven_from_the_page_is_handled_once() {
    let db = PgTestDb::new().await;
    let run = tidings()
        .args([
            "demo",
            "checkout",
            "--json",
            "--orders",
            "200",
            "--poison-rate",
            "0.05",
        ])
        .args(["--database", &db.url, "--max-connections", "8"])
        .output()
        .unwrap();
    let summary = summary_of(&run);
    let poisoned = summary["dead_lettered"]["inventory"]
        .as_i64()
        .expect("poisoned orders");
    assert!(poisoned >= 3, "{summary:#}");

    // The daemon serves the console; its relay is off, the fixed handler
    // runs later in the demo's own process.
    let (port, metrics) = (free_port(), free_port());
    let mut daemon = start_daemon(
        &db.url,
        &[
            ("TIDINGS_RELAY__ENABLED", "false".into()),
            ("TIDINGS_METRICS__LISTEN", format!("127.0.0.1:{metrics}")),
            ("TIDINGS_CONSOLE__LISTEN", format!("127.0.0.1:{port}")),
            ("TIDINGS_CONSOLE_TOKENS", format!("operator:oncall:{TOKEN}")),
            ("TIDINGS_CONSOLE__SCHEMAS", SCHEMAS.into()),
        ],
    );
    wait_for_endpoint(metrics, &mut daemon);
    let console = format!("http://127.0.0.1:{port}");

    // The overview shows the database's figures; the dead-letter page the
    // cause with its count; a letter in full, with its actions.
    let seen = browse(&console, &["read"]);
    let lag = json(&db.url, &["lag", "--json"]);
    let pending: i64 = lag["dead_letters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["pending"].as_i64().unwrap())
        .sum();
    assert_eq!(seen["figures"]["dead-letters"], pending.to_string(), "{seen:#}");
    assert_eq!(
        seen["figures"]["outbox-pending"],
        lag["outbox_pending"].to_string(),
        "{seen:#}"
    );
    assert_eq!(seen["signedIn"], "oncall (operator)");
    // Each consumer group's handling rate over the last minute, in which
    // the demo's consumers handled every order.
    let overview: Value = reqwest::Client::new()
        .get(format!("{console}/api/overview"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    for g in overview["groups"].as_array().unwrap() {
        assert!(
            g["handled_per_second"].as_f64().unwrap() > 0.0,
            "{} handled in the last minute: {overview:#}",
            g["group"]
        );
    }
    assert!(!overview["groups"].as_array().unwrap().is_empty(), "{overview:#}");
    assert!(
        seen["charts"].as_i64().unwrap() > 0,
        "the last hour's charts: {seen:#}"
    );
    let causes = json(&db.url, &["dlq", "list", "--json"]);
    let fingerprint = causes[0]["fingerprint"].as_str().unwrap().to_owned();
    assert_eq!(seen["causes"].as_array().unwrap().len(), 1, "{seen:#}");
    assert_eq!(seen["causes"][0]["fingerprint"], fingerprint.as_str());
    assert_eq!(seen["causes"][0]["count"], poisoned);
    assert!(
        seen["causes"][0]["text"]
            .as_str()
            .unwrap()
            .contains("warehouse rejected sku POISON-<n>")
    );
    let letter = &seen["letter"];
    assert_eq!(letter["state"], "pending");
    assert!(
        letter["body"].as_str().unwrap().contains("order_id"),
        "{letter:#}"
    );
    assert!(letter["errors"].as_i64().unwrap() >= 2, "{letter:#}");
    assert_eq!(letter["actions"], serde_json::json!(["Redrive", "Skip"]));

    // The key page of a poisoned order: its dead letter, and the later
    // events of the order parked behind it.
    let poisoned_id = causes[0]["ids"][0].as_str().unwrap();
    let order = json(&db.url, &["dlq", "show", poisoned_id, "--json"])["aggregate_key"]
        .as_str()
        .unwrap()
        .to_owned();
    let before = browse(&console, &["key", &order, "key-poisoned"]);
    let messages = before["messages"].as_array().unwrap();
    assert!(
        messages
            .iter()
            .any(|m| m["verdict"] == "dead-lettered by inventory"
                && m["deadLetters"][0] == serde_json::json!({"consumer": "inventory", "state": "pending"})),
        "{before:#}"
    );
    assert!(
        messages
            .iter()
            .any(|m| m["verdict"].as_str().unwrap().starts_with("parked by inventory") && m["parked"] == 1),
        "the order's later events wait behind it: {before:#}"
    );
    // The first of them on its own page, as the key page told it.
    assert_eq!(before["message"]["id"], messages[0]["message"], "{before:#}");
    assert_eq!(before["message"]["verdict"], messages[0]["verdict"], "{before:#}");

    // One letter's payload edited on its page: the warehouse takes the SKU
    // it is changed to, and the edit is audited.
    let shown = json(&db.url, &["dlq", "show", poisoned_id, "--json"]);
    let mut data = shown["body"]["data"].clone();
    assert!(data["sku"].as_str().unwrap().starts_with("POISON"), "{shown:#}");
    data["sku"] = "EDITED-1".into();
    let edited = browse(
        &console,
        &["edit", poisoned_id, &serde_json::to_string_pretty(&data).unwrap()],
    );
    assert!(
        edited["before"].as_str().unwrap().contains("POISON"),
        "the form holds the payload as stored: {edited:#}"
    );
    assert_eq!(edited["url"], format!("{console}/dead-letters/{poisoned_id}"));
    assert_eq!(edited["state"], "redriven");
    assert_eq!(edited["form"], 0, "a settled letter has no edit form");
    let edits = edited["edits"].as_array().unwrap();
    assert_eq!(edits.len(), 1, "{edited:#}");
    assert_eq!(edits[0]["by"], "oncall");
    assert!(
        edits[0]["original"].as_str().unwrap().contains("POISON")
            && edits[0]["edited"].as_str().unwrap().contains("EDITED-1"),
        "{edited:#}"
    );
    let trail = db.store.audit_trail(Some(poisoned_id), 10).await.unwrap();
    assert_eq!(trail.len(), 1, "{trail:?}");
    assert_eq!(
        (trail[0].actor.as_str(), trail[0].action.as_str()),
        ("oncall", "edit-redrive")
    );
    assert_eq!(trail[0].detail["edit"], edits[0]["id"]);
    assert_eq!(trail[0].detail["message_id"], shown["message_id"]);

    // The rest of the cause redriven from the page.
    let rest = poisoned - 1;
    let done = browse(&console, &["redrive", &fingerprint]);
    assert_eq!(done["label"], format!("Redrive {rest}"));
    assert_eq!(
        done["outcome"],
        format!("{rest} of {rest} dead letter(s) redriven.")
    );
    let after = browse(&console, &["letters"]);
    assert_eq!(after["count"], "0 dead letter(s), 0 cause(s)", "{after:#}");
    daemon.terminate();

    // The fix ships: every order is handled, once; no dead letter is left.
    let fixed = tidings()
        .args(["demo", "checkout", "--json", "--orders", "0", "--warehouse-fixed"])
        .args(["--database", &db.url, "--max-connections", "8"])
        .output()
        .unwrap();
    let fixed = summary_of(&fixed);
    let events = fixed["events_committed"].as_i64().unwrap();
    assert_eq!(fixed["handled"]["inventory"], events, "{fixed:#}");
    assert!(
        json(&db.url, &["dlq", "list", "--json"])
            .as_array()
            .unwrap()
            .is_empty()
    );
    // The edited order was handled as edited.
    let reserved = texts(
        &db.store,
        "SELECT sku FROM inventory_reservations WHERE sku LIKE 'EDITED-%'",
    )
    .await;
    assert_eq!(reserved, ["EDITED-1"]);
    db.drop_schema().await;
}
