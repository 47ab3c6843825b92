-- Partitions: the key hash of log rows, and partition leases.

-- The 32-bit FNV-1a hash of the row's aggregate key (tidings_core::partition),
-- so that the members of a group each read their partitions. Rows written
-- before this column existed have none and read as partition 0.
ALTER TABLE tidings_log ADD COLUMN key_hash BIGINT;

-- A group's offsets are kept per partition (index out of count); a whole
-- topic is partition 0 of 1.
ALTER TABLE tidings_log_offsets
    ADD COLUMN partition_count INTEGER NOT NULL DEFAULT 1,
    ADD COLUMN partition_index INTEGER NOT NULL DEFAULT 0,
    DROP CONSTRAINT tidings_log_offsets_pkey,
    ADD PRIMARY KEY (consumer_group, topic, partition_count, partition_index);

-- The live members of a scope (a consumer group on a topic), each renewing
-- its row before it expires.
CREATE TABLE tidings_members (
    scope      TEXT        NOT NULL,
    member     TEXT        NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (scope, member)
);

-- Who holds each partition of a scope, until when, and the fencing token:
-- it grows every time the partition changes hands, and the holder's
-- writes check it, so a member that lost its lease cannot write.
CREATE TABLE tidings_leases (
    scope           TEXT        NOT NULL,
    partition_index INTEGER     NOT NULL,
    owner           TEXT        NOT NULL,
    fence           BIGINT      NOT NULL,
    expires_at      TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (scope, partition_index)
);
