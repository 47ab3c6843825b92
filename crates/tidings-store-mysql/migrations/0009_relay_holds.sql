-- Outbox records the relay set aside (a body that is not an envelope, or a
-- record its transport refuses), each holding its key: the relay claims
-- none of the key's later records until a redrive lets it try the record
-- again or a skip deletes it. A record with no key (an empty one) holds
-- only itself. Its dead letter is in tidings_dead_letters (consumer @relay).
-- Times are Unix microseconds.
CREATE TABLE tidings_relay_holds (
    seq           BIGINT       NOT NULL PRIMARY KEY,
    message_id    BINARY(16)   NOT NULL,
    topic         VARCHAR(255) NOT NULL,
    aggregate_key VARCHAR(255) NOT NULL,
    held_at       BIGINT       NOT NULL DEFAULT (UNIX_TIMESTAMP() * 1000000 + MICROSECOND(NOW(6))),
    KEY tidings_relay_holds_key (topic, aggregate_key, seq),
    KEY tidings_relay_holds_message (message_id)
) ENGINE=InnoDB ROW_FORMAT=DYNAMIC DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
