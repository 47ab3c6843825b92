-- Tidings schema for PostgreSQL, version 1.

-- The transactional outbox. Producers insert in their own transaction; the
-- relay claims the oldest rows with FOR UPDATE SKIP LOCKED.
CREATE TABLE tidings_outbox (
    seq           BIGSERIAL PRIMARY KEY,
    id            UUID        NOT NULL,
    topic         TEXT        NOT NULL,
    aggregate_key TEXT        NOT NULL,
    message_type  TEXT        NOT NULL,
    body          BYTEA       NOT NULL,
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    published_at  TIMESTAMPTZ
);
-- Only unsent rows are ever scanned by the relay: without this partial
-- index, marking rows sent (retention mode) drains several times slower.
CREATE INDEX tidings_outbox_unsent ON tidings_outbox (seq) WHERE published_at IS NULL;
CREATE INDEX tidings_outbox_published ON tidings_outbox (published_at) WHERE published_at IS NOT NULL;

-- The database-log transport: an append-only table read with per-group offsets.
-- txid is the writing transaction's id: readers only read rows of
-- transactions older than every transaction still running, so a row that
-- commits late with a low seq is never skipped.
CREATE TABLE tidings_log (
    seq           BIGSERIAL PRIMARY KEY,
    txid          BIGINT      NOT NULL DEFAULT (pg_current_xact_id()::text::bigint),
    topic         TEXT        NOT NULL,
    aggregate_key TEXT,
    body          BYTEA       NOT NULL,
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX tidings_log_read ON tidings_log (topic, txid, seq);

CREATE TABLE tidings_log_offsets (
    consumer_group TEXT        NOT NULL,
    topic          TEXT        NOT NULL,
    txid           BIGINT      NOT NULL,
    seq            BIGINT      NOT NULL,
    updated_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_group, topic)
);

-- Processed markers: one row per (consumer, message), inserted in the
-- handler's transaction. Durable: idempotency is not a time window.
CREATE TABLE tidings_processed (
    consumer     TEXT        NOT NULL,
    message_id   UUID        NOT NULL,
    processed_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_id)
);

-- The effects ledger: outbound side effects done, per (consumer, message, effect).
CREATE TABLE tidings_effects (
    consumer        TEXT        NOT NULL,
    message_id      UUID        NOT NULL,
    effect          TEXT        NOT NULL,
    idempotency_key TEXT        NOT NULL,
    recorded_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_id, effect)
);

-- The failure store.
CREATE TABLE tidings_dead_letters (
    id            UUID PRIMARY KEY,
    consumer      TEXT        NOT NULL,
    topic         TEXT        NOT NULL,
    message_id    UUID,
    message_type  TEXT,
    aggregate_key TEXT,
    headers       JSONB       NOT NULL,
    body          BYTEA       NOT NULL,
    attempts      INTEGER     NOT NULL,
    errors        JSONB       NOT NULL,
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at    TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX tidings_dead_letters_message ON tidings_dead_letters (consumer, message_id)
    WHERE message_id IS NOT NULL;
CREATE INDEX tidings_dead_letters_created ON tidings_dead_letters (created_at);
