//! Which database errors are worth trying again.
//!
//! A dropped connection, a pool that ran dry or timed out, a TLS or
//! protocol fault: these are the same on every database, and transient. A
//! database's own error codes are its dialect's to read
//! ([`Dialect::transient`]): which mean a lost race (a serialization
//! failure, a deadlock), a busy lock or a server going down. Everything
//! else (a constraint violation, a row that does not decode) is a bug or
//! bad data, and permanent.

use sqlx::Error as E;
use tidings_core::{Error, ErrorClass};

use crate::Dialect;

/// The class of `error`, an error of `D`'s database.
pub fn classify<D: Dialect>(error: &sqlx::Error) -> ErrorClass {
    match error {
        E::Io(_) | E::Tls(_) | E::Protocol(_) | E::PoolTimedOut | E::PoolClosed | E::WorkerCrashed => {
            ErrorClass::Transient
        }
        E::Database(db) if D::transient(db.as_ref()) => ErrorClass::Transient,
        _ => ErrorClass::Permanent,
    }
}

/// Wraps an error of `D`'s database with what Tidings was doing, classified:
/// `.map_err(db_error::<D>("claiming an outbox batch"))`.
pub fn db_error<D: Dialect>(operation: &'static str) -> impl FnOnce(sqlx::Error) -> Error {
    move |source| Error::database(operation, classify::<D>(&source), source)
}

/// Wraps an error of appending to `D`'s database log as the log
/// transport's (`pg-log`), classified: `what` says what failed.
pub fn log_error<D: Dialect>(what: impl Into<String>) -> impl Fn(sqlx::Error) -> Error {
    let what = what.into();
    move |source| {
        let retryable = classify::<D>(&source).is_retryable();
        Error::transport(D::LOG_TRANSPORT, what.clone(), source, retryable)
    }
}
