-- Keys held after a dead letter, and the messages parked behind them.
-- Times are Unix milliseconds.

-- A skipped dead letter is given up for good; its key's parked messages go on.
ALTER TABLE tidings_dead_letters ADD COLUMN skipped_at INTEGER;

-- A consumer holds a key while one of its messages is dead-lettered:
-- message_id is that message, the only one of the key it handles until the
-- hold goes (a redrive delivers it); released is set by a skip.
CREATE TABLE tidings_held_keys (
    consumer      TEXT    NOT NULL,
    topic         TEXT    NOT NULL,
    aggregate_key TEXT    NOT NULL,
    message_id    BLOB    NOT NULL,
    released      INTEGER NOT NULL,
    held_at       INTEGER NOT NULL DEFAULT (CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)),
    PRIMARY KEY (consumer, topic, aggregate_key)
);

-- Messages of held keys, set aside unhandled, in arrival order (seq).
CREATE TABLE tidings_parked (
    seq           INTEGER PRIMARY KEY AUTOINCREMENT,
    consumer      TEXT    NOT NULL,
    topic         TEXT    NOT NULL,
    aggregate_key TEXT    NOT NULL,
    message_id    BLOB    NOT NULL,
    headers       TEXT    NOT NULL,
    body          BLOB    NOT NULL,
    parked_at     INTEGER NOT NULL DEFAULT (CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER))
);
CREATE UNIQUE INDEX tidings_parked_message ON tidings_parked (consumer, message_id);
CREATE INDEX tidings_parked_key ON tidings_parked (consumer, topic, aggregate_key, seq);
