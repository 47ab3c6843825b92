//! SQLite's statements (the conventions: [`tidings_sql::Statements`]).
//!
//! Times are `INTEGER` Unix milliseconds of this host's clock (every member
//! of a SQLite database runs on the host that holds the file): a bound
//! point in time, in microseconds, is `$n / 1000`, a read one `col * 1000`,
//! and `now!()` is the current time in the statement itself. Lists are JSON
//! arrays read with `json_each` (ids as hex, matched with `unhex`).

use tidings_sql::{Statements, shared};

/// The current time, in the columns' milliseconds.
macro_rules! now {
    () => {
        "CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)"
    };
}

/// A dead letter's columns, times in microseconds.
macro_rules! dead_letter_columns {
    () => {
        "id, consumer, topic, message_id, message_type, aggregate_key, headers, body, attempts, errors,
         created_at * 1000, redrives, redriven_at * 1000, skipped_at * 1000"
    };
}

/// A replay's columns, times in microseconds.
macro_rules! replay_columns {
    () => {
        "id, consumer, topics, source, since * 1000, until * 1000, rate, total, state, member, cursor,
         delivered, suppressed, handled, failed"
    };
}

/// The retained events of `$table` (sent ones only, for the outbox).
macro_rules! retained {
    ($select:literal, $from:literal, $tail:literal) => {
        concat!(
            "SELECT ",
            $select,
            " FROM ",
            $from,
            " topic IN (SELECT value FROM json_each($1))
              AND created_at >= $2 / 1000 AND created_at < $3 / 1000 ",
            $tail
        )
    };
}

