//! MySQL's and MariaDB's statements (the conventions:
//! [`tidings_sql::Statements`]).
//!
//! Times are `BIGINT` microseconds since the Unix epoch on the database's
//! clock, `now!()` in the statements themselves: bound points in time need
//! no conversion, durations in milliseconds are `* 1000`, ages are read
//! back with `DIV 1000`. Lists are JSON arrays read with `JSON_TABLE` (ids
//! as hex, matched with `UNHEX`). There is no `RETURNING`: where the flow
//! needs the rows a statement changed, a second statement reads them in the
//! same transaction (`held_leases`, `claimed_replay`). Upserts are `ON
//! DUPLICATE KEY UPDATE`, whose assignments run left to right, each seeing
//! the ones before: the orders below are deliberate. `member`, `cursor`
//! and `until` are reserved words, quoted.

use tidings_sql::{Statements, shared};

/// The rows of a JSON array of integers (`$n`) as a column `v`.
macro_rules! ints {
    ($param:literal) => {
        concat!(
            "SELECT v FROM JSON_TABLE(",
            $param,
            ", '$[*]' COLUMNS (v BIGINT PATH '$')) AS list"
        )
    };
}

/// The rows of a JSON array of hex ids (`$n`) as 16-byte values.
macro_rules! ids {
    ($param:literal) => {
        concat!(
            "SELECT UNHEX(v) FROM JSON_TABLE(",
            $param,
            ", '$[*]' COLUMNS (v CHAR(32) PATH '$')) AS list"
        )
    };
}

/// The rows of a JSON array of strings (`$n`), compared byte for byte like
/// the columns they are matched against.
macro_rules! texts {
    ($param:literal) => {
        concat!(
            "SELECT v COLLATE utf8mb4_bin FROM JSON_TABLE(",
            $param,
            ", '$[*]' COLUMNS (v VARCHAR(255) PATH '$')) AS list"
        )
    };
}

/// A dead letter's columns, times in microseconds.
macro_rules! dead_letter_columns {
    () => {
        "id, consumer, topic, message_id, message_type, aggregate_key, headers, body, attempts, errors,
         created_at, redrives, redriven_at, skipped_at"
    };
}

/// A replay's columns, times in microseconds.
macro_rules! replay_columns {
    () => {
        "id, consumer, topics, source, since, `until`, rate, total, state, `member`, `cursor`,
         delivered, suppressed, handled, failed"
    };
}

