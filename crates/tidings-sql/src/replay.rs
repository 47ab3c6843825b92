//! Replay requests and the retained events they re-deliver.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use tidings_core::replay::{
    Replay, ReplayCounts, ReplayRequest, ReplaySource, ReplayState, ReplayStore, Retained,
};
use tidings_core::{RawMessage, Result};
use uuid::Uuid;

use crate::db::{Record, Stmt};
use crate::errors::db_error;
use crate::store::{count, from_micros, micros, millis};
use crate::{Dialect, SqlStore};

/// The columns a dialect's replay queries return, in this order (times in
/// microseconds, topics as JSON text).
pub const REPLAY_COLUMNS: &str = "id, consumer, topics, source, since, until, rate, total, state, member, \
    cursor, delivered, suppressed, handled, failed";

fn replay_of<D: Dialect>(r: &Record<D>) -> Result<Replay> {
    let n = |i| r.get::<i64>(i).map(count);
    Ok(Replay {
        id: r.get(0)?,
        request: ReplayRequest {
            consumer: r.get(1)?,
            topics: serde_json::from_str(&r.get::<String>(2)?).unwrap_or_default(),
            source: ReplaySource::parse(&r.get::<String>(3)?).unwrap_or(ReplaySource::Log),
            since: from_micros(r.get(4)?),
            until: from_micros(r.get(5)?),
            rate: r.get(6)?,
            total: n(7)?,
        },
        state: ReplayState::parse(&r.get::<String>(8)?),
        member: r.get(9)?,
        cursor: r.get(10)?,
        counts: ReplayCounts {
            delivered: n(11)?,
            suppressed: n(12)?,
            handled: n(13)?,
            failed: n(14)?,
        },
    })
}

fn bounded(n: u64) -> i64 {
    n.min(i64::MAX as u64) as i64
}

#[async_trait]
impl<D: Dialect> ReplayStore for SqlStore<D> {
    async fn retained(
        &self,
        source: ReplaySource,
        topics: &[String],
        since: DateTime<Utc>,
        until: DateTime<Utc>,
        after: i64,
        limit: usize,
    ) -> Result<Vec<Retained>> {
        let sql = match source {
            ReplaySource::Log => D::SQL.retained_log,
            ReplaySource::Outbox => D::SQL.retained_outbox,
        };
        let mut conn = self.conn("reading retained events").await?;
        let rows = Stmt::<D>::new(sql, "reading retained events")
            .bind(D::text_list(topics))
            .bind(micros(since))
            .bind(micros(until))
            .bind(after)
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(&mut conn)
            .await?;
        rows.iter()
            .map(|r| {
                Ok(Retained {
                    position: r.get(0)?,
                    message: RawMessage {
                        topic: r.get(1)?,
                        key: r.get(2)?,
                        headers: Default::default(),
                        body: r.get(3)?,
                        refused: None,
                    },
                })
            })
            .collect()
    }

    async fn count_retained(
        &self,
        source: ReplaySource,
        topics: &[String],
        since: DateTime<Utc>,
        until: DateTime<Utc>,
    ) -> Result<u64> {
        let sql = match source {
            ReplaySource::Log => D::SQL.count_retained_log,
            ReplaySource::Outbox => D::SQL.count_retained_outbox,
        };
        let mut conn = self.conn("counting retained events").await?;
        let row = Stmt::<D>::new(sql, "counting retained events")
            .bind(D::text_list(topics))
            .bind(micros(since))
            .bind(micros(until))
            .fetch_one(&mut conn)
            .await?;
        Ok(count(row.get(0)?))
    }

    async fn count_processed(&self, consumer: &str, ids: &[Uuid]) -> Result<u64> {
        let mut conn = self.conn("counting processed markers").await?;
        let row = Stmt::<D>::new(D::SQL.count_processed, "counting processed markers")
            .bind(consumer)
            .bind(D::uuid_list(ids))
            .fetch_one(&mut conn)
            .await?;
        Ok(count(row.get(0)?))
    }

    async fn request_replay(&self, request: &ReplayRequest) -> Result<Uuid> {
        let id = Uuid::now_v7();
        let topics = serde_json::json!(request.topics).to_string();
        let mut conn = self.conn("recording a replay").await?;
        Stmt::<D>::new(D::SQL.request_replay, "recording a replay")
            .bind(id)
            .bind(request.consumer.as_str())
            .bind(topics.as_str())
            .bind(request.source.as_str())
            .bind(micros(request.since))
            .bind(micros(request.until))
            .bind(request.rate)
            .bind(bounded(request.total))
            .execute(&mut conn)
            .await?;
        Ok(id)
    }

    async fn replay(&self, id: Uuid) -> Result<Option<Replay>> {
        let mut conn = self.conn("reading a replay").await?;
        let row = Stmt::<D>::new(D::SQL.replay, "reading a replay")
            .bind(id)
            .fetch_optional(&mut conn)
            .await?;
        row.as_ref().map(replay_of::<D>).transpose()
    }

    async fn claim_replay(&self, consumer: &str, member: &str, ttl: Duration) -> Result<Option<Replay>> {
        let claim = Stmt::<D>::new(D::SQL.claim_replay, "claiming a replay")
            .bind(consumer)
            .bind(member)
            .bind(millis(ttl));
        let row = match D::SQL.claimed_replay {
            None => {
                let mut conn = self.conn("claiming a replay").await?;
                claim.fetch_optional(&mut conn).await?
            }
            // The claimed row stays locked until the read.
            Some(claimed) => {
                let mut tx = self.begin_tx("claiming a replay").await?;
                if D::rows_affected(&claim.execute(&mut tx).await?) == 0 {
                    return Ok(None);
                }
                let row = Stmt::<D>::new(claimed, "reading the claimed replay")
                    .bind(consumer)
                    .bind(member)
                    .fetch_optional(&mut tx)
                    .await?;
                tx.commit().await.map_err(db_error::<D>("claiming a replay"))?;
                row
            }
        };
        row.as_ref().map(replay_of::<D>).transpose()
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
        let mut conn = self.conn("recording a replay's progress").await?;
        let updated = Stmt::<D>::new(D::SQL.replay_progress, "recording a replay's progress")
            .bind(id)
            .bind(member)
            .bind(cursor)
            .bind(bounded(counts.delivered))
            .bind(bounded(counts.suppressed))
            .bind(bounded(counts.handled))
            .bind(bounded(counts.failed))
            .bind(millis(ttl))
            .bind(done)
            .execute(&mut conn)
            .await?;
        Ok(D::rows_affected(&updated) == 1)
    }

    async fn cancel_replay(&self, id: Uuid) -> Result<bool> {
        let mut conn = self.conn("cancelling a replay").await?;
        let updated = Stmt::<D>::new(D::SQL.cancel_replay, "cancelling a replay")
            .bind(id)
            .execute(&mut conn)
            .await?;
        Ok(D::rows_affected(&updated) == 1)
    }
}
