//! Lag figures.

use async_trait::async_trait;
use tidings_core::{ConsumerLag, DeadLetterLag, LagReport, LagSource, ParkedLag, Result};

use crate::db::Stmt;
use crate::store::{age, count};
use crate::{Dialect, SqlStore};

#[async_trait]
impl<D: Dialect> LagSource for SqlStore<D> {
    async fn lag(&self) -> Result<LagReport> {
        let mut conn = self.conn("measuring lag").await?;
        let outbox = Stmt::<D>::new(D::SQL.outbox_lag, "measuring outbox lag")
            .fetch_one(&mut conn)
            .await?;
        let consumers = Stmt::<D>::new(D::SQL.log_lag, "measuring consumer lag")
            .fetch_all(&mut conn)
            .await?;
        let dead = Stmt::<D>::new(D::SQL.dead_letter_lag, "counting dead letters")
            .fetch_all(&mut conn)
            .await?;
        let parked = Stmt::<D>::new(D::SQL.parked_lag, "counting parked messages")
            .fetch_all(&mut conn)
            .await?;
        Ok(LagReport {
            outbox_pending: count(outbox.get(0)?),
            oldest_unsent_age: outbox.get::<Option<i64>>(1)?.map(age),
            consumers: consumers
                .iter()
                .map(|r| {
                    Ok(ConsumerLag {
                        consumer: r.get(0)?,
                        topic: r.get(1)?,
                        pending: count(r.get::<Option<i64>>(2)?.unwrap_or(0)),
                    })
                })
                .collect::<Result<_>>()?,
            dead_letters: dead
                .iter()
                .map(|r| {
                    Ok(DeadLetterLag {
                        consumer: r.get(0)?,
                        pending: count(r.get(1)?),
                        oldest_age: r.get::<Option<i64>>(2)?.map(age),
                    })
                })
                .collect::<Result<_>>()?,
            parked: parked
                .iter()
                .map(|r| Ok(ParkedLag::from((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))))
                .collect::<Result<_>>()?,
        })
    }
}
