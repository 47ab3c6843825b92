//! The relay's claim on MySQL: the rows of its partitions, locked by key, under the lease locks.

use sqlx::{Executor, Row};
use tidings_core::{OutboxPartitions, OutboxRecord, Result};
use tidings_sql::{CLAIM_SAVEPOINT, ClaimedRows, TxBatch, db_error};

use crate::{My, MySqlStore};

/// A batch claimed by one relay: its rows stay locked until it is
/// completed or released ([`TxBatch`]).
pub type MySqlBatch = TxBatch<My>;

// Read committed: InnoDB then locks the rows a locking read returns and
// no gaps between them, so producers inserting new rows never wait for a
// batch being published. Repeatable read (the server's default) would
// lock the gap after the last unsent row, and every producer with it.
const CLAIM_BEGIN: &str = "SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION";

// The claim's transaction first takes a share lock on the relay's live
// leases: until the batch commits or rolls back, no other relay can take
// those partitions over (taking one over updates its row). The fences are
// compared here, not in SQL.
const HOLD_LEASES: &str = concat!(
    "SELECT partition_index, fence, EXISTS (SELECT 1 FROM tidings_relay_holds) FROM tidings_leases
     WHERE scope = ? AND owner = ? AND expires_at > ",
    now!(),
    " LOCK IN SHARE MODE"
);

/// Claims a batch: the rows stay locked until it is completed or released.
pub(crate) async fn claim(store: &MySqlStore, limit: usize, held: &OutboxPartitions) -> Result<MySqlBatch> {
    let mut tx = store
        .pool()
        .begin_with(CLAIM_BEGIN)
        .await
        .map_err(db_error::<My>("starting an outbox claim"))?;
    let rows = sqlx::query(HOLD_LEASES)
        .bind(&held.scope)
        .bind(&held.member)
        .fetch_all(&mut *tx)
        .await
        .map_err(db_error::<My>("checking the relay's leases"))?;
    // Whether the relay holds any key: only then do claims filter them.
    let holds = rows.iter().any(|r| r.get::<bool, _>(2));
    let live: Vec<i64> = rows
        .iter()
        .map(|r| (r.get::<i32, _>(0), r.get::<i64, _>(1)))
        .filter(|&(p, fence)| {
            held.leases
                .iter()
                .any(|l| i64::from(l.partition) == i64::from(p) && l.fence == fence)
        })
        .map(|(p, _)| i64::from(p))
        .collect();
    if live.is_empty() {
        let _ = tx.rollback().await;
        return Ok(MySqlBatch::empty());
    }
    // First the candidates, read without locking; rows of a key the relay
    // holds behind a record set aside are left where they are
    // ([`tidings_core::set_aside`]), filtered only when there are holds
    // (none on these partitions can appear meanwhile: only their holder,
    // this relay under the lease locks, sets records aside). A locking read would lock
    // every unsent row it scans before testing its partition (the test
    // cannot use the index), and another relay's claim, skipping locked
    // rows, would then skip rows of its own partitions and publish a key's
    // later records before its earlier ones.
    //
    // Every value in these statements is a number the store computed, so
    // they go as plain text, never prepared: their text changes with each
    // batch, and prepared, each would take a place in the connection's
    // statement cache and, once it is full, evict another with a
    // close-statement message the server never answers, which leaves the
    // next request waiting out a delayed acknowledgement (about 40 ms).
    let partitions = live.iter().map(i64::to_string).collect::<Vec<_>>().join(", ");
    let count = held.count;
    let not_held = if holds {
        "AND NOT EXISTS (SELECT 1 FROM tidings_relay_holds h
                         WHERE h.topic = o.topic AND h.aggregate_key = o.aggregate_key AND h.seq <= o.seq
                           AND (h.seq = o.seq OR h.aggregate_key <> ''))"
    } else {
        ""
    };
    let candidates = format!(
        "SELECT seq FROM tidings_outbox o
         WHERE published_at IS NULL AND ({count} = 1 OR COALESCE(key_hash, 0) % {count} IN ({partitions}))
           {not_held}
         ORDER BY seq LIMIT {limit}"
    );
    let candidates: Vec<i64> = (&mut *tx)
        .fetch_all(sqlx::AssertSqlSafe(candidates))
        .await
        .map_err(db_error::<My>("claiming an outbox batch"))?
        .iter()
        .map(|r| r.get::<i64, _>(0))
        .collect();
    if candidates.is_empty() {
        let _ = tx.rollback().await;
        return Ok(MySqlBatch::empty());
    }
    // Then exactly those rows, locked by their keys. Only a relay holding
    // these partitions reads them so, and the lease locks above keep any
    // other relay from holding them now. By the primary key: a point read
    // of a unique key locks that row alone, where one through the
    // unsent-rows index (not unique) also reads, and may wait for, the
    // entry after it, often a producer's row not yet committed.
    let candidates = candidates
        .iter()
        .map(i64::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    let locked = format!(
        "SELECT seq, topic, body, id, aggregate_key, message_type FROM tidings_outbox FORCE INDEX (PRIMARY)
         WHERE seq IN ({candidates}) AND published_at IS NULL ORDER BY seq FOR UPDATE"
    );
    let rows = (&mut *tx)
        .fetch_all(sqlx::AssertSqlSafe(locked))
        .await
        .map_err(db_error::<My>("claiming an outbox batch"))?;
    let mut seqs = Vec::with_capacity(rows.len());
    let mut claimed = ClaimedRows::with_capacity(rows.len());
    for r in rows {
        seqs.push(r.get::<i64, _>(0).to_string());
        claimed.push(OutboxRecord {
            seq: r.get(0),
            topic: r.get(1),
            body: r.get(2),
            id: r.get(3),
            aggregate_key: r.get(4),
            message_type: r.get(5),
        });
    }
    if seqs.is_empty() {
        // Sent meanwhile, by the partitions' previous holder finishing its
        // batch: nothing to publish, nothing to hold.
        let _ = tx.rollback().await;
        return Ok(MySqlBatch::empty());
    }
    // Deleted (or stamped) now, under the locks: the change is only
    // seen if the relay commits, after the transport confirmed.
    let seqs = seqs.join(", ");
    let done = match store.options().retention_period() {
        Some(_) => format!(
            concat!(
                "UPDATE tidings_outbox SET published_at = ",
                now!(),
                " WHERE seq IN ({})"
            ),
            seqs
        ),
        None => format!("DELETE FROM tidings_outbox WHERE seq IN ({seqs})"),
    };
    // After the savepoint a batch settled in part goes back to
    // ([`TxBatch`]), in the same round trip: the lease and row locks
    // taken, no row changed yet (InnoDB keeps the row locks).
    let done = format!("{CLAIM_SAVEPOINT}; {done}");
    (&mut *tx)
        .execute(sqlx::AssertSqlSafe(done))
        .await
        .map_err(db_error::<My>("claiming an outbox batch"))?;
    Ok(MySqlBatch::new(tx, claimed, store))
}
