//! Test helpers for Tidings and for applications built on it.
//!
//! - [`services`]: isolated stores on the real services (a fresh PostgreSQL
//!   schema per test, a fresh SQLite file per test), with errors that name
//!   the service and the URL when it cannot be reached.
//! - [`conformance`]: the suite every transport must pass;
//!   [`database_log`] runs it over each dialect's database log.
//! - [`store_conformance`]: the suite every SQL dialect's store must pass
//!   (outbox and relays, the database log, the consumer runtime, dead
//!   letters and parking, leases and members, replay), run per dialect by
//!   [`store_conformance!`].
//! - [`faults`]: transport wrappers that inject the failures brokers really
//!   have: redelivered duplicates, publishes that fail.
//! - [`idempotency`]: a harness that delivers a handler's events twice, out
//!   of order across keys and around crashes, and compares the final state
//!   with a clean run's.
//! - [`outage`]: the broker-outage scenario every broker transport runs
//!   against a private server ([`nats::PrivateNats`], [`rabbitmq::PrivateRabbit`]).
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

pub mod conformance;
pub mod database_log;
pub mod faults;
pub mod freezable;
pub mod idempotency;
pub mod kafka;
pub mod nats;
pub mod otlp;
pub mod outage;
pub mod postgres;
pub mod pubsub;
pub mod rabbitmq;
pub mod services;
pub mod sqs;
pub mod store_conformance;
