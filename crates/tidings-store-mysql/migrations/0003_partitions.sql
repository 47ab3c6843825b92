-- Partitions: the key hash of log rows, and partition leases.
-- Times are Unix microseconds.

-- The 32-bit FNV-1a hash of the row's aggregate key (tidings_core::partition),
-- so that the members of a group each read their partitions. Rows written
-- before this column existed have none and read as partition 0.
ALTER TABLE tidings_log ADD COLUMN key_hash BIGINT;

-- A group's offsets are kept per partition (index out of count); a whole
-- topic is partition 0 of 1.
ALTER TABLE tidings_log_offsets
    ADD COLUMN partition_count INT NOT NULL DEFAULT 1,
    ADD COLUMN partition_index INT NOT NULL DEFAULT 0,
    DROP PRIMARY KEY,
    ADD PRIMARY KEY (consumer_group, topic, partition_count, partition_index);

-- The live members of a scope (a consumer group on a topic), each renewing
-- its row before it expires. A scope is `group@topic`, hence 512 characters.
CREATE TABLE tidings_members (
    scope      VARCHAR(512) NOT NULL,
    `member`   VARCHAR(255) NOT NULL,
    expires_at BIGINT       NOT NULL,
    PRIMARY KEY (scope, `member`)
) ENGINE=InnoDB ROW_FORMAT=DYNAMIC DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- Who holds each partition of a scope, until when, and the fencing token:
-- it grows every time the partition changes hands, and the holder's
-- writes check it, so a member that lost its lease cannot write.
CREATE TABLE tidings_leases (
    scope           VARCHAR(512) NOT NULL,
    partition_index INT          NOT NULL,
    owner           VARCHAR(255) NOT NULL,
    fence           BIGINT       NOT NULL,
    expires_at      BIGINT       NOT NULL,
    PRIMARY KEY (scope, partition_index)
) ENGINE=InnoDB ROW_FORMAT=DYNAMIC DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
