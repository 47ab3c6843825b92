//! The upload system's own SQL: written once, each database supplying
//! only what reads differently there. Parameters are numbered (`$1`...).

use tidings_demo_kit::KitDialect;
use tidings_demo_kit::dialects::{Lite, My, Pg};

/// The upload system's statements on one database.
#[derive(Debug, Clone, Copy)]
pub struct UploadSql {
    /// Creates the tables if missing.
    pub schema: &'static [&'static str],
    /// Starts one snapshot for every figure of the tally.
    pub snapshot: &'static str,
}

/// A database the upload system runs on.
pub trait UploadDialect: KitDialect {
    /// Its statements.
    const UPLOAD: UploadSql;
}

/// The statements that read the same on every database.
pub mod shared {
    /// ($1 file, $2 name, $3 bytes, $4 infected, $5 corrupt): the stored file.
    pub const UPLOAD: &str =
        "INSERT INTO uploads (file_id, name, bytes, infected, corrupt) VALUES ($1, $2, $3, $4, $5)";
    /// ($1 file) -> (bytes, infected, corrupt).
    pub const FILE: &str = "SELECT bytes, infected, corrupt FROM uploads WHERE file_id = $1";
    /// ($1 file, $2 status): the catalog's view of the file.
    pub const STATUS: &str = "INSERT INTO file_status (file_id, status) VALUES ($1, $2)";
    /// ($1 file, $2 status).
    pub const RESTATUS: &str = "UPDATE file_status SET status = $2 WHERE file_id = $1";
    /// ($1 file, $2 verdict).
    pub const SCANNED: &str = "INSERT INTO scans (file_id, verdict) VALUES ($1, $2)";
    /// ($1 file, $2 digest).
    pub const THUMBNAIL: &str = "INSERT INTO thumbnails (file_id, digest) VALUES ($1, $2)";
    /// ($1 consumer, $2 message, $3 milliseconds): how long a handling took, committed with it.
    pub const TIMING: &str = "INSERT INTO stage_timings (consumer, message_id, took_ms) VALUES ($1, $2, $3)";
    /// () -> (consumer, the slowest handling committed, in milliseconds).
    pub const SLOWEST: &str = "SELECT consumer, max(took_ms) FROM stage_timings GROUP BY consumer";
    /// () -> the figures of [`Tally`](crate::system::Tally), in its order.
    pub const TALLY: &str = "SELECT
        (SELECT count(*) FROM uploads),
        (SELECT count(*) FROM uploads WHERE infected = 1),
        (SELECT count(*) FROM uploads WHERE corrupt = 1 AND infected = 0),
        (SELECT count(*) FROM scans),
        (SELECT count(*) FROM scans WHERE verdict = 'infected'),
        (SELECT count(*) FROM thumbnails),
        (SELECT count(*) FROM thumbnails t JOIN uploads u ON u.file_id = t.file_id WHERE u.infected = 1),
        (SELECT count(*) FROM file_status WHERE status = 'quarantined'),
        (SELECT count(*) FROM tidings_outbox WHERE published_at IS NULL),
        (SELECT count(*) FROM demo_step_violations WHERE consumer = 'catalog')";
}

const SCHEMA: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS uploads (
        file_id TEXT PRIMARY KEY, name TEXT NOT NULL, bytes BIGINT NOT NULL, infected BIGINT NOT NULL,
        corrupt BIGINT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS file_status (file_id TEXT PRIMARY KEY, status TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS scans (file_id TEXT PRIMARY KEY, verdict TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS thumbnails (file_id TEXT PRIMARY KEY, digest TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS stage_timings (
        consumer TEXT NOT NULL, message_id TEXT NOT NULL, took_ms BIGINT NOT NULL, PRIMARY KEY (consumer, message_id))",
];

const PORTABLE: UploadSql = UploadSql {
    schema: SCHEMA,
    snapshot: "SELECT 1",
};

impl UploadDialect for Pg {
    const UPLOAD: UploadSql = UploadSql {
        // One snapshot for the whole transaction, not one per statement.
        snapshot: "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ",
        ..PORTABLE
    };
}

impl UploadDialect for Lite {
    const UPLOAD: UploadSql = PORTABLE;
}

impl UploadDialect for My {
    const UPLOAD: UploadSql = UploadSql {
        schema: &[
            "CREATE TABLE IF NOT EXISTS uploads (
                file_id VARCHAR(255) PRIMARY KEY, name TEXT NOT NULL, bytes BIGINT NOT NULL,
                infected BIGINT NOT NULL, corrupt BIGINT NOT NULL) DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
            "CREATE TABLE IF NOT EXISTS file_status (file_id VARCHAR(255) PRIMARY KEY, status VARCHAR(32) NOT NULL)
                DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
            "CREATE TABLE IF NOT EXISTS scans (file_id VARCHAR(255) PRIMARY KEY, verdict VARCHAR(32) NOT NULL)
                DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
            "CREATE TABLE IF NOT EXISTS thumbnails (file_id VARCHAR(255) PRIMARY KEY, digest VARCHAR(64) NOT NULL)
                DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
            "CREATE TABLE IF NOT EXISTS stage_timings (
                consumer VARCHAR(64) NOT NULL, message_id VARCHAR(64) NOT NULL, took_ms BIGINT NOT NULL,
                PRIMARY KEY (consumer, message_id)) DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
        ],
        // Repeatable read, the server's default: the snapshot is taken at
        // the first read of a table.
        snapshot: "SELECT count(*) FROM demo_systems",
    };
}
