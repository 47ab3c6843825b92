-- The audit trail: one row per action a person or a tool took on the
-- deployment (a redrive, a skip, a purge, an edit), kept for whoever asks
-- later who did what. target is what the action was done to (a dead
-- letter's id, a selection); detail is the rest, as JSON.
-- Times are Unix milliseconds.
CREATE TABLE tidings_audit (
    id     INTEGER PRIMARY KEY AUTOINCREMENT,
    at     INTEGER NOT NULL,
    actor  TEXT    NOT NULL,
    action TEXT    NOT NULL,
    target TEXT    NOT NULL,
    detail TEXT    NOT NULL
);
-- The trail of one target, newest first.
CREATE INDEX tidings_audit_target ON tidings_audit (target, at);
-- The whole trail, newest first.
CREATE INDEX tidings_audit_at ON tidings_audit (at);
