-- The audit trail: one row per action a person or a tool took on the
-- deployment (a redrive, a skip, a purge, an edit), kept for whoever asks
-- later who did what. target is what the action was done to (a dead
-- letter's id, a selection); detail is the rest, as JSON.
-- Times are Unix microseconds.
CREATE TABLE tidings_audit (
    id     BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    at     BIGINT       NOT NULL,
    actor  TEXT         NOT NULL,
    action TEXT         NOT NULL,
    -- Part of a key: 255 characters at most, like every name that is.
    target VARCHAR(255) NOT NULL,
    detail LONGTEXT     NOT NULL CHECK (JSON_VALID(detail)),
    -- The trail of one target, newest first.
    KEY tidings_audit_target (target, at),
    -- The whole trail, newest first.
    KEY tidings_audit_at (at)
) ENGINE=InnoDB ROW_FORMAT=DYNAMIC DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
