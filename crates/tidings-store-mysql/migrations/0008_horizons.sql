-- How far back Tidings' records reach: 'dedupe' is the time before which
-- processed markers and effects records may have been deleted, so that a
-- replay or a redrive from before it could handle a message twice.
-- Times are Unix microseconds.
CREATE TABLE tidings_horizons (
    name       VARCHAR(64) NOT NULL PRIMARY KEY,
    horizon_at BIGINT      NOT NULL
) ENGINE=InnoDB ROW_FORMAT=DYNAMIC DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
-- The dedupe retention deletes by age.
CREATE INDEX tidings_processed_age ON tidings_processed (processed_at);
CREATE INDEX tidings_effects_age ON tidings_effects (recorded_at);
