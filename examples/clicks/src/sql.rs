//! The clicks system's own SQL: written once, each database supplying
//! only what reads differently there (its upserts, its column types).
//! Parameters are numbered (`$1`...).

use tidings_demo_kit::KitDialect;
use tidings_demo_kit::dialects::{Lite, My, Pg};

/// The clicks system's statements on one database.
#[derive(Debug, Clone, Copy)]
pub struct ClicksSql {
    /// Creates the tables if missing.
    pub schema: &'static [&'static str],
    /// ($1 click, $2 session, $3 seq, $4 page, $5 at): the stored click, unless stored already.
    pub store_click: &'static str,
    /// ($1 session, $2 clicks, $3 fast, $4 streak, $5 max streak, $6 last at): the scorer's state.
    pub save_session: &'static str,
    /// ($1 session, $2 clicks, $3 fast, $4 max streak, $5 score, $6 flagged): the feature store's row, by upsert.
    pub save_features: &'static str,
    /// Starts one snapshot for every figure of the tally.
    pub snapshot: &'static str,
}

/// A database the clicks system runs on.
pub trait ClicksDialect: KitDialect {
    /// Its statements.
    const CLICKS: ClicksSql;
}

/// The statements that read the same on every database.
pub mod shared {
    /// ($1 session) -> (clicks, fast, streak, max streak, last at).
    pub const SESSION: &str =
        "SELECT clicks, fast, streak, max_streak, last_at_ms FROM click_sessions WHERE session_id = $1";
    /// () -> (click, session, seq, page, at) of every stored click, each session's in order.
    pub const STORED: &str =
        "SELECT click_id, session_id, seq, page, at_ms FROM stored_clicks ORDER BY session_id, seq";
    /// () -> (session, clicks, fast, max streak, score, flagged) of every session in the feature store.
    pub const FEATURES: &str =
        "SELECT session_id, clicks, fast_clicks, max_streak, score, flagged FROM click_features";
    /// () -> the figures of [`Tally`](crate::system::Tally), in its order.
    pub const TALLY: &str = "SELECT
        (SELECT count(*) FROM stored_clicks),
        (SELECT count(*) FROM click_features),
        (SELECT count(*) FROM click_features WHERE flagged = 1),
        (SELECT count(*) FROM tidings_outbox WHERE published_at IS NULL),
        (SELECT count(*) FROM demo_step_violations WHERE consumer = 'fraud')";
}

const SCHEMA: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS stored_clicks (
        click_id TEXT PRIMARY KEY, session_id TEXT NOT NULL, seq BIGINT NOT NULL, page TEXT NOT NULL,
        at_ms BIGINT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS click_sessions (
        session_id TEXT PRIMARY KEY, clicks BIGINT NOT NULL, fast BIGINT NOT NULL, streak BIGINT NOT NULL,
        max_streak BIGINT NOT NULL, last_at_ms BIGINT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS click_features (
        session_id TEXT PRIMARY KEY, clicks BIGINT NOT NULL, fast_clicks BIGINT NOT NULL,
        max_streak BIGINT NOT NULL, score BIGINT NOT NULL, flagged BIGINT NOT NULL)",
];

const PORTABLE: ClicksSql = ClicksSql {
    schema: SCHEMA,
    store_click:
        "INSERT INTO stored_clicks (click_id, session_id, seq, page, at_ms) VALUES ($1, $2, $3, $4, $5)
        ON CONFLICT (click_id) DO NOTHING",
    save_session: "INSERT INTO click_sessions (session_id, clicks, fast, streak, max_streak, last_at_ms)
        VALUES ($1, $2, $3, $4, $5, $6)
        ON CONFLICT (session_id) DO UPDATE SET clicks = excluded.clicks, fast = excluded.fast,
            streak = excluded.streak, max_streak = excluded.max_streak, last_at_ms = excluded.last_at_ms",
    save_features: "INSERT INTO click_features (session_id, clicks, fast_clicks, max_streak, score, flagged)
        VALUES ($1, $2, $3, $4, $5, $6)
        ON CONFLICT (session_id) DO UPDATE SET clicks = excluded.clicks, fast_clicks = excluded.fast_clicks,
            max_streak = excluded.max_streak, score = excluded.score, flagged = excluded.flagged",
    snapshot: "SELECT 1",
};

impl ClicksDialect for Pg {
    const CLICKS: ClicksSql = ClicksSql {
        // One snapshot for the whole transaction, not one per statement.
        snapshot: "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ",
        ..PORTABLE
    };
}

impl ClicksDialect for Lite {
    const CLICKS: ClicksSql = PORTABLE;
}

impl ClicksDialect for My {
    const CLICKS: ClicksSql = ClicksSql {
        schema: &[
            "CREATE TABLE IF NOT EXISTS stored_clicks (
                click_id VARCHAR(255) PRIMARY KEY, session_id VARCHAR(255) NOT NULL, seq BIGINT NOT NULL,
                page TEXT NOT NULL, at_ms BIGINT NOT NULL) DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
            "CREATE TABLE IF NOT EXISTS click_sessions (
                session_id VARCHAR(255) PRIMARY KEY, clicks BIGINT NOT NULL, fast BIGINT NOT NULL,
                streak BIGINT NOT NULL, max_streak BIGINT NOT NULL, last_at_ms BIGINT NOT NULL)
                DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
            "CREATE TABLE IF NOT EXISTS click_features (
                session_id VARCHAR(255) PRIMARY KEY, clicks BIGINT NOT NULL, fast_clicks BIGINT NOT NULL,
                max_streak BIGINT NOT NULL, score BIGINT NOT NULL, flagged BIGINT NOT NULL)
                DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
        ],
        store_click:
            "INSERT INTO stored_clicks (click_id, session_id, seq, page, at_ms) VALUES ($1, $2, $3, $4, $5)
            ON DUPLICATE KEY UPDATE click_id = click_id",
        save_session: "INSERT INTO click_sessions (session_id, clicks, fast, streak, max_streak, last_at_ms)
            VALUES ($1, $2, $3, $4, $5, $6)
            ON DUPLICATE KEY UPDATE clicks = VALUES(clicks), fast = VALUES(fast), streak = VALUES(streak),
                max_streak = VALUES(max_streak), last_at_ms = VALUES(last_at_ms)",
        save_features:
            "INSERT INTO click_features (session_id, clicks, fast_clicks, max_streak, score, flagged)
            VALUES ($1, $2, $3, $4, $5, $6)
            ON DUPLICATE KEY UPDATE clicks = VALUES(clicks), fast_clicks = VALUES(fast_clicks),
                max_streak = VALUES(max_streak), score = VALUES(score), flagged = VALUES(flagged)",
        // Repeatable read, the server's default: the snapshot is taken at
        // the first read of a table.
        snapshot: "SELECT count(*) FROM demo_systems",
    };
}
