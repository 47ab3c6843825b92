//! The payments system's own SQL: written once, each database supplying
//! only what reads differently there (key types, upserts, row locks).
//! Parameters are numbered (`$1`...) everywhere.

use tidings_demo_kit::KitDialect;
use tidings_demo_kit::dialects::{Lite, My, Pg};

/// The payments system's statements on one database.
#[derive(Debug, Clone, Copy)]
pub struct PaymentsSql {
    /// Creates the payments tables if missing.
    pub schema: &'static [&'static str],
    /// ($1 payment): its row, if missing.
    pub ensure_payment: &'static str,
    /// ($1 payment) -> (captured, refunded, pending refund, pending refund's event, refunds):
    /// the payment's row, locked until the transaction ends.
    pub lock_payment: &'static str,
    /// ($1 entry, $2 payment, $3 account, $4 currency, $5 amount): a
    /// ledger entry, unless one with that id exists.
    pub entry: &'static str,
    /// ($1 account, $2 currency, $3 amount): adds to the account's balance.
    pub balance: &'static str,
    /// Starts one snapshot for every figure of the tally.
    pub snapshot: &'static str,
    /// () -> (currency, payments captured, captured, refunded, events emitted) per currency.
    pub per_currency: &'static str,
}

/// The sums per currency, cast to `$int` (the database's name of a 64-bit integer in `CAST`).
macro_rules! per_currency {
    ($int:literal) => {
        concat!(
            "SELECT COALESCE(currency, ''), count(captured_cents), CAST(COALESCE(sum(captured_cents), 0) AS ",
            $int,
            "),
                CAST(COALESCE(sum(refunded_cents), 0) AS ",
            $int,
            "), CAST(COALESCE(sum(events), 0) AS ",
            $int,
            ")
             FROM payment_state GROUP BY currency ORDER BY currency"
        )
    };
}

/// A database the payments system runs on.
pub trait PaymentsDialect: KitDialect {
    /// Its statements.
    const PAYMENTS: PaymentsSql;
}

/// The statements that read the same on every database.
pub mod shared {
    /// ($1 payment, $2 amount, $3 currency, $4 event): the capture, one event more.
    pub const CAPTURE: &str =
        "UPDATE payment_state SET captured_cents = $2, currency = $3, capture_event = $4,
        events = events + 1 WHERE payment_id = $1";
    /// ($1 payment, $2 refunded so far): one refund emitted, one event more.
    pub const REFUND: &str = "UPDATE payment_state SET refunded_cents = $2, refunds = refunds + 1,
        events = events + 1, pending_refund_cents = 0, pending_refund_event = NULL WHERE payment_id = $1";
    /// ($1 payment, $2 refunded so far, $3 event): a refund waiting for its capture.
    pub const PEND_REFUND: &str =
        "UPDATE payment_state SET pending_refund_cents = $2, pending_refund_event = $3,
        waited = 1 WHERE payment_id = $1 AND pending_refund_cents < $2";
    /// () -> (account, currency, balance).
    pub const BALANCES: &str =
        "SELECT account, currency, balance FROM ledger_balances ORDER BY account, currency";
    /// () -> the figures of [`Tally`](crate::system::Tally), in its order.
    pub const TALLY: &str = "SELECT
        (SELECT count(*) FROM tidings_inbox WHERE provider = 'stripe'),
        (SELECT count(*) FROM payment_state WHERE captured_cents IS NOT NULL),
        (SELECT count(*) FROM payment_state WHERE refunds > 0),
        (SELECT count(*) FROM payment_state WHERE waited = 1),
        (SELECT count(*) FROM payment_state WHERE pending_refund_cents > 0),
        (SELECT count(*) FROM tidings_outbox WHERE published_at IS NULL),
        (SELECT count(*) FROM demo_step_violations WHERE consumer IN ('ledger', 'notify')),
        (SELECT count(*) FROM ledger_entries)";
}

const SCHEMA: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS payment_state (
        payment_id TEXT PRIMARY KEY, currency TEXT, captured_cents BIGINT, capture_event TEXT,
        refunded_cents BIGINT NOT NULL DEFAULT 0, refunds BIGINT NOT NULL DEFAULT 0,
        pending_refund_cents BIGINT NOT NULL DEFAULT 0, pending_refund_event TEXT,
        waited BIGINT NOT NULL DEFAULT 0, events BIGINT NOT NULL DEFAULT 0)",
    "CREATE TABLE IF NOT EXISTS ledger_entries (
        entry_id TEXT PRIMARY KEY, payment_id TEXT NOT NULL, account TEXT NOT NULL, currency TEXT NOT NULL,
        amount_cents BIGINT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS ledger_balances (
        account TEXT NOT NULL, currency TEXT NOT NULL, balance BIGINT NOT NULL, PRIMARY KEY (account, currency))",
];

