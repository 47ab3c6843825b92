//! Appending to the database log on SQLite: one transaction, confirmed
//! when it commits.

use tidings_core::partition::key_hash;
use tidings_core::{OutgoingMessage, Result, cloudevents};
use tidings_sql::log_error;

use crate::{Lite, SqliteStore, now_millis};

pub(crate) async fn append(store: &SqliteStore, batch: &[OutgoingMessage]) -> Result<()> {
    let transport_error = log_error::<Lite>(format!("appending {} messages failed", batch.len()));
    let mut tx = store.pool().begin().await.map_err(&transport_error)?;
    let now = now_millis();
    for m in batch {
        sqlx::query(
            "INSERT INTO tidings_log (topic, aggregate_key, key_hash, body, created_at)
             VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(&m.topic)
        .bind(&m.envelope.aggregate_key)
        .bind(i64::from(key_hash(&m.envelope.aggregate_key)))
        .bind(cloudevents::to_json(&m.envelope))
        .bind(now)
        .execute(&mut *tx)
        .await
        .map_err(&transport_error)?;
    }
    tx.commit().await.map_err(&transport_error)?;
    Ok(())
}