pub(crate) const SQL: Statements = Statements {
    enqueue: concat!(
        "INSERT INTO tidings_outbox (id, topic, aggregate_key, key_hash, message_type, body, created_at)
         VALUES ($1, $2, $3, $4, $5, $6, ",
        now!(),
        ")"
    ),
    outbox_cleanup: concat!("DELETE FROM tidings_outbox WHERE published_at < ", now!(), " - $1"),

    mark_processed: shared::MARK_PROCESSED,
    mark_processed_all: None,
    effect_recorded: shared::EFFECT_RECORDED,
    record_effect: shared::RECORD_EFFECT,
    // The runtime writes the processed marker first, so the transaction
    // already holds SQLite's only write lock: the lease cannot change hands
    // until it ends.
    holds_lease: concat!(
        "SELECT 1 FROM tidings_leases
         WHERE scope = $1 AND partition_index = $2 AND owner = $3 AND fence = $4 AND expires_at > ",
        now!()
    ),
    begin_handling: None,
    handling_started: concat!(
        "INSERT INTO tidings_handlings (consumer, message_id, begun, begun_at) VALUES ($1, $2, 1, ",
        now!(),
        ") ON CONFLICT (consumer, message_id) DO UPDATE SET begun = begun + 1, begun_at = excluded.begun_at"
    ),
    handlings_begun: shared::HANDLINGS_BEGUN,
    handling_ended: shared::HANDLING_ENDED,
    record_delivery: shared::RECORD_DELIVERY,
    forget_deliveries: concat!(
        "DELETE FROM tidings_inbox WHERE (provider, event_id) IN (
           SELECT provider, event_id FROM tidings_inbox WHERE received_at < ",
        now!(),
        " - $1 LIMIT $2)"
    ),
    audit_insert: "INSERT INTO tidings_audit (at, actor, action, target, detail) VALUES ($1 / 1000, $2, $3, $4, $5)",
    audit_trail: "SELECT at * 1000, actor, action, target, detail FROM tidings_audit
        WHERE ($1 IS NULL OR target = $1) ORDER BY at DESC, id DESC LIMIT $2",
    forget_processed: concat!(
        "DELETE FROM tidings_processed WHERE (consumer, message_id) IN (
           SELECT consumer, message_id FROM tidings_processed WHERE processed_at < ",
        now!(),
        " - $1 LIMIT $2)"
    ),
    forget_effects: concat!(
        "DELETE FROM tidings_effects WHERE (consumer, message_id, effect) IN (
           SELECT consumer, message_id, effect FROM tidings_effects WHERE recorded_at < ",
        now!(),
        " - $1 LIMIT $2)"
    ),
    forget_handlings: concat!(
        "DELETE FROM tidings_handlings WHERE (consumer, message_id) IN (
           SELECT consumer, message_id FROM tidings_handlings WHERE begun_at < ",
        now!(),
        " - $1 LIMIT $2)"
    ),
    set_horizon: concat!(
        "INSERT INTO tidings_horizons (name, horizon_at) VALUES ($1, ",
        now!(),
        " - $2) ON CONFLICT (name) DO UPDATE SET horizon_at = max(horizon_at, excluded.horizon_at)"
    ),
    horizon: "SELECT horizon_at * 1000 FROM tidings_horizons WHERE name = $1",

    dead_letter_upsert: concat!(
        "INSERT INTO tidings_dead_letters
           (id, consumer, topic, message_id, message_type, aggregate_key, headers, body, attempts, errors,
            created_at, updated_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11 / 1000, ",
        now!(),
        ")
         ON CONFLICT (consumer, message_id) WHERE message_id IS NOT NULL DO UPDATE SET
           attempts = tidings_dead_letters.attempts + excluded.attempts,
           errors = (SELECT json_group_array(json(value)) FROM (
               SELECT value FROM json_each(tidings_dead_letters.errors)
               UNION ALL SELECT value FROM json_each(excluded.errors))),
           headers = excluded.headers,
           body = excluded.body,
           redriven_at = NULL,
           skipped_at = NULL,
           updated_at = excluded.updated_at"
    ),
    dead_letters: concat!(
        "SELECT ",
        dead_letter_columns!(),
        " FROM tidings_dead_letters
         WHERE ($1 IS NULL OR consumer = $1) AND ($2 IS NULL OR message_type = $2)
           AND ($4 OR (redriven_at IS NULL AND skipped_at IS NULL))
         ORDER BY created_at DESC LIMIT $3"
    ),
    // Take the write lock first, so that the read is consistent with the update.
    lock_dead_letter: Some("UPDATE tidings_dead_letters SET updated_at = updated_at WHERE id = $1"),
    dead_letter_for_redrive: concat!(
        "SELECT ",
        dead_letter_columns!(),
        " FROM tidings_dead_letters WHERE id = $1"
    ),
    dead_letter_by_id: concat!(
        "SELECT ",
        dead_letter_columns!(),
        " FROM tidings_dead_letters WHERE id = $1"
    ),
    mark_redriven: concat!(
        "UPDATE tidings_dead_letters SET redrives = redrives + 1, redriven_at = ",
        now!(),
        " WHERE id = $1"
    ),
    mark_skipped: concat!(
        "UPDATE tidings_dead_letters SET skipped_at = ",
        now!(),
        ", updated_at = ",
        now!(),
        " WHERE id = $1"
    ),
    purge: "DELETE FROM tidings_dead_letters
        WHERE id IN (SELECT unhex(value) FROM json_each($1))
          AND (redriven_at IS NOT NULL OR skipped_at IS NOT NULL)",
    purge_edits: "DELETE FROM tidings_dead_letter_edits WHERE dead_letter_id IN (
        SELECT id FROM tidings_dead_letters
        WHERE id IN (SELECT unhex(value) FROM json_each($1))
          AND (redriven_at IS NOT NULL OR skipped_at IS NOT NULL))",
    edit_insert: "INSERT INTO tidings_dead_letter_edits
           (id, dead_letter_id, edited_by, edited_at, original_body, edited_body)
         VALUES ($1, $2, $3, $4 / 1000, $5, $6)",
    edits: "SELECT id, dead_letter_id, edited_by, edited_at * 1000, original_body, edited_body
        FROM tidings_dead_letter_edits WHERE dead_letter_id = $1 ORDER BY edited_at, id",

    hold: shared::HOLD,
    held_keys: shared::HELD_KEYS,
    park: shared::PARK,
    next_parked: shared::NEXT_PARKED,
    unpark: shared::UNPARK,
    release_key: shared::RELEASE_KEY,
    release_skipped: shared::RELEASE_SKIPPED,

    relay_hold: concat!(
        "INSERT INTO tidings_relay_holds (seq, message_id, topic, aggregate_key, held_at) VALUES ($1, $2, $3, $4, ",
        now!(),
        ") ON CONFLICT (seq) DO NOTHING"
    ),
    relay_delete_sent: "DELETE FROM tidings_outbox WHERE seq IN (SELECT value FROM json_each($1))",
    relay_stamp_sent: concat!(
        "UPDATE tidings_outbox SET published_at = ",
        now!(),
        " WHERE seq IN (SELECT value FROM json_each($1)) AND published_at IS NULL"
    ),
    relay_drop_held: shared::RELAY_DROP_HELD,
    relay_unhold: shared::RELAY_UNHOLD,
    relay_holds: shared::RELAY_HOLDS,

    heartbeat: concat!(
        "INSERT INTO tidings_members (scope, member, expires_at) VALUES ($1, $2, ",
        now!(),
        " + $3)
         ON CONFLICT (scope, member) DO UPDATE SET expires_at = excluded.expires_at"
    ),
    forget_expired_members: concat!(
        "DELETE FROM tidings_members WHERE scope = $1 AND expires_at < ",
        now!()
    ),
    members: shared::MEMBERS,
    // The same rule as on PostgreSQL: ours or lapsed is taken, and the fence
    // grows unless it was ours and live. (`WHERE true` tells the parser the
    // ON CONFLICT belongs to the INSERT, not to a join.)
    acquire_leases: concat!(
        "INSERT INTO tidings_leases AS l (scope, partition_index, owner, fence, expires_at)
         SELECT $1, value, $2, 1, ",
        now!(),
        " + $4 FROM json_each($3) WHERE true
         ON CONFLICT (scope, partition_index) DO UPDATE
           SET owner = excluded.owner,
               expires_at = excluded.expires_at,
               fence = CASE WHEN l.owner = excluded.owner AND l.expires_at >= ",
        now!(),
        " THEN l.fence ELSE l.fence + 1 END
           WHERE l.owner = excluded.owner OR l.expires_at < ",
        now!(),
        "
         RETURNING partition_index, fence"
    ),
    held_leases: None,
    release_leases: "UPDATE tidings_leases SET expires_at = 0
        WHERE scope = $1 AND owner = $2 AND partition_index IN (SELECT value FROM json_each($3))",
    release_all_leases: "UPDATE tidings_leases SET expires_at = 0 WHERE scope = $1 AND owner = $2",
    leave: shared::LEAVE,

    outbox_lag: concat!(
        "SELECT count(*), ",
        now!(),
        " - min(created_at) FROM tidings_outbox WHERE published_at IS NULL"
    ),
    log_lag: "SELECT o.consumer_group, o.topic,
               sum((SELECT count(*) FROM tidings_log l
                    WHERE l.topic = o.topic AND l.seq > o.seq
                      AND (o.partition_count = 1
                           OR COALESCE(l.key_hash, 0) % o.partition_count = o.partition_index)))
        FROM tidings_log_offsets o GROUP BY 1, 2 ORDER BY 1, 2",
    dead_letter_lag: concat!(
        "SELECT consumer, count(*), ",
        now!(),
        " - min(created_at)
         FROM tidings_dead_letters WHERE redriven_at IS NULL AND skipped_at IS NULL
         GROUP BY consumer ORDER BY consumer"
    ),
    parked_lag: shared::PARKED_LAG,
    live_members: concat!(
        "SELECT scope, member, expires_at - ",
        now!(),
        " FROM tidings_members WHERE expires_at > ",
        now!(),
        " ORDER BY scope, member"
    ),
    live_leases: concat!(
        "SELECT scope, owner, partition_index, fence FROM tidings_leases WHERE expires_at > ",
        now!(),
        " ORDER BY scope, owner, partition_index"
    ),
    outbox_backlog: concat!(
        "SELECT COALESCE(key_hash, 0) % $1, count(*), ",
        now!(),
        " - min(created_at) FROM tidings_outbox WHERE published_at IS NULL GROUP BY 1 ORDER BY 1"
    ),
    // AUTOINCREMENT keeps the highest sequence number even once every record is deleted.
    outbox_high_water: "SELECT max(COALESCE((SELECT max(seq) FROM tidings_outbox), 0),
                    COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'tidings_outbox'), 0))",
    has_processed: shared::HAS_PROCESSED,
    handled_recently: concat!(
        "SELECT consumer, COUNT(*) FROM tidings_processed WHERE processed_at >= ",
        now!(),
        " - $1 GROUP BY consumer ORDER BY consumer"
    ),
    migrations_table_exists: "SELECT EXISTS (SELECT 1 FROM sqlite_master
        WHERE type = 'table' AND name = 'tidings_migrations')",
    applied_migration: shared::APPLIED_MIGRATION,
    replication_slots: None,

    trace_key_messages: "SELECT id, min(at) * 1000, min(seq)
        FROM (SELECT id, created_at AS at, seq FROM tidings_outbox WHERE aggregate_key = $1
              UNION ALL
              SELECT message_id, created_at, NULL FROM tidings_dead_letters
              WHERE aggregate_key = $1 AND message_id IS NOT NULL
              UNION ALL
              SELECT message_id, parked_at, NULL FROM tidings_parked WHERE aggregate_key = $1) AS known
        GROUP BY id ORDER BY min(at), COALESCE(min(seq), 0), id LIMIT $2",
    trace_outbox: "SELECT o.id, o.seq, o.key_hash, o.topic, o.aggregate_key, o.message_type, o.created_at * 1000,
               o.published_at * 1000, EXISTS (SELECT 1 FROM tidings_relay_holds h WHERE h.seq = o.seq)
        FROM tidings_outbox o WHERE o.id IN (SELECT unhex(value) FROM json_each($1)) ORDER BY o.seq",
    trace_processed: "SELECT message_id, consumer, processed_at * 1000 FROM tidings_processed
        WHERE message_id IN (SELECT unhex(value) FROM json_each($1)) ORDER BY processed_at, consumer",
    trace_effects: "SELECT message_id, consumer, effect, idempotency_key, recorded_at * 1000 FROM tidings_effects
        WHERE message_id IN (SELECT unhex(value) FROM json_each($1)) ORDER BY recorded_at, consumer, effect",
    trace_dead_letters: "SELECT message_id, id, consumer, topic, message_type, aggregate_key, attempts, errors,
               created_at * 1000, redriven_at * 1000, skipped_at * 1000
        FROM tidings_dead_letters WHERE message_id IN (SELECT unhex(value) FROM json_each($1))
        ORDER BY created_at, consumer",
    trace_parked: "SELECT p.message_id, p.consumer, p.topic, p.aggregate_key, p.parked_at * 1000, h.message_id,
               d.id, COALESCE(h.released, 0)
        FROM tidings_parked p
        LEFT JOIN tidings_held_keys h
          ON h.consumer = p.consumer AND h.topic = p.topic AND h.aggregate_key = p.aggregate_key
        LEFT JOIN tidings_dead_letters d ON d.consumer = p.consumer AND d.message_id = h.message_id
        WHERE p.message_id IN (SELECT unhex(value) FROM json_each($1)) ORDER BY p.seq",

    retained_log: retained!("seq, topic, aggregate_key, body", "tidings_log WHERE", "AND seq > $4 ORDER BY seq LIMIT $5"),
    retained_outbox: retained!(
        "seq, topic, aggregate_key, body",
        "tidings_outbox WHERE published_at IS NOT NULL AND",
        "AND seq > $4 ORDER BY seq LIMIT $5"
    ),
    count_retained_log: retained!("count(*)", "tidings_log WHERE", ""),
    count_retained_outbox: retained!("count(*)", "tidings_outbox WHERE published_at IS NOT NULL AND", ""),
    count_processed: "SELECT count(*) FROM tidings_processed
        WHERE consumer = $1 AND message_id IN (SELECT unhex(value) FROM json_each($2))",
    request_replay: concat!(
        "INSERT INTO tidings_replays
           (id, consumer, topics, source, since, until, rate, total, state, requested_at, updated_at)
         VALUES ($1, $2, $3, $4, $5 / 1000, $6 / 1000, $7, $8, 'pending', ",
        now!(),
        ", ",
        now!(),
        ")"
    ),
    replay: concat!("SELECT ", replay_columns!(), " FROM tidings_replays WHERE id = $1"),
    // One statement: SQLite runs it under its write lock, so two members cannot both take it.
    claim_replay: concat!(
        "UPDATE tidings_replays SET state = 'running', member = $2, claimed_until = ",
        now!(),
        " + $3, updated_at = ",
        now!(),
        " WHERE id = (SELECT id FROM tidings_replays
                     WHERE consumer = $1 AND (state = 'pending' OR (state = 'running' AND claimed_until < ",
        now!(),
        ")) ORDER BY requested_at LIMIT 1)
         RETURNING ",
        replay_columns!()
    ),
    claimed_replay: None,
    replay_progress: concat!(
        "UPDATE tidings_replays SET cursor = $3, delivered = $4, suppressed = $5, handled = $6, failed = $7,
                claimed_until = ",
        now!(),
        " + $8, state = CASE WHEN $9 THEN 'done' ELSE state END, updated_at = ",
        now!(),
        " WHERE id = $1 AND member = $2 AND state = 'running'"
    ),
    cancel_replay: concat!(
        "UPDATE tidings_replays SET state = 'cancelled', updated_at = ",
        now!(),
        " WHERE id = $1 AND state IN ('pending', 'running')"
    ),

    // One writer at a time: a row is visible once committed, in seq order.
    log_read: shared::LOG_READ_BY_SEQ,
    log_offset: shared::LOG_OFFSET_BY_SEQ,
    log_commit: concat!(
        "INSERT INTO tidings_log_offsets (consumer_group, topic, seq, updated_at, partition_count, partition_index)
         VALUES ($1, $2, $4, ",
        now!(),
        ", $5, $6)
         ON CONFLICT (consumer_group, topic, partition_count, partition_index) DO UPDATE
           SET seq = excluded.seq, updated_at = excluded.updated_at
           WHERE tidings_log_offsets.seq < excluded.seq"
    ),
    log_trim: concat!(
        "DELETE FROM tidings_log WHERE seq IN (
           SELECT l.seq FROM tidings_log l
           WHERE l.created_at < ",
        now!(),
        " - $1
             AND NOT EXISTS (
               SELECT 1 FROM tidings_log_offsets o
               WHERE o.topic = l.topic AND o.seq < l.seq
                 AND (o.partition_count = 1
                      OR COALESCE(l.key_hash, 0) % o.partition_count = o.partition_index))
           ORDER BY l.seq LIMIT $2)"
    ),
};
