-- Relay partitions: the key hash of outbox rows, so that several relays
-- each publish the partitions they hold a lease on. Rows written before
-- this column existed have none and belong to partition 0.
ALTER TABLE tidings_outbox ADD COLUMN key_hash BIGINT;
