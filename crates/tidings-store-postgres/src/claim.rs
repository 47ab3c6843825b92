//! The relay's claim on PostgreSQL: `FOR UPDATE SKIP LOCKED` under the lease locks.

use std::collections::HashMap;

use sqlx::postgres::PgRow;
use sqlx::{Postgres, Row, Transaction};
use tidings_core::{OutboxPartitions, OutboxRecord, Result};
use tidings_sql::{CLAIM_SAVEPOINT, ClaimedRows, TxBatch, db_error};

use crate::{Pg, PgStore};

/// A batch claimed by one relay: its rows stay locked until it is
/// completed or released ([`TxBatch`]).
pub type PgBatch = TxBatch<Pg>;

// The claim's transaction first takes a share lock on the relay's live
// leases whose fencing token is still its own: until the batch commits or
// rolls back, no other relay can take those partitions over. It then
// deletes (or stamps) the rows of those partitions: the change only becomes
// visible if the relay commits after the transport's confirmation. The
// inner SELECT orders by seq and skips rows another relay holds. RETURNING
// has no defined order, so rows are sorted afterwards.
const HOLD_LEASES: &str =
    "SELECT partition_index, EXISTS (SELECT 1 FROM tidings_relay_holds) FROM tidings_leases
    WHERE scope = $1 AND owner = $2 AND expires_at > clock_timestamp()
      AND (partition_index, fence) IN (SELECT * FROM UNNEST($3::int4[], $4::int8[]))
    FOR SHARE";
// Rows of a key the relay holds behind a record set aside are left where
// they are ([`tidings_core::set_aside`]). The holds table is empty but for
// those, and the lease check says whether it is: only then does the claim
// pay for the filter (measured with 50 000 rows waiting, batches of 500:
// about 0.4 ms a batch). No hold on these partitions can appear meanwhile:
// only their holder sets records aside, and the lease locks keep it this relay.
macro_rules! claim {
    ($change:literal, $filter:expr) => {
        concat!(
            $change,
            " WHERE seq IN (SELECT seq FROM tidings_outbox o WHERE published_at IS NULL
               AND ($2 = 1 OR COALESCE(key_hash, 0) % $2 = ANY($3::int8[]))",
            $filter,
            " ORDER BY seq LIMIT $1 FOR UPDATE OF o SKIP LOCKED)
             RETURNING seq, topic, body, id, aggregate_key, message_type"
        )
    };
}
macro_rules! not_held {
    () => {
        " AND NOT EXISTS (SELECT 1 FROM tidings_relay_holds h
             WHERE h.topic = o.topic AND h.aggregate_key = o.aggregate_key AND h.seq <= o.seq
               AND (h.seq = o.seq OR h.aggregate_key <> ''))"
    };
}
const CLAIM_DELETE: &str = claim!("DELETE FROM tidings_outbox", "");
const CLAIM_MARK: &str = claim!("UPDATE tidings_outbox SET published_at = now()", "");
const CLAIM_DELETE_UNHELD: &str = claim!("DELETE FROM tidings_outbox", not_held!());
const CLAIM_MARK_UNHELD: &str = claim!("UPDATE tidings_outbox SET published_at = now()", not_held!());

// The claim's transaction steers the planner to the unsent-rows index, read
// in seq order. Right after a burst (a broker outage, a backfill) the
// outbox's statistics still describe a near-empty table, and PostgreSQL then
// picks a bitmap scan that sorts the whole backlog for every batch:
// measured with 50 000 rows waiting and no fresh statistics, 15 to 20 ms per
// batch of 500 instead of 1.5 ms. It costs no round trip: the settings ride
// with BEGIN and end with the transaction.
const CLAIM_BEGIN: &str = "BEGIN; SET LOCAL enable_bitmapscan = off; SET LOCAL enable_seqscan = off";

/// A claim's transaction with the relay's live leases locked and the
/// savepoint set: the partitions still held, and whether any key is held
/// behind a record set aside. `None` when no lease is live any more.
async fn lock_leases(
    store: &PgStore,
    begin: &'static str,
    held: &OutboxPartitions,
) -> Result<Option<(Transaction<'static, Postgres>, Vec<i32>, bool)>> {
    let mut tx = store
        .pool()
        .begin_with(begin)
        .await
        .map_err(db_error::<Pg>("starting an outbox claim"))?;
    let live: Vec<(i32, bool)> = sqlx::query_as(HOLD_LEASES)
        .bind(&held.scope)
        .bind(&held.member)
        .bind(held.leases.iter().map(|l| l.partition as i32).collect::<Vec<_>>())
        .bind(held.leases.iter().map(|l| l.fence).collect::<Vec<_>>())
        .fetch_all(&mut *tx)
        .await
        .map_err(db_error::<Pg>("checking the relay's leases"))?;
    if live.is_empty() {
        let _ = tx.rollback().await;
        return Ok(None);
    }
    let holds = live.iter().any(|&(_, holds)| holds);
    let live: Vec<i32> = live.into_iter().map(|(p, _)| p).collect();
    // What a batch settled in part goes back to ([`TxBatch`]): the lease
    // locks taken, no row changed yet.
    sqlx::raw_sql(CLAIM_SAVEPOINT)
        .execute(&mut *tx)
        .await
        .map_err(db_error::<Pg>("claiming an outbox batch"))?;
    Ok(Some((tx, live, holds)))
}

