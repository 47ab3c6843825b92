//! `tidings replay` after a checkout run on PostgreSQL and on MariaDB: the
//! dry run counts every event and changes nothing; the replay re-delivers
//! every event to the consumer, through its running member, and changes no
//! balance; asked of a console (`--daemon`), the same, behind an operator's
//! token, audited, and cancellable.

mod common;

use std::time::Duration;

use chrono::{SecondsFormat, Utc};
use common::{
    ConsoleProcess, OPERATOR, READER, count, produce, start_consumers, start_daemon, texts, tidings,
    wait_drained,
};
use serde_json::Value;
use tidings::sql::{Dialect, SqlStore};
use tidings_testkit::services::{MySqlTestDb, PgTestDb, TestDb};

/// What the loyalty and analytics services hold, and the markers they wrote.
async fn business_state<D: Dialect>(store: &SqlStore<D>) -> Vec<String> {
    let mut state = Vec::new();
    for sql in [
        "SELECT CONCAT(customer_id, '=', CAST(points AS CHAR)) FROM loyalty_points ORDER BY 1",
        "SELECT CONCAT(order_id, '=', CAST(points AS CHAR)) FROM loyalty_pending ORDER BY 1",
        "SELECT CONCAT(message_type, '=', CAST(n AS CHAR)) FROM analytics_counts ORDER BY 1",
        "SELECT CONCAT(consumer, '=', CAST(count(*) AS CHAR)) FROM tidings_processed GROUP BY consumer ORDER BY 1",
    ] {
        state.push(texts(store, sql).await.join(","));
    }
    state
}

fn replay(database: &str, args: &[&str]) -> (Value, String) {
    let out = tidings()
        .args(["replay", "--json", "--database", database])
        .args(args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "tidings replay {args:?} failed: {stderr}");
    let json = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)));
    (json, stderr)
}

