-- Deliveries the webhook inbox accepted, one per (provider, the provider's
-- event id), written in the transaction that enqueues the delivery as a
-- Tidings event: a delivery retried by its provider finds its row and
-- changes nothing. message_id is the event's envelope id.
-- Times are Unix microseconds.
CREATE TABLE tidings_inbox (
    provider    VARCHAR(64)  NOT NULL,
    -- Bytes, compared exactly: a PAD SPACE collation would take "a" and
    -- "a " for one id. 255 characters of UTF-8 at most.
    event_id    VARBINARY(1020) NOT NULL,
    message_id  BINARY(16)   NOT NULL,
    received_at BIGINT       NOT NULL DEFAULT (UNIX_TIMESTAMP() * 1000000 + MICROSECOND(NOW(6))),
    PRIMARY KEY (provider, event_id),
    KEY tidings_inbox_age (received_at)
) ENGINE=InnoDB ROW_FORMAT=DYNAMIC DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
