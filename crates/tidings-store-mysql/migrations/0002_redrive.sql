-- Redrive bookkeeping for dead letters.
ALTER TABLE tidings_dead_letters
    ADD COLUMN redrives INT NOT NULL DEFAULT 0,
    ADD COLUMN redriven_at BIGINT;
