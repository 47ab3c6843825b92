//! Tidings' console: the pipeline on one page for whoever is on call.
//!
//! An axum [`Router`] over any store: an overview (the outbox backlog per
//! partition and its relays, each consumer group's lag, held keys, parked
//! messages and members, the dead letters waiting), the dead letters
//! grouped by cause with filters, one letter in full with its likely
//! secrets masked; and the JSON API under `/api/` the pages read and
//! `tidings` commands call, where redrive, skip, purge and an edited
//! redrive need an operator's bearer token ([`Access`]). An edit is
//! accepted only against the schema registry the console is given
//! ([`Console::schemas`]).
//!
//! The pages are rendered on the server and read without JavaScript.
//!
//! ```no_run
//! # async fn run(store: impl tidings_console::ConsoleStore) -> std::io::Result<()> {
//! use tidings_console::{Access, Console};
//! let access = Access::from_env_and_file(None).expect("tokens");
//! let app = Console::new(store, access).router();
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:9470").await?;
//! tidings_console::serve(listener, app, std::future::pending()).await;
//! # Ok(()) }
//! ```
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

pub mod access;
pub mod actions;
mod api;
pub mod doctor;
pub mod history;
pub mod letter;
mod openapi;
pub mod outbox;
pub mod overview;
mod pages;
pub mod replay;
mod session;
pub mod triage;

use std::future::Future;
use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use tidings_core::inspect::Inspect;
use tidings_core::metrics::BrokerLag;
use tidings_core::replay::ReplayStore;
use tidings_core::{AuditStore, ConsumerStore, FailureStore};
use tokio::net::TcpListener;

pub use access::{Access, Caller, Role};
pub use actions::Schemas;
pub use api::{ApiError, CSRF_HEADER};
pub use overview::Overview;
pub use session::COOKIE_NAME;

/// The most dead letters one request reads, the newest first: a page, a
/// list or an action over more reads the newest this many (and says so).
pub const READ_LIMIT: u32 = 10_000;

/// The largest request body accepted (a redrive's selection is small).
pub const BODY_LIMIT: usize = 64 * 1024;

/// The largest body of an edit (an edited payload, or the page's form
/// holding one): the size brokers commonly take for one message.
pub const EDIT_BODY_LIMIT: usize = 1024 * 1024;

/// What a console serves: a store, who may act on it, the outbox's
/// partition count (else read from the relays' leases), and the schemas
/// edits are checked against.
pub struct Console<S> {
    store: Arc<S>,
    access: Access,
    partitions: Option<u32>,
    schemas: Option<Arc<actions::Schemas>>,
    sessions: session::Sessions,
    history: history::History,
    broker: BrokerLag,
    cdc_group: Option<String>,
}

impl<S> std::fmt::Debug for Console<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Console")
            .field("access", &self.access)
            .field("partitions", &self.partitions)
            .field("schemas", &self.schemas)
            .finish_non_exhaustive()
    }
}

impl<S> Clone for Console<S> {
    fn clone(&self) -> Self {
        Console {
            store: self.store.clone(),
            access: self.access.clone(),
            partitions: self.partitions,
            schemas: self.schemas.clone(),
            sessions: self.sessions.clone(),
            history: self.history.clone(),
            broker: self.broker.clone(),
            cdc_group: self.cdc_group.clone(),
        }
    }
}

/// What the console needs of a store.
pub trait ConsoleStore: Inspect + FailureStore + ConsumerStore + AuditStore + ReplayStore {}
impl<S: Inspect + FailureStore + ConsumerStore + AuditStore + ReplayStore> ConsoleStore for S {}

impl<S: ConsoleStore> Console<S> {
    /// A console over `store`, letting in whom `access` names.
    pub fn new(store: S, access: Access) -> Console<S> {
        Console {
            store: Arc::new(store),
            access,
            partitions: None,
            schemas: None,
            sessions: session::Sessions::default(),
            history: history::History::default(),
            broker: BrokerLag::default(),
            cdc_group: None,
        }
    }

    /// The consumer groups' counts on the broker, as the daemon's sampler
    /// measures them ([`tidings_core::metrics::sample_broker_lag`]): the
    /// overview shows them for the groups the store cannot count.
    pub fn broker_lag(mut self, lag: BrokerLag) -> Console<S> {
        self.broker = lag;
        self
    }

