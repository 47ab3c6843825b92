-- Replays asked by operators and carried out by a member of the consumer.
-- Times are Unix milliseconds.
CREATE TABLE tidings_replays (
    id            BLOB    PRIMARY KEY,
    consumer      TEXT    NOT NULL,
    topics        TEXT    NOT NULL,
    source        TEXT    NOT NULL,
    since         INTEGER NOT NULL,
    until         INTEGER NOT NULL,
    rate          REAL    NOT NULL,
    total         INTEGER NOT NULL,
    state         TEXT    NOT NULL,
    member        TEXT,
    claimed_until INTEGER,
    cursor        INTEGER NOT NULL DEFAULT 0,
    delivered     INTEGER NOT NULL DEFAULT 0,
    suppressed    INTEGER NOT NULL DEFAULT 0,
    handled       INTEGER NOT NULL DEFAULT 0,
    failed        INTEGER NOT NULL DEFAULT 0,
    requested_at  INTEGER NOT NULL,
    updated_at    INTEGER NOT NULL
);
CREATE INDEX tidings_replays_open ON tidings_replays (consumer, requested_at)
    WHERE state IN ('pending', 'running');
-- Retained events are read by time.
CREATE INDEX tidings_log_created ON tidings_log (created_at);
