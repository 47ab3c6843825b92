-- Message traces: a message's records found by its id in every table, and
-- the messages of a key found by the key, each by an index.
CREATE INDEX tidings_outbox_id ON tidings_outbox (id);
CREATE INDEX tidings_outbox_key ON tidings_outbox (aggregate_key, seq);
CREATE INDEX tidings_processed_message ON tidings_processed (message_id);
CREATE INDEX tidings_effects_message ON tidings_effects (message_id);
CREATE INDEX tidings_dead_letters_message_id ON tidings_dead_letters (message_id);
CREATE INDEX tidings_dead_letters_key ON tidings_dead_letters (aggregate_key, created_at);
CREATE INDEX tidings_parked_message_id ON tidings_parked (message_id);
CREATE INDEX tidings_parked_by_key ON tidings_parked (aggregate_key, seq);
