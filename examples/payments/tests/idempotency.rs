//! The payments system's three consumers through the idempotency harness
//! on PostgreSQL and on MySQL (MariaDB here): delivered twice, redelivered
//! after a crash on either side of the commit, and reordered across
//! payments, each ends in the state of a clean run.

use tidings_core::{Envelope, Message};
use tidings_demo_kit::dialects::{My, Pg};
use tidings_demo_kit::{SidePool, ThirdParty};
use tidings_example_payments::handlers::{Intake, Ledger, Notify};
use tidings_example_payments::messages::*;
use tidings_example_payments::sql::PaymentsDialect;
use tidings_example_payments::stripe::*;
use tidings_example_payments::system::PaymentsStore;
use tidings_sql::SqlStore;
use tidings_testkit::idempotency::{Harness, OUTBOX, State};
use tidings_testkit::services::{MySqlTestDb, PgTestDb, TestDb};

const PAYMENTS_MADE: usize = 12;

fn envelope<M: Message>(message: &M) -> Envelope {
    Envelope::new("payments-tests", message).unwrap()
}

fn amount(i: usize) -> i64 {
    1_000 + 137 * i as i64
}

/// The refunds' running totals of payment `i`: none, one, or two steps.
fn refunds(i: usize) -> Vec<i64> {
    match i % 4 {
        1 => vec![amount(i) / 3],
        2 => vec![amount(i) / 2, amount(i)],
        _ => vec![],
    }
}

/// Payment 7 is in a currency the ledger has no accounts for.
fn currency(i: usize) -> &'static str {
    if i == 7 {
        "xts"
    } else {
        ["eur", "usd", "gbp"][i % 3]
    }
}

/// Stripe's deliveries as the inbox enqueues them: for some payments the
/// refunds come before the capture, and a two-step refund's steps swapped.
fn stripe_events() -> Vec<Envelope> {
    let mut out = Vec::new();
    for i in 0..PAYMENTS_MADE {
        let (intent, charge) = (format!("pi_{i:03}"), format!("ch_{i:03}"));
        let capture = envelope(&PaymentIntentSucceeded {
            id: format!("evt_capture_{i:03}"),
            object: "event".into(),
            created: 1_764_806_400,
            event_type: "payment_intent.succeeded".into(),
            livemode: false,
            data: Data {
                object: PaymentIntent {
                    id: intent.clone(),
                    amount: amount(i),
                    currency: currency(i).into(),
                    customer: Some(format!("cus_{}", i % 5)),
                    latest_charge: Some(charge.clone()),
                    status: "succeeded".into(),
                },
            },
        });
        let mut refunded: Vec<Envelope> = refunds(i)
            .into_iter()
            .enumerate()
            .map(|(n, total)| {
                envelope(&ChargeRefunded {
                    id: format!("evt_refund_{i:03}_{n}"),
                    object: "event".into(),
                    created: 1_764_806_401 + n as i64,
                    event_type: "charge.refunded".into(),
                    livemode: false,
                    data: Data {
                        object: Charge {
                            id: charge.clone(),
                            payment_intent: intent.clone(),
                            amount: amount(i),
                            amount_refunded: total,
                            currency: currency(i).into(),
                        },
                    },
                })
            })
            .collect();
        if i % 3 == 0 {
            refunded.reverse();
        }
        if i % 2 == 0 {
            out.extend(refunded);
            out.push(capture);
        } else {
            out.push(capture);
            out.extend(refunded);
        }
    }
    out
}

/// The payment events the intake emits for those, in each payment's order.
fn payment_events() -> Vec<Envelope> {
    let mut out = Vec::new();
    for i in 0..PAYMENTS_MADE {
        let payment_id = format!("pi_{i:03}");
        out.push(envelope(&PaymentCaptured {
            payment_id: payment_id.clone(),
            amount_cents: amount(i),
            currency: currency(i).into(),
            customer_id: Some(format!("cus_{}", i % 5)),
            provider_event_id: format!("evt_capture_{i:03}"),
            step: step::CAPTURED,
        }));
        let mut before = 0;
        for (n, total) in refunds(i).into_iter().enumerate() {
            out.push(envelope(&PaymentRefunded {
                payment_id: payment_id.clone(),
                amount_cents: total - before,
                currency: currency(i).into(),
                provider_event_id: format!("evt_refund_{i:03}_{n}"),
                step: step::REFUNDED + n as i64,
            }));
            before = total;
        }
    }
    out
}

