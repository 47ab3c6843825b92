//! Checks a message must pass before the outbox accepts it.
//!
//! A store given a [`PublishGuard`] calls it in `enqueue`, before writing:
//! a refused message is never written, and the caller's transaction gets
//! the error ([`Error::Refused`](crate::Error::Refused)) while it can still
//! roll back. `tidings-schema`'s `SchemaGuard` is the one Tidings ships: it
//! validates payloads against the registered schemas and refuses likely
//! secrets.

use std::fmt;
use std::sync::Arc;

use crate::error::Result;
use crate::transport::OutgoingMessage;

/// Decides whether the outbox may accept a message.
pub trait PublishGuard: fmt::Debug + Send + Sync + 'static {
    /// `Ok` to accept `message`; [`Error::Refused`](crate::Error::Refused)
    /// naming the field and the rule to refuse it.
    fn check(&self, message: &OutgoingMessage) -> Result<()>;
}

/// The guard a store holds: none by default.
pub type Guard = Option<Arc<dyn PublishGuard>>;

/// Runs `guard` on `message`, if there is one.
pub fn check(guard: &Guard, message: &OutgoingMessage) -> Result<()> {
    match guard {
        Some(guard) => guard.check(message),
        None => Ok(()),
    }
}
