//! The relay's claim on SQLite: read without locking, completed under a fence check.

use async_trait::async_trait;
use sqlx::Row;
use tidings_core::{
    ClaimedBatch, Error, Lease, OutboxPartitions, OutboxRecord, OutgoingMessage, Result, Settlement,
    Undecodable,
};
use tidings_sql::{ClaimedRows, db_error};

use crate::{Lite, SqliteStore, now_millis};

/// A batch read by a relay of a SQLite file. Nothing is locked while it is
/// published: holding SQLite's one write lock across a publish would block
/// every producer. Completing deletes (or stamps) the rows of each
/// partition in one statement that first checks the relay still holds the
/// partition's lease with the same fencing token.
#[derive(Debug)]
pub struct SqliteBatch {
    store: SqliteStore,
    scope: String,
    member: String,
    count: u32,
    /// The rows read, per partition lease.
    rows: Vec<(Lease, Vec<i64>)>,
    claimed: ClaimedRows,
}

/// Reads a batch; nothing is locked until it completes.
pub(crate) async fn claim(store: &SqliteStore, limit: usize, held: &OutboxPartitions) -> Result<SqliteBatch> {
    let now = now_millis();
    let mut live = Vec::with_capacity(held.leases.len());
    for lease in &held.leases {
        let holds: Option<i64> = sqlx::query_scalar(
            "SELECT 1 FROM tidings_leases WHERE scope = $1 AND partition_index = $2 AND owner = $3
               AND fence = $4 AND expires_at > $5",
        )
        .bind(&held.scope)
        .bind(i64::from(lease.partition))
        .bind(&held.member)
        .bind(lease.fence)
        .bind(now)
        .fetch_optional(store.pool())
        .await
        .map_err(db_error::<Lite>("checking the relay's leases"))?;
        if holds.is_some() {
            live.push(*lease);
        }
    }
    let mut batch = SqliteBatch {
        store: store.clone(),
        scope: held.scope.clone(),
        member: held.member.clone(),
        count: held.count,
        rows: live.iter().map(|l| (*l, Vec::new())).collect(),
        claimed: ClaimedRows::default(),
    };
    if live.is_empty() {
        return Ok(batch);
    }
    let partitions: Vec<u32> = live.iter().map(|l| l.partition).collect();
    // Rows of a key the relay holds behind a record set aside are left where
    // they are ([`tidings_core::set_aside`]).
    let rows = sqlx::query(
        "SELECT seq, topic, body, COALESCE(key_hash, 0), id, aggregate_key, message_type FROM tidings_outbox o
         WHERE published_at IS NULL
           AND ($2 = 1 OR COALESCE(key_hash, 0) % $2 IN (SELECT value FROM json_each($3)))
           AND NOT EXISTS (SELECT 1 FROM tidings_relay_holds h
                           WHERE h.topic = o.topic AND h.aggregate_key = o.aggregate_key AND h.seq <= o.seq
                             AND (h.seq = o.seq OR h.aggregate_key <> ''))
         ORDER BY seq LIMIT $1",
    )
    .bind(i64::try_from(limit).unwrap_or(i64::MAX))
    .bind(i64::from(held.count))
    .bind(format!("{partitions:?}"))
    .fetch_all(store.pool())
    .await
    .map_err(db_error::<Lite>("claiming an outbox batch"))?;
    for r in rows {
        let seq: i64 = r.get(0);
        let hash: i64 = r.get(3);
        let partition = (hash.rem_euclid(i64::from(held.count.max(1)))) as u32;
        if let Some((_, seqs)) = batch.rows.iter_mut().find(|(l, _)| l.partition == partition) {
            seqs.push(seq);
        }
        batch.claimed.push(OutboxRecord {
            seq,
            topic: r.get(1),
            body: r.get(2),
            id: r.get(4),
            aggregate_key: r.get(5),
            message_type: r.get(6),
        });
    }
    Ok(batch)
}

#[async_trait]
impl ClaimedBatch for SqliteBatch {
    fn messages(&self) -> &[OutgoingMessage] {
        &self.claimed.messages
    }

    fn seqs(&self) -> &[i64] {
        &self.claimed.seqs
    }

    fn undecodable(&self) -> &[Undecodable] {
        &self.claimed.undecodable
    }

    async fn complete(self) -> Result<()> {
        // Never mark what was not sent: the undecodable stay unsent.
        if let Some(decoded) = self.claimed.decoded_only() {
            return self.settle(decoded).await;
        }
        let retention = self.store.options().retention_period().is_some();
        let mut fenced = Vec::new();
        for (lease, seqs) in &self.rows {
            if seqs.is_empty() {
                continue;
            }
            // One statement: the lease check and the change are atomic.
            let sql = if retention {
                "UPDATE tidings_outbox SET published_at = $6
                 WHERE seq IN (SELECT value FROM json_each($1)) AND published_at IS NULL
                   AND EXISTS (SELECT 1 FROM tidings_leases
                               WHERE scope = $2 AND partition_index = $3 AND owner = $4 AND fence = $5)"
            } else {
                "DELETE FROM tidings_outbox
                 WHERE seq IN (SELECT value FROM json_each($1))
                   AND EXISTS (SELECT 1 FROM tidings_leases
                               WHERE scope = $2 AND partition_index = $3 AND owner = $4 AND fence = $5)"
            };
            let done = sqlx::query(sql)
                .bind(format!("{seqs:?}"))
                .bind(&self.scope)
                .bind(i64::from(lease.partition))
                .bind(&self.member)
                .bind(lease.fence)
                .bind(now_millis())
                .execute(self.store.pool())
                .await
                .map_err(db_error::<Lite>("completing an outbox batch"))?;
            if done.rows_affected() == 0 {
                fenced.push(lease.partition);
            }
        }
        if fenced.is_empty() {
            Ok(())
        } else {
            // Published, but another relay holds these partitions now: it
            // publishes the records again (a duplicate, never a loss).
            Err(Error::transport_reason(
                "relay",
                format!("partitions {fenced:?} changed hands during the batch; left for their new holder"),
                true,
            ))
        }
    }

    async fn release(self) -> Result<()> {
        Ok(())
    }

    async fn settle(self, settlement: Settlement) -> Result<()> {
        let live = OutboxPartitions {
            scope: self.scope.clone(),
            member: self.member.clone(),
            count: self.count,
            leases: self.rows.iter().map(|(lease, _)| *lease).collect(),
        };
        tidings_sql::settle(&self.store, &live, settlement).await
    }
}
