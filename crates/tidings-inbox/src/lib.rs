//! The webhook inbox: deliveries from a payment provider, a forge or any
//! service that signs its webhooks, each taken once as a Tidings event.
//!
//! [`Inbox::router`] is an axum router with one route, `POST /{provider}`.
//! For each delivery it:
//!
//! 1. reads the body within its size limit and the request timeout
//!    (`413`, `408`);
//! 2. verifies the provider's signature in constant time ([`signature`];
//!    `401`, nothing stored, and neither the signature nor the secret in
//!    any log or answer);
//! 3. reads the provider's event id, type and key from the delivery
//!    (`400` with the reason when the body is not JSON or lacks them);
//! 4. in one transaction, records (provider, event id) in `tidings_inbox`
//!    and enqueues the event to the outbox, then commits;
//! 5. answers `200` only after that commit. A delivery seen before is
//!    answered `200` too, and changes nothing. Where the event id is a
//!    header the signature does not cover, the body is recorded too, and
//!    the same signed body under another id is refused (`409`): a replay. A database that fails or
//!    does not answer within the timeout gets `503` (`500` for an error
//!    trying again cannot fix), so the provider retries later.
//!
//! [`serve`] serves the router on a socket open to the internet: clients
//! slow to send their headers are cut off, connections are capped, and a
//! shutdown waits a bounded time for deliveries in flight.
//!
//! The event's id is derived from (provider, event id) as
//! [`cloudevents::foreign_id`](tidings_core::cloudevents::foreign_id)
//! derives it, so the consumers downstream deduplicate it too; the
//! provider's own id is in the header `tidingsforeignid`
//! ([`Envelope::event_id`](tidings_core::Envelope::event_id)). The payload
//! is the body as the provider sent it.
//!
//! ```no_run
//! use tidings_inbox::{Inbox, Provider, secret_from_env};
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let store = tidings_store_sqlite::SqliteStore::connect("sqlite://tidings.db").await?;
//! store.migrate().await?;
//! let webhooks = Inbox::new(store)
//!     .provider(Provider::stripe(secret_from_env("STRIPE_WEBHOOK_SECRET")?).topic("payments"))
//!     .router()?;
//! // In the service's own app: Stripe delivers to POST /webhooks/stripe.
//! let app = axum::Router::new().nest("/webhooks", webhooks);
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! axum::serve(listener, app).await?;
//! # Ok(()) }
//! ```
//!
//! [`Provider::cloudevents`] takes CloudEvents over HTTP from another
//! service instead, in every mode of the HTTP binding (binary, structured,
//! batch), authenticated by a bearer token; each event keeps what its
//! producer wrote and is taken once per (`source`, `id`), a batch in one
//! transaction.
//!
//! The `tidings` crate re-exports this crate as `tidings::inbox` (feature
//! `inbox`), and `tidings run` serves it from its configuration.
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

mod cloudevents;
mod config;
mod deliver;
mod provider;
pub mod signature;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicI64;
use std::time::Duration;

use axum::Router;
use axum::routing::post;
use tidings_core::{Error, InboxStore, Result};

pub use config::{KeySetting, ProviderConfig, SchemeName};
pub use provider::{Provider, secret_from_env, secret_from_file};
pub use signature::{Encoding, Scheme, SignatureError};
pub use tidings_core::field::Field;
/// Serving the router on a socket facing the internet (`tidings-http`).
pub use tidings_http::{ServeLimits, serve, serve_with};

/// The longest event id, message type or key read from a delivery, in
/// characters.
pub const MAX_ID_CHARS: usize = 255;

/// The most CloudEvents one batch may carry; a larger batch gets `413`.
pub const MAX_BATCH_EVENTS: usize = 1000;

/// How often an inbox deletes deliveries past its retention, at most.
const FORGET_EVERY: Duration = Duration::from_secs(3600);

/// How many deliveries one deletion pass removes, at most.
const FORGET_BATCH: usize = 10_000;

/// A webhook inbox over a store: the providers it accepts and its limits.
/// Build the router with [`Inbox::router`].
#[derive(Debug)]
pub struct Inbox<S> {
    store: S,
    providers: Vec<Provider>,
    body_limit: usize,
    timeout: Duration,
    retention: Option<Duration>,
}

/// What every request of one router shares.
#[derive(Debug)]
pub(crate) struct Shared<S> {
    pub(crate) store: S,
    pub(crate) providers: HashMap<String, Provider>,
    pub(crate) body_limit: usize,
    pub(crate) timeout: Duration,
    pub(crate) retention: Option<Duration>,
    /// When deliveries past the retention were last deleted (Unix seconds).
    pub(crate) last_forget: AtomicI64,
}

impl<S: InboxStore + Clone> Inbox<S> {
    /// An inbox writing to `store`, with no provider yet, a 1 MiB body
    /// limit, a 10 s request timeout and a 30-day retention.
    pub fn new(store: S) -> Inbox<S> {
        Inbox {
            store,
            providers: Vec::new(),
            body_limit: 1024 * 1024,
            timeout: Duration::from_secs(10),
            retention: Some(Duration::from_secs(30 * 24 * 3600)),
        }
    }

    /// Accepts deliveries from `provider` at `POST /<its name>`.
    pub fn provider(mut self, provider: Provider) -> Inbox<S> {
        self.providers.push(provider);
        self
    }

    /// The largest body accepted, in bytes; larger ones get `413`.
    pub fn body_limit(mut self, bytes: usize) -> Inbox<S> {
        self.body_limit = bytes;
        self
    }

    /// How long a delivery may take, from the moment its handler starts
    /// (the headers read) to the commit. Providers give up after about ten
    /// seconds.
    pub fn timeout(mut self, timeout: Duration) -> Inbox<S> {
        self.timeout = timeout;
        self
    }

    /// How long accepted deliveries are remembered, so that a retry is
    /// recognised (`None`: forever). Keep it longer than the provider
    /// retries: Stripe retries for three days.
    pub fn retention(mut self, retention: Option<Duration>) -> Inbox<S> {
        self.retention = retention;
        self
    }

    /// The router: `POST /{provider}` for each provider. Nest it where the
    /// providers are told to deliver (`/webhooks`).
    ///
    /// Refuses a provider that cannot serve (an empty secret, a name that
    /// is not a path segment) or two of the same name.
    pub fn router(self) -> Result<Router> {
        let mut providers = HashMap::with_capacity(self.providers.len());
        for provider in self.providers {
            provider.check()?;
            let name = provider.name.clone();
            if providers.insert(name.clone(), provider).is_some() {
                return Err(Error::Config {
                    key: format!("inbox provider {name:?}"),
                    reason: "two providers have this name: rename one (Provider::named)".into(),
                });
            }
        }
        deliver::count_from_zero(providers.keys().map(String::as_str));
        let shared = Arc::new(Shared {
            store: self.store,
            providers,
            body_limit: self.body_limit,
            timeout: self.timeout,
            retention: self.retention,
            last_forget: AtomicI64::new(0),
        });
        Ok(Router::new()
            .route("/{provider}", post(deliver::handle::<S>))
            .with_state(shared))
    }
}
