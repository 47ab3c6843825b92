-- Handlings of redelivered messages that began and have not ended: a count
-- that outlives the member, so that the crash-loop guard counts handlings
-- that crashed, not the broker's redeliveries.
CREATE TABLE tidings_handlings (
    consumer   TEXT        NOT NULL,
    message_id UUID        NOT NULL,
    begun      INTEGER     NOT NULL,
    begun_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_id)
);
