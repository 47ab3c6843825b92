//! What a handler is, what it gets, and how it says what went wrong.

use std::error::Error as StdError;
use std::fmt;
use std::future::Future;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::{Database, Transaction};
use tidings_core::{DecodeError, Envelope, ErrorClass, Message, OutgoingMessage};

use crate::effects::IdempotencyKey;
use crate::store::ContextStore;

type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// Handles one message, inside the transaction the runtime opened for it.
///
/// Whatever the handler writes through [`Context::tx`] commits together
/// with the processed marker, so a redelivered duplicate changes nothing.
///
/// ```
/// use sqlx::Sqlite;
/// use tidings_consumer::{Context, Handler, HandlerError};
///
/// struct Analytics;
///
/// #[async_trait::async_trait]
/// impl Handler<Sqlite> for Analytics {
///     async fn handle(&self, ctx: &mut Context<'_, Sqlite>) -> Result<(), HandlerError> {
///         let kind = ctx.envelope().message_type.clone();
///         sqlx::query("INSERT INTO counts (kind, n) VALUES ($1, 1) ON CONFLICT (kind) DO UPDATE SET n = n + 1")
///             .bind(kind)
///             .execute(ctx.tx())
///             .await?;
///         Ok(())
///     }
/// }
/// ```
#[async_trait]
pub trait Handler<DB: Database>: Send + Sync + 'static {
    /// Handles the message in `ctx`. Return an error to roll back; its class decides what happens next.
    async fn handle(&self, ctx: &mut Context<'_, DB>) -> Result<(), HandlerError>;
}

/// A failed handler run, classified.
///
/// - [`HandlerError::transient`]: retried with backoff, then dead-lettered after the last attempt;
/// - [`HandlerError::retry_after`]: the same, waiting at least the given delay;
/// - [`HandlerError::permanent`]: dead-lettered at once.
///
/// `?` on a `sqlx::Error` leaves it to the store's database to classify
/// ([`Outbox::error_class`](tidings_core::Outbox::error_class)): lost races,
/// busy locks and connection faults are transient, constraint violations
/// permanent. The codes read are the store's database's: classify an error
/// of another database yourself ([`HandlerError::transient`],
/// [`HandlerError::permanent`]).
pub struct HandlerError {
    /// `None` for a database error: the store's dialect classifies it.
    class: Option<ErrorClass>,
    source: BoxError,
}

impl HandlerError {
    /// A passing failure: try again later.
    pub fn transient(source: impl Into<BoxError>) -> Self {
        HandlerError {
            class: Some(ErrorClass::Transient),
            source: source.into(),
        }
    }

    /// A failure that will not go away: dead-letter the message.
    pub fn permanent(source: impl Into<BoxError>) -> Self {
        HandlerError {
            class: Some(ErrorClass::Permanent),
            source: source.into(),
        }
    }

    /// Try again, but not before `delay`.
    pub fn retry_after(delay: Duration, source: impl Into<BoxError>) -> Self {
        HandlerError {
            class: Some(ErrorClass::RetryAfter(delay)),
            source: source.into(),
        }
    }

    /// How the runtime treats it, where the handler said so; `None` for a
    /// database error passed on with `?`, which the store's database
    /// classifies ([`HandlerError::class_with`]).
    pub fn class(&self) -> Option<ErrorClass> {
        self.class
    }

    /// How the runtime treats it, a database error classified by
    /// `database` (the store's [`Outbox::error_class`](tidings_core::Outbox::error_class)).
    pub fn class_with(&self, database: impl FnOnce(&sqlx::Error) -> ErrorClass) -> ErrorClass {
        match self.class {
            Some(class) => class,
            None => self
                .source
                .downcast_ref::<sqlx::Error>()
                .map_or(ErrorClass::Permanent, database),
        }
    }
}

impl fmt::Debug for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HandlerError")
            .field("class", &self.class)
            .field("source", &self.source)
            .finish()
    }
}

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.source)?;
        let mut cause = self.source.source();
        while let Some(c) = cause {
            write!(f, ": {c}")?;
            cause = c.source();
        }
        Ok(())
    }
}

