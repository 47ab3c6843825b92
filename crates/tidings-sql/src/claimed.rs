//! What a relay's claim read, decoded record by record, and how a batch
//! ends in part: the records sent, the records set aside holding their
//! keys ([`tidings_core::set_aside`]), the rest given back.

use tidings_core::{
    Error, OutboxPartitions, OutboxRecord, OutgoingMessage, Result, Settlement, Undecodable, cloudevents,
};

use crate::db::Stmt;
use crate::errors::db_error;
use crate::{Dialect, SqlStore};

/// The records of one claim, oldest first: those whose body decodes, with
/// their sequence numbers, and those whose body does not. One bad body
/// never fails the claim: the relay sets it aside.
#[derive(Debug, Default)]
pub struct ClaimedRows {
    /// The records that decoded.
    pub messages: Vec<OutgoingMessage>,
    /// The sequence number of each of `messages`.
    pub seqs: Vec<i64>,
    /// The records that did not.
    pub undecodable: Vec<Undecodable>,
}

impl ClaimedRows {
    /// Room for `n` records.
    pub fn with_capacity(n: usize) -> Self {
        ClaimedRows {
            messages: Vec::with_capacity(n),
            seqs: Vec::with_capacity(n),
            undecodable: Vec::new(),
        }
    }

    /// Adds `record`, the next in sequence order.
    pub fn push(&mut self, record: OutboxRecord) {
        match cloudevents::from_json(&record.body) {
            Ok(envelope) => {
                self.seqs.push(record.seq);
                self.messages.push(OutgoingMessage {
                    topic: record.topic,
                    envelope,
                });
            }
            Err(e) => self.undecodable.push(Undecodable {
                record,
                reason: e.to_string(),
            }),
        }
    }

    /// What completing such a batch may mark: only the records that
    /// decoded, when some did not (those stay unsent); `None` when all did.
    pub fn decoded_only(&self) -> Option<Settlement> {
        (!self.undecodable.is_empty()).then(|| Settlement {
            sent: self.seqs.clone(),
            set_aside: Vec::new(),
        })
    }

    /// Whether nothing was claimed.
    pub fn is_empty(&self) -> bool {
        self.messages.is_empty() && self.undecodable.is_empty()
    }
}

/// Settles a batch the relay claimed under `live` (its scope, member and
/// the leases the claim found live), in one transaction of its own: marks
/// the records sent, stores each record set aside as a dead letter with a
/// hold on its key, then checks that the relay still holds every one of
/// those leases, and commits only if it does. The records it does not name
/// stay unsent. For a claim that held no lock on its leases while it was
/// published (SQLite's); a claim that did ends in its own transaction
/// ([`TxBatch`](crate::TxBatch)).
///
/// The writes come before the check so that the check holds until the
/// commit: SQLite's transaction holds the write lock from its first write.
pub async fn settle<D: Dialect>(store: &SqlStore<D>, live: &OutboxPartitions, s: Settlement) -> Result<()> {
    if s.is_empty() {
        return Ok(());
    }
    let mut tx = store.begin_tx("settling an outbox batch").await?;
    write_settlement(store, &mut tx, &s).await?;
    for lease in &live.leases {
        let holds = Stmt::<D>::new(D::SQL.holds_lease, "checking the relay's leases")
            .bind(live.scope.as_str())
            .bind(i32::try_from(lease.partition).unwrap_or(i32::MAX))
            .bind(live.member.as_str())
            .bind(lease.fence)
            .fetch_optional(&mut tx)
            .await?;
        if holds.is_none() {
            let _ = tx.rollback().await;
            return Err(Error::transport_reason(
                "relay",
                format!(
                    "partition {} changed hands during the batch; left for its new holder",
                    lease.partition
                ),
                true,
            ));
        }
    }
    tx.commit()
        .await
        .map_err(db_error::<D>("committing an outbox batch"))
}

/// Writes a settlement in `conn`: the records sent marked (deleted, or
/// stamped under a retention), each record set aside stored as a dead
/// letter of the relay with a hold on its key.
pub(crate) async fn write_settlement<D: Dialect>(
    store: &SqlStore<D>,
    conn: &mut <D::Db as sqlx::Database>::Connection,
    s: &Settlement,
) -> Result<()> {
    if !s.sent.is_empty() {
        let sql = match store.options().retention_period() {
            Some(_) => D::SQL.relay_stamp_sent,
            None => D::SQL.relay_delete_sent,
        };
        Stmt::<D>::new(sql, "completing an outbox batch")
            .bind(D::int_list(&s.sent))
            .execute(&mut *conn)
            .await?;
    }
    for aside in &s.set_aside {
        SqlStore::<D>::insert_dead_letter(&mut *conn, &aside.letter).await?;
        Stmt::<D>::new(D::SQL.relay_hold, "holding a key behind a record set aside")
            .bind(aside.seq)
            .bind(aside.letter.message_id.unwrap_or_default())
            .bind(aside.letter.topic.as_str())
            .bind(aside.key())
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}
