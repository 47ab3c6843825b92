//! What each consumer did, read from Tidings' own tables: the truth,
//! whatever happened to the processes.

use sqlx::Database;
use tidings_sql::Dialect;
use tidings_sql::db::{Record, Stmt};

/// () -> (consumer, processed markers).
const PROCESSED: &str = "SELECT consumer, count(*) FROM tidings_processed GROUP BY consumer";
/// () -> (consumer, dead letters). Redriven dead letters are not counted:
/// their messages are on their way again, and count once handled (or once
/// dead-lettered anew).
const DEAD: &str = "SELECT consumer, count(*) FROM tidings_dead_letters
     WHERE redriven_at IS NULL GROUP BY consumer";
/// () -> (consumer, parked messages). Only messages still blocked by a live
/// hold count: behind a key whose hold is released, or whose held message
/// was handled, they are on their way (being drained) and count once handled.
/// A redelivery parked while its key is held counts once, where its
/// message is: a message delivered twice is parked twice, a copy of one
/// handled before the hold or of the held message itself is parked too,
/// and those count as handled or dead-lettered.
const PARKED: &str = "SELECT p.consumer, count(DISTINCT p.message_id) FROM tidings_parked p
     WHERE EXISTS (SELECT 1 FROM tidings_held_keys h
                   WHERE h.consumer = p.consumer AND h.topic = p.topic AND h.aggregate_key = p.aggregate_key
                     AND NOT h.released
                     AND h.message_id <> p.message_id
                     AND NOT EXISTS (SELECT 1 FROM tidings_processed m
                                     WHERE m.consumer = h.consumer AND m.message_id = h.message_id))
       AND NOT EXISTS (SELECT 1 FROM tidings_processed d
                       WHERE d.consumer = p.consumer AND d.message_id = p.message_id)
     GROUP BY p.consumer";

/// Per consumer: messages handled, dead-lettered, and parked behind a dead letter of their key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Work {
    /// Processed markers per consumer.
    pub processed: Vec<(String, i64)>,
    /// Dead letters per consumer (redriven ones not counted until they fail again).
    pub dead_letters: Vec<(String, i64)>,
    /// Messages parked behind a dead letter of their key, per consumer (those
    /// being drained after a skip or a handled redrive not counted).
    pub parked: Vec<(String, i64)>,
}

impl Work {
    /// Reads it on `conn` (in the caller's snapshot, if it started one).
    pub async fn read<D: Dialect>(conn: &mut <D::Db as Database>::Connection) -> tidings_core::Result<Work> {
        Ok(Work {
            processed: per_consumer::<D>(conn, PROCESSED).await?,
            dead_letters: per_consumer::<D>(conn, DEAD).await?,
            parked: per_consumer::<D>(conn, PARKED).await?,
        })
    }

    /// Only the figures of `consumers`: a database may hold other systems' consumers.
    pub fn only(&self, consumers: &[&str]) -> Work {
        let keep = |counts: &[(String, i64)]| {
            counts
                .iter()
                .filter(|(c, _)| consumers.contains(&c.as_str()))
                .cloned()
                .collect()
        };
        Work {
            processed: keep(&self.processed),
            dead_letters: keep(&self.dead_letters),
            parked: keep(&self.parked),
        }
    }

    /// Processed markers of `consumer`.
    pub fn processed_by(&self, consumer: &str) -> i64 {
        count_of(&self.processed, consumer)
    }

    /// Dead letters of `consumer`.
    pub fn dead_by(&self, consumer: &str) -> i64 {
        count_of(&self.dead_letters, consumer)
    }

    /// Messages `consumer` parked.
    pub fn parked_by(&self, consumer: &str) -> i64 {
        count_of(&self.parked, consumer)
    }

    /// Of `expected` messages for `consumer`, those neither handled,
    /// dead-lettered nor parked: lost, or not there yet.
    pub fn missing(&self, consumer: &str, expected: i64) -> i64 {
        (expected - self.processed_by(consumer) - self.dead_by(consumer) - self.parked_by(consumer)).max(0)
    }

    /// Everything every consumer did: handled, dead-lettered or parked.
    pub fn done(&self) -> u64 {
        let sum = |counts: &[(String, i64)]| counts.iter().map(|(_, n)| n).sum::<i64>();
        (sum(&self.processed) + sum(&self.dead_letters) + sum(&self.parked)).max(0) as u64
    }
}

fn count_of(counts: &[(String, i64)], consumer: &str) -> i64 {
    counts.iter().find(|(c, _)| c == consumer).map_or(0, |(_, n)| *n)
}

/// (consumer, count) rows of `sql`.
async fn per_consumer<D: Dialect>(
    conn: &mut <D::Db as Database>::Connection,
    sql: &'static str,
) -> tidings_core::Result<Vec<(String, i64)>> {
    let rows = Stmt::<D>::new(sql, "reading counts per consumer")
        .fetch_all(conn)
        .await?;
    let pair = |r: &Record<D>| Ok::<_, tidings_core::Error>((r.get::<String>(0)?, r.get::<i64>(1)?));
    rows.iter().map(pair).collect()
}
