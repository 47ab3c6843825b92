//! The failure store (dead letters).

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use sqlx::Row;
use sqlx::postgres::PgRow;
use tidings_core::{
    DeadLetter, DeadLetterFilter, Error, Failure, FailureStore, Outbox, OutgoingMessage, Redrive, Result,
    Skip, redrive_envelope,
};
use uuid::Uuid;

use crate::PgStore;

const COLUMNS: &str =
    "id, consumer, topic, message_id, message_type, aggregate_key, headers, body, attempts, errors,
    created_at, redrives, redriven_at, skipped_at";

fn letter(r: PgRow) -> DeadLetter {
    let headers: serde_json::Value = r.get("headers");
    let errors: serde_json::Value = r.get("errors");
    DeadLetter {
        id: r.get::<Uuid, _>("id"),
        consumer: r.get("consumer"),
        topic: r.get("topic"),
        message_id: r.get("message_id"),
        message_type: r.get("message_type"),
        aggregate_key: r.get("aggregate_key"),
        headers: serde_json::from_value(headers).unwrap_or_default(),
        body: r.get("body"),
        attempts: u32::try_from(r.get::<i32, _>("attempts")).unwrap_or(0),
        errors: serde_json::from_value::<Vec<Failure>>(errors).unwrap_or_default(),
        created_at: r.get::<DateTime<Utc>, _>("created_at"),
        redrives: u32::try_from(r.get::<i32, _>("redrives")).unwrap_or(0),
        redriven_at: r.get("redriven_at"),
        skipped_at: r.get("skipped_at"),
    }
}

impl PgStore {
    /// Stores a dead letter on `conn`.
    async fn insert_dead_letter(conn: &mut PgConnection, l: &DeadLetter) -> Result<()> {
        let headers = serde_json::to_value(&l.headers).expect("string map to JSON");
        let errors = serde_json::to_value(&l.errors).expect("failures to JSON");
        // Failing again after a redrive or a skip makes it pending again, history appended.
        sqlx::query(
            "INSERT INTO tidings_dead_letters
               (id, consumer, topic, message_id, message_type, aggregate_key, headers, body, attempts, errors, created_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
             ON CONFLICT (consumer, message_id) WHERE message_id IS NOT NULL DO UPDATE SET
               attempts = tidings_dead_letters.attempts + EXCLUDED.attempts,
               errors = tidings_dead_letters.errors || EXCLUDED.errors,
               redriven_at = NULL,
               skipped_at = NULL,
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
        .execute(conn)
        .await
        .map_err(Error::db("storing a dead letter"))?;
        Ok(())
    }
}

tidings_core::impl_parking_store!(PgStore, now = "now()");

#[async_trait]
impl FailureStore for PgStore {
    async fn dead_letter(&self, l: &DeadLetter) -> Result<()> {
        let mut conn = self
            .inner
            .pool
            .acquire()
            .await
            .map_err(Error::db("storing a dead letter"))?;
        Self::insert_dead_letter(&mut conn, l).await
    }

    async fn dead_letters(&self, filter: &DeadLetterFilter) -> Result<Vec<DeadLetter>> {
        let sql = format!(
            "SELECT {COLUMNS} FROM tidings_dead_letters
             WHERE ($1::text IS NULL OR consumer = $1) AND ($2::text IS NULL OR message_type = $2)
               AND ($4 OR (redriven_at IS NULL AND skipped_at IS NULL))
             ORDER BY created_at DESC LIMIT $3"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(&filter.consumer)
            .bind(&filter.message_type)
            .bind(filter.limit.map(i64::from))
            .bind(filter.include_redriven)
            .fetch_all(&self.inner.pool)
            .await
            .map_err(Error::db("listing dead letters"))?;
        Ok(rows.into_iter().map(letter).collect())
    }

    async fn redrive(&self, id: Uuid) -> Result<Redrive> {
        let mut tx = self
            .inner
            .pool
            .begin()
            .await
            .map_err(Error::db("starting a redrive"))?;
        let sql = format!("SELECT {COLUMNS} FROM tidings_dead_letters WHERE id = $1 FOR UPDATE");
        let Some(row) = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(id)
            .fetch_optional(&mut *tx)
            .await
            .map_err(Error::db("reading a dead letter"))?
        else {
            return Ok(Redrive::NotFound);
        };
        let dead = letter(row);
        let Some(envelope) = redrive_envelope(&dead) else {
            return Ok(Redrive::Undecodable);
        };
        let message_id = envelope.id;
        self.enqueue(
            &mut tx,
            &OutgoingMessage {
                topic: dead.topic.clone(),
                envelope,
            },
        )
        .await?;
        sqlx::query(
            "UPDATE tidings_dead_letters SET redrives = redrives + 1, redriven_at = now() WHERE id = $1",
        )
        .bind(id)
        .execute(&mut *tx)
        .await
        .map_err(Error::db("marking a dead letter redriven"))?;
        tx.commit().await.map_err(Error::db("committing a redrive"))?;
        self.wake();
        Ok(Redrive::Enqueued {
            message_id,
            redrive: dead.redrives + 1,
        })
    }

    async fn skip(&self, id: Uuid) -> Result<Skip> {
        self.skip_dead_letter(id).await
    }

    async fn purge(&self, ids: &[Uuid]) -> Result<u64> {
        let done = sqlx::query(
            "DELETE FROM tidings_dead_letters
             WHERE id = ANY($1) AND (redriven_at IS NOT NULL OR skipped_at IS NOT NULL)",
        )
        .bind(ids)
        .execute(&self.inner.pool)
        .await
        .map_err(Error::db("purging dead letters"))?;
        Ok(done.rows_affected())
    }
}
