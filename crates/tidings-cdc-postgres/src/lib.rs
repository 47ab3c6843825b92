//! Change data capture for the relay on PostgreSQL: the outbox's inserts
//! read from a logical replication slot (pgoutput) rather than looked for
//! by polling.
//!
//! [`CdcStore`] is a [`RelayStore`](tidings_core::RelayStore): the same
//! relay loop claims, publishes, confirms and marks as with polling, with
//! the same fencing, dead letters and held keys, but it learns what was
//! committed, in commit order, from the server's change stream. Nothing
//! scans the outbox for work while the stream flows, and a record is
//! claimed as soon as its transaction commits.
//!
//! ```no_run
//! use tidings_cdc_postgres::{CdcOptions, CdcStore};
//! use tidings_relay::Relay;
//! use tidings_store_postgres::PgStore;
//! use tokio_util::sync::CancellationToken;
//! # async fn run(publisher: impl tidings_core::Publisher) -> tidings_core::Result<()> {
//! let url = "postgres://postgres@127.0.0.1/app";
//! let pg = PgStore::connect(url).await?;
//! pg.migrate().await?;
//! let cdc = CdcStore::new(pg, url, CdcOptions::default())?; // slot and publication `tidings_relay`
//! Relay::new(cdc, publisher).run(CancellationToken::new()).await
//! # }
//! ```
//!
//! The server must run with `wal_level = logical`, and the relay's login
//! needs the `REPLICATION` attribute (or to be a superuser) and to own the
//! outbox table (to publish it). The slot and the publication are made at
//! the first start and kept: [`slot::drop`] removes them.
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

mod batch;
mod guard;
pub mod pgoutput;
pub mod slot;
mod store;
mod stream;

use std::time::Duration;

pub use batch::CdcBatch;
pub use guard::sample_slot;
pub use pgwire_replication::Lsn;
pub use store::CdcStore;

/// Options of a [`CdcStore`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CdcOptions {
    group: String,
    status_interval: Duration,
    heartbeat_interval: Duration,
    wal_cap: Option<u64>,
    guard_interval: Duration,
}

impl Default for CdcOptions {
    /// The group `relay` (slot and publication `tidings_relay`); positions
    /// confirmed to the server at most every second; a heartbeat every 10 s
    /// while idle; the slot may hold 4 GiB of log past what the relay
    /// confirmed, measured every 10 s.
    fn default() -> Self {
        CdcOptions {
            group: "relay".into(),
            status_interval: Duration::from_secs(1),
            heartbeat_interval: Duration::from_secs(10),
            wal_cap: Some(4096 * 1024 * 1024),
            guard_interval: Duration::from_secs(10),
        }
    }
}

impl CdcOptions {
    /// The relay group, which names the slot and the publication
    /// (`tidings_<group>`): relays of one group share them, one streaming at
    /// a time.
    pub fn group(mut self, group: impl Into<String>) -> Self {
        self.group = group.into();
        self
    }

    /// How often an idle relay writes a heartbeat, a logical message of its
    /// own (`pg_logical_emit_message`), so that the slot's position moves
    /// on while the server's log grows with other work.
    pub fn heartbeat_interval(mut self, d: Duration) -> Self {
        self.heartbeat_interval = d.max(Duration::from_millis(10));
        self
    }

    /// The write-ahead log the slot may hold past the position the relay
    /// confirmed, in bytes (`None`: no cap).
    /// Past it, while the relay cannot confirm (a broker away, a relay
    /// stuck), the relay drops the slot rather than let it fill the
    /// server's disk, sends from the outbox as the polling relay does
    /// until nothing is left, then makes a new slot: nothing is lost, and
    /// the relay polls meanwhile.
    pub fn wal_cap(mut self, bytes: Option<u64>) -> Self {
        self.wal_cap = bytes;
        self
    }

    /// How often the slot's log is measured against the cap.
    pub fn guard_interval(mut self, d: Duration) -> Self {
        self.guard_interval = d.max(Duration::from_millis(10));
        self
    }

    /// How often, at most, the confirmed position is sent to the server.
    pub fn status_interval(mut self, d: Duration) -> Self {
        self.status_interval = d.max(Duration::from_millis(10));
        self
    }
}
