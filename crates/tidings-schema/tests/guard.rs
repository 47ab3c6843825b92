//! Validation at publish, on both databases: the outbox refuses what does
//! not match the registered schema or carries a likely secret, writes
//! nothing for it, and accepts the rest.

use std::sync::Arc;

use base64::Engine;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tidings_core::transport::OutgoingMessage;
use tidings_core::{Envelope, Error, Kind, Message, Outbox};
use tidings_schema::{Registry, SchemaGuard};
use tidings_store_postgres::{PgStore, PgStoreOptions};
use tidings_store_sqlite::{SqliteStore, SqliteStoreOptions};
use tidings_testkit::services::{PgTestDb, SqliteTestDb};

/// A payment was captured.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
struct PaymentCaptured {
    order_id: String,
    amount_cents: i64,
    note: Option<String>,
    /// The provider's reference for the charge.
    #[schemars(extend("x-tidings-not-a-secret" = "opaque provider reference"))]
    charge_token: String,
}

impl Message for PaymentCaptured {
    const TYPE: &'static str = "PaymentCaptured";
    const VERSION: u32 = 1;
    const KIND: Kind = Kind::Event;
    const AGGREGATE: &'static str = "order";
    const TOPIC: &'static str = "payments";
    fn key(&self) -> String {
        self.order_id.clone()
    }
}

fn captured(note: Option<&str>) -> PaymentCaptured {
    PaymentCaptured {
        order_id: "o-1".into(),
        amount_cents: 4200,
        note: note.map(str::to_owned),
        charge_token: "ch_3PqRsTuVwXyZ".into(),
    }
}

fn out(envelope: Envelope) -> OutgoingMessage {
    OutgoingMessage {
        topic: "payments".into(),
        envelope,
    }
}

fn jwt() -> String {
    let b64 = |s: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
    format!(
        "{}.{}.{}",
        b64(br#"{"alg":"HS256","typ":"JWT"}"#),
        b64(br#"{"sub":"customer-7"}"#),
        b64(b"signature")
    )
}

fn guard() -> Arc<SchemaGuard> {
    Arc::new(SchemaGuard::new(&Registry::new().register::<PaymentCaptured>()).unwrap())
}

/// Enqueues each case in its own transaction and commits what is accepted;
/// returns the errors, and how many rows the outbox holds.
macro_rules! run_cases {
    ($store:expr) => {{
        let store = $store;
        let mut results = Vec::new();
        for message in cases() {
            let mut tx = store.pool().begin().await.unwrap();
            let result = store.enqueue_outgoing(&mut tx, &message).await;
            if result.is_ok() {
                tx.commit().await.unwrap();
            } else {
                tx.rollback().await.unwrap();
            }
            results.push(result);
        }
        let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM tidings_outbox")
            .fetch_one(store.pool())
            .await
            .unwrap();
        (results, rows)
    }};
}

fn cases() -> Vec<OutgoingMessage> {
    let valid = Envelope::new("payments", &captured(Some("paid by card"))).unwrap();
    let mut retyped = Envelope::new("payments", &captured(None)).unwrap();
    retyped.payload =
        br#"{"order_id":"o-1","amount_cents":"42.00","note":null,"charge_token":"ch_1"}"#.to_vec();
    let with_jwt = Envelope::new("payments", &captured(Some(&jwt()))).unwrap();
    let with_card = Envelope::new("payments", &captured(Some("4111 1111 1111 1111"))).unwrap();
    let mut with_password = Envelope::new("payments", &captured(None)).unwrap();
    with_password.payload =
        br#"{"order_id":"o-1","amount_cents":1,"note":null,"charge_token":"ch_1","password":"hunter2"}"#
            .to_vec();
    let mut unregistered = Envelope::new("payments", &captured(None)).unwrap();
    unregistered.message_type = "PaymentRefunded".into();
    vec![
        out(valid),
        out(retyped),
        out(with_jwt),
        out(with_card),
        out(with_password),
        out(unregistered),
    ]
}

fn assert_outcomes(results: Vec<tidings_core::Result<()>>, rows: i64) {
    let refused: Vec<String> = results
        .iter()
        .map(|r| match r {
            Ok(()) => "accepted".to_owned(),
            Err(e @ Error::Refused { .. }) => e.to_string(),
            Err(e) => panic!("expected a refusal, got {e}"),
        })
        .collect();
    assert_eq!(
        refused[0], "accepted",
        "a valid payload with an exempted token field"
    );
    assert!(
        refused[1].starts_with(
            "the outbox refused PaymentCaptured v1: `/amount_cents` does not match the registered schema"
        ),
        "{}",
        refused[1]
    );
    assert_eq!(
        refused[2],
        "the outbox refused PaymentCaptured v1: field `note` looks like a secret (a JSON Web Token); \
         keep secrets out of events, or mark the field `x-tidings-not-a-secret` with the reason"
    );
    assert!(
        refused[3].contains("field `note` looks like a secret (a card number passing the Luhn check)"),
        "{}",
        refused[3]
    );
    assert!(
        refused[4].contains("field `password` looks like a secret (a field named like a password)"),
        "{}",
        refused[4]
    );
    assert_eq!(
        refused[5],
        "the outbox refused PaymentRefunded v1: no schema registered for this type and version (run `tidings schema generate`)"
    );
    assert!(
        results[1..].iter().all(|r| r
            .as_ref()
            .is_err_and(|e| e.class() == tidings_core::ErrorClass::Permanent)),
        "a refusal is permanent"
    );
    assert_eq!(rows, 1, "only the valid message was written");
}

#[tokio::test]
async fn postgres_outbox_refuses_what_the_registry_does_not_allow() {
    let db = PgTestDb::new().await;
    let store = PgStore::with_options(db.store.pool().clone(), PgStoreOptions::default().guard(guard()));
    let (results, rows) = run_cases!(&store);
    assert_outcomes(results, rows);
    db.drop_schema().await;
}

#[tokio::test]
async fn sqlite_outbox_refuses_what_the_registry_does_not_allow() {
    let db = SqliteTestDb::new().await;
    let store = SqliteStore::with_options(
        db.store.pool().clone(),
        SqliteStoreOptions::default().guard(guard()),
    );
    let (results, rows) = run_cases!(&store);
    assert_outcomes(results, rows);
}

#[tokio::test]
async fn a_trusted_type_skips_the_checks() {
    let db = SqliteTestDb::new().await;
    let trusting = SchemaGuard::new(&Registry::new().register::<PaymentCaptured>())
        .unwrap()
        .trust("PaymentCaptured");
    let store = SqliteStore::with_options(
        db.store.pool().clone(),
        SqliteStoreOptions::default().guard(Arc::new(trusting)),
    );
    let (results, rows) = run_cases!(&store);
    assert!(results[..5].iter().all(Result::is_ok), "{results:?}");
    assert!(results[5].is_err(), "an unregistered type is still refused");
    assert_eq!(rows, 5);
}
