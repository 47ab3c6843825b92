//! The database-log transport, written once for every database.
//!
//! A store crate provides a [`LogBackend`]: append to a table, read it
//! after a position, keep per-group offsets. [`LogPublisher`] and
//! [`LogSubscriber`] turn that into a [`Publisher`] and a [`Subscriber`]
//! with the same semantics as a broker:
//!
//! - a group's offset only moves past a message once it and every message
//!   before it were settled, so a crash redelivers, never skips;
//! - a `Nak(delay)` redelivers the message after the delay (in this process),
//!   keeping the offset behind it;
//! - a bounded window of unsettled messages gives backpressure.
//!
//! The backend decides what a position is. On PostgreSQL it is the pair
//! (transaction id, sequence), read only below the oldest transaction still
//! running, so a row that commits late with a low sequence number is never
//! passed over (the gap that loses messages in naive log tables).
//!
//! The contract itself ([`LogBackend`], [`LogPosition`], [`LogEntry`]) is
//! `tidings_core::log`, which the SQL dialects implement.
//!
//! [`LogBackend`]: tidings_core::log::LogBackend
//! [`LogPosition`]: tidings_core::log::LogPosition
//! [`LogEntry`]: tidings_core::log::LogEntry
//! [`Publisher`]: tidings_core::Publisher
//! [`Subscriber`]: tidings_core::Subscriber
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

mod acker;
mod config;
mod publisher;
mod reader;
mod subscriber;
mod window;

pub use config::LogReaderConfig;
pub use publisher::LogPublisher;
pub use subscriber::LogSubscriber;
