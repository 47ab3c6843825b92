-- Keys held after a dead letter, and the messages parked behind them.

-- A skipped dead letter is given up for good; its key's parked messages go on.
ALTER TABLE tidings_dead_letters ADD COLUMN skipped_at TIMESTAMPTZ;

-- A consumer holds a key while one of its messages is dead-lettered:
-- message_id is that message, the only one of the key it handles until the
-- hold goes (a redrive delivers it); released is set by a skip.
CREATE TABLE tidings_held_keys (
    consumer      TEXT        NOT NULL,
    topic         TEXT        NOT NULL,
    aggregate_key TEXT        NOT NULL,
    message_id    UUID        NOT NULL,
    released      BOOLEAN     NOT NULL,
    held_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, topic, aggregate_key)
);

-- Messages of held keys, set aside unhandled, in arrival order (seq).
CREATE TABLE tidings_parked (
    seq           BIGSERIAL   PRIMARY KEY,
    consumer      TEXT        NOT NULL,
    topic         TEXT        NOT NULL,
    aggregate_key TEXT        NOT NULL,
    message_id    UUID        NOT NULL,
    headers       TEXT        NOT NULL,
    body          BYTEA       NOT NULL,
    parked_at     TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX tidings_parked_message ON tidings_parked (consumer, message_id);
CREATE INDEX tidings_parked_key ON tidings_parked (consumer, topic, aggregate_key, seq);
