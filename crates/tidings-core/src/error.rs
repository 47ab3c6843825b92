//! Errors, and how each one says whether trying again can help.

use std::time::Duration;

/// What a caller should do about an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// A passing fault (network, lock, overload): try again after a backoff.
    Transient,
    /// Try again, but not before this delay (a rate limit, a `Retry-After`).
    RetryAfter(Duration),
    /// Trying again cannot help (bad input, a bug): dead-letter it.
    Permanent,
}

impl ErrorClass {
    /// Whether a retry may succeed.
    pub fn is_retryable(self) -> bool {
        !matches!(self, ErrorClass::Permanent)
    }
}

/// Why bytes could not become an [`Envelope`](crate::Envelope) or a typed message.
///
/// Always permanent: the same bytes will fail the same way.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The bytes are not a CloudEvents 1.0 message.
    #[error("malformed envelope: {reason}")]
    Malformed {
        /// What is wrong, naming the attribute.
        reason: String,
    },
    /// A consumer received a type it has no handler or decoder for.
    #[error("unexpected message type {found:?} (expected {expected:?})")]
    UnexpectedType {
        /// The type the code asked for.
        expected: String,
        /// The type the envelope carries.
        found: String,
    },
    /// The type is known but this version is not.
    #[error("{message_type} version {version} is not supported (this code reads version {supported})")]
    UnsupportedVersion {
        /// The message type.
        message_type: String,
        /// The version found.
        version: u32,
        /// The version the code reads.
        supported: u32,
    },
    /// An older version could not be brought up to the version the code reads.
    #[error("{message_type} version {version} could not be upcast to version {supported}: {reason}")]
    Upcast {
        /// The message type.
        message_type: String,
        /// The version found.
        version: u32,
        /// The version the code reads.
        supported: u32,
        /// The upcaster's complaint.
        reason: String,
    },
    /// The payload does not match the type's shape.
    #[error("invalid {message_type} v{version} payload: {reason}")]
    Payload {
        /// The message type.
        message_type: String,
        /// Its version.
        version: u32,
        /// The parser's complaint (field and position).
        reason: String,
    },
}