/// A database whose tables the harness compares: (name, query of (key, row)).
trait Tables: PaymentsDialect {
    const TABLES: &'static [(&'static str, &'static str)];
    fn side(pool: sqlx::Pool<Self::Db>) -> SidePool;
}

impl Tables for Pg {
    const TABLES: &'static [(&'static str, &'static str)] = &[
        (
            "payment",
            "SELECT payment_id, concat_ws(' ', currency, captured_cents, capture_event, refunded_cents,
                 pending_refund_cents) FROM payment_state",
        ),
        (
            "entry",
            "SELECT entry_id, row_to_json(t)::text FROM ledger_entries t",
        ),
        (
            "balance",
            "SELECT account || '/' || currency, balance::text FROM ledger_balances",
        ),
        (
            "notification",
            "SELECT subject || '/' || kind, count(*)::text FROM demo_third_party GROUP BY 1",
        ),
        (
            "step",
            "SELECT consumer || '/' || subject, step::text FROM demo_steps",
        ),
        (
            "violations",
            "SELECT 'count', count(*)::text FROM demo_step_violations",
        ),
        ("emitted", OUTBOX),
    ];
    fn side(pool: sqlx::PgPool) -> SidePool {
        SidePool::Postgres(pool)
    }
}

impl Tables for My {
    const TABLES: &'static [(&'static str, &'static str)] = &[
        (
            "payment",
            "SELECT payment_id, concat_ws(' ', currency, captured_cents, capture_event, refunded_cents,
                 pending_refund_cents) FROM payment_state",
        ),
        (
            "entry",
            "SELECT entry_id, CAST(JSON_OBJECT('payment', payment_id, 'account', account, 'currency', currency,
                 'amount', amount_cents) AS CHAR) FROM ledger_entries",
        ),
        ("balance", "SELECT CONCAT(account, '/', currency), CAST(balance AS CHAR) FROM ledger_balances"),
        (
            "notification",
            "SELECT CONCAT(subject, '/', kind), CAST(count(*) AS CHAR) FROM demo_third_party GROUP BY subject, kind",
        ),
        ("step", "SELECT CONCAT(consumer, '/', subject), CAST(step AS CHAR) FROM demo_steps"),
        ("violations", "SELECT 'count', CAST(count(*) AS CHAR) FROM demo_step_violations"),
        ("emitted", OUTBOX),
    ];
    fn side(pool: sqlx::MySqlPool) -> SidePool {
        SidePool::MySql(pool)
    }
}

/// A payment's refunds are compared by their total: Stripe may deliver a
/// capture and its refunds in any order (they have different keys), and a
/// refund that came first is emitted after the capture, joined with any
/// other that came before it.
fn refunds_summed(kind: &str, payloads: Vec<String>) -> String {
    if kind != PaymentRefunded::TYPE {
        return payloads.join(" | ");
    }
    let total: i64 = payloads
        .iter()
        .map(|p| serde_json::from_str::<PaymentRefunded>(p).unwrap().amount_cents)
        .sum();
    format!("refunded in all {total}")
}

async fn snapshot<D: Tables>(store: &SqlStore<D>) -> State {
    State::read(store, D::TABLES, refunds_summed).await
}

async fn check<T, H>(
    consumer: &str,
    handler: impl Fn(&SqlStore<T::Dialect>) -> H,
    topic: &str,
    events: Vec<Envelope>,
) -> tidings_testkit::idempotency::Report
where
    T: TestDb,
    T::Dialect: Tables,
    H: tidings_consumer::Handler<<T::Dialect as tidings_sql::Dialect>::Db>,
{
    let mut dbs = Vec::new();
    let report = Harness::new(consumer, handler)
        .events(topic, events)
        .check(
            async || {
                let db = T::create().await;
                db.store().setup().await.unwrap();
                ThirdParty::new(T::Dialect::side(db.store().pool().clone()), "notifications")
                    .setup()
                    .await
                    .unwrap();
                let store = db.store().clone();
                dbs.push(db);
                store
            },
            async |store: &SqlStore<T::Dialect>| snapshot(store).await,
        )
        .await;
    for db in dbs {
        db.teardown().await;
    }
    println!("{report}");
    report.assert_idempotent();
    report
}

