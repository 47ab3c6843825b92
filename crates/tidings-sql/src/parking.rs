//! Held keys and the messages parked behind them.

use async_trait::async_trait;
use tidings_core::{ConsumerStore, DeadLetter, Fence, HeldKey, ParkedMessage, ParkingStore, Result};
use uuid::Uuid;

use crate::db::Stmt;
use crate::errors::db_error;
use crate::{Dialect, SqlStore};

#[async_trait]
impl<D: Dialect> ParkingStore for SqlStore<D> {
    async fn dead_letter_holding_key(&self, letter: &DeadLetter, fence: Option<Fence<'_>>) -> Result<bool> {
        let mut tx = self.begin_tx("starting a dead letter").await?;
        // The lease first, held (FOR SHARE where the database can) until the
        // commit: a successor's acquire waits for it, and loads the hold.
        if let Some(f) = fence
            && !self.holds_lease(&mut tx, f.scope, f.member, f.lease).await?
        {
            let _ = tx.rollback().await;
            return Ok(false);
        }
        Self::insert_dead_letter(&mut tx, letter).await?;
        if let (Some(id), Some(key)) = (letter.message_id, &letter.aggregate_key) {
            Stmt::<D>::new(D::SQL.hold, "holding a key")
                .bind(letter.consumer.as_str())
                .bind(letter.topic.as_str())
                .bind(key.as_str())
                .bind(id)
                .bind(false)
                .execute(&mut tx)
                .await?;
        }
        tx.commit()
            .await
            .map_err(db_error::<D>("committing a dead letter"))?;
        Ok(true)
    }

    async fn held_keys(&self, consumer: &str) -> Result<Vec<HeldKey>> {
        let mut conn = self.conn("reading held keys").await?;
        let rows = Stmt::<D>::new(D::SQL.held_keys, "reading held keys")
            .bind(consumer)
            .fetch_all(&mut conn)
            .await?;
        rows.iter()
            .map(|r| {
                Ok(HeldKey {
                    consumer: consumer.to_owned(),
                    topic: r.get(0)?,
                    aggregate_key: r.get(1)?,
                    message_id: r.get(2)?,
                    released: r.get(3)?,
                })
            })
            .collect()
    }

    async fn park(&self, consumer: &str, m: &ParkedMessage) -> Result<()> {
        let headers = serde_json::to_string(&m.headers).expect("string map to JSON");
        let mut conn = self.conn("parking a message").await?;
        Stmt::<D>::new(D::SQL.park, "parking a message")
            .bind(consumer)
            .bind(m.topic.as_str())
            .bind(m.aggregate_key.as_str())
            .bind(m.message_id)
            .bind(headers.as_str())
            .bind(m.body.as_slice())
            .execute(&mut conn)
            .await?;
        Ok(())
    }

    async fn next_parked(&self, consumer: &str, topic: &str, key: &str) -> Result<Option<ParkedMessage>> {
        let mut conn = self.conn("reading parked messages").await?;
        let row = Stmt::<D>::new(D::SQL.next_parked, "reading parked messages")
            .bind(consumer)
            .bind(topic)
            .bind(key)
            .fetch_optional(&mut conn)
            .await?;
        row.map(|r| {
            Ok(ParkedMessage {
                topic: topic.to_owned(),
                aggregate_key: key.to_owned(),
                message_id: r.get(0)?,
                headers: serde_json::from_str(&r.get::<String>(1)?).unwrap_or_default(),
                body: r.get(2)?,
            })
        })
        .transpose()
    }

    async fn unpark(&self, consumer: &str, message_id: Uuid) -> Result<()> {
        let mut conn = self.conn("removing a parked message").await?;
        Stmt::<D>::new(D::SQL.unpark, "removing a parked message")
            .bind(consumer)
            .bind(message_id)
            .execute(&mut conn)
            .await?;
        Ok(())
    }

    async fn release_key(&self, consumer: &str, topic: &str, key: &str) -> Result<bool> {
        let mut conn = self.conn("releasing a key").await?;
        let done = Stmt::<D>::new(D::SQL.release_key, "releasing a key")
            .bind(consumer)
            .bind(topic)
            .bind(key)
            .execute(&mut conn)
            .await?;
        Ok(D::rows_affected(&done) > 0)
    }
}
