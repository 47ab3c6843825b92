-- Handlings of redelivered messages that began and have not ended: a count
-- that outlives the member, so that the crash-loop guard counts handlings
-- that crashed, not the broker's redeliveries. Times are Unix milliseconds.
CREATE TABLE tidings_handlings (
    consumer   TEXT    NOT NULL,
    message_id BLOB    NOT NULL,
    begun      INTEGER NOT NULL,
    begun_at   INTEGER NOT NULL DEFAULT (CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)),
    PRIMARY KEY (consumer, message_id)
);
