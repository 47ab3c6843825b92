-- Handlings of redelivered messages that began and have not ended: a count
-- that outlives the member, so that the crash-loop guard counts handlings
-- that crashed, not the broker's redeliveries. Times are Unix microseconds.
CREATE TABLE tidings_handlings (
    consumer   VARCHAR(255) NOT NULL,
    message_id BINARY(16)   NOT NULL,
    begun      INT          NOT NULL,
    begun_at   BIGINT       NOT NULL DEFAULT (UNIX_TIMESTAMP() * 1000000 + MICROSECOND(NOW(6))),
    PRIMARY KEY (consumer, message_id)
) ENGINE=InnoDB ROW_FORMAT=DYNAMIC DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
