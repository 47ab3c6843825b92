-- Replays asked by operators and carried out by a member of the consumer.
CREATE TABLE tidings_replays (
    id            UUID PRIMARY KEY,
    consumer      TEXT             NOT NULL,
    topics        JSONB            NOT NULL,
    source        TEXT             NOT NULL,
    since         TIMESTAMPTZ      NOT NULL,
    until         TIMESTAMPTZ      NOT NULL,
    rate          DOUBLE PRECISION NOT NULL,
    total         BIGINT           NOT NULL,
    state         TEXT             NOT NULL,
    member        TEXT,
    claimed_until TIMESTAMPTZ,
    cursor        BIGINT           NOT NULL DEFAULT 0,
    delivered     BIGINT           NOT NULL DEFAULT 0,
    suppressed    BIGINT           NOT NULL DEFAULT 0,
    handled       BIGINT           NOT NULL DEFAULT 0,
    failed        BIGINT           NOT NULL DEFAULT 0,
    requested_at  TIMESTAMPTZ      NOT NULL DEFAULT now(),
    updated_at    TIMESTAMPTZ      NOT NULL DEFAULT now()
);
CREATE INDEX tidings_replays_open ON tidings_replays (consumer, requested_at)
    WHERE state IN ('pending', 'running');
-- Retained events are read by time.
CREATE INDEX tidings_log_created ON tidings_log (created_at);
