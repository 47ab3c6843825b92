//! The failure store (dead letters).

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::Row;
use tidings_core::{DeadLetter, DeadLetterFilter, Error, Failure, FailureStore, Result};
use uuid::Uuid;

use crate::PgStore;

#[async_trait]
impl FailureStore for PgStore {
    async fn dead_letter(&self, l: &DeadLetter) -> Result<()> {
        let headers = serde_json::to_value(&l.headers).expect("string map to JSON");
        let errors = serde_json::to_value(&l.errors).expect("failures to JSON");
        sqlx::query(
            "INSERT INTO tidings_dead_letters
               (id, consumer, topic, message_id, message_type, aggregate_key, headers, body, attempts, errors, created_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
             ON CONFLICT (consumer, message_id) WHERE message_id IS NOT NULL DO UPDATE SET
               attempts = tidings_dead_letters.attempts + EXCLUDED.attempts,
               errors = tidings_dead_letters.errors || EXCLUDED.errors,
               updated_at = now()",
        )
        .bind(l.id)
        .bind(&l.consumer)
        .bind(&l.topic)
        .bind(l.message_id)
        .bind(&l.message_type)
        .bind(&l.aggregate_key)
        .bind(headers)
        .bind(&l.body)
        .bind(i32::try_from(l.attempts).unwrap_or(i32::MAX))
        .bind(errors)
        .bind(l.created_at)
        .execute(&self.inner.pool)
        .await
        .map_err(Error::db("storing a dead letter"))?;
        Ok(())
    }

    async fn dead_letters(&self, filter: &DeadLetterFilter) -> Result<Vec<DeadLetter>> {
        let rows = sqlx::query(
            "SELECT id, consumer, topic, message_id, message_type, aggregate_key, headers, body, attempts, errors, created_at
             FROM tidings_dead_letters
             WHERE ($1::text IS NULL OR consumer = $1) AND ($2::text IS NULL OR message_type = $2)
             ORDER BY created_at DESC LIMIT $3",
        )
        .bind(&filter.consumer)
        .bind(&filter.message_type)
        .bind(filter.limit.map(i64::from))
        .fetch_all(&self.inner.pool)
        .await
        .map_err(Error::db("listing dead letters"))?;
        rows.into_iter()
            .map(|r| {
                let headers: serde_json::Value = r.get(6);
                let errors: serde_json::Value = r.get(9);
                let attempts: i32 = r.get(8);
                Ok(DeadLetter {
                    id: r.get::<Uuid, _>(0),
                    consumer: r.get(1),
                    topic: r.get(2),
                    message_id: r.get(3),
                    message_type: r.get(4),
                    aggregate_key: r.get(5),
                    headers: serde_json::from_value(headers).unwrap_or_default(),
                    body: r.get(7),
                    attempts: u32::try_from(attempts).unwrap_or(0),
                    errors: serde_json::from_value::<Vec<Failure>>(errors).unwrap_or_default(),
                    created_at: r.get::<DateTime<Utc>, _>(10),
                })
            })
            .collect()
    }
}
