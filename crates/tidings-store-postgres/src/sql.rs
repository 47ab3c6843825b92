//! PostgreSQL's statements (the conventions: [`tidings_sql::Statements`]).
//!
//! Times are `TIMESTAMPTZ`, converted at the boundary: a bound point in
//! time is `TIMESTAMPTZ 'epoch' + $n * INTERVAL '1 microsecond'`, a read
//! one `EXTRACT(EPOCH FROM ...) * 1000000`. Leases and replay claims are
//! timed by `clock_timestamp()`, the database's clock, so that members on
//! different hosts agree on expiry. Lists are arrays.

use tidings_sql::{Statements, shared};

/// A dead letter's columns, times in microseconds.
macro_rules! dead_letter_columns {
    () => {
        "id, consumer, topic, message_id, message_type, aggregate_key, headers::text, body, attempts,
         errors::text, CAST(EXTRACT(EPOCH FROM created_at) * 1000000 AS BIGINT), redrives,
         CAST(EXTRACT(EPOCH FROM redriven_at) * 1000000 AS BIGINT),
         CAST(EXTRACT(EPOCH FROM skipped_at) * 1000000 AS BIGINT)"
    };
}

/// A replay's columns, times in microseconds.
macro_rules! replay_columns {
    () => {
        "id, consumer, topics::text, source, CAST(EXTRACT(EPOCH FROM since) * 1000000 AS BIGINT),
         CAST(EXTRACT(EPOCH FROM until) * 1000000 AS BIGINT), rate, total, state, member, cursor,
         delivered, suppressed, handled, failed"
    };
}

