-- Deliveries the webhook inbox accepted, one per (provider, the provider's
-- event id), written in the transaction that enqueues the delivery as a
-- Tidings event: a delivery retried by its provider finds its row and
-- changes nothing. message_id is the event's envelope id.
-- Times are Unix milliseconds.
CREATE TABLE tidings_inbox (
    provider    TEXT    NOT NULL,
    event_id    TEXT    NOT NULL,
    message_id  BLOB    NOT NULL,
    received_at INTEGER NOT NULL DEFAULT (CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)),
    PRIMARY KEY (provider, event_id)
);
-- The inbox retention deletes by age.
CREATE INDEX tidings_inbox_age ON tidings_inbox (received_at);
