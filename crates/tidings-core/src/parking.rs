//! The SQL of [`ParkingStore`](crate::ParkingStore), the same on every
//! supported database, and the macro that implements the trait with it for
//! a store type.

/// Holds a key for a consumer, or moves its hold to another message.
pub const HOLD: &str = "INSERT INTO tidings_held_keys (consumer, topic, aggregate_key, message_id, released)
    VALUES ($1, $2, $3, $4, $5)
    ON CONFLICT (consumer, topic, aggregate_key) DO UPDATE SET
        message_id = excluded.message_id, released = excluded.released";

/// A consumer's held keys.
pub const HELD_KEYS: &str = "SELECT topic, aggregate_key, message_id, released FROM tidings_held_keys
    WHERE consumer = $1";

/// Parks a message, once per (consumer, message id).
pub const PARK: &str =
    "INSERT INTO tidings_parked (consumer, topic, aggregate_key, message_id, headers, body)
    VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (consumer, message_id) DO NOTHING";

/// The oldest message parked behind a key.
pub const NEXT_PARKED: &str = "SELECT message_id, headers, body FROM tidings_parked
    WHERE consumer = $1 AND topic = $2 AND aggregate_key = $3 ORDER BY seq LIMIT 1";

/// Removes a parked message.
pub const UNPARK: &str = "DELETE FROM tidings_parked WHERE consumer = $1 AND message_id = $2";

/// Releases a key with nothing parked behind it.
pub const RELEASE_KEY: &str = "DELETE FROM tidings_held_keys
    WHERE consumer = $1 AND topic = $2 AND aggregate_key = $3
      AND NOT EXISTS (SELECT 1 FROM tidings_parked p
                      WHERE p.consumer = $1 AND p.topic = $2 AND p.aggregate_key = $3)";

/// Marks the hold of a skipped dead letter's message released.
pub const RELEASE_SKIPPED: &str = "UPDATE tidings_held_keys SET released = $5
    WHERE consumer = $1 AND topic = $2 AND aggregate_key = $3 AND message_id = $4";

/// Held keys and parked messages per consumer and topic.
pub const PARKED_LAG: &str = "SELECT h.consumer, h.topic, CAST(count(*) AS BIGINT),
        CAST(COALESCE(sum((SELECT count(*) FROM tidings_parked p
             WHERE p.consumer = h.consumer AND p.topic = h.topic AND p.aggregate_key = h.aggregate_key)), 0) AS BIGINT)
    FROM tidings_held_keys h GROUP BY h.consumer, h.topic ORDER BY h.consumer, h.topic";

