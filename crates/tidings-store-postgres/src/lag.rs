//! Lag figures.

use std::time::Duration;

use async_trait::async_trait;
use tidings_core::{ConsumerLag, DeadLetterLag, Error, LagReport, LagSource, ParkedLag, Result};

use crate::PgStore;

#[async_trait]
impl LagSource for PgStore {
    async fn lag(&self) -> Result<LagReport> {
        let pool = &self.inner.pool;
        let (pending, oldest): (i64, Option<f64>) = sqlx::query_as(
            "SELECT count(*), EXTRACT(EPOCH FROM now() - min(created_at))::float8
             FROM tidings_outbox WHERE published_at IS NULL",
        )
        .fetch_one(pool)
        .await
        .map_err(Error::db("measuring outbox lag"))?;
        let consumers: Vec<(String, String, i64)> = sqlx::query_as(
            "SELECT o.consumer_group, o.topic,
                    sum((SELECT count(*) FROM tidings_log l
                         WHERE l.topic = o.topic AND (l.txid, l.seq) > (o.txid, o.seq)
                           AND (o.partition_count = 1
                                OR COALESCE(l.key_hash, 0) % o.partition_count = o.partition_index)))::bigint
             FROM tidings_log_offsets o GROUP BY 1, 2 ORDER BY 1, 2",
        )
        .fetch_all(pool)
        .await
        .map_err(Error::db("measuring consumer lag"))?;
        let dead: Vec<(String, i64, Option<f64>)> = sqlx::query_as(
            "SELECT consumer, count(*), EXTRACT(EPOCH FROM now() - min(created_at))::float8
             FROM tidings_dead_letters WHERE redriven_at IS NULL AND skipped_at IS NULL
             GROUP BY consumer ORDER BY consumer",
        )
        .fetch_all(pool)
        .await
        .map_err(Error::db("counting dead letters"))?;
        let parked: Vec<(String, String, i64, i64)> = sqlx::query_as(tidings_core::parking::PARKED_LAG)
            .fetch_all(pool)
            .await
            .map_err(Error::db("counting parked messages"))?;
        Ok(LagReport {
            outbox_pending: pending.max(0) as u64,
            oldest_unsent_age: oldest.map(|s| Duration::from_secs_f64(s.max(0.0))),
            consumers: consumers
                .into_iter()
                .map(|(consumer, topic, pending)| ConsumerLag {
                    consumer,
                    topic,
                    pending: pending.max(0) as u64,
                })
                .collect(),
            dead_letters: dead
                .into_iter()
                .map(|(consumer, pending, oldest)| DeadLetterLag {
                    consumer,
                    pending: pending.max(0) as u64,
                    oldest_age: oldest.map(|s| Duration::from_secs_f64(s.max(0.0))),
                })
                .collect(),
            parked: parked.into_iter().map(ParkedLag::from).collect(),
        })
    }
}
