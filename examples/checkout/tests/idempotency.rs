//! The checkout system's five consumers through the idempotency harness on
//! PostgreSQL and on MySQL (MariaDB here): delivered twice, redelivered
//! after a crash on either side of the commit, and reordered across orders,
//! each ends in the state of a clean run.

use tidings_core::{Envelope, Message};
use tidings_example_checkout::handlers::{Analytics, Checkout, Email, Inventory, Loyalty};
use tidings_example_checkout::messages::*;
use tidings_example_checkout::sql::CheckoutDialect;
use tidings_example_checkout::system::CheckoutStore;
use tidings_sql::SqlStore;
use tidings_store_mysql::My;
use tidings_store_postgres::Pg;
use tidings_testkit::idempotency::{Harness, OUTBOX, Report, State, joined};
use tidings_testkit::services::{MySqlTestDb, PgTestDb, TestDb};

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

/// A database whose business tables the harness compares, row by row, and
/// what the email provider sent (emails, not calls: a retried call with
/// the same idempotency key is the same email): (name, query of (key, row)).
trait Tables: CheckoutDialect {
    const TABLES: &'static [(&'static str, &'static str)];
}

impl Tables for Pg {
    const TABLES: &'static [(&'static str, &'static str)] = &[
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
            "SELECT subject || '/' || kind, count(*)::text FROM demo_third_party WHERE service = 'email' GROUP BY 1",
        ),
        ("emitted", OUTBOX),
    ];
}

impl Tables for My {
    const TABLES: &'static [(&'static str, &'static str)] = &[
        (
            "order",
            "SELECT order_id, CAST(JSON_OBJECT('order_id', order_id, 'customer_id', customer_id, 'sku', sku,
                 'quantity', quantity, 'total_cents', total_cents, 'status', status, 'events', events) AS CHAR)
             FROM checkout_orders",
        ),
        (
            "reservation",
            "SELECT order_id, CAST(JSON_OBJECT('order_id', order_id, 'sku', sku, 'quantity', quantity,
                 'status', status) AS CHAR) FROM inventory_reservations",
        ),
        ("analytics", "SELECT message_type, CAST(n AS CHAR) FROM analytics_counts"),
        ("loyalty pending", "SELECT order_id, CAST(points AS CHAR) FROM loyalty_pending"),
        ("loyalty points", "SELECT customer_id, CAST(points AS CHAR) FROM loyalty_points"),
        ("progress", "SELECT CONCAT(consumer, '/', order_id), CAST(last_step AS CHAR) FROM order_progress"),
        ("violations", "SELECT 'count', CAST(count(*) AS CHAR) FROM order_violations"),
        (
            "email",
            "SELECT CONCAT(subject, '/', kind), CAST(count(*) AS CHAR) FROM demo_third_party
             WHERE service = 'email' GROUP BY subject, kind",
        ),
        ("emitted", OUTBOX),
    ];
}

async fn snapshot<D: Tables>(store: &SqlStore<D>) -> State {
    State::read(store, D::TABLES, joined).await
}

async fn check<T, H>(
    consumer: &str,
    handler: impl Fn(&SqlStore<T::Dialect>) -> H,
    topic: &str,
    events: Vec<Envelope>,
) -> Report
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
                T::Dialect::email_provider(db.store().pool().clone())
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

/// Each consumer's check, on the test database `$db`.
macro_rules! idempotency_checks {
    ($module:ident, $db:ty) => {
        mod $module {
            use super::*;

            #[tokio::test]
            async fn checkout_is_idempotent() {
                let report = check::<$db, _>("checkout", |_| Checkout, COMMANDS, commands()).await;
                assert_eq!(report.scenarios[0].handled, 3 * ORDERS_PLACED);
            }

            #[tokio::test]
            async fn inventory_is_idempotent_and_dead_letters_the_poisoned_order() {
                // A redelivered poisoned event is not processed, so it fails and is
                // dead-lettered again: one dead letter in the store all the same (the
                // state compares them).
                let report = check::<$db, _>("inventory", |_| Inventory::default(), ORDERS, events()).await;
                assert_eq!(report.scenarios[0].dead_lettered, 1, "{report}");
                assert!(
                    report.scenarios.iter().all(|s| s.dead_lettered >= 1),
                    "{report}"
                );
            }

            #[tokio::test]
            async fn email_is_idempotent() {
                let provider = |store: &SqlStore<<$db as TestDb>::Dialect>| Email {
                    provider: <<$db as TestDb>::Dialect as CheckoutDialect>::email_provider(
                        store.pool().clone(),
                    ),
                };
                check::<$db, _>("email", provider, ORDERS, events()).await;
            }

            #[tokio::test]
            async fn analytics_is_idempotent() {
                check::<$db, _>("analytics", |_| Analytics, ORDERS, events()).await;
            }

            #[tokio::test]
            async fn loyalty_is_idempotent() {
                check::<$db, _>("loyalty", |_| Loyalty, ORDERS, events()).await;
            }
        }
    };
}

idempotency_checks!(on_postgres, PgTestDb);
idempotency_checks!(on_mysql, MySqlTestDb);
