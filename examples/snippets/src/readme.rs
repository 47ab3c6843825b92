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
