//! The failure store: dead letters, redrive (as they are or edited), skip and purge.

use async_trait::async_trait;
use sqlx::Database;
use tidings_core::{
    DeadLetter, DeadLetterEdit, DeadLetterFilter, EDIT_HEADER, Edit, Failure, FailureStore, Outbox,
    OutgoingMessage, RELAY_LETTERS, Redrive, Result, Skip, cloudevents, redrive_envelope,
};
use uuid::Uuid;

use tidings_core::set_aside::OUTBOX_SEQ_HEADER;

use crate::db::{Record, Stmt};
use crate::errors::db_error;
use crate::store::{from_micros, micros};
use crate::{Dialect, SqlStore};

/// The columns a dialect's dead-letter queries return, in this order
/// (times in microseconds, JSON as text).
pub const DEAD_LETTER_COLUMNS: &str = "id, consumer, topic, message_id, message_type, aggregate_key, \
    headers, body, attempts, errors, created_at, redrives, redriven_at, skipped_at";

fn letter<D: Dialect>(r: &Record<D>) -> Result<DeadLetter> {
    let headers: String = r.get(6)?;
    let errors: String = r.get(9)?;
    Ok(DeadLetter {
        id: r.get(0)?,
        consumer: r.get(1)?,
        topic: r.get(2)?,
        message_id: r.get(3)?,
        message_type: r.get(4)?,
        aggregate_key: r.get(5)?,
        headers: serde_json::from_str(&headers).unwrap_or_default(),
        body: r.get(7)?,
        attempts: u32::try_from(r.get::<i32>(8)?).unwrap_or(0),
        errors: serde_json::from_str::<Vec<Failure>>(&errors).unwrap_or_default(),
        created_at: from_micros(r.get(10)?),
        redrives: u32::try_from(r.get::<i32>(11)?).unwrap_or(0),
        redriven_at: r.get::<Option<i64>>(12)?.map(from_micros),
        skipped_at: r.get::<Option<i64>>(13)?.map(from_micros),
    })
}

/// An edit read back from `edits`' columns.
fn edit<D: Dialect>(r: &Record<D>) -> Result<DeadLetterEdit> {
    Ok(DeadLetterEdit {
        id: r.get(0)?,
        dead_letter_id: r.get(1)?,
        by: r.get(2)?,
        at: from_micros(r.get(3)?),
        original: r.get(4)?,
        edited: r.get(5)?,
    })
}

impl<D: Dialect> SqlStore<D> {
    /// The dead letter `id`, locked until `tx` ends, if there is one.
    async fn locked_letter(tx: &mut <D::Db as Database>::Connection, id: Uuid) -> Result<Option<DeadLetter>> {
        if let Some(lock) = D::SQL.lock_dead_letter {
            // Take the write lock first, so that the read below is consistent with the update.
            Stmt::<D>::new(lock, "locking a dead letter")
                .bind(id)
                .execute(&mut *tx)
                .await?;
        }
        let row = Stmt::<D>::new(D::SQL.dead_letter_for_redrive, "reading a dead letter")
            .bind(id)
            .fetch_optional(&mut *tx)
            .await?;
        row.as_ref().map(letter::<D>).transpose()
    }

    /// Stores a dead letter on `conn`; failing again after a redrive or a
    /// skip makes it pending again, with its history appended.
    pub(crate) async fn insert_dead_letter(
        conn: &mut <D::Db as Database>::Connection,
        l: &DeadLetter,
    ) -> Result<()> {
        let headers = serde_json::to_string(&l.headers).expect("string map to JSON");
        let errors = serde_json::to_string(&l.errors).expect("failures to JSON");
        Stmt::<D>::new(D::SQL.dead_letter_upsert, "storing a dead letter")
            .bind(l.id)
            .bind(l.consumer.as_str())
            .bind(l.topic.as_str())
            .bind(l.message_id)
            .bind(l.message_type.as_deref())
            .bind(l.aggregate_key.as_deref())
            .bind(headers.as_str())
            .bind(l.body.as_slice())
            .bind(i32::try_from(l.attempts).unwrap_or(i32::MAX))
            .bind(errors.as_str())
            .bind(micros(l.created_at))
            .execute(conn)
            .await?;
        Ok(())
    }
}