    /// The outbox's partition count (`outbox.partitions`).
    pub fn partitions(mut self, count: u32) -> Console<S> {
        self.partitions = Some(count);
        self
    }

    /// The relay group whose CDC relay runs here (`relay.mode = "cdc"`):
    /// the checklist (`GET /api/doctor`) then checks that it streams its slot.
    pub fn cdc_group(mut self, group: impl Into<String>) -> Console<S> {
        self.cdc_group = Some(group.into());
        self
    }

    /// The schemas ([`Schemas::load`]) an edited dead letter's payload
    /// must match, by its type and version. Without them, no dead letter
    /// can be edited.
    pub fn schemas(mut self, schemas: Schemas) -> Console<S> {
        self.schemas = Some(Arc::new(schemas));
        self
    }

    /// Samples the overview's figures every `every` for its charts, until
    /// `stop` completes. Run it beside the router.
    pub fn sample<F>(
        &self,
        every: std::time::Duration,
        stop: F,
    ) -> impl Future<Output = ()> + Send + use<S, F>
    where
        F: Future<Output = ()> + Send,
    {
        let (store, history, broker) = (self.store.clone(), self.history.clone(), self.broker.clone());
        async move { history.run(&*store, &broker, every, stop).await }
    }

    /// The overview as the store, the broker's last counts and the last
    /// sample give it.
    async fn overview(&self) -> tidings_core::Result<Overview> {
        Ok(Overview::read(&*self.store, self.partitions)
            .await?
            .with_broker_lag(&self.broker)
            .with_rates(self.history.last().as_ref()))
    }

    /// The pages and the API.
    pub fn router(self) -> Router {
        Router::new()
            .merge(pages::routes::<S>())
            .nest("/api", api::routes::<S>())
            .layer(DefaultBodyLimit::max(BODY_LIMIT))
            .layer(axum::middleware::from_fn_with_state(
                self.clone(),
                loopback_names::<S>,
            ))
            .layer(axum::middleware::map_response(guard_headers))
            .with_state(self)
    }
}

/// Where reading needs no token (a console on the loopback interface),
/// a request must name a loopback host: a page of another site that
/// points its own name at 127.0.0.1 (DNS rebinding) is refused, not read.
async fn loopback_names<S>(
    axum::extract::State(console): axum::extract::State<Console<S>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse as _;
    if console.access.reading_needs_token() {
        return next.run(request).await;
    }
    let host = request
        .headers()
        .get(axum::http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("");
    if is_loopback_host(host) {
        return next.run(request).await;
    }
    ApiError::new(
        axum::http::StatusCode::MISDIRECTED_REQUEST,
        "this console reads without a token, so it answers only requests for a loopback name (localhost, 127.0.0.1, [::1]); \
         behind a proxy, set [console] reads_need_token = true",
    )
    .into_response()
}

/// Whether `host` (a Host header: a name or address, maybe with a port)
/// names this machine's loopback interface.
fn is_loopback_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    name.eq_ignore_ascii_case("localhost")
        || name.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// What every answer carries: the pages load nothing from elsewhere, run
/// no inline script, and are never framed or sniffed.
async fn guard_headers(mut response: axum::response::Response) -> axum::response::Response {
    use axum::http::{HeaderValue, header};
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    // Not `no-referrer`: under it a browser sends `Origin: null` even on
    // the console's own forms, which sign-in refuses as foreign. Under
    // `same-origin` the console's own requests carry its origin, and no
    // other site is told a console address.
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("same-origin"));
    headers
        .entry(header::CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-store"));
    response
}

/// Serves `app` on `listener` until `shutdown` (with a header timeout and a
/// connection cap: see `tidings_http`).
pub async fn serve(listener: TcpListener, app: Router, shutdown: impl Future<Output = ()> + Send) {
    tidings_http::serve(listener, app, shutdown).await;
}

#[cfg(test)]
mod tests {
    #[test]
    fn loopback_hosts_are_names_of_this_machine() {
        for host in [
            "127.0.0.1:9470",
            "localhost:9470",
            "LOCALHOST",
            "[::1]:9470",
            "127.0.0.2",
        ] {
            assert!(super::is_loopback_host(host), "{host}");
        }
        for host in [
            "evil.example:9470",
            "",
            "10.0.0.1:9470",
            "[2001:db8::1]:80",
            "localhost.evil.example",
        ] {
            assert!(!super::is_loopback_host(host), "{host}");
        }
    }
}
