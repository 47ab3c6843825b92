-- Edits of dead letters: each message an operator redrove with new data
-- in place of its own, keeping the dead letter's body as it was stored
-- beside the envelope enqueued instead. id is the value of the
-- `tidingsedit` header the edited message carries.
-- Times are Unix microseconds.
CREATE TABLE tidings_dead_letter_edits (
    id             BINARY(16) NOT NULL PRIMARY KEY,
    dead_letter_id BINARY(16) NOT NULL,
    edited_by      TEXT       NOT NULL,
    edited_at      BIGINT     NOT NULL,
    original_body  LONGBLOB   NOT NULL,
    edited_body    LONGBLOB   NOT NULL,
    -- The edits of one dead letter, oldest first.
    KEY tidings_dead_letter_edits_letter (dead_letter_id, edited_at)
) ENGINE=InnoDB ROW_FORMAT=DYNAMIC DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