impl<D: Dialect> SqlStore<D> {
    /// Marks the dead letter `id` redriven and commits `tx` (`what` names
    /// the commit in an error), then wakes the relay for what it enqueued.
    async fn settle_redrive(
        &self,
        mut tx: sqlx::Transaction<'static, D::Db>,
        id: Uuid,
        what: &'static str,
    ) -> Result<()> {
        Stmt::<D>::new(D::SQL.mark_redriven, "marking a dead letter redriven")
            .bind(id)
            .execute(&mut tx)
            .await?;
        tx.commit().await.map_err(db_error::<D>(what))?;
        self.wake();
        Ok(())
    }

    /// Redrives a record the relay set aside: lets its hold go, so that the
    /// relay claims it again where it stands, then the rest of its key.
    async fn redrive_held(
        &self,
        mut tx: sqlx::Transaction<'static, D::Db>,
        dead: &DeadLetter,
    ) -> Result<Redrive> {
        let message_id = dead.message_id.unwrap_or_default();
        Stmt::<D>::new(D::SQL.relay_unhold, "letting a relay hold go")
            .bind(message_id)
            .execute(&mut tx)
            .await?;
        self.settle_redrive(tx, dead.id, "committing a redrive").await?;
        Ok(Redrive::Released {
            message_id,
            redrive: dead.redrives + 1,
        })
    }

    /// Skips a record the relay set aside: deletes it from the outbox and
    /// lets its hold go, so that the rest of its key goes on without it.
    async fn skip_held(mut tx: sqlx::Transaction<'static, D::Db>, dead: &DeadLetter) -> Result<Skip> {
        let message_id = dead.message_id.unwrap_or_default();
        let seq = dead
            .headers
            .get(OUTBOX_SEQ_HEADER)
            .and_then(|s| s.parse::<i64>().ok())
            .unwrap_or(-1);
        Stmt::<D>::new(D::SQL.relay_drop_held, "deleting a record set aside")
            .bind(seq)
            .bind(message_id)
            .execute(&mut tx)
            .await?;
        let released = Stmt::<D>::new(D::SQL.relay_unhold, "letting a relay hold go")
            .bind(message_id)
            .execute(&mut tx)
            .await?;
        tx.commit().await.map_err(db_error::<D>("committing a skip"))?;
        Ok(Skip::Skipped {
            released_key: D::rows_affected(&released) > 0,
        })
    }
}

#[async_trait]
impl<D: Dialect> FailureStore for SqlStore<D> {
    async fn dead_letter(&self, l: &DeadLetter) -> Result<()> {
        let mut conn = self.conn("storing a dead letter").await?;
        Self::insert_dead_letter(&mut conn, l).await
    }

    async fn dead_letters(&self, filter: &DeadLetterFilter) -> Result<Vec<DeadLetter>> {
        let mut conn = self.conn("listing dead letters").await?;
        let rows = Stmt::<D>::new(D::SQL.dead_letters, "listing dead letters")
            .bind(filter.consumer.as_deref())
            .bind(filter.message_type.as_deref())
            .bind(filter.limit.map_or(i64::MAX, i64::from))
            .bind(filter.include_redriven)
            .fetch_all(&mut conn)
            .await?;
        rows.iter().map(letter::<D>).collect()
    }

    async fn letter(&self, id: Uuid) -> Result<Option<DeadLetter>> {
        let what = "reading a dead letter";
        let mut conn = self.conn(what).await?;
        let row = Stmt::<D>::new(D::SQL.dead_letter_by_id, what)
            .bind(id)
            .fetch_optional(&mut conn)
            .await?;
        row.as_ref().map(letter::<D>).transpose()
    }

    async fn redrive(&self, id: Uuid) -> Result<Redrive> {
        let mut tx = self.begin_tx("starting a redrive").await?;
        let Some(dead) = Self::locked_letter(&mut tx, id).await? else {
            return Ok(Redrive::NotFound);
        };
        // Read under the lock: of two redrives at once, the second finds it settled.
        if !dead.is_pending() {
            return Ok(Redrive::Settled);
        }
        if dead.consumer == RELAY_LETTERS {
            return self.redrive_held(tx, &dead).await;
        }
        let Some(envelope) = redrive_envelope(&dead) else {
            return Ok(Redrive::Undecodable);
        };
        let message_id = envelope.id;
        self.enqueue_outgoing(
            &mut tx,
            &OutgoingMessage {
                topic: dead.topic.clone(),
                envelope,
            },
        )
        .await?;
        self.settle_redrive(tx, id, "committing a redrive").await?;
        Ok(Redrive::Enqueued {
            message_id,
            redrive: dead.redrives + 1,
        })
    }