impl StdError for HandlerError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&*self.source)
    }
}

impl From<sqlx::Error> for HandlerError {
    fn from(e: sqlx::Error) -> Self {
        HandlerError {
            class: None,
            source: Box::new(e),
        }
    }
}

impl From<tidings_core::Error> for HandlerError {
    fn from(e: tidings_core::Error) -> Self {
        HandlerError {
            class: Some(e.class()),
            source: Box::new(e),
        }
    }
}

impl From<DecodeError> for HandlerError {
    fn from(e: DecodeError) -> Self {
        HandlerError::permanent(e)
    }
}

/// What a handler gets: the message, the transaction, and helpers to emit
/// messages and perform side effects once.
pub struct Context<'a, DB: Database> {
    pub(crate) envelope: &'a Envelope,
    pub(crate) tx: &'a mut Transaction<'static, DB>,
    pub(crate) consumer: &'a str,
    pub(crate) source: &'a str,
    pub(crate) attempt: u32,
    pub(crate) store: &'a dyn ContextStore<DB>,
    pub(crate) emitted: bool,
}

impl<DB: Database> fmt::Debug for Context<'_, DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("consumer", &self.consumer)
            .field("envelope", self.envelope)
            .field("attempt", &self.attempt)
            .finish_non_exhaustive()
    }
}

impl<'a, DB: Database> Context<'a, DB> {
    /// The message being handled.
    pub fn envelope(&self) -> &Envelope {
        self.envelope
    }

    /// The handler's transaction: run the business writes on it.
    pub fn tx(&mut self) -> &mut DB::Connection {
        &mut *self.tx
    }

    /// This consumer's name.
    pub fn consumer(&self) -> &str {
        self.consumer
    }

    /// Which attempt this is, from 1.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// Decodes the payload as `M`; a mismatch is a permanent error.
    pub fn decode<M: Message>(&self) -> Result<M, HandlerError> {
        Ok(self.envelope.decode::<M>()?)
    }

    /// Emits `message` through the outbox, on the handler's transaction: it is
    /// sent if and only if this handler run commits. Its correlation id is the
    /// handled message's and its causation id the handled message's id.
    pub async fn emit<M: Message>(&mut self, message: &M) -> Result<(), HandlerError> {
        let envelope = Envelope::new(self.source, message)?.caused_by(self.envelope);
        let out = OutgoingMessage {
            topic: M::TOPIC.to_owned(),
            envelope,
        };
        self.store.enqueue(&mut *self.tx, &out).await?;
        self.emitted = true;
        Ok(())
    }

    /// Performs an outbound side effect at most once per (consumer, message, `effect`)
    /// as far as this system can tell, and exactly once where the provider honours
    /// idempotency keys.
    ///
    /// `call` receives a stable [`IdempotencyKey`] derived from (consumer,
    /// message id, effect). If the ledger already records the effect, `call`
    /// is not run and `None` is returned. Otherwise `call` runs and, if it
    /// succeeds, the effect is recorded on the handler's transaction.
    ///
    /// **The rule for partial failure:** the record commits with the handler's
    /// other writes. If the process dies (or the handler fails) after the
    /// provider accepted the call but before that commit, the next attempt
    /// calls the provider again *with the same key*, and the provider must
    /// treat it as the same request (Stripe, Adyen, most email and SMS APIs
    /// do). Never derive the key from anything else, and never call the
    /// provider without it.
    pub async fn once<T, F, Fut>(&mut self, effect: &str, call: F) -> Result<Option<T>, HandlerError>
    where
        F: FnOnce(IdempotencyKey) -> Fut + Send,
        Fut: Future<Output = Result<T, HandlerError>> + Send,
        T: Send,
    {
        let id = self.envelope.id;
        if self
            .store
            .effect_recorded(&mut *self.tx, self.consumer, id, effect)
            .await?
        {
            return Ok(None);
        }
        let key = IdempotencyKey::derive(self.consumer, id, effect);
        let value = call(key.clone()).await?;
        self.store
            .record_effect(&mut *self.tx, self.consumer, id, effect, key.as_str())
            .await?;
        Ok(Some(value))
    }
}