/// The error type of Tidings' stores, transports, relay and runtime.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A database statement failed. The driver's error is the
    /// [`source`](std::error::Error::source), printed with the chain
    /// ([`Error::report`]), not repeated in the message.
    ///
    /// Build it with [`Error::database`]: which driver errors are worth
    /// trying again is the database's own knowledge (its dialect's).
    #[error("database error while {operation}")]
    Database {
        /// What Tidings was doing (`claiming an outbox batch`).
        operation: &'static str,
        /// Whether trying again may help, as the database's dialect
        /// classified the driver's error.
        class: ErrorClass,
        /// The driver's error.
        #[source]
        source: sqlx::Error,
    },
    /// A message could not be decoded.
    #[error(transparent)]
    Decode(#[from] DecodeError),
    /// A transport (broker or database log) failed.
    ///
    /// Build it with [`Error::transport`] (a client or driver error caused
    /// it) or [`Error::transport_reason`] (nothing underneath). The message
    /// says what failed; the underlying error is the [`source`], not
    /// repeated in the message: print the chain (`{:#}` of `anyhow`, or
    /// walking [`std::error::Error::source`]) to see both.
    ///
    /// [`source`]: std::error::Error::source
    #[error("{transport} transport error: {reason}")]
    Transport {
        /// Which transport (`nats`, `pg-log`).
        transport: &'static str,
        /// What Tidings was doing, or what went wrong when there is no
        /// underlying error.
        reason: String,
        /// Whether trying again may help.
        retryable: bool,
        /// The client's or driver's error, if one caused it.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// A configuration value is wrong.
    #[error("invalid configuration {key}: {reason}")]
    Config {
        /// The option, e.g. `relay.batch_size`.
        key: String,
        /// Why it is refused.
        reason: String,
    },
    /// The outbox refused a message before writing it: its payload does not
    /// match the schema registered for its type and version, or looks like
    /// it carries a secret. Nothing was written; fix the producer.
    #[error("the outbox refused {message_type} v{version}: {reason}")]
    Refused {
        /// The message type.
        message_type: String,
        /// Its version.
        version: u32,
        /// Why, naming the field.
        reason: String,
    },
    /// The component was shut down.
    #[error("shut down")]
    Shutdown,
}

impl Error {
    /// A database error: what Tidings was doing, the class the database's
    /// dialect gave the driver's error, and the error.
    pub fn database(operation: &'static str, class: ErrorClass, source: sqlx::Error) -> Error {
        Error::Database {
            operation,
            class,
            source,
        }
    }

    /// A transport failure caused by `source`, a client or driver error:
    /// `what` says what Tidings was doing (`publishing`, `connecting to
    /// NATS at nats://host:4222`), without the source's text, which stays
    /// reachable as [`std::error::Error::source`]. `source` is any error,
    /// boxed or not (a client's `Box<dyn Error + Send + Sync>` too); text
    /// that is the whole story belongs in [`Error::transport_reason`]
    /// instead, or it would show only where the chain is printed.
    ///
    /// ```
    /// use std::error::Error as _;
    /// use tidings_core::Error;
    ///
    /// let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
    /// let e = Error::transport("nats", "connecting to NATS at nats://127.0.0.1:4222", io, true);
    /// assert_eq!(e.to_string(), "nats transport error: connecting to NATS at nats://127.0.0.1:4222");
    /// assert_eq!(e.source().unwrap().to_string(), "connection refused");
    /// assert!(e.class().is_retryable());
    /// ```
    pub fn transport(
        transport: &'static str,
        what: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
        retryable: bool,
    ) -> Error {
        Error::Transport {
            transport,
            reason: what.into(),
            retryable,
            source: Some(source.into()),
        }
    }

    /// A transport failure with no underlying error: `reason` says all
    /// there is (`no confirmation within 5s`, `switched off`).
    ///
    /// ```
    /// use tidings_core::Error;
    ///
    /// let e = Error::transport_reason("relay", "no confirmation within 5s", true);
    /// assert_eq!(e.to_string(), "relay transport error: no confirmation within 5s");
    /// assert!(std::error::Error::source(&e).is_none());
    /// ```
    pub fn transport_reason(transport: &'static str, reason: impl Into<String>, retryable: bool) -> Error {
        Error::Transport {
            transport,
            reason: reason.into(),
            retryable,
            source: None,
        }
    }

    /// Whether and when to try again.
    pub fn class(&self) -> ErrorClass {
        match self {
            Error::Database { class, .. } => *class,
            Error::Decode(_) => ErrorClass::Permanent,
            Error::Transport { retryable, .. } => {
                if *retryable {
                    ErrorClass::Transient
                } else {
                    ErrorClass::Permanent
                }
            }
            Error::Config { .. } | Error::Refused { .. } => ErrorClass::Permanent,
            Error::Shutdown => ErrorClass::Permanent,
        }
    }
}

/// An error with its whole chain of causes, each printed once
/// (`relay transport error: publishing: connection reset`): what logs show.
#[derive(Debug, Clone, Copy)]
pub struct Report<'a>(pub &'a (dyn std::error::Error + 'static));

impl std::fmt::Display for Report<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // A cause many errors already print in their own message (sqlx's
        // "error returned from database: ..."): each text once.
        let mut last = self.0.to_string();
        write!(f, "{last}")?;
        let mut next = self.0.source();
        while let Some(cause) = next {
            let text = cause.to_string();
            if !last.contains(&text) {
                write!(f, ": {text}")?;
                last = text;
            }
            next = cause.source();
        }
        Ok(())
    }
}

impl Error {
    /// The error and its causes, for a log line: `error = %e.report()`.
    pub fn report(&self) -> Report<'_> {
        Report(self)
    }
}

/// Shorthand for results in Tidings.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    /// `{:#}` of `anyhow`, or any report walking the sources.
    fn chain(e: &dyn std::error::Error) -> String {
        let mut out = e.to_string();
        let mut next = e.source();
        while let Some(cause) = next {
            out.push_str(": ");
            out.push_str(&cause.to_string());
            next = cause.source();
        }
        out
    }

    #[test]
    fn a_transport_error_prints_each_cause_once() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
        let e = Error::transport(
            "rabbitmq",
            "connecting to amqp://guest@127.0.0.1:5672/%2f",
            io,
            true,
        );
        assert_eq!(
            chain(&e),
            "rabbitmq transport error: connecting to amqp://guest@127.0.0.1:5672/%2f: connection refused"
        );
        assert_eq!(e.class(), ErrorClass::Transient);
        let boxed: Box<dyn std::error::Error + Send + Sync> = "no responders".into();
        let e = Error::transport("nats", "publishing", boxed, false);
        assert_eq!(chain(&e), "nats transport error: publishing: no responders");
        assert_eq!(e.class(), ErrorClass::Permanent);
        let e = Error::transport_reason("relay", "no confirmation within 5s", true);
        assert_eq!(chain(&e), "relay transport error: no confirmation within 5s");
    }

    /// An error that prints its source in its own message, as sqlx's do.
    #[derive(Debug)]
    struct Loud(std::io::Error);

    impl std::fmt::Display for Loud {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "error returned from database: {}", self.0)
        }
    }

    impl std::error::Error for Loud {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn a_report_prints_a_cause_its_error_already_printed_once() {
        let io = std::io::Error::other("sorry, too many clients already");
        let e = Error::transport("postgres", "connecting", Loud(io), true);
        assert_eq!(
            e.report().to_string(),
            "postgres transport error: connecting: error returned from database: sorry, too many clients already"
        );
    }
}