    async fn redrive_edited(&self, id: Uuid, edit: &Edit) -> Result<Redrive> {
        let mut tx = self.begin_tx("starting an edited redrive").await?;
        let Some(dead) = Self::locked_letter(&mut tx, id).await? else {
            return Ok(Redrive::NotFound);
        };
        if !dead.is_pending() {
            return Ok(Redrive::Settled);
        }
        if dead.consumer == RELAY_LETTERS {
            return Ok(Redrive::NotEditable);
        }
        let Some(mut envelope) = redrive_envelope(&dead) else {
            return Ok(Redrive::Undecodable);
        };
        let edit_id = Uuid::now_v7();
        envelope.payload = serde_json::to_vec(&edit.data).expect("a JSON value to bytes");
        if !cloudevents::is_json(&envelope.content_type) {
            // The data is JSON now, whatever it was.
            envelope.content_type = tidings_core::envelope::JSON.to_owned();
        }
        let message = OutgoingMessage {
            topic: dead.topic.clone(),
            envelope: envelope.header(EDIT_HEADER, edit_id.to_string()),
        };
        let message_id = message.envelope.id;
        self.enqueue_outgoing(&mut tx, &message).await?;
        let edited = cloudevents::to_json(&message.envelope);
        Stmt::<D>::new(D::SQL.edit_insert, "recording a dead letter's edit")
            .bind(edit_id)
            .bind(id)
            .bind(edit.by.as_str())
            .bind(micros(chrono::Utc::now()))
            .bind(dead.body.as_slice())
            .bind(edited.as_slice())
            .execute(&mut tx)
            .await?;
        self.settle_redrive(tx, id, "committing an edited redrive")
            .await?;
        Ok(Redrive::Edited {
            message_id,
            redrive: dead.redrives + 1,
            edit: edit_id,
        })
    }

    async fn edits(&self, dead_letter_id: Uuid) -> Result<Vec<DeadLetterEdit>> {
        let what = "reading a dead letter's edits";
        let mut conn = self.conn(what).await?;
        let rows = Stmt::<D>::new(D::SQL.edits, what)
            .bind(dead_letter_id)
            .fetch_all(&mut conn)
            .await?;
        rows.iter().map(edit::<D>).collect()
    }

    async fn skip(&self, id: Uuid) -> Result<Skip> {
        // Marks it skipped and releases the key it holds, in one transaction.
        let mut tx = self.begin_tx("starting a skip").await?;
        let Some(dead) = Self::locked_letter(&mut tx, id).await? else {
            return Ok(Skip::NotFound);
        };
        if !dead.is_pending() {
            return Ok(Skip::Settled);
        }
        Stmt::<D>::new(D::SQL.mark_skipped, "marking a dead letter skipped")
            .bind(id)
            .execute(&mut tx)
            .await?;
        if dead.consumer == RELAY_LETTERS {
            return Self::skip_held(tx, &dead).await;
        }
        let released = Stmt::<D>::new(D::SQL.release_skipped, "releasing a held key")
            .bind(dead.consumer.as_str())
            .bind(dead.topic.as_str())
            .bind(dead.aggregate_key.as_deref())
            .bind(dead.message_id)
            .bind(true)
            .execute(&mut tx)
            .await?;
        tx.commit().await.map_err(db_error::<D>("committing a skip"))?;
        Ok(Skip::Skipped {
            released_key: D::rows_affected(&released) > 0,
        })
    }

    /// The settled letters among `ids` go, their edits (and the original
    /// bodies these keep) with them, in one transaction.
    async fn purge(&self, ids: &[Uuid]) -> Result<u64> {
        let mut tx = self.begin_tx("starting a purge").await?;
        Stmt::<D>::new(D::SQL.purge_edits, "purging the edits of dead letters")
            .bind(D::uuid_list(ids))
            .execute(&mut tx)
            .await?;
        let done = Stmt::<D>::new(D::SQL.purge, "purging dead letters")
            .bind(D::uuid_list(ids))
            .execute(&mut tx)
            .await?;
        tx.commit().await.map_err(db_error::<D>("committing a purge"))?;
        Ok(D::rows_affected(&done))
    }
}
