-- Keys held after a dead letter, and the messages parked behind them.
-- Times are Unix microseconds.

-- A skipped dead letter is given up for good; its key's parked messages go on.
ALTER TABLE tidings_dead_letters ADD COLUMN skipped_at BIGINT;

-- A consumer holds a key while one of its messages is dead-lettered:
-- message_id is that message, the only one of the key it handles until the
-- hold goes (a redrive delivers it); released is set by a skip.
CREATE TABLE tidings_held_keys (
    consumer      VARCHAR(255) NOT NULL,
    topic         VARCHAR(255) NOT NULL,
    aggregate_key VARCHAR(255) NOT NULL,
    message_id    BINARY(16)   NOT NULL,
    released      BOOLEAN      NOT NULL,
    held_at       BIGINT       NOT NULL DEFAULT (UNIX_TIMESTAMP() * 1000000 + MICROSECOND(NOW(6))),
    PRIMARY KEY (consumer, topic, aggregate_key)
) ENGINE=InnoDB ROW_FORMAT=DYNAMIC DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- Messages of held keys, set aside unhandled, in arrival order (seq).
CREATE TABLE tidings_parked (
    seq           BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    consumer      VARCHAR(255) NOT NULL,
    topic         VARCHAR(255) NOT NULL,
    aggregate_key VARCHAR(255) NOT NULL,
    message_id    BINARY(16)   NOT NULL,
    headers       LONGTEXT     NOT NULL,
    body          LONGBLOB     NOT NULL,
    parked_at     BIGINT       NOT NULL DEFAULT (UNIX_TIMESTAMP() * 1000000 + MICROSECOND(NOW(6)))
) ENGINE=InnoDB ROW_FORMAT=DYNAMIC DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
CREATE UNIQUE INDEX tidings_parked_message ON tidings_parked (consumer, message_id);
-- 3 x 255 characters x 4 bytes + 8: 3068 of InnoDB's 3072 bytes.
CREATE INDEX tidings_parked_key ON tidings_parked (consumer, topic, aggregate_key, seq);
