//! The idempotency harness on PostgreSQL: it passes a handler whose writes
//! all go through its transaction, and catches one that counts on another
//! connection and one whose result depends on the order of different keys.

use serde::{Deserialize, Serialize};
use sqlx::Postgres;
use tidings_consumer::{Context, Handler, HandlerError};
use tidings_core::{Envelope, Kind, Message};
use tidings_store_postgres::PgStore;
use tidings_testkit::idempotency::{Harness, Report, State};
use tidings_testkit::services::PgTestDb;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Deposited {
    account: String,
    cents: i64,
}

impl Message for Deposited {
    const TYPE: &'static str = "Deposited";
    const VERSION: u32 = 1;
    const KIND: Kind = Kind::Event;
    const AGGREGATE: &'static str = "account";
    const TOPIC: &'static str = "deposits";
    fn key(&self) -> String {
        self.account.clone()
    }
}

const SCHEMA: &str = "CREATE TABLE balances (account TEXT PRIMARY KEY, cents BIGINT NOT NULL);
    CREATE TABLE first_account (id INT PRIMARY KEY, account TEXT NOT NULL)";

fn deposits() -> Vec<Envelope> {
    (0..40)
        .map(|i| {
            let deposit = Deposited {
                account: format!("acct-{}", i % 8),
                cents: 100 + i,
            };
            Envelope::new("bank", &deposit).unwrap()
        })
        .collect()
}

/// Adds each deposit to the balance on the handler's transaction: correct.
#[derive(Debug, Clone)]
struct InTransaction;

/// Adds each deposit on a connection of its own: the write escapes the
/// marker and survives a rolled-back attempt.
#[derive(Debug, Clone)]
struct OnItsOwnConnection(PgStore);

/// Remembers which account deposited first, across all accounts: correct
/// under duplicates, wrong when keys interleave differently.
#[derive(Debug, Clone)]
struct FirstAccountWins;

const CREDIT: &str = "INSERT INTO balances (account, cents) VALUES ($1, $2)
    ON CONFLICT (account) DO UPDATE SET cents = balances.cents + excluded.cents";

#[async_trait::async_trait]
impl Handler<Postgres> for InTransaction {
    async fn handle(&self, ctx: &mut Context<'_, Postgres>) -> Result<(), HandlerError> {
        let d: Deposited = ctx.decode()?;
        sqlx::query(CREDIT)
            .bind(d.account)
            .bind(d.cents)
            .execute(ctx.tx())
            .await?;
        Ok(())
    }
}

#[async_trait::async_trait]
impl Handler<Postgres> for OnItsOwnConnection {
    async fn handle(&self, ctx: &mut Context<'_, Postgres>) -> Result<(), HandlerError> {
        let d: Deposited = ctx.decode()?;
        sqlx::query(CREDIT)
            .bind(d.account)
            .bind(d.cents)
            .execute(self.0.pool())
            .await?;
        Ok(())
    }
}

#[async_trait::async_trait]
impl Handler<Postgres> for FirstAccountWins {
    async fn handle(&self, ctx: &mut Context<'_, Postgres>) -> Result<(), HandlerError> {
        let d: Deposited = ctx.decode()?;
        sqlx::query("INSERT INTO first_account (id, account) VALUES (1, $1) ON CONFLICT (id) DO NOTHING")
            .bind(d.account)
            .execute(ctx.tx())
            .await?;
        Ok(())
    }
}

/// Runs the harness over the deposits, each scenario on a schema of its own.
async fn check<H: Handler<Postgres>>(handler: impl Fn(&PgStore) -> H) -> Report {
    let mut dbs = Vec::new();
    let report = Harness::new("ledger", handler)
        .events(Deposited::TOPIC, deposits())
        .check(
            async || {
                let db = PgTestDb::new().await;
                sqlx::raw_sql(SCHEMA).execute(db.store.pool()).await.unwrap();
                let store = db.store.clone();
                dbs.push(db);
                store
            },
            async |store: &PgStore| {
                let mut state: State =
                    sqlx::query_as::<_, (String, i64)>("SELECT account, cents FROM balances")
                        .fetch_all(store.pool())
                        .await
                        .unwrap()
                        .into_iter()
                        .collect();
                let first: Option<String> = sqlx::query_scalar("SELECT account FROM first_account")
                    .fetch_optional(store.pool())
                    .await
                    .unwrap();
                state.insert("first account", first.unwrap_or_default());
                state
            },
        )
        .await;
    for db in dbs {
        db.drop_schema().await;
    }
    println!("{report}");
    report
}

#[tokio::test]
async fn a_handler_writing_through_its_transaction_passes() {
    let report = check(|_| InTransaction).await;
    report.assert_idempotent();
    let clean = &report.scenarios[0];
    assert_eq!((clean.handled, clean.duplicates), (40, 0));
    let twice = &report.scenarios[1];
    assert_eq!((twice.deliveries, twice.handled, twice.duplicates), (80, 40, 40));
}

#[tokio::test]
async fn a_counter_on_another_connection_is_caught_by_the_crash_before_commit() {
    let report = check(|store: &PgStore| OnItsOwnConnection(store.clone())).await;
    let (scenario, difference) = report
        .first_failure()
        .expect("the harness must catch the double credit");
    assert_eq!(scenario, "crash before commit");
    // acct-0 gets deposits 100, 108, ..., 132: 580 once, twice that when every attempt runs twice.
    assert_eq!(difference.key, "acct-0");
    assert_eq!(difference.expected.as_deref(), Some("580"));
    assert_eq!(difference.found.as_deref(), Some("1160"));
    let panic = std::panic::catch_unwind(|| report.assert_idempotent()).unwrap_err();
    let message = panic.downcast_ref::<String>().unwrap();
    assert!(
        message.contains(
            "ledger is not idempotent: crash before commit: acct-0: 580 after a clean run, 1160 here"
        ),
        "{message}"
    );
}

#[tokio::test]
async fn a_result_depending_on_the_order_of_keys_is_caught_by_the_reordering() {
    let report = check(|_| FirstAccountWins).await;
    let (scenario, difference) = report
        .first_failure()
        .expect("the harness must catch the order dependence");
    assert_eq!(scenario, "reordered across keys");
    assert_eq!(difference.key, "first account");
    assert_eq!(difference.expected.as_deref(), Some("acct-0"));
    assert_ne!(difference.found.as_deref(), Some("acct-0"));
}
