//! `tidings dlq` on the dead letters of a real demo run (a SQLite file, and
//! a MariaDB database): the poisoned orders show as one cause with a count,
//! one shows in full, a dry run changes nothing, a redrive by cause is
//! recorded on each, a skip settles one.

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::{ConsoleProcess, OPERATOR, READER};
use serde_json::Value;
use tidings_testkit::services::MySqlTestDb;

fn tidings(database: &str, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tidings"))
        .env("RUST_LOG", "error")
        .args(args)
        .args(["--database", database])
        .output()
        .expect("running tidings");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn json(database: &str, args: &[&str]) -> Value {
    let (ok, stdout, stderr) = tidings(database, args);
    assert!(ok, "tidings {args:?} failed: {stderr}");
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"))
}

fn database() -> (PathBuf, String) {
    let dir = std::env::temp_dir().join(format!("tidings-dlq-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("sqlite://{}", dir.join("dlq.db").display());
    (dir, url)
}

#[test]
fn dead_letters_group_by_cause_show_redrive_and_skip() {
    let (dir, db) = database();
    dead_letters_of_a_demo_run(&db);
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test]
async fn dead_letters_on_mysql_group_by_cause_show_redrive_and_skip() {
    let db = MySqlTestDb::new().await;
    dead_letters_of_a_demo_run(&db.url);
    db.drop_database().await;
}

fn dead_letters_of_a_demo_run(db: &str) {
    let db = db.to_owned();
    let summary = json(
        &db,
        &[
            "demo",
            "checkout",
            "--json",
            "--orders",
            "300",
            "--poison-rate",
            "0.05",
        ],
    );
    let poisoned = summary["dead_lettered"]["inventory"]
        .as_i64()
        .expect("poisoned orders");
    assert!(poisoned >= 3, "{summary:#}");

    // One bug, one line.
    let groups = json(&db, &["dlq", "list", "--json"]);
    let groups = groups.as_array().unwrap();
    assert_eq!(groups.len(), 1, "{groups:#?}");
    let group = &groups[0];
    assert_eq!(group["count"], poisoned);
    assert_eq!(group["cause"]["consumer"], "inventory");
    assert_eq!(group["cause"]["message_type"], "OrderPlaced");
    assert_eq!(group["cause"]["shape"], "warehouse rejected sku POISON-<n>");
    let fingerprint = group["fingerprint"].as_str().unwrap().to_owned();
    let (ok, text, _) = tidings(&db, &["dlq", "list"]);
    assert!(
        ok && text.contains(&fingerprint) && text.contains("1 cause(s)"),
        "{text}"
    );

    // The same list through a console over the same database; a write
    // without an operator's token is refused there and changes nothing.
    let console = ConsoleProcess::start(&db);
    let (ok, text, stderr) = console.tidings(&["dlq", "list", "--json"], None);
    assert!(ok, "{stderr}");
    let remote: Value = serde_json::from_str(text.trim()).unwrap();
    assert_eq!(
        remote,
        json(&db, &["dlq", "list", "--json"]),
        "--daemon lists as --database"
    );
    let (ok, text, stderr) = console.tidings(&["dlq", "list"], None);
    assert!(
        ok && text.contains(&fingerprint) && text.contains("1 cause(s)"),
        "{text}{stderr}"
    );
    // `tidings lag` too, ages aside (they grow between the two reads).
    let counts = |mut v: Value| -> Value {
        v["oldest_unsent_age"] = Value::Null;
        for d in v["dead_letters"].as_array_mut().unwrap() {
            d["oldest_age"] = Value::Null;
        }
        v
    };
    let (ok, text, stderr) = console.tidings(&["lag", "--json"], None);
    assert!(ok, "{stderr}");
    let remote = counts(serde_json::from_str(text.trim()).unwrap());
    assert_eq!(
        remote,
        counts(json(&db, &["lag", "--json"])),
        "--daemon lag as --database"
    );
    assert!(
        remote["dead_letters"][0]["pending"].as_u64() >= Some(1),
        "the poisoned orders' dead letters are counted: {remote:#}"
    );
    let (ok, text, stderr) = console.tidings(&["lag"], None);
    assert!(ok && text.contains("dead letters"), "{text}{stderr}");
    // `tidings outbox status` too, measured by the console, ages and rates aside.
    let backlog = |v: Value| -> Value {
        serde_json::json!({
            "pending": v["pending"],
            "partitions": v["partitions"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| serde_json::json!([p["partition"], p["pending"], p["relay"]]))
                .collect::<Vec<_>>(),
            "relays": v["relays"].as_array().unwrap().len(),
        })
    };
    let args = [
        "outbox",
        "status",
        "--window",
        "100ms",
        "--partitions",
        "2",
        "--json",
    ];
    let (ok, text, stderr) = console.tidings(&args, None);
    assert!(ok, "{stderr}");
    let remote: Value = serde_json::from_str(text.trim()).unwrap();
    assert_eq!(remote["window"]["secs"], 0, "{remote:#}");
    assert_eq!(
        backlog(remote),
        backlog(json(&db, &args)),
        "--daemon outbox status as --database"
    );
    let (ok, text, stderr) = console.tidings(&["outbox", "status", "--window", "100ms"], None);
    assert!(ok && text.contains("relay (fence)"), "{text}{stderr}");
    let (ok, _, stderr) = console.tidings(&["outbox", "status", "--window", "11s"], None);
    assert!(!ok && stderr.contains("window_ms"), "{stderr}");
    let ids = |v: Value| -> Vec<String> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|l| format!("{} {}", l["id"], l["state"]))
            .collect()
    };
    let (ok, text, stderr) = console.tidings(&["dlq", "list", "--each", "--json"], None);
    assert!(ok, "{stderr}");
    assert_eq!(
        ids(serde_json::from_str(text.trim()).unwrap()),
        ids(json(&db, &["dlq", "list", "--each", "--json"]))
    );
    for token in [None, Some(READER)] {
        let (ok, _, stderr) = console.tidings(&["dlq", "redrive", "--cause", &fingerprint], token);
        assert!(!ok, "a redrive through the daemon with {token:?} was accepted");
        assert!(
            stderr.contains(if token.is_none() { "401" } else { "403" }),
            "{stderr}"
        );
    }
    assert_eq!(json(&db, &["dlq", "list", "--json"])[0]["count"], poisoned);

    // One in full.
    let id = group["ids"][0].as_str().unwrap().to_owned();
    let letter = json(&db, &["dlq", "show", &id, "--json"]);
    assert_eq!(letter["state"], "pending");
    assert!(letter["errors"].as_array().unwrap().len() >= 2, "{letter:#}");
    assert!(
        letter["body"]["data"]["order_id"].is_string(),
        "the body as JSON: {letter:#}"
    );
    let (ok, text, _) = tidings(&db, &["dlq", "show", &id]);
    assert!(ok && text.contains("warehouse rejected sku POISON-"), "{text}");

    // A dry run changes nothing.
    let (ok, text, _) = tidings(&db, &["dlq", "redrive", "--consumer", "inventory", "--dry-run"]);
    assert!(ok, "{text}");
    assert!(
        text.contains(&format!(
            "{poisoned} dead letter(s) would be redriven; nothing changed"
        )),
        "{text}"
    );
    assert_eq!(json(&db, &["dlq", "list", "--json"])[0]["count"], poisoned);

    // Redriving needs to be told which.
    let (ok, _, stderr) = tidings(&db, &["dlq", "redrive"]);
    assert!(!ok && stderr.contains("say which dead letters"), "{stderr}");

    // Skip one (through the console, as an operator), redrive the rest of
    // the cause: each is recorded.
    let (ok, text, stderr) = console.tidings(&["dlq", "skip", &id], Some(OPERATOR));
    assert!(ok && text.contains(&format!("skipped {id}")), "{text}{stderr}");
    drop(console);
    let (ok, text, stderr) = tidings(
        &db,
        &["dlq", "redrive", "--cause", &fingerprint, "--rate", "1000"],
    );
    assert!(ok, "{stderr}");
    assert!(
        text.contains(&format!("{0} of {0} dead letter(s) redriven", poisoned - 1)),
        "{text}"
    );
    assert!(
        json(&db, &["dlq", "list", "--json"])
            .as_array()
            .unwrap()
            .is_empty()
    );
    let all = json(&db, &["dlq", "list", "--each", "--include-settled", "--json"]);
    let states: Vec<(&str, i64)> = all
        .as_array()
        .unwrap()
        .iter()
        .map(|l| (l["state"].as_str().unwrap(), l["redrives"].as_i64().unwrap()))
        .collect();
    assert_eq!(states.len() as i64, poisoned);
    assert_eq!(
        states.iter().filter(|s| *s == &("skipped", 0)).count(),
        1,
        "{all:#}"
    );
    assert_eq!(
        states.iter().filter(|s| *s == &("redriven", 1)).count() as i64,
        poisoned - 1,
        "{all:#}"
    );
    let lag = json(&db, &["lag", "--json"]);
    assert_eq!(
        lag["outbox_pending"],
        poisoned - 1,
        "redriven messages wait in the outbox: {lag:#}"
    );

    // The fix ships: the redriven orders are handled, once; the skipped one never.
    let after = json(
        &db,
        &["demo", "checkout", "--json", "--orders", "0", "--warehouse-fixed"],
    );
    let events = after["events_committed"].as_i64().unwrap();
    assert_eq!(after["handled"]["inventory"], events - 1, "{after:#}");
    assert_eq!(after["lost"], 0, "{after:#}");
    assert_eq!(after["duplicated_effects"], 0, "{after:#}");
    assert!(
        after["state_mismatches"].as_array().unwrap().is_empty(),
        "{after:#}"
    );
    assert!(
        json(&db, &["lag", "--json"])["parked"]
            .as_array()
            .unwrap()
            .is_empty()
    );

    // Settled dead letters can go, but only when asked plainly.
    let (ok, _, stderr) = tidings(&db, &["dlq", "purge", "--consumer", "inventory"]);
    assert!(!ok && stderr.contains("pass --yes"), "{stderr}");
    let (ok, text, stderr) = tidings(&db, &["dlq", "purge", "--consumer", "inventory", "--yes"]);
    assert!(ok, "{stderr}");
    assert!(
        text.contains(&format!("purged {poisoned} dead letter(s)")),
        "{text}"
    );
    let left = json(&db, &["dlq", "list", "--each", "--include-settled", "--json"]);
    assert!(left.as_array().unwrap().is_empty(), "{left:#}");

    // Every action is in the audit trail: the skip through the console by
    // its token's name, the redrives and the purge on the database by the
    // command's user.
    let trail = json(&db, &["audit", "--json", "--limit", "1000"]);
    let actions: Vec<(String, String)> = trail
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let actor = e["actor"].as_str().unwrap();
            let who = if actor.starts_with("cli:") { "cli" } else { actor };
            (who.to_owned(), e["action"].as_str().unwrap().to_owned())
        })
        .collect();
    let times = |who: &str, action: &str| {
        actions
            .iter()
            .filter(|a| *a == &(who.to_owned(), action.to_owned()))
            .count()
    };
    assert_eq!(times("cli", "redrive") as i64, poisoned - 1, "{trail:#}");
    assert_eq!(times("cli", "purge"), 1, "{trail:#}");
    assert_eq!(times("ops", "skip"), 1, "{trail:#}");
    let (ok, text, _) = tidings(&db, &["audit", "--target", &id]);
    assert!(ok && text.contains("skip") && text.contains("ops"), "{text}");
    let console = ConsoleProcess::start(&db);
    let (ok, text, stderr) = console.tidings(&["audit", "--json", "--limit", "1000"], None);
    assert!(ok, "{stderr}");
    assert_eq!(
        serde_json::from_str::<Value>(text.trim()).unwrap(),
        trail,
        "--daemon reads the trail as --database"
    );
}

