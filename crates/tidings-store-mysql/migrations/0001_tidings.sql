-- Tidings schema for MySQL 8.0 and MariaDB 10.6 and later, version 1.
--
-- Times are microseconds since the Unix epoch, on the database's clock:
-- NOW_US below is (UNIX_TIMESTAMP() * 1000000 + MICROSECOND(NOW(6))), which
-- does not depend on the session's time zone (both functions read the
-- statement's start time). Expression defaults need MySQL 8.0.13 or later.
-- UUIDs are BINARY(16). JSON is LONGTEXT checked with JSON_VALID (MySQL
-- enforces CHECK from 8.0.16). Names that are part of a key somewhere
-- (topics, aggregate keys, consumers, groups) are VARCHAR(255) in every
-- table, so a value one table takes fits in the others, and every key fits
-- InnoDB's limit of 3072 bytes at 4 bytes a character (utf8mb4);
-- ROW_FORMAT=DYNAMIC is what allows keys that long. The binary collation
-- compares keys byte for byte, as PostgreSQL does.

-- The transactional outbox. Producers insert in their own transaction; the
-- relay reads the oldest rows of its partitions, then locks exactly those.
CREATE TABLE tidings_outbox (
    seq           BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    id            BINARY(16)   NOT NULL,
    topic         VARCHAR(255) NOT NULL,
    aggregate_key VARCHAR(255) NOT NULL,
    message_type  TEXT         NOT NULL,
    body          LONGBLOB     NOT NULL,
    created_at    BIGINT       NOT NULL DEFAULT (UNIX_TIMESTAMP() * 1000000 + MICROSECOND(NOW(6))),
    published_at  BIGINT
) ENGINE=InnoDB ROW_FORMAT=DYNAMIC DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
-- There are no partial indexes: this one index stands for PostgreSQL's two.
-- Unsent rows (published_at IS NULL) are one range of it, in seq order, so
-- the relay's claim reads only them; sent rows are ordered by published_at
-- for retention cleanup.
CREATE INDEX tidings_outbox_unsent ON tidings_outbox (published_at, seq);

-- The database-log transport: an append-only table read with per-group offsets.
CREATE TABLE tidings_log (
    seq           BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    topic         VARCHAR(255) NOT NULL,
    aggregate_key VARCHAR(255),
    body          LONGBLOB     NOT NULL,
    created_at    BIGINT       NOT NULL DEFAULT (UNIX_TIMESTAMP() * 1000000 + MICROSECOND(NOW(6)))
) ENGINE=InnoDB ROW_FORMAT=DYNAMIC DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
CREATE INDEX tidings_log_read ON tidings_log (topic, seq);

-- Appends to the log are serialized, so that seq follows commit order and a
-- reader that has read up to some seq never finds a lower one committed
-- later. Auto-increment values are handed out as rows are written, not as
-- transactions commit: without this, a transaction that took seq 5 could
-- commit after one that took seq 6, behind a reader already past 6. The
-- trigger runs before the row gets its seq and updates the one row below,
-- so each appending transaction holds that row's lock until it commits or
-- rolls back, and the next appender waits for it. Every writer of
-- tidings_log goes through the trigger; appends should come late in their
-- transaction, since the lock is held from the first append to the commit.
-- (With binary logging on, creating a trigger needs SUPER or
-- log_bin_trust_function_creators = 1.)
CREATE TABLE tidings_log_sequencer (
    id      TINYINT NOT NULL PRIMARY KEY CHECK (id = 1),
    appends BIGINT  NOT NULL
) ENGINE=InnoDB;
INSERT INTO tidings_log_sequencer (id, appends) VALUES (1, 0);
CREATE TRIGGER tidings_log_sequence BEFORE INSERT ON tidings_log FOR EACH ROW
    UPDATE tidings_log_sequencer SET appends = appends + 1 WHERE id = 1;

-- Offsets are seqs alone: the sequencer above makes seq order commit order,
-- so there is no transaction id to keep (PostgreSQL keeps one).
CREATE TABLE tidings_log_offsets (
    consumer_group VARCHAR(255) NOT NULL,
    topic          VARCHAR(255) NOT NULL,
    seq            BIGINT       NOT NULL,
    updated_at     BIGINT       NOT NULL DEFAULT (UNIX_TIMESTAMP() * 1000000 + MICROSECOND(NOW(6))),
    PRIMARY KEY (consumer_group, topic)
) ENGINE=InnoDB ROW_FORMAT=DYNAMIC DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- Processed markers: one row per (consumer, message), inserted in the
-- handler's transaction. Durable: idempotency is not a time window.
CREATE TABLE tidings_processed (
    consumer     VARCHAR(255) NOT NULL,
    message_id   BINARY(16)   NOT NULL,
    processed_at BIGINT       NOT NULL DEFAULT (UNIX_TIMESTAMP() * 1000000 + MICROSECOND(NOW(6))),
    PRIMARY KEY (consumer, message_id)
) ENGINE=InnoDB ROW_FORMAT=DYNAMIC DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- The effects ledger: outbound side effects done, per (consumer, message, effect).
CREATE TABLE tidings_effects (
    consumer        VARCHAR(255) NOT NULL,
    message_id      BINARY(16)   NOT NULL,
    effect          VARCHAR(255) NOT NULL,
    idempotency_key TEXT         NOT NULL,
    recorded_at     BIGINT       NOT NULL DEFAULT (UNIX_TIMESTAMP() * 1000000 + MICROSECOND(NOW(6))),
    PRIMARY KEY (consumer, message_id, effect)
) ENGINE=InnoDB ROW_FORMAT=DYNAMIC DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- The failure store.
CREATE TABLE tidings_dead_letters (
    id            BINARY(16)   NOT NULL PRIMARY KEY,
    consumer      VARCHAR(255) NOT NULL,
    topic         VARCHAR(255) NOT NULL,
    message_id    BINARY(16),
    message_type  TEXT,
    aggregate_key VARCHAR(255),
    headers       LONGTEXT     NOT NULL CHECK (JSON_VALID(headers)),
    body          LONGBLOB     NOT NULL,
    attempts      INT          NOT NULL,
    errors        LONGTEXT     NOT NULL CHECK (JSON_VALID(errors)),
    created_at    BIGINT       NOT NULL DEFAULT (UNIX_TIMESTAMP() * 1000000 + MICROSECOND(NOW(6))),
    updated_at    BIGINT       NOT NULL DEFAULT (UNIX_TIMESTAMP() * 1000000 + MICROSECOND(NOW(6)))
) ENGINE=InnoDB ROW_FORMAT=DYNAMIC DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
-- One dead letter per (consumer, message) when the message id is known. A
-- unique index admits any number of rows whose message_id is NULL, which is
-- what PostgreSQL's partial index (WHERE message_id IS NOT NULL) does.
CREATE UNIQUE INDEX tidings_dead_letters_message ON tidings_dead_letters (consumer, message_id);
CREATE INDEX tidings_dead_letters_created ON tidings_dead_letters (created_at);
