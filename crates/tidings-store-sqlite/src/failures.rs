//! The failure store (dead letters).

use async_trait::async_trait;
use chrono::DateTime;
use sqlx::Row;
use tidings_core::{DeadLetter, DeadLetterFilter, Error, Failure, FailureStore, Result};
use uuid::Uuid;

use crate::{SqliteStore, now_millis};

#[async_trait]
impl FailureStore for SqliteStore {
    async fn dead_letter(&self, l: &DeadLetter) -> Result<()> {
        let headers = serde_json::to_string(&l.headers).expect("string map to JSON");
        let errors = serde_json::to_string(&l.errors).expect("failures to JSON");
        sqlx::query(
            "INSERT INTO tidings_dead_letters
               (id, consumer, topic, message_id, message_type, aggregate_key, headers, body, attempts, errors,
                created_at, updated_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
             ON CONFLICT (consumer, message_id) WHERE message_id IS NOT NULL DO UPDATE SET
               attempts = tidings_dead_letters.attempts + excluded.attempts,
               errors = (SELECT json_group_array(json(value)) FROM (
                   SELECT value FROM json_each(tidings_dead_letters.errors)
                   UNION ALL SELECT value FROM json_each(excluded.errors))),
               updated_at = excluded.updated_at",
        )
        .bind(l.id)
        .bind(&l.consumer)
        .bind(&l.topic)
        .bind(l.message_id)
        .bind(&l.message_type)
        .bind(&l.aggregate_key)
        .bind(headers)
        .bind(&l.body)
        .bind(i64::from(l.attempts))
        .bind(errors)
        .bind(l.created_at.timestamp_millis())
        .bind(now_millis())
        .execute(&self.inner.pool)
        .await
        .map_err(Error::db("storing a dead letter"))?;
        Ok(())
    }

    async fn dead_letters(&self, filter: &DeadLetterFilter) -> Result<Vec<DeadLetter>> {
        let rows = sqlx::query(
            "SELECT id, consumer, topic, message_id, message_type, aggregate_key, headers, body, attempts, errors,
                    created_at
             FROM tidings_dead_letters
             WHERE ($1 IS NULL OR consumer = $1) AND ($2 IS NULL OR message_type = $2)
             ORDER BY created_at DESC LIMIT $3",
        )
        .bind(&filter.consumer)
        .bind(&filter.message_type)
        .bind(filter.limit.map(i64::from).unwrap_or(-1))
        .fetch_all(&self.inner.pool)
        .await
        .map_err(Error::db("listing dead letters"))?;
        rows.into_iter()
            .map(|r| {
                let headers: String = r.get(6);
                let errors: String = r.get(9);
                let attempts: i64 = r.get(8);
                Ok(DeadLetter {
                    id: r.get::<Uuid, _>(0),
                    consumer: r.get(1),
                    topic: r.get(2),
                    message_id: r.get(3),
                    message_type: r.get(4),
                    aggregate_key: r.get(5),
                    headers: serde_json::from_str(&headers).unwrap_or_default(),
                    body: r.get(7),
                    attempts: u32::try_from(attempts).unwrap_or(0),
                    errors: serde_json::from_str::<Vec<Failure>>(&errors).unwrap_or_default(),
                    created_at: DateTime::from_timestamp_millis(r.get(10)).unwrap_or_default(),
                })
            })
            .collect()
    }
}
