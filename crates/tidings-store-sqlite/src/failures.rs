//! The failure store (dead letters).

use async_trait::async_trait;
use chrono::DateTime;
use sqlx::Row;
use sqlx::SqliteConnection;
use sqlx::sqlite::SqliteRow;
use tidings_core::{
    DeadLetter, DeadLetterFilter, Error, Failure, FailureStore, Outbox, OutgoingMessage, Redrive, Result,
    Skip, redrive_envelope,
};
use uuid::Uuid;

use crate::{SqliteStore, now_millis};

const COLUMNS: &str =
    "id, consumer, topic, message_id, message_type, aggregate_key, headers, body, attempts, errors,
    created_at, redrives, redriven_at, skipped_at";

fn letter(r: SqliteRow) -> DeadLetter {
    let headers: String = r.get("headers");
    let errors: String = r.get("errors");
    DeadLetter {
        id: r.get::<Uuid, _>("id"),
        consumer: r.get("consumer"),
        topic: r.get("topic"),
        message_id: r.get("message_id"),
        message_type: r.get("message_type"),
        aggregate_key: r.get("aggregate_key"),
        headers: serde_json::from_str(&headers).unwrap_or_default(),
        body: r.get("body"),
        attempts: u32::try_from(r.get::<i64, _>("attempts")).unwrap_or(0),
        errors: serde_json::from_str::<Vec<Failure>>(&errors).unwrap_or_default(),
        created_at: DateTime::from_timestamp_millis(r.get("created_at")).unwrap_or_default(),
        redrives: u32::try_from(r.get::<i64, _>("redrives")).unwrap_or(0),
        redriven_at: r
            .get::<Option<i64>, _>("redriven_at")
            .and_then(DateTime::from_timestamp_millis),
        skipped_at: r
            .get::<Option<i64>, _>("skipped_at")
            .and_then(DateTime::from_timestamp_millis),
    }
}

impl SqliteStore {
    /// Stores a dead letter on `conn`.
    async fn insert_dead_letter(conn: &mut SqliteConnection, l: &DeadLetter) -> Result<()> {
        let headers = serde_json::to_string(&l.headers).expect("string map to JSON");
        let errors = serde_json::to_string(&l.errors).expect("failures to JSON");
        // Failing again after a redrive or a skip makes it pending again, history appended.
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
               redriven_at = NULL,
               skipped_at = NULL,
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
        .execute(conn)
        .await
        .map_err(Error::db("storing a dead letter"))?;
        Ok(())
    }
}

tidings_core::impl_parking_store!(
    SqliteStore,
    now = "CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)"
);

#[async_trait]
impl FailureStore for SqliteStore {
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
             WHERE ($1 IS NULL OR consumer = $1) AND ($2 IS NULL OR message_type = $2)
               AND ($4 OR (redriven_at IS NULL AND skipped_at IS NULL))
             ORDER BY created_at DESC LIMIT $3"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(&filter.consumer)
            .bind(&filter.message_type)
            .bind(filter.limit.map(i64::from).unwrap_or(-1))
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
        // Take the write lock first, so that the read below is consistent with the update.
        sqlx::query("UPDATE tidings_dead_letters SET updated_at = updated_at WHERE id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await
            .map_err(Error::db("locking a dead letter"))?;
        let sql = format!("SELECT {COLUMNS} FROM tidings_dead_letters WHERE id = $1");
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
            "UPDATE tidings_dead_letters SET redrives = redrives + 1, redriven_at = $2 WHERE id = $1",
        )
        .bind(id)
        .bind(now_millis())
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
        let mut tx = self
            .pool()
            .begin()
            .await
            .map_err(Error::db("purging dead letters"))?;
        let mut purged = 0;
        for id in ids {
            let done = sqlx::query(
                "DELETE FROM tidings_dead_letters
                 WHERE id = $1 AND (redriven_at IS NOT NULL OR skipped_at IS NOT NULL)",
            )
            .bind(id)
            .execute(&mut *tx)
            .await
            .map_err(Error::db("purging dead letters"))?;
            purged += done.rows_affected();
        }
        tx.commit().await.map_err(Error::db("purging dead letters"))?;
        Ok(purged)
    }
}