#[tokio::test(flavor = "multi_thread")]
async fn replay_redelivers_every_event_and_changes_no_balance() {
    replay_changes_no_balance::<PgTestDb>(true).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn replay_on_mysql_redelivers_every_event_and_changes_no_balance() {
    replay_changes_no_balance::<MySqlTestDb>(false).await;
}

/// With `through_console`, the analytics replay is asked of a console.
async fn replay_changes_no_balance<T: TestDb>(through_console: bool) {
    let db = T::create().await;
    let (url, store) = (db.url(), db.store());
    let since = (Utc::now() - chrono::Duration::seconds(1)).to_rfc3339_opts(SecondsFormat::Millis, true);
    let mut daemon = start_daemon(&url, &[("TIDINGS_METRICS__LISTEN", String::new())]);
    let mut consumers = start_consumers(&url, &[]);
    produce(&url, 150, 0.0);
    wait_drained(&url);
    let before = business_state(store).await;
    assert!(!before[0].is_empty(), "loyalty credited nothing: {before:?}");
    let events = count(store, "SELECT count(*) FROM tidings_log WHERE topic = 'orders'").await;
    assert!(
        events >= 450,
        "150 orders make at least 450 order events, got {events}"
    );

    // The dry run: every event counted, every one already processed, nothing changed.
    let (dry, _) = replay(&url, &["--consumer", "loyalty", "--since", &since, "--dry-run"]);
    assert_eq!(dry["events"], events, "{dry:#}");
    assert_eq!(dry["suppressed"], events, "{dry:#}");
    assert_eq!(dry["to_handle"], 0, "{dry:#}");
    assert_eq!(dry["source"], "log", "{dry:#}");
    assert_eq!(dry["topics"], serde_json::json!(["orders"]), "{dry:#}");
    let requests = count(store, "SELECT count(*) FROM tidings_replays").await;
    assert_eq!(requests, 0, "a dry run records nothing");
    assert_eq!(business_state(store).await, before);

    // The replay, carried out by the running loyalty member, at a bounded rate.
    let started = std::time::Instant::now();
    let (done, progress) = replay(
        &url,
        &["--consumer", "loyalty", "--since", &since, "--rate", "400"],
    );
    assert_eq!(done["state"], "done", "{done:#}");
    assert_eq!(done["counts"]["delivered"], events, "{done:#}");
    assert_eq!(done["counts"]["suppressed"], events, "{done:#}");
    assert_eq!(done["counts"]["handled"], 0, "{done:#}");
    assert_eq!(done["counts"]["failed"], 0, "{done:#}");
    assert!(
        started.elapsed() >= Duration::from_secs_f64(events as f64 / 400.0 * 0.9),
        "faster than the rate asked: {:?} for {events}",
        started.elapsed()
    );
    assert!(
        progress.contains("re-delivered") && progress.contains("ETA"),
        "{progress}"
    );
    assert_eq!(
        business_state(store).await,
        before,
        "a replay changed business state"
    );

    // Analytics counts every event it handles: a replay of it changes no count either.
    let analytics = ["--consumer", "analytics", "--since", &since, "--rate", "5000"];
    let done = if through_console {
        replay_through_console(&url, store, &analytics, events).await
    } else {
        replay(&url, &analytics).0
    };
    assert_eq!(done["counts"]["suppressed"], events, "{done:#}");
    assert_eq!(
        business_state(store).await,
        before,
        "a replay changed business state"
    );
    let actors = texts(
        store,
        "SELECT actor FROM tidings_audit WHERE action = 'replay' ORDER BY at",
    )
    .await;
    assert!(
        actors.len() >= 2 && actors[0].starts_with("cli:"),
        "each replay asked is audited, by whoever asked: {actors:?}"
    );

    assert!(daemon.terminate().success(), "{}", daemon.stderr());
    assert!(consumers.terminate().success(), "{}", consumers.stderr());
    db.teardown().await;
}

/// The analytics replay (`args`), asked of `tidings console` over `url`:
/// refused without a token and to a reader, changing nothing; the console's
/// dry run counts what the database's does; an operator's replay runs to
/// the end through the running member; a slow one is cancelled. Returns the
/// finished replay.
async fn replay_through_console<D: Dialect>(
    url: &str,
    store: &SqlStore<D>,
    args: &[&str],
    events: i64,
) -> Value {
    let console = ConsoleProcess::start(url);
    let asked = || async { count(store, "SELECT count(*) FROM tidings_replays").await };
    let before = asked().await;
    let replay_args: Vec<&str> = ["replay", "--json"]
        .iter()
        .copied()
        .chain(args.iter().copied())
        .collect();
    for (token, status) in [(None, "401"), (Some(READER), "403")] {
        let (ok, _, stderr) = console.tidings(&replay_args, token);
        assert!(!ok && stderr.contains(status), "{token:?}: {stderr}");
    }
    assert_eq!(asked().await, before, "a refused replay recorded nothing");

    let mut dry_args = replay_args.clone();
    dry_args.push("--dry-run");
    let (ok, remote, stderr) = console.tidings(&dry_args, Some(OPERATOR));
    assert!(ok, "{stderr}");
    let remote: Value = serde_json::from_str(&remote).unwrap();
    let (local, _) = replay(url, &dry_args[2..]);
    for field in [
        "events",
        "suppressed",
        "to_handle",
        "undecodable",
        "source",
        "topics",
    ] {
        assert_eq!(
            remote[field], local[field],
            "{field}: {remote:#} against {local:#}"
        );
    }
    assert_eq!(remote["events"], events, "{remote:#}");
    assert_eq!(asked().await, before, "a dry run records nothing");

    let (ok, done, stderr) = console.tidings(&replay_args, Some(OPERATOR));
    assert!(ok, "{stderr}");
    let done: Value = serde_json::from_str(&done).unwrap();
    assert_eq!(done["state"], "done", "{done:#}");
    assert_eq!(done["counts"]["delivered"], events, "{done:#}");
    let actor = texts(
        store,
        "SELECT actor FROM tidings_audit WHERE action = 'replay' ORDER BY at DESC LIMIT 1",
    )
    .await;
    assert_eq!(
        actor,
        ["ops"],
        "the console's replay is audited under its token's name"
    );

    // A replay at one event a second, cancelled through the API.
    let mut slow: Vec<&str> = replay_args[..replay_args.len() - 1].to_vec();
    slow.extend(["1", "--no-wait"]);
    let (ok, started, stderr) = console.tidings(&slow, Some(OPERATOR));
    assert!(ok, "{stderr}");
    let id = serde_json::from_str::<Value>(&started).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let http = reqwest::Client::new();
    let cancel = format!("{}/api/replays/{id}/cancel", console.url);
    let refused = http.post(&cancel).bearer_auth(READER).send().await.unwrap();
    assert_eq!(refused.status(), 403);
    let cancelled: Value = http
        .post(&cancel)
        .bearer_auth(OPERATOR)
        .send()
        .await
        .unwrap()
        .error_for_status()
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(cancelled["state"], "cancelled", "{cancelled:#}");
    let again = http.post(&cancel).bearer_auth(OPERATOR).send().await.unwrap();
    assert_eq!(again.status(), 409, "an ended replay is not cancelled twice");
    let shown: Value = http
        .get(format!("{}/api/replays/{id}", console.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(shown["state"], "cancelled", "{shown:#}");
    let cancels = count(
        store,
        "SELECT count(*) FROM tidings_audit WHERE action = 'replay-cancel'",
    )
    .await;
    assert_eq!(cancels, 1);
    done
}

/// `--kafka`: the consumer's Kafka group is rewound to `--since`; the dry
/// run changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kafka_group_is_rewound_and_the_dry_run_changes_nothing() {
    use futures::StreamExt;
    use tidings_broker_kafka::{KafkaOptions, KafkaTransport};
    use tidings_core::{AckKind, OutgoingMessage, Publisher, Subscriber};
    use tidings_testkit::conformance::Probe;

    let url = tidings_testkit::kafka::kafka_url();
    let prefix = format!("rewind-{}.", uuid::Uuid::new_v4().simple());
    let kafka = KafkaTransport::connect_with(&url, KafkaOptions::default().prefix(&prefix))
        .await
        .unwrap_or_else(|e| panic!("Kafka is not reachable at {url} (set KAFKA_URL): {e}"));
    let events: Vec<OutgoingMessage> = (0..10)
        .map(|seq| {
            let mut m = OutgoingMessage::new(
                "replay-test",
                &Probe {
                    key: format!("k{seq}"),
                    seq,
                },
            )
            .unwrap();
            m.topic = "ledger".into();
            m
        })
        .collect();
    kafka.publish(&events).await.unwrap();
    // The group reads everything and commits the end.
    let mut sub = kafka.subscribe("books", "ledger").await.unwrap();
    for _ in 0..10 {
        let d = sub.next().await.unwrap().unwrap();
        d.ack(AckKind::Ack).await.unwrap();
    }
    sub.close().await.unwrap();
    assert_eq!(kafka.committed("books", "ledger").await.unwrap(), vec![Some(10)]);

    let db = PgTestDb::new().await;
    let args = [
        "--consumer",
        "books",
        "--topic",
        "ledger",
        "--since",
        "1h",
        "--kafka",
        url.as_str(),
        "--kafka-prefix",
        prefix.as_str(),
        "--kafka-partitions",
        "1",
    ];
    let mut dry = args.to_vec();
    dry.push("--dry-run");
    let (plan, _) = replay(&db.url, &dry);
    assert_eq!(plan["dry_run"], true);
    assert_eq!(plan["topics"][0]["messages"], 10, "{plan}");
    assert_eq!(
        kafka.committed("books", "ledger").await.unwrap(),
        vec![Some(10)],
        "the dry run moved nothing"
    );

    let (done, _) = replay(&db.url, &args);
    assert_eq!(done["topics"][0]["messages"], 10, "{done}");
    assert_eq!(kafka.committed("books", "ledger").await.unwrap(), vec![Some(0)]);
    kafka.delete_topic("ledger").await.unwrap();
    db.drop_schema().await;
}