/// The retained events of `$from` (sent ones only, for the outbox).
macro_rules! retained {
    ($select:literal, $from:literal, $tail:literal) => {
        concat!(
            "SELECT ",
            $select,
            " FROM ",
            $from,
            " topic IN (",
            texts!("$1"),
            ") AND created_at >= $2 AND created_at < $3 ",
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
    outbox_cleanup: concat!("DELETE FROM tidings_outbox WHERE published_at < ", now!(), " - $1 * 1000"),

    // `IGNORE` reports 0 rows for a duplicate; an `ON DUPLICATE KEY UPDATE`
    // that changes nothing reports 1, like an insert, under the found-rows
    // flag sqlx connects with.
    mark_processed: concat!(
        "INSERT IGNORE INTO tidings_processed (consumer, message_id, processed_at) VALUES ($1, $2, ",
        now!(),
        ")"
    ),
    mark_processed_all: None,
    effect_recorded: shared::EFFECT_RECORDED,
    record_effect: concat!(
        "INSERT INTO tidings_effects (consumer, message_id, effect, idempotency_key, recorded_at)
         VALUES ($1, $2, $3, $4, ",
        now!(),
        ") ON DUPLICATE KEY UPDATE effect = effect"
    ),
    // The share lock keeps the row from changing hands until the handler's
    // transaction ends.
    holds_lease: concat!(
        "SELECT 1 FROM tidings_leases
         WHERE scope = $1 AND partition_index = $2 AND owner = $3 AND fence = $4 AND expires_at > ",
        now!(),
        " LOCK IN SHARE MODE"
    ),
    begin_handling: None,
    handling_started: concat!(
        "INSERT INTO tidings_handlings (consumer, message_id, begun, begun_at) VALUES ($1, $2, 1, ",
        now!(),
        ") ON DUPLICATE KEY UPDATE begun = begun + 1, begun_at = ",
        now!()
    ),
    handlings_begun: shared::HANDLINGS_BEGUN,
    handling_ended: shared::HANDLING_ENDED,
    // The inbox refuses event ids longer than the column, and control
    // characters, before it gets here: `IGNORE` would otherwise truncate
    // them into a false duplicate. The column compares bytes exactly.
    record_delivery: "INSERT IGNORE INTO tidings_inbox (provider, event_id, message_id) VALUES ($1, $2, $3)",
    forget_deliveries: concat!(
        "DELETE FROM tidings_inbox WHERE received_at < ",
        now!(),
        " - $1 * 1000 ORDER BY received_at LIMIT $2"
    ),
    audit_insert: "INSERT INTO tidings_audit (at, actor, action, target, detail) VALUES ($1, $2, $3, $4, $5)",
    audit_trail: "SELECT at, actor, action, target, detail FROM tidings_audit
        WHERE ($1 IS NULL OR target = $1) ORDER BY at DESC, id DESC LIMIT $2",
    forget_processed: concat!(
        "DELETE FROM tidings_processed WHERE processed_at < ",
        now!(),
        " - $1 * 1000 ORDER BY processed_at LIMIT $2"
    ),
    forget_effects: concat!(
        "DELETE FROM tidings_effects WHERE recorded_at < ",
        now!(),
        " - $1 * 1000 ORDER BY recorded_at LIMIT $2"
    ),
    forget_handlings: concat!(
        "DELETE FROM tidings_handlings WHERE begun_at < ",
        now!(),
        " - $1 * 1000 LIMIT $2"
    ),
    set_horizon: concat!(
        "INSERT INTO tidings_horizons (name, horizon_at) VALUES ($1, ",
        now!(),
        " - $2 * 1000) ON DUPLICATE KEY UPDATE horizon_at = GREATEST(horizon_at, VALUES(horizon_at))"
    ),
    horizon: "SELECT horizon_at FROM tidings_horizons WHERE name = $1",

    // Only (consumer, message_id) can collide: the id is new each time, and
    // a unique index lets any number of rows without a message id in.
    dead_letter_upsert: concat!(
        "INSERT INTO tidings_dead_letters
           (id, consumer, topic, message_id, message_type, aggregate_key, headers, body, attempts, errors,
            created_at, updated_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, ",
        now!(),
        ")
         ON DUPLICATE KEY UPDATE
           attempts = attempts + VALUES(attempts),
           errors = JSON_MERGE_PRESERVE(errors, VALUES(errors)),
           headers = VALUES(headers),
           body = VALUES(body),
           redriven_at = NULL,
           skipped_at = NULL,
           updated_at = VALUES(updated_at)"
    ),
    dead_letters: concat!(
        "SELECT ",
        dead_letter_columns!(),
        " FROM tidings_dead_letters
         WHERE ($1 IS NULL OR consumer = $1) AND ($2 IS NULL OR message_type = $2)
           AND ($4 OR (redriven_at IS NULL AND skipped_at IS NULL))
         ORDER BY created_at DESC LIMIT $3"
    ),
    lock_dead_letter: None,
    dead_letter_for_redrive: concat!(
        "SELECT ",
        dead_letter_columns!(),
        " FROM tidings_dead_letters WHERE id = $1 FOR UPDATE"
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
    purge: concat!(
        "DELETE FROM tidings_dead_letters WHERE id IN (",
        ids!("$1"),
        ") AND (redriven_at IS NOT NULL OR skipped_at IS NOT NULL)"
    ),
    purge_edits: concat!(
        "DELETE FROM tidings_dead_letter_edits WHERE dead_letter_id IN (",
        "SELECT id FROM tidings_dead_letters WHERE id IN (",
        ids!("$1"),
        ") AND (redriven_at IS NOT NULL OR skipped_at IS NOT NULL))"
    ),
    edit_insert: "INSERT INTO tidings_dead_letter_edits
           (id, dead_letter_id, edited_by, edited_at, original_body, edited_body)
         VALUES ($1, $2, $3, $4, $5, $6)",
    edits: "SELECT id, dead_letter_id, edited_by, edited_at, original_body, edited_body
        FROM tidings_dead_letter_edits WHERE dead_letter_id = $1 ORDER BY edited_at, id",

    hold: concat!(
        "INSERT INTO tidings_held_keys (consumer, topic, aggregate_key, message_id, released, held_at)
         VALUES ($1, $2, $3, $4, $5, ",
        now!(),
        ") ON DUPLICATE KEY UPDATE message_id = VALUES(message_id), released = VALUES(released)"
    ),
    held_keys: shared::HELD_KEYS,
    park: concat!(
        "INSERT INTO tidings_parked (consumer, topic, aggregate_key, message_id, headers, body, parked_at)
         VALUES ($1, $2, $3, $4, $5, $6, ",
        now!(),
        ") ON DUPLICATE KEY UPDATE message_id = message_id"
    ),
    next_parked: shared::NEXT_PARKED,
    unpark: shared::UNPARK,
    release_key: shared::RELEASE_KEY,
    release_skipped: shared::RELEASE_SKIPPED,

    relay_hold: "INSERT IGNORE INTO tidings_relay_holds (seq, message_id, topic, aggregate_key) VALUES ($1, $2, $3, $4)",
    relay_delete_sent: concat!("DELETE FROM tidings_outbox WHERE seq IN (", ints!("$1"), ")"),
    relay_stamp_sent: concat!(
        "UPDATE tidings_outbox SET published_at = ",
        now!(),
        " WHERE seq IN (",
        ints!("$1"),
        ") AND published_at IS NULL"
    ),
    relay_drop_held: shared::RELAY_DROP_HELD,
    relay_unhold: shared::RELAY_UNHOLD,
    relay_holds: shared::RELAY_HOLDS,

    heartbeat: concat!(
        "INSERT INTO tidings_members (scope, `member`, expires_at) VALUES ($1, $2, ",
        now!(),
        " + $3 * 1000) ON DUPLICATE KEY UPDATE expires_at = VALUES(expires_at)"
    ),
    forget_expired_members: concat!(
        "DELETE FROM tidings_members WHERE scope = $1 AND expires_at < ",
        now!()
    ),
    members: "SELECT `member` FROM tidings_members WHERE scope = $1 ORDER BY `member`",
    // The same rule as on PostgreSQL: ours or lapsed is taken, and the fence
    // grows unless it was ours and live. The fence is set first, from the
    // row as it was; then the owner; then the expiry, for the rows now ours.
    // Timed after the row lock (`clock!`): a wait on a batch or a handler
    // that holds it must not eat into the new lease.
    acquire_leases: concat!(
        "INSERT INTO tidings_leases (scope, partition_index, owner, fence, expires_at)
         SELECT $1, v, $2, 1, ",
        clock!(),
        " + $4 * 1000 FROM (",
        ints!("$3"),
        ") AS wanted
         ON DUPLICATE KEY UPDATE
           fence = IF(expires_at < ",
        clock!(),
        ", fence + 1, fence),
           owner = IF(owner = VALUES(owner) OR expires_at < ",
        clock!(),
        ", VALUES(owner), owner),
           expires_at = IF(owner = VALUES(owner), ",
        clock!(),
        " + $4 * 1000, expires_at)"
    ),
    held_leases: Some(concat!(
        "SELECT partition_index, fence FROM tidings_leases
         WHERE scope = $1 AND owner = $2 AND expires_at > ",
        now!(),
        " AND partition_index IN (",
        ints!("$3"),
        ")"
    )),
    release_leases: concat!(
        "UPDATE tidings_leases SET expires_at = 0 WHERE scope = $1 AND owner = $2 AND partition_index IN (",
        ints!("$3"),
        ")"
    ),
    release_all_leases: "UPDATE tidings_leases SET expires_at = 0 WHERE scope = $1 AND owner = $2",
    leave: "DELETE FROM tidings_members WHERE scope = $1 AND `member` = $2",

    outbox_lag: concat!(
        "SELECT count(*), (",
        now!(),
        " - min(created_at)) DIV 1000 FROM tidings_outbox WHERE published_at IS NULL"
    ),
    log_lag: "SELECT o.consumer_group, o.topic, count(l.seq)
        FROM tidings_log_offsets o
        LEFT JOIN tidings_log l ON l.topic = o.topic AND l.seq > o.seq
          AND (o.partition_count = 1 OR COALESCE(l.key_hash, 0) % o.partition_count = o.partition_index)
        GROUP BY o.consumer_group, o.topic ORDER BY o.consumer_group, o.topic",
    dead_letter_lag: concat!(
        "SELECT consumer, count(*), (",
        now!(),
        " - min(created_at)) DIV 1000
         FROM tidings_dead_letters WHERE redriven_at IS NULL AND skipped_at IS NULL
         GROUP BY consumer ORDER BY consumer"
    ),
    parked_lag: "SELECT h.consumer, h.topic, count(DISTINCT h.aggregate_key), count(p.seq)
        FROM tidings_held_keys h
        LEFT JOIN tidings_parked p
          ON p.consumer = h.consumer AND p.topic = h.topic AND p.aggregate_key = h.aggregate_key
        GROUP BY h.consumer, h.topic ORDER BY h.consumer, h.topic",
    live_members: concat!(
        "SELECT scope, `member`, (expires_at - ",
        now!(),
        ") DIV 1000 FROM tidings_members WHERE expires_at > ",
        now!(),
        " ORDER BY scope, `member`"
    ),
    live_leases: concat!(
        "SELECT scope, owner, partition_index, fence FROM tidings_leases WHERE expires_at > ",
        now!(),
        " ORDER BY scope, owner, partition_index"
    ),
    outbox_backlog: concat!(
        "SELECT COALESCE(key_hash, 0) % $1 AS p, count(*), (",
        now!(),
        " - min(created_at)) DIV 1000 FROM tidings_outbox WHERE published_at IS NULL GROUP BY p ORDER BY p"
    ),
    // The table's counter, not max(seq): sent records may be deleted. (On
    // MySQL 8 the counter is read from statistics that may lag.)
    outbox_high_water: "SELECT CAST(GREATEST(
            COALESCE((SELECT max(seq) FROM tidings_outbox), 0),
            COALESCE((SELECT AUTO_INCREMENT - 1 FROM information_schema.tables
                      WHERE table_schema = DATABASE() AND table_name = 'tidings_outbox'), 0)) AS SIGNED)",
    has_processed: shared::HAS_PROCESSED,
    handled_recently: concat!(
        "SELECT consumer, COUNT(*) FROM tidings_processed WHERE processed_at >= ",
        now!(),
        " - $1 * 1000 GROUP BY consumer ORDER BY consumer"
    ),
    migrations_table_exists: "SELECT EXISTS (SELECT 1 FROM information_schema.tables
        WHERE table_schema = DATABASE() AND table_name = 'tidings_migrations')",
    applied_migration: shared::APPLIED_MIGRATION,
    replication_slots: None,

    trace_key_messages: "SELECT id, min(at), min(seq)
        FROM (SELECT id, created_at AS at, seq FROM tidings_outbox WHERE aggregate_key = $1
              UNION ALL
              SELECT message_id, created_at, NULL FROM tidings_dead_letters
              WHERE aggregate_key = $1 AND message_id IS NOT NULL
              UNION ALL
              SELECT message_id, parked_at, NULL FROM tidings_parked WHERE aggregate_key = $1) AS known
        GROUP BY id ORDER BY min(at), COALESCE(min(seq), 0), id LIMIT $2",
    trace_outbox: concat!(
        "SELECT o.id, o.seq, o.key_hash, o.topic, o.aggregate_key, o.message_type, o.created_at, o.published_at,
                EXISTS (SELECT 1 FROM tidings_relay_holds h WHERE h.seq = o.seq)
         FROM tidings_outbox o WHERE o.id IN (",
        ids!("$1"),
        ") ORDER BY o.seq"
    ),
    trace_processed: concat!(
        "SELECT message_id, consumer, processed_at FROM tidings_processed WHERE message_id IN (",
        ids!("$1"),
        ") ORDER BY processed_at, consumer"
    ),
    trace_effects: concat!(
        "SELECT message_id, consumer, effect, idempotency_key, recorded_at FROM tidings_effects
         WHERE message_id IN (",
        ids!("$1"),
        ") ORDER BY recorded_at, consumer, effect"
    ),
    trace_dead_letters: concat!(
        "SELECT message_id, id, consumer, topic, message_type, aggregate_key, attempts, errors, created_at,
                redriven_at, skipped_at
         FROM tidings_dead_letters WHERE message_id IN (",
        ids!("$1"),
        ") ORDER BY created_at, consumer"
    ),
    trace_parked: concat!(
        "SELECT p.message_id, p.consumer, p.topic, p.aggregate_key, p.parked_at, h.message_id, d.id,
                COALESCE(h.released, FALSE)
         FROM tidings_parked p
         LEFT JOIN tidings_held_keys h
           ON h.consumer = p.consumer AND h.topic = p.topic AND h.aggregate_key = p.aggregate_key
         LEFT JOIN tidings_dead_letters d ON d.consumer = p.consumer AND d.message_id = h.message_id
         WHERE p.message_id IN (",
        ids!("$1"),
        ") ORDER BY p.seq"
    ),

    retained_log: retained!(
        "seq, topic, aggregate_key, body",
        "tidings_log WHERE",
        "AND seq > $4 ORDER BY seq LIMIT $5"
    ),
    retained_outbox: retained!(
        "seq, topic, aggregate_key, body",
        "tidings_outbox WHERE published_at IS NOT NULL AND",
        "AND seq > $4 ORDER BY seq LIMIT $5"
    ),
    count_retained_log: retained!("count(*)", "tidings_log WHERE", ""),
    count_retained_outbox: retained!("count(*)", "tidings_outbox WHERE published_at IS NOT NULL AND", ""),
    count_processed: concat!(
        "SELECT count(*) FROM tidings_processed WHERE consumer = $1 AND message_id IN (",
        ids!("$2"),
        ")"
    ),
    request_replay: concat!(
        "INSERT INTO tidings_replays
           (id, consumer, topics, source, since, `until`, rate, total, state, requested_at, updated_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'pending', ",
        now!(),
        ", ",
        now!(),
        ")"
    ),
    replay: concat!("SELECT ", replay_columns!(), " FROM tidings_replays WHERE id = $1"),
    // The update locks the rows it reads: a member claiming at the same
    // time waits, then finds the replay taken.
    claim_replay: concat!(
        "UPDATE tidings_replays SET state = 'running', `member` = $2, claimed_until = ",
        clock!(),
        " + $3 * 1000, updated_at = ",
        now!(),
        " WHERE consumer = $1 AND (state = 'pending' OR (state = 'running' AND claimed_until < ",
        now!(),
        ")) ORDER BY requested_at LIMIT 1"
    ),
    claimed_replay: Some(concat!(
        "SELECT ",
        replay_columns!(),
        " FROM tidings_replays WHERE consumer = $1 AND `member` = $2 AND state = 'running'
         ORDER BY updated_at DESC LIMIT 1"
    )),
    replay_progress: concat!(
        "UPDATE tidings_replays SET `cursor` = $3, delivered = $4, suppressed = $5, handled = $6, failed = $7,
                claimed_until = ",
        now!(),
        " + $8 * 1000, state = CASE WHEN $9 THEN 'done' ELSE state END, updated_at = ",
        now!(),
        " WHERE id = $1 AND `member` = $2 AND state = 'running'"
    ),
    cancel_replay: concat!(
        "UPDATE tidings_replays SET state = 'cancelled', updated_at = ",
        now!(),
        " WHERE id = $1 AND state IN ('pending', 'running')"
    ),

    // Appends are serialized by the log's sequencer (the migration's
    // trigger), so seq follows commit order: a row is visible once
    // committed, with no lower one to come.
    log_read: shared::LOG_READ_BY_SEQ,
    log_offset: shared::LOG_OFFSET_BY_SEQ,
    // Never backwards: the time first, from the offset as it was.
    log_commit: concat!(
        "INSERT INTO tidings_log_offsets (consumer_group, topic, seq, updated_at, partition_count, partition_index)
         VALUES ($1, $2, $4, ",
        now!(),
        ", $5, $6)
         ON DUPLICATE KEY UPDATE
           updated_at = IF(VALUES(seq) > seq, VALUES(updated_at), updated_at),
           seq = GREATEST(seq, VALUES(seq))"
    ),
    log_trim: concat!(
        "DELETE FROM tidings_log
         WHERE created_at < ",
        now!(),
        " - $1 * 1000
           AND NOT EXISTS (
             SELECT 1 FROM tidings_log_offsets o
             WHERE o.topic = tidings_log.topic AND o.seq < tidings_log.seq
               AND (o.partition_count = 1
                    OR COALESCE(tidings_log.key_hash, 0) % o.partition_count = o.partition_index))
         ORDER BY seq LIMIT $2"
    ),
};
