//! Statements that read the same on several databases, declared once for
//! the dialects' tables ([`Statements`](crate::Statements)).

/// Records a processed marker.
pub const MARK_PROCESSED: &str = "INSERT INTO tidings_processed (consumer, message_id) VALUES ($1, $2)
    ON CONFLICT DO NOTHING";

/// Records a webhook delivery in the inbox.
pub const RECORD_DELIVERY: &str =
    "INSERT INTO tidings_inbox (provider, event_id, message_id) VALUES ($1, $2, $3)
    ON CONFLICT DO NOTHING";

/// Whether an effect is recorded.
pub const EFFECT_RECORDED: &str =
    "SELECT 1 FROM tidings_effects WHERE consumer = $1 AND message_id = $2 AND effect = $3";

/// Records an effect.
pub const RECORD_EFFECT: &str =
    "INSERT INTO tidings_effects (consumer, message_id, effect, idempotency_key) VALUES ($1, $2, $3, $4)
    ON CONFLICT DO NOTHING";

/// The handlings of a message begun and not ended.
pub const HANDLINGS_BEGUN: &str =
    "SELECT begun FROM tidings_handlings WHERE consumer = $1 AND message_id = $2";

/// Forgets the handlings of a message begun.
pub const HANDLING_ENDED: &str = "DELETE FROM tidings_handlings WHERE consumer = $1 AND message_id = $2";

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
pub const PARKED_LAG: &str = "SELECT h.consumer, h.topic, count(*),
        CAST(COALESCE(sum((SELECT count(*) FROM tidings_parked p
             WHERE p.consumer = h.consumer AND p.topic = h.topic AND p.aggregate_key = h.aggregate_key)), 0) AS BIGINT)
    FROM tidings_held_keys h GROUP BY h.consumer, h.topic ORDER BY h.consumer, h.topic";

/// Lists a scope's members.
pub const MEMBERS: &str = "SELECT member FROM tidings_members WHERE scope = $1 ORDER BY member";

/// Removes a member.
pub const LEAVE: &str = "DELETE FROM tidings_members WHERE scope = $1 AND member = $2";

/// Whether a consumer has processed markers.
pub const HAS_PROCESSED: &str = "SELECT EXISTS (SELECT 1 FROM tidings_processed WHERE consumer = $1)";

/// The highest applied migration.
pub const APPLIED_MIGRATION: &str = "SELECT max(version) FROM tidings_migrations";

/// Reads the database log by sequence alone, for databases whose log
/// positions follow commit order (one writer at a time, or appends
/// serialized): a row is visible once committed, with no lower one to come.
pub const LOG_READ_BY_SEQ: &str = "SELECT 0, seq, aggregate_key, body FROM tidings_log
    WHERE topic = $1 AND seq > $3 AND ($5 = 1 OR COALESCE(key_hash, 0) % $5 = $6)
    ORDER BY seq LIMIT $4";

/// A reader's offset, by sequence alone (see [`LOG_READ_BY_SEQ`]).
pub const LOG_OFFSET_BY_SEQ: &str = "SELECT 0, seq FROM tidings_log_offsets
    WHERE consumer_group = $1 AND topic = $2 AND partition_count = $3 AND partition_index = $4";

/// Lets a relay dead letter's hold go (a redrive or a skip).
pub const RELAY_UNHOLD: &str = "DELETE FROM tidings_relay_holds WHERE message_id = $1";

/// Deletes the unsent record a relay dead letter stands for (a skip), by
/// its place in the outbox, held or not (a redrive may have let it go).
pub const RELAY_DROP_HELD: &str =
    "DELETE FROM tidings_outbox WHERE seq = $1 AND id = $2 AND published_at IS NULL";

/// The relay's holds, with the records of their keys waiting behind them.
pub const RELAY_HOLDS: &str = "SELECT h.seq, h.message_id, h.topic, h.aggregate_key,
        (SELECT count(*) FROM tidings_outbox o
         WHERE o.published_at IS NULL AND o.topic = h.topic AND o.aggregate_key = h.aggregate_key
           AND h.aggregate_key <> '' AND o.seq > h.seq)
    FROM tidings_relay_holds h ORDER BY h.seq";