const PORTABLE: PaymentsSql = PaymentsSql {
    schema: SCHEMA,
    ensure_payment: "INSERT INTO payment_state (payment_id) VALUES ($1) ON CONFLICT (payment_id) DO NOTHING",
    lock_payment: "SELECT captured_cents, refunded_cents, pending_refund_cents, pending_refund_event, refunds
        FROM payment_state WHERE payment_id = $1 FOR UPDATE",
    entry: "INSERT INTO ledger_entries (entry_id, payment_id, account, currency, amount_cents)
        VALUES ($1, $2, $3, $4, $5) ON CONFLICT (entry_id) DO NOTHING",
    balance: "INSERT INTO ledger_balances (account, currency, balance) VALUES ($1, $2, $3)
        ON CONFLICT (account, currency) DO UPDATE SET balance = ledger_balances.balance + excluded.balance",
    snapshot: "SELECT 1",
    per_currency: per_currency!("BIGINT"),
};

impl PaymentsDialect for Pg {
    const PAYMENTS: PaymentsSql = PaymentsSql {
        // One snapshot for the whole transaction, not one per statement.
        snapshot: "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ",
        ..PORTABLE
    };
}

impl PaymentsDialect for Lite {
    const PAYMENTS: PaymentsSql = PaymentsSql {
        // No row locks: the transaction already holds the database's one
        // writer lock (it wrote the row just before).
        lock_payment:
            "SELECT captured_cents, refunded_cents, pending_refund_cents, pending_refund_event, refunds
            FROM payment_state WHERE payment_id = $1",
        ..PORTABLE
    };
}

impl PaymentsDialect for My {
    const PAYMENTS: PaymentsSql = PaymentsSql {
        schema: &[
            "CREATE TABLE IF NOT EXISTS payment_state (
                payment_id VARCHAR(255) PRIMARY KEY, currency VARCHAR(16), captured_cents BIGINT,
                capture_event VARCHAR(255), refunded_cents BIGINT NOT NULL DEFAULT 0,
                refunds BIGINT NOT NULL DEFAULT 0, pending_refund_cents BIGINT NOT NULL DEFAULT 0,
                pending_refund_event VARCHAR(255), waited BIGINT NOT NULL DEFAULT 0,
                events BIGINT NOT NULL DEFAULT 0) DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
            "CREATE TABLE IF NOT EXISTS ledger_entries (
                entry_id VARCHAR(320) PRIMARY KEY, payment_id VARCHAR(255) NOT NULL, account VARCHAR(64) NOT NULL,
                currency VARCHAR(16) NOT NULL, amount_cents BIGINT NOT NULL)
                DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
            "CREATE TABLE IF NOT EXISTS ledger_balances (
                account VARCHAR(64) NOT NULL, currency VARCHAR(16) NOT NULL, balance BIGINT NOT NULL,
                PRIMARY KEY (account, currency)) DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
        ],
        // A no-op update on a duplicate: no other error is turned into a
        // warning, as INSERT IGNORE would.
        ensure_payment: "INSERT INTO payment_state (payment_id) VALUES ($1)
            ON DUPLICATE KEY UPDATE payment_id = payment_id",
        // IGNORE: the entry's insert must say 0 rows on a duplicate, and an
        // update of a duplicate counts as a row found on sqlx's connections.
        // IGNORE would also truncate a longer id into a warning: the column
        // holds the longest (a 255-character event id, `/`, an account).
        entry: "INSERT IGNORE INTO ledger_entries (entry_id, payment_id, account, currency, amount_cents)
            VALUES ($1, $2, $3, $4, $5)",
        balance: "INSERT INTO ledger_balances (account, currency, balance) VALUES ($1, $2, $3)
            ON DUPLICATE KEY UPDATE balance = balance + VALUES(balance)",
        // Repeatable read, the server's default: the snapshot is taken at
        // the first read of a table.
        snapshot: "SELECT count(*) FROM demo_systems",
        per_currency: per_currency!("SIGNED"),
        ..PORTABLE
    };
}
