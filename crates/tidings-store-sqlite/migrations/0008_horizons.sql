-- How far back Tidings' records reach: 'dedupe' is the time before which
-- processed markers and effects records may have been deleted, so that a
-- replay or a redrive from before it could handle a message twice.
-- Times are Unix milliseconds.
CREATE TABLE tidings_horizons (
    name       TEXT    PRIMARY KEY,
    horizon_at INTEGER NOT NULL
);
-- The dedupe retention deletes by age.
CREATE INDEX tidings_processed_age ON tidings_processed (processed_at);
CREATE INDEX tidings_effects_age ON tidings_effects (recorded_at);
