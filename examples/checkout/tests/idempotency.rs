//! The checkout system's five consumers through the idempotency harness on
//! PostgreSQL: delivered twice, redelivered after a crash on either side of
//! the commit, and reordered across orders, each ends in the state of a
//! clean run.

use sqlx::PgPool;
use tidings_core::{Envelope, Message};
use tidings_example_checkout::handlers::{Analytics, Checkout, Email, EmailProvider, Inventory, Loyalty};
use tidings_example_checkout::messages::*;
use tidings_example_checkout::system::CheckoutStore;
use tidings_store_postgres::PgStore;
use tidings_testkit::idempotency::{Harness, Report, State};
use tidings_testkit::services::PgTestDb;

const ORDERS_PLACED: usize = 24;

fn envelope<M: Message>(message: &M) -> Envelope {
    Envelope::new("checkout-tests", message).unwrap()
}

fn order_id(i: usize) -> String {
    format!("ord-{i:03}")
}

fn sku(i: usize) -> String {
    if i == 5 {
        format!("POISON-{i}")
    } else {
        format!("SKU-{}", i % 7)
    }
}

fn cancelled(i: usize) -> bool {
    i % 6 == 1
}

/// The commands of every order, orders interleaved step by step as a front door sends them.
fn commands() -> Vec<Envelope> {
    let mut out = Vec::new();
    for step in 1..=3 {
        for i in 0..ORDERS_PLACED {
            let order_id = order_id(i);
            out.push(match step {
                1 => envelope(&PlaceOrder {
                    order_id,
                    customer_id: format!("cus-{}", i % 5),
                    sku: sku(i),
                    quantity: 1 + (i % 3) as u32,
                    total_cents: 1_000 + 137 * i as i64,
                }),
                2 => envelope(&CapturePayment { order_id }),
                _ if cancelled(i) => envelope(&CancelOrder { order_id }),
                _ => envelope(&ShipOrder { order_id }),
            });
        }
    }
    out
}

/// The events the checkout service emits for those commands.
fn events() -> Vec<Envelope> {
    let mut out = Vec::new();
    for step in 1..=3 {
        for i in 0..ORDERS_PLACED {
            let order_id = order_id(i);
            out.push(match step {
                1 => envelope(&OrderPlaced {
                    order_id,
                    customer_id: format!("cus-{}", i % 5),
                    sku: sku(i),
                    quantity: 1 + (i % 3) as u32,
                    total_cents: 1_000 + 137 * i as i64,
                    step,
                    customer_email: None,
                }),
                2 => envelope(&PaymentCaptured {
                    order_id,
                    amount_cents: 1_000 + 137 * i as i64,
                    step,
                }),
                _ if cancelled(i) => envelope(&OrderCancelled { order_id, step }),
                _ => envelope(&OrderShipped { order_id, step }),
            });
        }
    }
    out
}

/// Every business table of the checkout system, row by row, and what the
/// email provider sent (emails, not calls: a retried call with the same
/// idempotency key is the same email).
const TABLES: &[(&str, &str)] = &[
    (
        "order",
        "SELECT order_id, row_to_json(t)::text FROM checkout_orders t",
    ),
    (
        "reservation",
        "SELECT order_id, row_to_json(t)::text FROM inventory_reservations t",
    ),
    ("analytics", "SELECT message_type, n::text FROM analytics_counts"),
    (
        "loyalty pending",
        "SELECT order_id, points::text FROM loyalty_pending",
    ),
    (
        "loyalty points",
        "SELECT customer_id, points::text FROM loyalty_points",
    ),
    (
        "progress",
        "SELECT consumer || '/' || order_id, last_step::text FROM order_progress",
    ),
    (
        "violations",
        "SELECT 'count', count(*)::text FROM order_violations",
    ),
    (
        "email",
        "SELECT order_id || '/' || kind, count(*)::text FROM email_provider GROUP BY 1",
    ),
];

async fn snapshot(store: &PgStore) -> State {
    let pool = store.pool();
    let mut state = State::new();
    for (name, query) in TABLES {
        let rows: Vec<(String, String)> = sqlx::query_as(*query).fetch_all(pool).await.unwrap();
        state.extend_prefixed(name, rows.into_iter().collect());
    }
    state.extend_prefixed("emitted", emitted(pool).await);
    state
}

/// What the checkout service emitted through the outbox: per order and type, the payloads.
async fn emitted(pool: &PgPool) -> State {
    let rows: Vec<(String, String, Vec<u8>)> =
        sqlx::query_as("SELECT aggregate_key, message_type, body FROM tidings_outbox ORDER BY seq")
            .fetch_all(pool)
            .await
            .unwrap();
    let mut grouped = std::collections::BTreeMap::<String, Vec<String>>::new();
    for (key, kind, body) in rows {
        let envelope = tidings_core::cloudevents::from_json(&body).unwrap();
        grouped
            .entry(format!("{key}/{kind}"))
            .or_default()
            .push(String::from_utf8(envelope.payload).unwrap());
    }
    grouped.into_iter().map(|(k, v)| (k, v.join(" | "))).collect()
}

async fn check<H: tidings_consumer::Handler<sqlx::Postgres>>(
    consumer: &str,
    handler: impl Fn(&PgStore) -> H,
    topic: &str,
    events: Vec<Envelope>,
) -> Report {
    let mut dbs = Vec::new();
    let report = Harness::new(consumer, handler)
        .events(topic, events)
        .check(
            async || {
                let db = PgTestDb::new().await;
                db.store.setup().await.unwrap();
                EmailProvider::Postgres(db.store.pool().clone())
                    .setup()
                    .await
                    .unwrap();
                let store = db.store.clone();
                dbs.push(db);
                store
            },
            async |store: &PgStore| snapshot(store).await,
        )
        .await;
    for db in dbs {
        db.drop_schema().await;
    }
    println!("{report}");
    report.assert_idempotent();
    report
}

#[tokio::test]
async fn checkout_is_idempotent() {
    let report = check("checkout", |_| Checkout, COMMANDS, commands()).await;
    assert_eq!(report.scenarios[0].handled, 3 * ORDERS_PLACED);
}

#[tokio::test]
async fn inventory_is_idempotent_and_dead_letters_the_poisoned_order() {
    // A redelivered poisoned event is not processed, so it fails and is
    // dead-lettered again: one dead letter in the store all the same (the
    // state compares them).
    let report = check("inventory", |_| Inventory::default(), ORDERS, events()).await;
    assert_eq!(report.scenarios[0].dead_lettered, 1, "{report}");
    assert!(report.scenarios.iter().all(|s| s.dead_lettered >= 1), "{report}");
}

#[tokio::test]
async fn email_is_idempotent() {
    let provider = |store: &PgStore| Email {
        provider: EmailProvider::Postgres(store.pool().clone()),
    };
    check("email", provider, ORDERS, events()).await;
}

#[tokio::test]
async fn analytics_is_idempotent() {
    check("analytics", |_| Analytics, ORDERS, events()).await;
}

#[tokio::test]
async fn loyalty_is_idempotent() {
    check("loyalty", |_| Loyalty, ORDERS, events()).await;
}