#[test]
fn an_unknown_dead_letter_is_one_clear_error() {
    let (dir, db) = database();
    migrate_then_show_an_unknown_letter(&db);
    std::fs::remove_dir_all(dir).unwrap();
}

/// The same on an empty MariaDB database, which `tidings migrate` sets up.
#[tokio::test]
async fn an_unknown_dead_letter_on_mysql_is_one_clear_error() {
    let db = MySqlTestDb::unmigrated().await;
    migrate_then_show_an_unknown_letter(&db.url);
    db.drop_database().await;
}

fn migrate_then_show_an_unknown_letter(db: &str) {
    let (ok, _, stderr) = tidings(db, &["migrate"]);
    assert!(ok, "{stderr}");
    let (ok, stdout, stderr) = tidings(db, &["migrate"]);
    assert!(ok, "a second migration finds nothing to do: {stderr}");
    assert!(stdout.contains("migrated"), "{stdout}");
    let id = uuid::Uuid::now_v7().to_string();
    let (ok, _, stderr) = tidings(db, &["dlq", "show", &id]);
    assert!(!ok);
    assert_eq!(stderr.trim(), format!("error: no dead letter has id {id}"));
}

/// A body that is not text (a message no decoder understood) shows in hex,
/// never raw on the terminal; a redrive that can move nothing fails, and so
/// does one that matches nothing.
#[tokio::test]
async fn a_binary_body_shows_in_hex_and_a_redrive_of_nothing_fails() {
    use tidings_core::{DeadLetter, Failure, FailureStore};
    let db = tidings_testkit::services::SqliteTestDb::new().await;
    let url = format!("sqlite://{}", db.path.display());
    let id = uuid::Uuid::now_v7();
    let body = vec![0x1b, b'[', b'2', b'J', 0x00, 0xff, 0xfe, 0x07];
    db.store
        .dead_letter(&DeadLetter {
            id,
            consumer: "inventory".into(),
            topic: "orders".into(),
            message_id: None,
            message_type: None,
            aggregate_key: None,
            headers: Default::default(),
            body: body.clone(),
            attempts: 1,
            errors: vec![Failure {
                attempt: 1,
                at: chrono::Utc::now(),
                class: "permanent".into(),
                error: "not an envelope".into(),
            }],
            created_at: chrono::Utc::now(),
            redrives: 0,
            redriven_at: None,
            skipped_at: None,
        })
        .await
        .unwrap();

    let (ok, text, stderr) = tidings(&url, &["dlq", "show", &id.to_string()]);
    assert!(ok, "{stderr}");
    assert!(
        text.contains("body (8 bytes, not text; in hex)\n1b5b324a00fffe07"),
        "{text}"
    );
    assert!(
        !text.contains('\u{1b}'),
        "a raw escape reached the terminal: {text:?}"
    );
    let letter = json(&url, &["dlq", "show", &id.to_string(), "--json"]);
    assert!(letter["body"].is_null(), "{letter:#}");
    assert_eq!(letter["body_hex"], "1b5b324a00fffe07", "{letter:#}");

    // Its body is not an envelope: kept, and the command says it failed.
    let (ok, text, stderr) = tidings(&url, &["dlq", "redrive", &id.to_string()]);
    assert!(!ok, "{text}");
    assert!(text.contains(&format!("kept {id}")), "{text}");
    assert!(
        stderr.contains("none of the 1 dead letter(s) could be redriven"),
        "{stderr}"
    );
    // A selection that matches nothing redrives nothing, and says so.
    for dry in [false, true] {
        let mut args = vec!["dlq", "redrive", "--consumer", "nobody"];
        if dry {
            args.push("--dry-run");
        }
        let (ok, _, stderr) = tidings(&url, &args);
        assert!(!ok, "dry run {dry}");
        assert_eq!(
            stderr.trim(),
            "error: no pending dead letter matches the selection; nothing redriven"
        );
    }
    // A skip of an id no dead letter has fails too.
    let unknown = uuid::Uuid::now_v7();
    let (ok, _, stderr) = tidings(&url, &["dlq", "skip", &unknown.to_string()]);
    assert!(!ok);
    assert_eq!(stderr.trim(), format!("error: no dead letter has id {unknown}"));
}

