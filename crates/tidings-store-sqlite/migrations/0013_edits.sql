-- Edits of dead letters: each message an operator redrove with new data
-- in place of its own, keeping the dead letter's body as it was stored
-- beside the envelope enqueued instead. id is the value of the
-- `tidingsedit` header the edited message carries.
-- Times are Unix milliseconds.
CREATE TABLE tidings_dead_letter_edits (
    id             BLOB    PRIMARY KEY,
    dead_letter_id BLOB    NOT NULL,
    edited_by      TEXT    NOT NULL,
    edited_at      INTEGER NOT NULL,
    original_body  BLOB    NOT NULL,
    edited_body    BLOB    NOT NULL
);
-- The edits of one dead letter, oldest first.
CREATE INDEX tidings_dead_letter_edits_letter ON tidings_dead_letter_edits (dead_letter_id, edited_at);
