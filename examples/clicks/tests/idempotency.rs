//! The fraud scorer through the idempotency harness on PostgreSQL and on
//! MySQL (MariaDB here): delivered twice, redelivered after a crash on
//! either side of the commit, and reordered across sessions, it ends in
//! the state of a clean run: each click stored once, each session's
//! state and features as one scoring of each click gives them.

use tidings_core::Envelope;
use tidings_demo_kit::dialects::{My, Pg};
use tidings_example_clicks::handlers::Fraud;
use tidings_example_clicks::messages::{CLICKS, Click};
use tidings_example_clicks::sql::ClicksDialect;
use tidings_example_clicks::system::ClicksStore;
use tidings_sql::SqlStore;
use tidings_testkit::idempotency::{Harness, Report, State, joined};
use tidings_testkit::services::{MySqlTestDb, PgTestDb, TestDb};

const SESSIONS: usize = 4;
const PER_SESSION: i64 = 6;

/// Six clicks in each of four sessions; session 0 a bot (clicks 100 ms
/// apart), the others people; click 3 of session 2 malformed.
fn clicks() -> Vec<Envelope> {
    let mut out = Vec::new();
    for seq in 1..=PER_SESSION {
        for s in 0..SESSIONS {
            let gap = if s == 0 { 100 } else { 1_500 };
            let click = Click {
                click_id: format!("clk-{s}-{seq}"),
                session_id: format!("sess-{s}"),
                seq,
                page: if s == 2 && seq == 3 {
                    String::new()
                } else {
                    format!("/p/{seq}")
                },
                at_ms: 1_700_000_000_000 + seq * gap,
            };
            out.push(Envelope::new("web", &click).unwrap());
        }
    }
    out
}

/// A database whose tables the harness compares: (name, query of (key, row)).
trait Tables: ClicksDialect {
    const TABLES: &'static [(&'static str, &'static str)];
}

impl Tables for Pg {
    const TABLES: &'static [(&'static str, &'static str)] = &[
        (
            "stored",
            "SELECT click_id, session_id || '/' || seq || '/' || page FROM stored_clicks",
        ),
        (
            "session",
            "SELECT session_id, clicks || '/' || fast || '/' || streak || '/' || max_streak || '/' || last_at_ms
             FROM click_sessions",
        ),
        (
            "features",
            "SELECT session_id, clicks || '/' || fast_clicks || '/' || max_streak || '/' || score || '/' || flagged
             FROM click_features",
        ),
        ("step", "SELECT consumer || '/' || subject, step::text FROM demo_steps"),
        ("violations", "SELECT 'count', count(*)::text FROM demo_step_violations"),
    ];
}

impl Tables for My {
    const TABLES: &'static [(&'static str, &'static str)] = &[
        (
            "stored",
            "SELECT click_id, CONCAT(session_id, '/', seq, '/', page) FROM stored_clicks",
        ),
        (
            "session",
            "SELECT session_id, CONCAT(clicks, '/', fast, '/', streak, '/', max_streak, '/', last_at_ms)
             FROM click_sessions",
        ),
        (
            "features",
            "SELECT session_id, CONCAT(clicks, '/', fast_clicks, '/', max_streak, '/', score, '/', flagged)
             FROM click_features",
        ),
        (
            "step",
            "SELECT CONCAT(consumer, '/', subject), CAST(step AS CHAR) FROM demo_steps",
        ),
        (
            "violations",
            "SELECT 'count', CAST(count(*) AS CHAR) FROM demo_step_violations",
        ),
    ];
}

async fn check<T>() -> Report
where
    T: TestDb,
    T::Dialect: Tables,
    Fraud: tidings_consumer::Handler<<T::Dialect as tidings_sql::Dialect>::Db>,
{
    let mut dbs = Vec::new();
    let report = Harness::new("fraud", |_: &SqlStore<T::Dialect>| Fraud)
        .events(CLICKS, clicks())
        .check(
            async || {
                let db = T::create().await;
                db.store().setup().await.unwrap();
                let store = db.store().clone();
                dbs.push(db);
                store
            },
            async |store: &SqlStore<T::Dialect>| State::read(store, T::Dialect::TABLES, joined).await,
        )
        .await;
    for db in dbs {
        db.teardown().await;
    }
    println!("{report}");
    report.assert_idempotent();
    report
}

#[tokio::test]
async fn the_fraud_scorer_is_idempotent_on_postgres() {
    let report = check::<PgTestDb>().await;
    // The malformed click is dead-lettered; the rest of its session waits behind it.
    assert_eq!(report.scenarios[0].dead_lettered, 1, "{report}");
}

#[tokio::test]
async fn the_fraud_scorer_is_idempotent_on_mysql() {
    let report = check::<MySqlTestDb>().await;
    assert_eq!(report.scenarios[0].dead_lettered, 1, "{report}");
}
