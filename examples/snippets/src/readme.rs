//! `README.md`: the schema guard in "Use it in a service" (the quickstart
//! block is `examples/quickstart/src/main.rs`).

use std::sync::Arc;

use tidings::prelude::*;
use tidings::schema::{Registry, SchemaGuard};
use tidings::sql::StoreOptions;

/// A PostgreSQL store whose outbox refuses payloads that do not match the
/// committed schemas, or carry a likely secret.
pub async fn guarded_store(url: &str) -> Result<PgStore, Box<dyn std::error::Error>> {
    // snippet: readme-schema-guard
    let guard = SchemaGuard::new(&Registry::load("schemas")?)?;
    let store = PgStore::connect_with(url, StoreOptions::default().guard(Arc::new(guard))).await?;
    // end snippet
    Ok(store)
}

/// `README.md`, "Take webhooks": the inbox in a service's own axum app.
pub async fn webhook_app(store: PgStore) -> Result<axum::Router, Box<dyn std::error::Error>> {
    use tidings::inbox::{Inbox, Provider, secret_from_env};
    // snippet: readme-webhook-inbox
    let webhooks = Inbox::new(store.clone())
        .provider(Provider::stripe(secret_from_env("STRIPE_WEBHOOK_SECRET")?).topic("payments"))
        .router()?;
    // Stripe delivers to POST /webhooks/stripe.
    let app = axum::Router::new().nest("/webhooks", webhooks);
    // end snippet
    Ok(app)
}

// snippet: readme-webhook-event
/// Stripe's event as the inbox enqueues it: the message type is Stripe's
/// event type, the payload the body Stripe signed.
#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(event, name = "payment_intent.succeeded", name_check = false)]
#[message(topic = "payments", aggregate = "stripe", key_fn = payment_id)]
pub struct PaymentSucceeded {
    pub id: String,
    pub data: serde_json::Value,
}

fn payment_id(event: &PaymentSucceeded) -> String {
    event.data["object"]["id"].as_str().unwrap_or_default().to_owned()
}
// end snippet
