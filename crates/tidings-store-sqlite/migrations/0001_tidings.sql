-- Tidings schema for SQLite, version 1. Times are Unix milliseconds
-- (NOW_MS below is (julianday('now') - 2440587.5) * 86400000 as an integer).

-- The transactional outbox. SQLite serializes writers, so seq follows commit order.
CREATE TABLE tidings_outbox (
    seq           INTEGER PRIMARY KEY AUTOINCREMENT,
    id            BLOB    NOT NULL,
    topic         TEXT    NOT NULL,
    aggregate_key TEXT    NOT NULL,
    message_type  TEXT    NOT NULL,
    body          BLOB    NOT NULL,
    created_at    INTEGER NOT NULL,
    published_at  INTEGER
);
CREATE INDEX tidings_outbox_unsent ON tidings_outbox (seq) WHERE published_at IS NULL;
CREATE INDEX tidings_outbox_published ON tidings_outbox (published_at) WHERE published_at IS NOT NULL;

-- The database-log transport. AUTOINCREMENT never reuses a seq, and a
-- writer holds the database lock until it commits, so a reader never sees
-- a higher seq before a lower one.
CREATE TABLE tidings_log (
    seq           INTEGER PRIMARY KEY AUTOINCREMENT,
    topic         TEXT    NOT NULL,
    aggregate_key TEXT,
    body          BLOB    NOT NULL,
    created_at    INTEGER NOT NULL
);
CREATE INDEX tidings_log_read ON tidings_log (topic, seq);

CREATE TABLE tidings_log_offsets (
    consumer_group TEXT    NOT NULL,
    topic          TEXT    NOT NULL,
    seq            INTEGER NOT NULL,
    updated_at     INTEGER NOT NULL,
    PRIMARY KEY (consumer_group, topic)
);

CREATE TABLE tidings_processed (
    consumer     TEXT    NOT NULL,
    message_id   BLOB    NOT NULL,
    processed_at INTEGER NOT NULL DEFAULT (CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)),
    PRIMARY KEY (consumer, message_id)
);

CREATE TABLE tidings_effects (
    consumer        TEXT    NOT NULL,
    message_id      BLOB    NOT NULL,
    effect          TEXT    NOT NULL,
    idempotency_key TEXT    NOT NULL,
    recorded_at     INTEGER NOT NULL DEFAULT (CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)),
    PRIMARY KEY (consumer, message_id, effect)
);

CREATE TABLE tidings_dead_letters (
    id            BLOB PRIMARY KEY,
    consumer      TEXT    NOT NULL,
    topic         TEXT    NOT NULL,
    message_id    BLOB,
    message_type  TEXT,
    aggregate_key TEXT,
    headers       TEXT    NOT NULL,
    body          BLOB    NOT NULL,
    attempts      INTEGER NOT NULL,
    errors        TEXT    NOT NULL,
    created_at    INTEGER NOT NULL,
    updated_at    INTEGER NOT NULL
);
CREATE UNIQUE INDEX tidings_dead_letters_message ON tidings_dead_letters (consumer, message_id)
    WHERE message_id IS NOT NULL;
CREATE INDEX tidings_dead_letters_created ON tidings_dead_letters (created_at);