fn record(r: PgRow) -> OutboxRecord {
    OutboxRecord {
        seq: r.get(0),
        topic: r.get(1),
        body: r.get(2),
        id: r.get(3),
        aggregate_key: r.get(4),
        message_type: r.get(5),
    }
}

/// Claims a batch: the rows stay locked until it is completed or released.
pub(crate) async fn claim(store: &PgStore, limit: usize, held: &OutboxPartitions) -> Result<PgBatch> {
    Ok(claim_oldest(store, limit, held)
        .await?
        .map_or_else(PgBatch::empty, |(batch, _)| batch))
}

/// Claims the oldest unsent records as [`RelayStore::claim`] does, saying
/// more of what it found: `None` when the relay holds no live lease any
/// more, else the batch (perhaps empty) and whether some key was held
/// behind a record set aside when the claim began.
///
/// [`RelayStore::claim`]: tidings_core::RelayStore::claim
pub async fn claim_oldest(
    store: &PgStore,
    limit: usize,
    held: &OutboxPartitions,
) -> Result<Option<(PgBatch, bool)>> {
    let Some((mut tx, live, holds)) = lock_leases(store, CLAIM_BEGIN, held).await? else {
        return Ok(None);
    };
    let sql = match (store.options().retention_period().is_some(), holds) {
        (true, false) => CLAIM_MARK,
        (true, true) => CLAIM_MARK_UNHELD,
        (false, false) => CLAIM_DELETE,
        (false, true) => CLAIM_DELETE_UNHELD,
    };
    let rows = sqlx::query(sql)
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .bind(i64::from(held.count))
        .bind(live.iter().map(|&p| i64::from(p)).collect::<Vec<_>>())
        .fetch_all(&mut *tx)
        .await
        .map_err(db_error::<Pg>("claiming an outbox batch"))?;
    let mut rows: Vec<OutboxRecord> = rows.into_iter().map(record).collect();
    rows.sort_unstable_by_key(|r| r.seq);
    let mut claimed = ClaimedRows::with_capacity(rows.len());
    rows.into_iter().for_each(|r| claimed.push(r));
    Ok(Some((PgBatch::new(tx, claimed, store), holds)))
}

// The claim of records named by their seq, in the order a change stream
// committed them: only those still unsent, the others were sent already.
const LISTED_DELETE: &str = "DELETE FROM tidings_outbox WHERE seq = ANY($1::int8[]) AND published_at IS NULL
     RETURNING seq, topic, body, id, aggregate_key, message_type";
const LISTED_MARK: &str = "UPDATE tidings_outbox SET published_at = now()
     WHERE seq = ANY($1::int8[]) AND published_at IS NULL
     RETURNING seq, topic, body, id, aggregate_key, message_type";

/// What a claim of listed records found.
#[derive(Debug)]
pub enum Listed {
    /// The relay no longer holds a live lease: nothing claimed.
    LeaseLost,
    /// Some key is held behind a record set aside: nothing claimed, since
    /// the records of held keys must wait in the outbox, in order. Claim
    /// the oldest records instead ([`tidings_core::RelayStore::claim`]).
    KeysHeld,
    /// The records of the list still unsent, in the list's order, locked
    /// until the batch ends (none: every one was sent already).
    Claimed(PgBatch),
}

/// Claims the unsent records among `seqs`, under the same lease locks and
/// with the same completion as [`claim`]: what a relay reading the
/// database's change stream calls with the seqs of the records committed,
/// in commit order. A record already sent (by an earlier claim, or before
/// a restart) is left out.
pub async fn claim_listed(store: &PgStore, seqs: &[i64], held: &OutboxPartitions) -> Result<Listed> {
    let Some((mut tx, _, holds)) = lock_leases(store, "BEGIN", held).await? else {
        return Ok(Listed::LeaseLost);
    };
    if holds {
        let _ = tx.rollback().await;
        return Ok(Listed::KeysHeld);
    }
    let sql = match store.options().retention_period() {
        Some(_) => LISTED_MARK,
        None => LISTED_DELETE,
    };
    let rows = sqlx::query(sql)
        .bind(seqs)
        .fetch_all(&mut *tx)
        .await
        .map_err(db_error::<Pg>("claiming listed outbox records"))?;
    let order: HashMap<i64, usize> = seqs.iter().enumerate().map(|(i, &s)| (s, i)).collect();
    let mut rows: Vec<OutboxRecord> = rows.into_iter().map(record).collect();
    rows.sort_unstable_by_key(|r| order.get(&r.seq).copied().unwrap_or(usize::MAX));
    let mut claimed = ClaimedRows::with_capacity(rows.len());
    rows.into_iter().for_each(|r| claimed.push(r));
    Ok(Listed::Claimed(PgBatch::new(tx, claimed, store)))
}
