//! Replay requests and retained events.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::sqlite::SqliteRow;
use tidings_core::replay::{
    Replay, ReplayCounts, ReplayRequest, ReplaySource, ReplayState, ReplayStore, Retained,
};
use tidings_core::{Error, RawMessage, Result};
use uuid::Uuid;

use crate::{SqliteStore, now_millis};

/// The retained events of a source: sent outbox records are those marked sent.
/// Topics are bound as a JSON array.
fn retained_sql(source: ReplaySource, select: &str, tail: &str) -> String {
    let (table, sent) = match source {
        ReplaySource::Log => ("tidings_log", ""),
        ReplaySource::Outbox => ("tidings_outbox", "published_at IS NOT NULL AND"),
    };
    format!(
        "SELECT {select} FROM {table}
         WHERE {sent} topic IN (SELECT value FROM json_each($1)) AND created_at >= $2 AND created_at < $3 {tail}"
    )
}

const COLUMNS: &str = "id, consumer, topics, source, since, until, rate, total, state, member, cursor,
                       delivered, suppressed, handled, failed";

fn time(ms: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(ms).unwrap_or_default()
}

fn replay_of(r: &SqliteRow) -> Replay {
    let count = |c: &str| r.get::<i64, _>(c).max(0) as u64;
    Replay {
        id: r.get("id"),
        request: ReplayRequest {
            consumer: r.get("consumer"),
            topics: serde_json::from_str(r.get("topics")).unwrap_or_default(),
            source: ReplaySource::parse(r.get("source")).unwrap_or(ReplaySource::Log),
            since: time(r.get("since")),
            until: time(r.get("until")),
            rate: r.get("rate"),
            total: count("total"),
        },
        state: ReplayState::parse(r.get("state")),
        member: r.get("member"),
        cursor: r.get("cursor"),
        counts: ReplayCounts {
            delivered: count("delivered"),
            suppressed: count("suppressed"),
            handled: count("handled"),
            failed: count("failed"),
        },
    }
}

fn millis(d: Duration) -> i64 {
    d.as_millis().min(i64::MAX as u128) as i64
}

#[async_trait]
impl ReplayStore for SqliteStore {
    async fn retained(
        &self,
        source: ReplaySource,
        topics: &[String],
        since: DateTime<Utc>,
        until: DateTime<Utc>,
        after: i64,
        limit: usize,
    ) -> Result<Vec<Retained>> {
        let sql = retained_sql(
            source,
            "seq, topic, aggregate_key, body",
            "AND seq > $4 ORDER BY seq LIMIT $5",
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(serde_json::json!(topics).to_string())
            .bind(since.timestamp_millis())
            .bind(until.timestamp_millis())
            .bind(after)
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(&self.inner.pool)
            .await
            .map_err(Error::db("reading retained events"))?;
        Ok(rows
            .into_iter()
            .map(|r| Retained {
                position: r.get(0),
                message: RawMessage {
                    topic: r.get(1),
                    key: r.get(2),
                    headers: Default::default(),
                    body: r.get(3),
                },
            })
            .collect())
    }

    async fn count_retained(
        &self,
        source: ReplaySource,
        topics: &[String],
        since: DateTime<Utc>,
        until: DateTime<Utc>,
    ) -> Result<u64> {
        let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(retained_sql(source, "count(*)", "")))
            .bind(serde_json::json!(topics).to_string())
            .bind(since.timestamp_millis())
            .bind(until.timestamp_millis())
            .fetch_one(&self.inner.pool)
            .await
            .map_err(Error::db("counting retained events"))?;
        Ok(n.max(0) as u64)
    }

