//! Replay requests and retained events.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::postgres::PgRow;
use tidings_core::replay::{
    Replay, ReplayCounts, ReplayRequest, ReplaySource, ReplayState, ReplayStore, Retained,
};
use tidings_core::{Error, RawMessage, Result};
use uuid::Uuid;

use crate::PgStore;

/// The retained events of a source: sent outbox records are those marked sent.
fn retained_sql(source: ReplaySource, select: &str, tail: &str) -> String {
    match source {
        ReplaySource::Log => format!(
            "SELECT {select} FROM tidings_log
             WHERE topic = ANY($1) AND created_at >= $2 AND created_at < $3 {tail}"
        ),
        ReplaySource::Outbox => format!(
            "SELECT {select} FROM tidings_outbox
             WHERE published_at IS NOT NULL AND topic = ANY($1) AND created_at >= $2 AND created_at < $3 {tail}"
        ),
    }
}

const COLUMNS: &str = "id, consumer, topics, source, since, until, rate, total, state, member, cursor,
                       delivered, suppressed, handled, failed";

fn replay_of(r: &PgRow) -> Replay {
    let count = |c: &str| r.get::<i64, _>(c).max(0) as u64;
    let topics: serde_json::Value = r.get("topics");
    Replay {
        id: r.get("id"),
        request: ReplayRequest {
            consumer: r.get("consumer"),
            topics: serde_json::from_value(topics).unwrap_or_default(),
            source: ReplaySource::parse(r.get("source")).unwrap_or(ReplaySource::Log),
            since: r.get("since"),
            until: r.get("until"),
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

#[async_trait]
impl ReplayStore for PgStore {
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
            .bind(topics)
            .bind(since)
            .bind(until)
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
            .bind(topics)
            .bind(since)
            .bind(until)
            .fetch_one(&self.inner.pool)
            .await
            .map_err(Error::db("counting retained events"))?;
        Ok(n.max(0) as u64)
    }

    async fn count_processed(&self, consumer: &str, ids: &[Uuid]) -> Result<u64> {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM tidings_processed WHERE consumer = $1 AND message_id = ANY($2)",
        )
        .bind(consumer)
        .bind(ids)
        .fetch_one(&self.inner.pool)
        .await
        .map_err(Error::db("counting processed markers"))?;
        Ok(n.max(0) as u64)
    }

    async fn request_replay(&self, request: &ReplayRequest) -> Result<Uuid> {
        let id = Uuid::now_v7();
        sqlx::query(
            "INSERT INTO tidings_replays (id, consumer, topics, source, since, until, rate, total, state)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'pending')",
        )
        .bind(id)
        .bind(&request.consumer)
        .bind(serde_json::json!(request.topics))
        .bind(request.source.as_str())
        .bind(request.since)
        .bind(request.until)
        .bind(request.rate)
        .bind(request.total.min(i64::MAX as u64) as i64)
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
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE tidings_replays SET state = 'running', member = $2,
                    claimed_until = clock_timestamp() + make_interval(secs => $3), updated_at = now()
             WHERE id = (SELECT id FROM tidings_replays
                         WHERE consumer = $1 AND (state = 'pending'
                               OR (state = 'running' AND claimed_until < clock_timestamp()))
                         ORDER BY requested_at LIMIT 1 FOR UPDATE SKIP LOCKED)
             RETURNING {COLUMNS}"
        )))
        .bind(consumer)
        .bind(member)
        .bind(ttl.as_secs_f64())
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
        let updated = sqlx::query(
            "UPDATE tidings_replays SET cursor = $3, delivered = $4, suppressed = $5, handled = $6, failed = $7,
                    claimed_until = clock_timestamp() + make_interval(secs => $8),
                    state = CASE WHEN $9 THEN 'done' ELSE state END, updated_at = now()
             WHERE id = $1 AND member = $2 AND state = 'running'",
        )
        .bind(id)
        .bind(member)
        .bind(cursor)
        .bind(n(counts.delivered))
        .bind(n(counts.suppressed))
        .bind(n(counts.handled))
        .bind(n(counts.failed))
        .bind(ttl.as_secs_f64())
        .bind(done)
        .execute(&self.inner.pool)
        .await
        .map_err(Error::db("recording a replay's progress"))?;
        Ok(updated.rows_affected() == 1)
    }

    async fn cancel_replay(&self, id: Uuid) -> Result<bool> {
        let updated = sqlx::query(
            "UPDATE tidings_replays SET state = 'cancelled', updated_at = now()
             WHERE id = $1 AND state IN ('pending', 'running')",
        )
        .bind(id)
        .execute(&self.inner.pool)
        .await
        .map_err(Error::db("cancelling a replay"))?;
        Ok(updated.rows_affected() == 1)
    }
}