pub(crate) const SQL: Statements = Statements {
    enqueue: "INSERT INTO tidings_outbox (id, topic, aggregate_key, key_hash, message_type, body)
        VALUES ($1, $2, $3, $4, $5, $6)",
    outbox_cleanup: "DELETE FROM tidings_outbox WHERE published_at < now() - $1 * INTERVAL '1 millisecond'",

    mark_processed: shared::MARK_PROCESSED,
    // One statement for the batch, in id order so that two batches sharing
    // ids wait on each other instead of deadlocking.
    mark_processed_all: Some(
        "INSERT INTO tidings_processed (consumer, message_id)
         SELECT $1, id FROM UNNEST($2::uuid[]) AS batch(id) ORDER BY id
         ON CONFLICT DO NOTHING RETURNING message_id",
    ),
    effect_recorded: shared::EFFECT_RECORDED,
    record_effect: shared::RECORD_EFFECT,
    // `FOR SHARE` keeps the row from changing hands until the handler's
    // transaction ends, while the member's other handlers check it at once.
    holds_lease: "SELECT 1 FROM tidings_leases
        WHERE scope = $1 AND partition_index = $2 AND owner = $3 AND fence = $4
          AND expires_at > clock_timestamp()
        FOR SHARE",
    begin_handling: Some(
        "WITH fence AS (
             SELECT 1 FROM tidings_leases
             WHERE scope = $3 AND partition_index = $4 AND owner = $5 AND fence = $6
               AND expires_at > clock_timestamp()
             FOR SHARE),
         marker AS (
             INSERT INTO tidings_processed (consumer, message_id)
             SELECT $1, $2 WHERE EXISTS (SELECT 1 FROM fence)
             ON CONFLICT DO NOTHING RETURNING 1)
         SELECT EXISTS (SELECT 1 FROM fence), EXISTS (SELECT 1 FROM marker)",
    ),
    handling_started: "INSERT INTO tidings_handlings (consumer, message_id, begun) VALUES ($1, $2, 1)
         ON CONFLICT (consumer, message_id) DO UPDATE SET begun = tidings_handlings.begun + 1, begun_at = now()",
    handlings_begun: shared::HANDLINGS_BEGUN,
    handling_ended: shared::HANDLING_ENDED,
    record_delivery: shared::RECORD_DELIVERY,
    forget_deliveries: "DELETE FROM tidings_inbox WHERE (provider, event_id) IN (
          SELECT provider, event_id FROM tidings_inbox
          WHERE received_at < now() - $1 * INTERVAL '1 millisecond' LIMIT $2)",
    audit_insert: "INSERT INTO tidings_audit (at, actor, action, target, detail)
        VALUES (TIMESTAMPTZ 'epoch' + $1 * INTERVAL '1 microsecond', $2, $3, $4, $5::jsonb)",
    audit_trail: "SELECT CAST(EXTRACT(EPOCH FROM at) * 1000000 AS BIGINT), actor, action, target, detail::text
        FROM tidings_audit WHERE ($1::text IS NULL OR target = $1)
        ORDER BY at DESC, id DESC LIMIT $2",
    forget_processed: "DELETE FROM tidings_processed WHERE (consumer, message_id) IN (
          SELECT consumer, message_id FROM tidings_processed
          WHERE processed_at < now() - $1 * INTERVAL '1 millisecond' LIMIT $2)",
    forget_effects: "DELETE FROM tidings_effects WHERE (consumer, message_id, effect) IN (
          SELECT consumer, message_id, effect FROM tidings_effects
          WHERE recorded_at < now() - $1 * INTERVAL '1 millisecond' LIMIT $2)",
    forget_handlings: "DELETE FROM tidings_handlings WHERE (consumer, message_id) IN (
          SELECT consumer, message_id FROM tidings_handlings
          WHERE begun_at < now() - $1 * INTERVAL '1 millisecond' LIMIT $2)",
    set_horizon: "INSERT INTO tidings_horizons (name, horizon_at) VALUES ($1, now() - $2 * INTERVAL '1 millisecond')
          ON CONFLICT (name) DO UPDATE SET horizon_at = GREATEST(tidings_horizons.horizon_at, EXCLUDED.horizon_at)",
    horizon: "SELECT CAST(EXTRACT(EPOCH FROM horizon_at) * 1000000 AS BIGINT) FROM tidings_horizons WHERE name = $1",

    dead_letter_upsert: "INSERT INTO tidings_dead_letters
           (id, consumer, topic, message_id, message_type, aggregate_key, headers, body, attempts, errors,
            created_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb, $8, $9, $10::jsonb,
                 TIMESTAMPTZ 'epoch' + $11 * INTERVAL '1 microsecond')
         ON CONFLICT (consumer, message_id) WHERE message_id IS NOT NULL DO UPDATE SET
           attempts = tidings_dead_letters.attempts + EXCLUDED.attempts,
           errors = tidings_dead_letters.errors || EXCLUDED.errors,
           headers = EXCLUDED.headers,
           body = EXCLUDED.body,
           redriven_at = NULL,
           skipped_at = NULL,
           updated_at = now()",
    dead_letters: concat!(
        "SELECT ",
        dead_letter_columns!(),
        " FROM tidings_dead_letters
         WHERE ($1::text IS NULL OR consumer = $1) AND ($2::text IS NULL OR message_type = $2)
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
    mark_redriven: "UPDATE tidings_dead_letters SET redrives = redrives + 1, redriven_at = now() WHERE id = $1",
    mark_skipped: "UPDATE tidings_dead_letters SET skipped_at = now(), updated_at = now() WHERE id = $1",
    purge: "DELETE FROM tidings_dead_letters
        WHERE id = ANY($1) AND (redriven_at IS NOT NULL OR skipped_at IS NOT NULL)",
    purge_edits: "DELETE FROM tidings_dead_letter_edits WHERE dead_letter_id IN (
        SELECT id FROM tidings_dead_letters
        WHERE id = ANY($1) AND (redriven_at IS NOT NULL OR skipped_at IS NOT NULL))",
    edit_insert: "INSERT INTO tidings_dead_letter_edits
           (id, dead_letter_id, edited_by, edited_at, original_body, edited_body)
         VALUES ($1, $2, $3, TIMESTAMPTZ 'epoch' + $4 * INTERVAL '1 microsecond', $5, $6)",
    edits: "SELECT id, dead_letter_id, edited_by, CAST(EXTRACT(EPOCH FROM edited_at) * 1000000 AS BIGINT),
               original_body, edited_body
        FROM tidings_dead_letter_edits WHERE dead_letter_id = $1 ORDER BY edited_at, id",

    hold: shared::HOLD,
    held_keys: shared::HELD_KEYS,
    park: shared::PARK,
    next_parked: shared::NEXT_PARKED,
    unpark: shared::UNPARK,
    release_key: shared::RELEASE_KEY,
    release_skipped: shared::RELEASE_SKIPPED,

    relay_hold: "INSERT INTO tidings_relay_holds (seq, message_id, topic, aggregate_key)
        VALUES ($1, $2, $3, $4) ON CONFLICT (seq) DO NOTHING",
    relay_delete_sent: "DELETE FROM tidings_outbox WHERE seq = ANY($1)",
    relay_stamp_sent: "UPDATE tidings_outbox SET published_at = now() WHERE seq = ANY($1) AND published_at IS NULL",
    relay_drop_held: shared::RELAY_DROP_HELD,
    relay_unhold: shared::RELAY_UNHOLD,
    relay_holds: shared::RELAY_HOLDS,

    heartbeat: "INSERT INTO tidings_members (scope, member, expires_at)
        VALUES ($1, $2, clock_timestamp() + $3 * INTERVAL '1 millisecond')
        ON CONFLICT (scope, member) DO UPDATE SET expires_at = EXCLUDED.expires_at",
    forget_expired_members: "DELETE FROM tidings_members WHERE scope = $1 AND expires_at < clock_timestamp()",
    members: shared::MEMBERS,
    acquire_leases: "INSERT INTO tidings_leases AS l (scope, partition_index, owner, fence, expires_at)
        SELECT $1, p, $2, 1, clock_timestamp() + $4 * INTERVAL '1 millisecond' FROM UNNEST($3::int4[]) AS p
        ON CONFLICT (scope, partition_index) DO UPDATE
          SET owner = EXCLUDED.owner,
              -- Timed after the row lock: a wait on a batch that holds it
              -- must not eat into the new lease.
              expires_at = clock_timestamp() + $4 * INTERVAL '1 millisecond',
              fence = CASE WHEN l.owner = EXCLUDED.owner AND l.expires_at >= clock_timestamp()
                           THEN l.fence ELSE l.fence + 1 END
          WHERE l.owner = EXCLUDED.owner OR l.expires_at < clock_timestamp()
        RETURNING partition_index, fence",
    held_leases: None,
    release_leases: "UPDATE tidings_leases SET expires_at = '-infinity'
        WHERE scope = $1 AND owner = $2 AND partition_index = ANY($3::int4[])",
    release_all_leases: "UPDATE tidings_leases SET expires_at = '-infinity' WHERE scope = $1 AND owner = $2",
    leave: shared::LEAVE,

    outbox_lag: "SELECT count(*), CAST(EXTRACT(EPOCH FROM now() - min(created_at)) * 1000 AS BIGINT)
        FROM tidings_outbox WHERE published_at IS NULL",
    log_lag: "SELECT o.consumer_group, o.topic,
               sum((SELECT count(*) FROM tidings_log l
                    WHERE l.topic = o.topic AND (l.txid, l.seq) > (o.txid, o.seq)
                      AND (o.partition_count = 1
                           OR COALESCE(l.key_hash, 0) % o.partition_count = o.partition_index)))::bigint
        FROM tidings_log_offsets o GROUP BY 1, 2 ORDER BY 1, 2",
    dead_letter_lag:
        "SELECT consumer, count(*), CAST(EXTRACT(EPOCH FROM now() - min(created_at)) * 1000 AS BIGINT)
        FROM tidings_dead_letters WHERE redriven_at IS NULL AND skipped_at IS NULL
        GROUP BY consumer ORDER BY consumer",
    parked_lag: shared::PARKED_LAG,
    live_members: "SELECT scope, member,
               CAST(EXTRACT(EPOCH FROM expires_at - clock_timestamp()) * 1000 AS BIGINT)
        FROM tidings_members WHERE expires_at > clock_timestamp() ORDER BY scope, member",
    live_leases: "SELECT scope, owner, partition_index, fence FROM tidings_leases
        WHERE expires_at > clock_timestamp() ORDER BY scope, owner, partition_index",
    outbox_backlog: "SELECT COALESCE(key_hash, 0) % $1, count(*),
               CAST(EXTRACT(EPOCH FROM now() - min(created_at)) * 1000 AS BIGINT)
        FROM tidings_outbox WHERE published_at IS NULL GROUP BY 1 ORDER BY 1",
    // The sequence, not max(seq): sent records may be deleted.
    outbox_high_water: "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM tidings_outbox_seq_seq",
    has_processed: shared::HAS_PROCESSED,
    handled_recently: "SELECT consumer, COUNT(*) FROM tidings_processed
        WHERE processed_at >= now() - $1 * INTERVAL '1 millisecond' GROUP BY consumer ORDER BY consumer",
    migrations_table_exists: "SELECT to_regclass('tidings_migrations') IS NOT NULL",
    applied_migration: shared::APPLIED_MIGRATION,
    replication_slots: Some(
        "SELECT slot_name::text, active, pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint,
                pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint
         FROM pg_replication_slots ORDER BY slot_name",
    ),

    trace_key_messages: "SELECT id, CAST(EXTRACT(EPOCH FROM min(at)) * 1000000 AS BIGINT), min(seq)
        FROM (SELECT id, created_at AS at, seq FROM tidings_outbox WHERE aggregate_key = $1
              UNION ALL
              SELECT message_id, created_at, NULL FROM tidings_dead_letters
              WHERE aggregate_key = $1 AND message_id IS NOT NULL
              UNION ALL
              SELECT message_id, parked_at, NULL FROM tidings_parked WHERE aggregate_key = $1) AS known
        GROUP BY id ORDER BY min(at), COALESCE(min(seq), 0), id LIMIT $2",
    trace_outbox: "SELECT o.id, o.seq, o.key_hash, o.topic, o.aggregate_key, o.message_type,
               CAST(EXTRACT(EPOCH FROM o.created_at) * 1000000 AS BIGINT),
               CAST(EXTRACT(EPOCH FROM o.published_at) * 1000000 AS BIGINT),
               EXISTS (SELECT 1 FROM tidings_relay_holds h WHERE h.seq = o.seq)
        FROM tidings_outbox o WHERE o.id = ANY($1) ORDER BY o.seq",
    trace_processed: "SELECT message_id, consumer, CAST(EXTRACT(EPOCH FROM processed_at) * 1000000 AS BIGINT)
        FROM tidings_processed WHERE message_id = ANY($1) ORDER BY processed_at, consumer",
    trace_effects: "SELECT message_id, consumer, effect, idempotency_key,
               CAST(EXTRACT(EPOCH FROM recorded_at) * 1000000 AS BIGINT)
        FROM tidings_effects WHERE message_id = ANY($1) ORDER BY recorded_at, consumer, effect",
    trace_dead_letters: "SELECT message_id, id, consumer, topic, message_type, aggregate_key, attempts, errors::text,
               CAST(EXTRACT(EPOCH FROM created_at) * 1000000 AS BIGINT),
               CAST(EXTRACT(EPOCH FROM redriven_at) * 1000000 AS BIGINT),
               CAST(EXTRACT(EPOCH FROM skipped_at) * 1000000 AS BIGINT)
        FROM tidings_dead_letters WHERE message_id = ANY($1) ORDER BY created_at, consumer",
    trace_parked: "SELECT p.message_id, p.consumer, p.topic, p.aggregate_key,
               CAST(EXTRACT(EPOCH FROM p.parked_at) * 1000000 AS BIGINT), h.message_id, d.id,
               COALESCE(h.released, false)
        FROM tidings_parked p
        LEFT JOIN tidings_held_keys h
          ON h.consumer = p.consumer AND h.topic = p.topic AND h.aggregate_key = p.aggregate_key
        LEFT JOIN tidings_dead_letters d ON d.consumer = p.consumer AND d.message_id = h.message_id
        WHERE p.message_id = ANY($1) ORDER BY p.seq",

    retained_log: "SELECT seq, topic, aggregate_key, body FROM tidings_log
        WHERE topic = ANY($1)
          AND created_at >= TIMESTAMPTZ 'epoch' + $2 * INTERVAL '1 microsecond'
          AND created_at < TIMESTAMPTZ 'epoch' + $3 * INTERVAL '1 microsecond'
          AND seq > $4 ORDER BY seq LIMIT $5",
    retained_outbox: "SELECT seq, topic, aggregate_key, body FROM tidings_outbox
        WHERE published_at IS NOT NULL AND topic = ANY($1)
          AND created_at >= TIMESTAMPTZ 'epoch' + $2 * INTERVAL '1 microsecond'
          AND created_at < TIMESTAMPTZ 'epoch' + $3 * INTERVAL '1 microsecond'
          AND seq > $4 ORDER BY seq LIMIT $5",
    count_retained_log: "SELECT count(*) FROM tidings_log
        WHERE topic = ANY($1)
          AND created_at >= TIMESTAMPTZ 'epoch' + $2 * INTERVAL '1 microsecond'
          AND created_at < TIMESTAMPTZ 'epoch' + $3 * INTERVAL '1 microsecond'",
    count_retained_outbox: "SELECT count(*) FROM tidings_outbox
        WHERE published_at IS NOT NULL AND topic = ANY($1)
          AND created_at >= TIMESTAMPTZ 'epoch' + $2 * INTERVAL '1 microsecond'
          AND created_at < TIMESTAMPTZ 'epoch' + $3 * INTERVAL '1 microsecond'",
    count_processed: "SELECT count(*) FROM tidings_processed WHERE consumer = $1 AND message_id = ANY($2)",
    request_replay:
        "INSERT INTO tidings_replays (id, consumer, topics, source, since, until, rate, total, state)
        VALUES ($1, $2, $3::jsonb, $4, TIMESTAMPTZ 'epoch' + $5 * INTERVAL '1 microsecond',
                TIMESTAMPTZ 'epoch' + $6 * INTERVAL '1 microsecond', $7, $8, 'pending')",
    replay: concat!(
        "SELECT ",
        replay_columns!(),
        " FROM tidings_replays WHERE id = $1"
    ),
    claim_replay: concat!(
        "UPDATE tidings_replays SET state = 'running', member = $2,
                claimed_until = clock_timestamp() + $3 * INTERVAL '1 millisecond', updated_at = now()
         WHERE id = (SELECT id FROM tidings_replays
                     WHERE consumer = $1 AND (state = 'pending'
                           OR (state = 'running' AND claimed_until < clock_timestamp()))
                     ORDER BY requested_at LIMIT 1 FOR UPDATE SKIP LOCKED)
         RETURNING ",
        replay_columns!()
    ),
    claimed_replay: None,
    replay_progress: "UPDATE tidings_replays SET cursor = $3, delivered = $4, suppressed = $5, handled = $6,
               failed = $7, claimed_until = clock_timestamp() + $8 * INTERVAL '1 millisecond',
               state = CASE WHEN $9 THEN 'done' ELSE state END, updated_at = now()
        WHERE id = $1 AND member = $2 AND state = 'running'",
    cancel_replay: "UPDATE tidings_replays SET state = 'cancelled', updated_at = now()
        WHERE id = $1 AND state IN ('pending', 'running')",

    // Only rows of transactions older than the oldest one still running:
    // those can no longer be joined by a row that sorts before them.
    log_read: "SELECT txid, seq, aggregate_key, body FROM tidings_log
        WHERE topic = $1 AND (txid, seq) > ($2, $3)
          AND txid < pg_snapshot_xmin(pg_current_snapshot())::text::bigint
          AND ($5 = 1 OR COALESCE(key_hash, 0) % $5 = $6)
        ORDER BY txid, seq LIMIT $4",
    log_offset: "SELECT txid, seq FROM tidings_log_offsets
        WHERE consumer_group = $1 AND topic = $2 AND partition_count = $3 AND partition_index = $4",
    log_commit:
        "INSERT INTO tidings_log_offsets (consumer_group, topic, txid, seq, partition_count, partition_index)
        VALUES ($1, $2, $3, $4, $5, $6)
        ON CONFLICT (consumer_group, topic, partition_count, partition_index) DO UPDATE
          SET txid = EXCLUDED.txid, seq = EXCLUDED.seq, updated_at = now()
          WHERE (tidings_log_offsets.txid, tidings_log_offsets.seq) < (EXCLUDED.txid, EXCLUDED.seq)",
    log_trim: "DELETE FROM tidings_log WHERE seq IN (
          SELECT l.seq FROM tidings_log l
          WHERE l.created_at < now() - $1 * INTERVAL '1 millisecond'
            AND NOT EXISTS (
              SELECT 1 FROM tidings_log_offsets o
              WHERE o.topic = l.topic AND (o.txid, o.seq) < (l.txid, l.seq)
                AND (o.partition_count = 1
                     OR COALESCE(l.key_hash, 0) % o.partition_count = o.partition_index))
          ORDER BY l.seq LIMIT $2)",
};