    async fn count_processed(&self, consumer: &str, ids: &[Uuid]) -> Result<u64> {
        let mut total = 0;
        for chunk in ids.chunks(500) {
            let marks = vec!["?"; chunk.len()].join(", ");
            let sql = format!(
                "SELECT count(*) FROM tidings_processed WHERE consumer = ? AND message_id IN ({marks})"
            );
            let mut query = sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(sql)).bind(consumer);
            for id in chunk {
                query = query.bind(*id);
            }
            total += query
                .fetch_one(&self.inner.pool)
                .await
                .map_err(Error::db("counting processed markers"))?
                .max(0) as u64;
        }
        Ok(total)
    }

    async fn request_replay(&self, request: &ReplayRequest) -> Result<Uuid> {
        let id = Uuid::now_v7();
        let now = now_millis();
        sqlx::query(
            "INSERT INTO tidings_replays
               (id, consumer, topics, source, since, until, rate, total, state, requested_at, updated_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'pending', $9, $9)",
        )
        .bind(id)
        .bind(&request.consumer)
        .bind(serde_json::json!(request.topics).to_string())
        .bind(request.source.as_str())
        .bind(request.since.timestamp_millis())
        .bind(request.until.timestamp_millis())
        .bind(request.rate)
        .bind(request.total.min(i64::MAX as u64) as i64)
        .bind(now)
        .execute(&self.inner.pool)
        .await
        .map_err(Error::db("recording a replay"))?;
        Ok(id)
    }

    async fn replay(&self, id: Uuid) -> Result<Option<Replay>> {
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {COLUMNS} FROM tidings_replays WHERE id = $1"
        )))
        .bind(id)
        .fetch_optional(&self.inner.pool)
        .await
        .map_err(Error::db("reading a replay"))?;
        Ok(row.as_ref().map(replay_of))
    }

    async fn claim_replay(&self, consumer: &str, member: &str, ttl: Duration) -> Result<Option<Replay>> {
        // One statement: SQLite runs it under its write lock, so two members cannot both take it.
        let now = now_millis();
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE tidings_replays SET state = 'running', member = $2, claimed_until = $3, updated_at = $4
             WHERE id = (SELECT id FROM tidings_replays
                         WHERE consumer = $1 AND (state = 'pending' OR (state = 'running' AND claimed_until < $4))
                         ORDER BY requested_at LIMIT 1)
             RETURNING {COLUMNS}"
        )))
        .bind(consumer)
        .bind(member)
        .bind(now.saturating_add(millis(ttl)))
        .bind(now)
        .fetch_optional(&self.inner.pool)
        .await
        .map_err(Error::db("claiming a replay"))?;
        Ok(row.as_ref().map(replay_of))
    }

    async fn replay_progress(
        &self,
        id: Uuid,
        member: &str,
        cursor: i64,
        counts: ReplayCounts,
        ttl: Duration,
        done: bool,
    ) -> Result<bool> {
        let n = |c: u64| c.min(i64::MAX as u64) as i64;
        let now = now_millis();
        let updated = sqlx::query(
            "UPDATE tidings_replays SET cursor = $3, delivered = $4, suppressed = $5, handled = $6, failed = $7,
                    claimed_until = $8, state = CASE WHEN $9 THEN 'done' ELSE state END, updated_at = $10
             WHERE id = $1 AND member = $2 AND state = 'running'",
        )
        .bind(id)
        .bind(member)
        .bind(cursor)
        .bind(n(counts.delivered))
        .bind(n(counts.suppressed))
        .bind(n(counts.handled))
        .bind(n(counts.failed))
        .bind(now.saturating_add(millis(ttl)))
        .bind(done)
        .bind(now)
        .execute(&self.inner.pool)
        .await
        .map_err(Error::db("recording a replay's progress"))?;
        Ok(updated.rows_affected() == 1)
    }

    async fn cancel_replay(&self, id: Uuid) -> Result<bool> {
        let updated = sqlx::query(
            "UPDATE tidings_replays SET state = 'cancelled', updated_at = $2
             WHERE id = $1 AND state IN ('pending', 'running')",
        )
        .bind(id)
        .bind(now_millis())
        .execute(&self.inner.pool)
        .await
        .map_err(Error::db("cancelling a replay"))?;
        Ok(updated.rows_affected() == 1)
    }
}