/// A redrive delivers its message to every group of the topic again: a
/// letter older than the dedupe horizon, whose groups' markers may be gone,
/// is refused unless forced.
#[tokio::test]
async fn a_letter_older_than_the_dedupe_horizon_is_redriven_only_by_force() {
    use tidings_core::{ConsumerStore, DeadLetter, Envelope, Failure, FailureStore};
    let db = tidings_testkit::services::SqliteTestDb::new().await;
    let url = format!("sqlite://{}", db.path.display());
    let probe = tidings_testkit::conformance::Probe {
        key: "order-1".into(),
        seq: 1,
    };
    let envelope = Envelope::new("old-order", &probe).unwrap();
    let id = uuid::Uuid::now_v7();
    let two_days_ago = chrono::Utc::now() - chrono::Duration::days(2);
    db.store
        .dead_letter(&DeadLetter {
            id,
            consumer: "inventory".into(),
            topic: "orders".into(),
            message_id: Some(envelope.id),
            message_type: Some(envelope.message_type.clone()),
            aggregate_key: Some(envelope.aggregate_key.clone()),
            headers: Default::default(),
            body: tidings_core::cloudevents::to_json(&envelope),
            attempts: 1,
            errors: vec![Failure {
                attempt: 1,
                at: two_days_ago,
                class: "permanent".into(),
                error: "warehouse rejected".into(),
            }],
            created_at: two_days_ago,
            redrives: 0,
            redriven_at: None,
            skipped_at: None,
        })
        .await
        .unwrap();
    // The daemon's dedupe retention ran with a day's retention.
    db.store
        .forget_processed(std::time::Duration::from_secs(86_400), 100)
        .await
        .unwrap();

    let (ok, text, stderr) = tidings(&url, &["dlq", "redrive", &id.to_string()]);
    assert!(!ok, "{text}");
    assert!(stderr.contains("past the dedupe horizon"), "{stderr}");
    let (ok, text, stderr) = tidings(&url, &["dlq", "redrive", &id.to_string(), "--force"]);
    assert!(ok, "{text}\n{stderr}");
    assert!(text.contains(&format!("redriven {id}")), "{text}");
    assert!(stderr.contains("will be handled again"), "{stderr}");
}
