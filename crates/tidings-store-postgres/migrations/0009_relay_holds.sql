-- Outbox records the relay set aside (a body that is not an envelope, or a
-- record its transport refuses), each holding its key: the relay claims
-- none of the key's later records until a redrive lets it try the record
-- again or a skip deletes it. A record with no key (an empty one) holds
-- only itself. Its dead letter is in tidings_dead_letters (consumer @relay).
CREATE TABLE tidings_relay_holds (
    seq           BIGINT      PRIMARY KEY,
    message_id    UUID        NOT NULL,
    topic         TEXT        NOT NULL,
    aggregate_key TEXT        NOT NULL,
    held_at       TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX tidings_relay_holds_key ON tidings_relay_holds (topic, aggregate_key, seq);
CREATE INDEX tidings_relay_holds_message ON tidings_relay_holds (message_id);
