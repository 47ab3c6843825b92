-- Replays asked by operators and carried out by a member of the consumer.
-- Times are Unix microseconds. CURSOR is a reserved word (and MEMBER was
-- in MySQL 8.0.17 and 8.0.18): statements must quote them with backticks.
CREATE TABLE tidings_replays (
    id            BINARY(16)   NOT NULL PRIMARY KEY,
    consumer      VARCHAR(255) NOT NULL,
    topics        LONGTEXT     NOT NULL CHECK (JSON_VALID(topics)),
    source        TEXT         NOT NULL,
    since         BIGINT       NOT NULL,
    until         BIGINT       NOT NULL,
    rate          DOUBLE       NOT NULL,
    total         BIGINT       NOT NULL,
    state         VARCHAR(16)  NOT NULL,
    `member`      VARCHAR(255),
    claimed_until BIGINT,
    `cursor`      BIGINT       NOT NULL DEFAULT 0,
    delivered     BIGINT       NOT NULL DEFAULT 0,
    suppressed    BIGINT       NOT NULL DEFAULT 0,
    handled       BIGINT       NOT NULL DEFAULT 0,
    failed        BIGINT       NOT NULL DEFAULT 0,
    requested_at  BIGINT       NOT NULL DEFAULT (UNIX_TIMESTAMP() * 1000000 + MICROSECOND(NOW(6))),
    updated_at    BIGINT       NOT NULL DEFAULT (UNIX_TIMESTAMP() * 1000000 + MICROSECOND(NOW(6)))
) ENGINE=InnoDB ROW_FORMAT=DYNAMIC DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
-- There are no partial indexes (PostgreSQL's is WHERE state IN ('pending',
-- 'running')): with state second, a consumer's open replays are two short
-- ranges of this index, and its finished ones are never read.
CREATE INDEX tidings_replays_open ON tidings_replays (consumer, state, requested_at);
-- Retained events are read by time.
CREATE INDEX tidings_log_created ON tidings_log (created_at);
