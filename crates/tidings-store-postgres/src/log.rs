//! Appending to the database log on PostgreSQL: one statement, one
//! transaction, the batch confirmed when it commits.

use tidings_core::partition::key_hash;
use tidings_core::{OutgoingMessage, Result, cloudevents};
use tidings_sql::log_error;

use crate::{Pg, PgStore};

pub(crate) async fn append(store: &PgStore, batch: &[OutgoingMessage]) -> Result<()> {
    let topics: Vec<&str> = batch.iter().map(|m| m.topic.as_str()).collect();
    let keys: Vec<&str> = batch.iter().map(|m| m.envelope.aggregate_key.as_str()).collect();
    let hashes: Vec<i64> = keys.iter().map(|k| i64::from(key_hash(k))).collect();
    let bodies: Vec<Vec<u8>> = batch.iter().map(|m| cloudevents::to_json(&m.envelope)).collect();
    sqlx::query(
        "INSERT INTO tidings_log (topic, aggregate_key, key_hash, body)
         SELECT t, k, h, b FROM UNNEST($1::text[], $2::text[], $3::int8[], $4::bytea[])
             WITH ORDINALITY AS u(t, k, h, b, n)
         ORDER BY n",
    )
    .bind(&topics)
    .bind(&keys)
    .bind(&hashes)
    .bind(&bodies)
    .execute(store.pool())
    .await
    .map_err(log_error::<Pg>(format!(
        "appending {} messages failed",
        batch.len()
    )))?;
    Ok(())
}