/// Implements [`ParkingStore`](crate::ParkingStore) for a store type with
/// `pool()` and `insert_dead_letter(conn, letter)` (the store's own dead
/// letter upsert, on a connection), and gives it `skip_dead_letter`, the
/// body of [`FailureStore::skip`](crate::FailureStore::skip); `now` is the
/// store's SQL for the current time in its timestamp columns.
#[doc(hidden)]
#[macro_export]
macro_rules! impl_parking_store {
    ($store:ty, now = $now:literal) => {
        impl $store {
            /// Marks a dead letter skipped and releases the key it holds, in one transaction.
            async fn skip_dead_letter(&self, id: uuid::Uuid) -> $crate::Result<$crate::Skip> {
                use $crate::Error;
                let mut tx = self
                    .pool()
                    .begin()
                    .await
                    .map_err(Error::db("starting a skip"))?;
                let found: Option<(String, String, Option<String>, Option<uuid::Uuid>)> =
                    sqlx::query_as(concat!(
                        "UPDATE tidings_dead_letters SET skipped_at = ",
                        $now,
                        ", updated_at = ",
                        $now,
                        " WHERE id = $1 RETURNING consumer, topic, aggregate_key, message_id"
                    ))
                    .bind(id)
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(Error::db("marking a dead letter skipped"))?;
                let Some((consumer, topic, key, message_id)) = found else {
                    return Ok($crate::Skip::NotFound);
                };
                let released = sqlx::query($crate::parking::RELEASE_SKIPPED)
                    .bind(consumer)
                    .bind(topic)
                    .bind(key)
                    .bind(message_id)
                    .bind(true)
                    .execute(&mut *tx)
                    .await
                    .map_err(Error::db("releasing a held key"))?;
                tx.commit().await.map_err(Error::db("committing a skip"))?;
                Ok($crate::Skip::Skipped {
                    released_key: released.rows_affected() > 0,
                })
            }
        }

        #[async_trait::async_trait]
        impl $crate::ParkingStore for $store {
            async fn dead_letter_holding_key(&self, letter: &$crate::DeadLetter) -> $crate::Result<()> {
                use $crate::Error;
                let mut tx = self
                    .pool()
                    .begin()
                    .await
                    .map_err(Error::db("starting a dead letter"))?;
                Self::insert_dead_letter(&mut *tx, letter).await?;
                if let (Some(id), Some(key)) = (letter.message_id, &letter.aggregate_key) {
                    sqlx::query($crate::parking::HOLD)
                        .bind(&letter.consumer)
                        .bind(&letter.topic)
                        .bind(key)
                        .bind(id)
                        .bind(false)
                        .execute(&mut *tx)
                        .await
                        .map_err(Error::db("holding a key"))?;
                }
                tx.commit()
                    .await
                    .map_err(Error::db("committing a dead letter"))
            }

            async fn held_keys(&self, consumer: &str) -> $crate::Result<Vec<$crate::HeldKey>> {
                let rows: Vec<(String, String, uuid::Uuid, bool)> =
                    sqlx::query_as($crate::parking::HELD_KEYS)
                        .bind(consumer)
                        .fetch_all(self.pool())
                        .await
                        .map_err($crate::Error::db("reading held keys"))?;
                Ok(rows
                    .into_iter()
                    .map(
                        |(topic, aggregate_key, message_id, released)| $crate::HeldKey {
                            consumer: consumer.to_owned(),
                            topic,
                            aggregate_key,
                            message_id,
                            released,
                        },
                    )
                    .collect())
            }

            async fn park(&self, consumer: &str, m: &$crate::ParkedMessage) -> $crate::Result<()> {
                let headers = serde_json::to_string(&m.headers).expect("string map to JSON");
                sqlx::query($crate::parking::PARK)
                    .bind(consumer)
                    .bind(&m.topic)
                    .bind(&m.aggregate_key)
                    .bind(m.message_id)
                    .bind(headers)
                    .bind(&m.body)
                    .execute(self.pool())
                    .await
                    .map_err($crate::Error::db("parking a message"))?;
                Ok(())
            }

            async fn next_parked(
                &self,
                consumer: &str,
                topic: &str,
                key: &str,
            ) -> $crate::Result<Option<$crate::ParkedMessage>> {
                let row: Option<(uuid::Uuid, String, Vec<u8>)> = sqlx::query_as($crate::parking::NEXT_PARKED)
                    .bind(consumer)
                    .bind(topic)
                    .bind(key)
                    .fetch_optional(self.pool())
                    .await
                    .map_err($crate::Error::db("reading parked messages"))?;
                Ok(
                    row.map(|(message_id, headers, body)| $crate::ParkedMessage {
                        topic: topic.to_owned(),
                        aggregate_key: key.to_owned(),
                        message_id,
                        headers: serde_json::from_str(&headers).unwrap_or_default(),
                        body,
                    }),
                )
            }

            async fn unpark(&self, consumer: &str, message_id: uuid::Uuid) -> $crate::Result<()> {
                sqlx::query($crate::parking::UNPARK)
                    .bind(consumer)
                    .bind(message_id)
                    .execute(self.pool())
                    .await
                    .map_err($crate::Error::db("removing a parked message"))?;
                Ok(())
            }

            async fn release_key(&self, consumer: &str, topic: &str, key: &str) -> $crate::Result<bool> {
                let done = sqlx::query($crate::parking::RELEASE_KEY)
                    .bind(consumer)
                    .bind(topic)
                    .bind(key)
                    .execute(self.pool())
                    .await
                    .map_err($crate::Error::db("releasing a key"))?;
                Ok(done.rows_affected() > 0)
            }
        }
    };
}