macro_rules! idempotency_checks {
    ($module:ident, $db:ty) => {
        mod $module {
            use super::*;

            #[tokio::test]
            async fn the_intake_is_idempotent_whatever_order_stripe_delivers_in() {
                let report = check::<$db, _>("intake", |_| Intake, STRIPE, stripe_events()).await;
                assert_eq!(report.scenarios[0].handled, stripe_events().len());
                assert_eq!(report.scenarios[0].dead_lettered, 0, "{report}");
            }

            #[tokio::test]
            async fn the_ledger_is_idempotent_and_dead_letters_an_unknown_currency() {
                let report = check::<$db, _>("ledger", |_| Ledger, PAYMENTS, payment_events()).await;
                assert_eq!(report.scenarios[0].dead_lettered, 1, "{report}");
            }

            #[tokio::test]
            async fn the_notifications_are_idempotent() {
                let notify = |store: &SqlStore<<$db as TestDb>::Dialect>| Notify {
                    sender: ThirdParty::new(
                        <<$db as TestDb>::Dialect as Tables>::side(store.pool().clone()),
                        "notifications",
                    ),
                };
                let report = check::<$db, _>("notify", notify, PAYMENTS, payment_events()).await;
                assert_eq!(report.scenarios[0].handled, payment_events().len());
            }
        }
    };
}

/// The ledger's entries are keyed by Stripe's event ids: with every
/// processed marker gone (past the dedupe horizon, say), booking the same
/// events again books nothing and moves no balance. (The order check does
/// see old steps again: without markers, a replay of the whole story looks
/// like one told out of order.)
async fn ledger_books_nothing_twice_without_markers<T>()
where
    T: TestDb,
    T::Dialect: Tables,
    Ledger: tidings_consumer::Handler<<T::Dialect as tidings_sql::Dialect>::Db>,
{
    let db = T::create().await;
    let store = db.store().clone();
    store.setup().await.unwrap();
    ThirdParty::new(T::Dialect::side(store.pool().clone()), "notifications")
        .setup()
        .await
        .unwrap();
    let ledger = tidings_consumer::Consumer::new("ledger", store.clone(), Ledger).topic(PAYMENTS);
    let events = payment_events();
    for e in &events {
        ledger.deliver(PAYMENTS, e).await;
    }
    let books = |state: State| -> Vec<(String, String)> {
        state
            .iter()
            .filter(|(k, _)| k.starts_with("balance/") || k.starts_with("entry/"))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
    };
    let before = books(snapshot(&store).await);
    assert!(before.len() > 20, "the ledger booked the events: {before:?}");
    let forget = "DELETE FROM tidings_processed WHERE consumer = 'ledger'";
    let mut conn = store.conn("forgetting").await.unwrap();
    tidings_sql::db::Stmt::<T::Dialect>::new(forget, "forgetting the markers")
        .execute(&mut conn)
        .await
        .unwrap();
    drop(conn);
    for e in &events {
        ledger.deliver(PAYMENTS, e).await;
    }
    assert_eq!(
        books(snapshot(&store).await),
        before,
        "booking again changed the books"
    );
    db.teardown().await;
}

#[tokio::test]
async fn the_ledger_books_nothing_twice_without_markers_on_postgres() {
    ledger_books_nothing_twice_without_markers::<PgTestDb>().await;
}

#[tokio::test]
async fn the_ledger_books_nothing_twice_without_markers_on_mysql() {
    ledger_books_nothing_twice_without_markers::<MySqlTestDb>().await;
}

idempotency_checks!(on_postgres, PgTestDb);
idempotency_checks!(on_mysql, MySqlTestDb);
