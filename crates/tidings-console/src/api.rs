//! The JSON API under `/api/`: what the pages show and what the `tidings`
//! commands call against a running daemon. Reading needs a token only where
//! the console was set so ([`Access::reads_need_token`]); redrive, skip,
//! purge, an edited redrive, and asking for or cancelling a replay need an
//! operator's, or are refused with 401 (no valid token) or 403 (a
//! reader's), changing nothing.

use std::time::Duration;

use axum::Json;
use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use tidings_core::inspect::ReplicationSlot;
use tidings_core::replay::Replay;
use uuid::Uuid;

use crate::access::{Caller, Role};
use crate::actions::{
    self, EditRequest, Edited, PurgeRequest, Purged, RedriveReport, RedriveRequest, Skipped,
};
use crate::doctor::{Check, Limits};
use crate::letter::LetterView;
use crate::openapi::{Access, Endpoint, SchemaFn, schema_of};
use crate::outbox::{OutboxQuery, OutboxStatus};
use crate::overview::Overview;
use crate::replay::{ReplayAsk, Replayed};
use crate::triage::{self, CauseGroup, Selection};
use crate::{Console, ConsoleStore};

/// Declares every endpoint once, for both the router and the OpenAPI
/// document: `method "path" handler, "summary", access, query, body, answer`
/// (`_` where it reads no query string or no body), then `, limit BYTES`
/// where its body may be larger than [`crate::BODY_LIMIT`].
macro_rules! endpoints {
    ($( $method:ident $path:literal $handler:ident, $summary:literal, $access:ident, $query:tt, $body:tt, $answer:ty $(, limit $limit:expr)?; )*) => {
        pub(crate) fn routes<S: ConsoleStore>() -> axum::Router<Console<S>> {
            axum::Router::new()
                $( .route($path, $method($handler::<S>) $(.layer(axum::extract::DefaultBodyLimit::max($limit)))?) )*
                .route("/openapi.json", get(openapi::<S>))
                .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "no such API path") })
                .method_not_allowed_fallback(|| async {
                    ApiError::new(
                        StatusCode::METHOD_NOT_ALLOWED,
                        "this API path does not answer that method (see /api/openapi.json)",
                    )
                })
        }

        /// What the router serves, as the OpenAPI document describes it.
        pub(crate) fn endpoints() -> Vec<Endpoint> {
            vec![$(Endpoint {
                method: stringify!($method),
                path: $path,
                summary: $summary,
                access: Access::$access,
                query: endpoints!(@schema $query),
                body: endpoints!(@schema $body),
                answer: schema_of::<$answer>,
            }),*]
        }
    };
    (@schema _) => { None };
    (@schema $t:ty) => { Some(schema_of::<$t> as SchemaFn) };
}

endpoints! {
    get "/overview" overview, "The overview: outbox backlog per partition, relays, consumer groups, dead letters waiting, relay holds, replication slots.", Read, _, _, Overview;
    get "/outbox" outbox, "The figures of `tidings outbox status`: the backlog per partition, its relays, and the rates over a window it watches.", Read, OutboxQuery, _, OutboxStatus;
    get "/lag" lag, "The figures of `tidings lag`, as its `--json` prints them.", Read, _, _, tidings_core::LagReport;
    get "/causes" causes, "Dead letters grouped by cause, as `tidings dlq list --json` prints them.", Read, Selection, _, Vec<CauseGroup>;
    get "/dead-letters" letters, "The dead letters of a selection, one by one, masked.", Read, Selection, _, Vec<LetterView>;
    get "/dead-letters/{id}" letter, "One dead letter in full, masked, with its edits.", Read, _, _, LetterView;
    post "/dead-letters/{id}/skip" skip, "Skips one dead letter, releasing the key it holds; audited.", Operate, _, _, Skipped;
    post "/dead-letters/{id}/edit" edit, "Redrives one dead letter with an edited payload, checked against its schema; audited.", Operate, _, EditRequest, Edited, limit crate::EDIT_BODY_LIMIT;
    post "/redrive" redrive, "Redrives dead letters (ids, a selection, or all) at a rate; audited.", Operate, _, RedriveRequest, RedriveReport;
    post "/purge" purge, "Deletes the settled dead letters of a selection (or all); audited.", Operate, _, PurgeRequest, Purged;
    get "/audit" audit, "The audit trail, newest first.", Read, AuditQuery, _, Vec<tidings_core::AuditEntry>;
    get "/messages/{id}" message, "A message's story: outbox, handled, effects, dead letters, parked.", Read, _, _, tidings_core::inspect::MessageTrace;
    get "/keys/{key}" key, "The stories of a key's messages, oldest first (200 at most).", Read, _, _, Vec<tidings_core::inspect::MessageTrace>;
    post "/replays" replay_ask, "Asks for a replay of a consumer's retained events (or counts it, with dry_run); a running member carries it out; audited.", Operate, _, ReplayAsk, Replayed;
    get "/replays/{id}" replay_get, "Where a replay stands: its state and counts so far.", Read, _, _, Replay;
    post "/replays/{id}/cancel" replay_cancel, "Cancels a replay that has not ended; audited.", Operate, _, _, Replay;
    get "/slots" slots, "The database's replication slots (CDC relays'), with the log each keeps and what its reader has not confirmed.", Read, _, _, Vec<ReplicationSlot>;
    get "/doctor" doctor, "The checklist of `tidings doctor` that a store answers (and the CDC relay's slot, when one runs here), under the thresholds given.", Read, Limits, _, Vec<Check>;
    get "/history" history, "The last hour of the overview's figures, as sampled.", Read, _, _, Vec<crate::history::Sample>;
}

/// The OpenAPI document of this API, to whoever may read.
async fn openapi<S: ConsoleStore>(_: Reading, State(console): State<Console<S>>) -> Json<serde_json::Value> {
    Json(crate::openapi::document(
        &endpoints(),
        console.access.reading_needs_token(),
    ))
}

/// An API refusal or failure: its status, and `{"error": "..."}`.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    message: String,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
        }
    }

    /// Its status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// What it says.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ApiError {}

impl From<tidings_core::Error> for ApiError {
    /// The cause goes to the log, not to the caller: a database's error
    /// can name its host, its user or a value.
    fn from(e: tidings_core::Error) -> Self {
        tracing::warn!(error = %e.report(), "the console could not read or write the database");
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("{e}: the database did not answer; the console's log says why"),
        )
    }
}

impl From<JsonRejection> for ApiError {
    /// A body that is not JSON (415), does not parse (400) or does not fit
    /// (422): the status axum chose, and what it found wrong.
    fn from(rejection: JsonRejection) -> Self {
        ApiError::new(
            rejection.status(),
            format!("the request's body: {}", rejection.body_text()),
        )
    }
}

impl From<QueryRejection> for ApiError {
    fn from(rejection: QueryRejection) -> Self {
        ApiError::new(
            rejection.status(),
            format!("the query string: {}", rejection.body_text()),
        )
    }
}

impl From<PathRejection> for ApiError {
    fn from(rejection: PathRejection) -> Self {
        ApiError::new(rejection.status(), format!("the path: {}", rejection.body_text()))
    }
}

/// axum's `Json`, refused with an [`ApiError`] rather than plain text.
#[derive(Debug)]
pub(crate) struct JsonBody<T>(pub(crate) T);

impl<T, St> FromRequest<St> for JsonBody<T>
where
    Json<T>: FromRequest<St, Rejection = JsonRejection>,
    St: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &St) -> Result<Self, ApiError> {
        let Json(value) = Json::<T>::from_request(request, state).await?;
        Ok(JsonBody(value))
    }
}

/// axum's `Query`, refused with an [`ApiError`] rather than plain text.
#[derive(Debug)]
pub(crate) struct Query<T>(pub(crate) T);

impl<T, St> FromRequestParts<St> for Query<T>
where
    axum::extract::Query<T>: FromRequestParts<St, Rejection = QueryRejection>,
    St: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &St) -> Result<Self, ApiError> {
        let axum::extract::Query(value) = axum::extract::Query::<T>::from_request_parts(parts, state).await?;
        Ok(Query(value))
    }
}

/// axum's `Path`, refused with an [`ApiError`] rather than plain text.
#[derive(Debug)]
pub(crate) struct Path<T>(pub(crate) T);

impl<T, St> FromRequestParts<St> for Path<T>
where
    axum::extract::Path<T>: FromRequestParts<St, Rejection = PathRejection>,
    St: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &St) -> Result<Self, ApiError> {
        let axum::extract::Path(value) = axum::extract::Path::<T>::from_request_parts(parts, state).await?;
        Ok(Path(value))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(serde_json::json!({ "error": self.message }))).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

/// Who sent a request: its bearer token's holder, else its session's (with
/// the session's anti-forgery token); nobody when it has neither.
pub(crate) fn caller<S>(
    parts: &Parts,
    console: &Console<S>,
) -> Result<Option<(Caller, Option<String>)>, ApiError> {
    if let Some(value) = parts.headers.get(header::AUTHORIZATION) {
        let token = value
            .to_str()
            .ok()
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .ok_or_else(|| {
                ApiError::new(
                    StatusCode::UNAUTHORIZED,
                    "the Authorization header must be `Bearer <token>`",
                )
            })?;
        return match console.access.caller(token) {
            Some(caller) => Ok(Some((caller, None))),
            None => Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "the bearer token is not one this console accepts",
            )),
        };
    }
    Ok(console
        .sessions
        .of(&parts.headers)
        .map(|s| (s.caller, Some(s.csrf))))
}

/// A request allowed to read, and who sent it, if anyone said.
#[derive(Debug)]
pub(crate) struct Reading(pub(crate) Option<(Caller, Option<String>)>);

impl<S: ConsoleStore> FromRequestParts<Console<S>> for Reading {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, console: &Console<S>) -> Result<Self, ApiError> {
        match caller(parts, console)? {
            None if console.access.reading_needs_token() => Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "this console needs a token to read: sign in at /login, or send Authorization: Bearer <token>",
            )),
            who => Ok(Reading(who)),
        }
    }
}

/// The header a signed-in page's script sends its anti-forgery token in.
pub const CSRF_HEADER: &str = "x-csrf-token";

/// A request from an operator: by bearer token, or by a session whose
/// anti-forgery token the request carries in [`CSRF_HEADER`].
#[derive(Debug)]
pub(crate) struct Operating(pub(crate) Caller);

impl<S: ConsoleStore> FromRequestParts<Console<S>> for Operating {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, console: &Console<S>) -> Result<Self, ApiError> {
        let (caller, csrf) = caller(parts, console)?.ok_or_else(|| {
            ApiError::new(
                StatusCode::UNAUTHORIZED,
                "changing anything (dead letters, replays) needs an operator's bearer token (Authorization: Bearer <token>)",
            )
        })?;
        if let Some(expected) = csrf {
            let sent = parts.headers.get(CSRF_HEADER).and_then(|v| v.to_str().ok());
            if !sent.is_some_and(|sent| crate::session::same(sent, &expected)) {
                return Err(ApiError::new(
                    StatusCode::FORBIDDEN,
                    "a signed-in request that changes something must carry the page's anti-forgery token",
                ));
            }
        }
        operator(caller).map(Operating)
    }
}

/// `caller`, if an operator.
pub(crate) fn operator(caller: Caller) -> Result<Caller, ApiError> {
    if caller.role >= Role::Operator {
        Ok(caller)
    } else {
        Err(ApiError::new(
            StatusCode::FORBIDDEN,
            format!(
                "`{}` is a reader: changing anything (dead letters, replays) needs an operator's token",
                caller.name
            ),
        ))
    }
}

/// A selection in a query string, refused with 400 when it does not parse.
type SelectionQuery = Query<Selection>;

async fn overview<S: ConsoleStore>(
    _: Reading,
    State(console): State<Console<S>>,
) -> Result<Json<Overview>, ApiError> {
    Ok(Json(console.overview().await?))
}

/// The figures of `tidings lag`, as its `--json` prints them.
async fn lag<S: ConsoleStore>(
    _: Reading,
    State(console): State<Console<S>>,
) -> Result<Json<tidings_core::LagReport>, ApiError> {
    Ok(Json(console.store.lag().await?))
}

async fn causes<S: ConsoleStore>(
    _: Reading,
    State(console): State<Console<S>>,
    Query(selection): SelectionQuery,
) -> Result<Json<Vec<CauseGroup>>, ApiError> {
    let letters = selection
        .letters_within(&*console.store, Some(crate::READ_LIMIT))
        .await?;
    Ok(Json(
        triage::by_cause(&letters)
            .into_iter()
            .map(masked_example)
            .collect(),
    ))
}

async fn letters<S: ConsoleStore>(
    _: Reading,
    State(console): State<Console<S>>,
    Query(selection): SelectionQuery,
) -> Result<Json<Vec<LetterView>>, ApiError> {
    let letters = selection
        .letters_within(&*console.store, Some(crate::READ_LIMIT))
        .await?;
    Ok(Json(letters.iter().map(LetterView::masked).collect()))
}

async fn letter<S: ConsoleStore>(
    _: Reading,
    State(console): State<Console<S>>,
    Path(id): Path<Uuid>,
) -> Result<Json<LetterView>, ApiError> {
    match console.store.letter(id).await? {
        Some(letter) => {
            let edits = console.store.edits(id).await?;
            Ok(Json(LetterView::masked(&letter).with_edits(&letter, &edits)))
        }
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("no dead letter has id {id}"),
        )),
    }
}

/// `{"data": ...}`: redrives the letter with that payload, once it passes
/// its schema; 422 when it does not (or has none), 409 when the letter is
/// settled already, changing nothing.
async fn edit<S: ConsoleStore>(
    Operating(caller): Operating,
    State(console): State<Console<S>>,
    Path(id): Path<Uuid>,
    JsonBody(request): JsonBody<EditRequest>,
) -> Result<Json<Edited>, ApiError> {
    let schemas = console.schemas.as_deref();
    Ok(Json(
        actions::edit(&*console.store, schemas, &caller, id, &request).await?,
    ))
}

async fn redrive<S: ConsoleStore>(
    Operating(caller): Operating,
    State(console): State<Console<S>>,
    JsonBody(request): JsonBody<RedriveRequest>,
) -> Result<Json<RedriveReport>, ApiError> {
    Ok(Json(actions::redrive(&*console.store, &caller, &request).await?))
}

async fn skip<S: ConsoleStore>(
    Operating(caller): Operating,
    State(console): State<Console<S>>,
    Path(id): Path<Uuid>,
) -> Result<Json<Skipped>, ApiError> {
    Ok(Json(actions::skip(&*console.store, &caller, id).await?))
}

async fn purge<S: ConsoleStore>(
    Operating(caller): Operating,
    State(console): State<Console<S>>,
    JsonBody(request): JsonBody<PurgeRequest>,
) -> Result<Json<Purged>, ApiError> {
    Ok(Json(actions::purge(&*console.store, &caller, &request).await?))
}

async fn replay_ask<S: ConsoleStore>(
    Operating(caller): Operating,
    State(console): State<Console<S>>,
    JsonBody(ask): JsonBody<ReplayAsk>,
) -> Result<Json<Replayed>, ApiError> {
    let role = caller.role.to_string();
    Ok(Json(
        crate::replay::ask(&*console.store, &ask, &caller.name, &role).await?,
    ))
}

async fn replay_get<S: ConsoleStore>(
    _: Reading,
    State(console): State<Console<S>>,
    Path(id): Path<Uuid>,
) -> Result<Json<Replay>, ApiError> {
    Ok(Json(crate::replay::get(&*console.store, id).await?))
}

async fn replay_cancel<S: ConsoleStore>(
    Operating(caller): Operating,
    State(console): State<Console<S>>,
    Path(id): Path<Uuid>,
) -> Result<Json<Replay>, ApiError> {
    let role = caller.role.to_string();
    Ok(Json(
        crate::replay::cancel(&*console.store, id, &caller.name, &role).await?,
    ))
}

async fn doctor<S: ConsoleStore>(
    _: Reading,
    State(console): State<Console<S>>,
    Query(limits): Query<Limits>,
) -> Result<Json<Vec<Check>>, ApiError> {
    let mut checks = crate::doctor::checklist(&*console.store, &limits).await?;
    if let Some(group) = &console.cdc_group
        && !crate::doctor::stopped_at_tables(&checks)
    {
        let slots = console.store.replication_slots().await?;
        checks.push(crate::doctor::cdc_slot(&slots, group));
    }
    Ok(Json(checks))
}

async fn slots<S: ConsoleStore>(
    _: Reading,
    State(console): State<Console<S>>,
) -> Result<Json<Vec<ReplicationSlot>>, ApiError> {
    Ok(Json(console.store.replication_slots().await?))
}

async fn outbox<S: ConsoleStore>(
    _: Reading,
    State(console): State<Console<S>>,
    Query(query): Query<OutboxQuery>,
) -> Result<Json<OutboxStatus>, ApiError> {
    let window = Duration::from_millis(query.window_ms.unwrap_or(2000));
    if window.is_zero() || window > crate::outbox::MAX_WINDOW {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "window_ms: between 1 and 10000 (the rates are measured while the request waits)",
        ));
    }
    let partitions = query.partitions.or(console.partitions);
    Ok(Json(
        crate::outbox::measure(&*console.store, window, partitions).await?,
    ))
}

/// Which audit entries.
#[derive(Debug, Default, serde::Deserialize, schemars::JsonSchema)]
#[serde(default)]
struct AuditQuery {
    /// Only those of this target (a dead letter's id); blank for all.
    #[serde(deserialize_with = "triage::blank_is_none")]
    target: Option<String>,
    /// At most this many (100 by default, 1000 at most).
    limit: Option<u32>,
}

async fn audit<S: ConsoleStore>(
    _: Reading,
    State(console): State<Console<S>>,
    Query(query): Query<AuditQuery>,
) -> Result<Json<Vec<tidings_core::AuditEntry>>, ApiError> {
    let limit = query.limit.unwrap_or(100).min(1000);
    Ok(Json(
        console.store.audit_trail(query.target.as_deref(), limit).await?,
    ))
}

async fn history<S: ConsoleStore>(
    _: Reading,
    State(console): State<Console<S>>,
) -> Json<Vec<crate::history::Sample>> {
    Json(console.history.samples())
}

async fn message<S: ConsoleStore>(
    _: Reading,
    State(console): State<Console<S>>,
    Path(id): Path<Uuid>,
) -> Result<Json<tidings_core::inspect::MessageTrace>, ApiError> {
    match console.store.trace_message(id).await? {
        Some(trace) => Ok(Json(masked_trace(trace))),
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("the database knows nothing of message {id}"),
        )),
    }
}

async fn key<S: ConsoleStore>(
    _: Reading,
    State(console): State<Console<S>>,
    Path(key): Path<String>,
) -> Result<Json<Vec<tidings_core::inspect::MessageTrace>>, ApiError> {
    let traces = console
        .store
        .trace_key(&key, crate::pages::story::KEY_LIMIT)
        .await?;
    Ok(Json(traces.into_iter().map(masked_trace).collect()))
}

/// `group` with the likely secrets of its example error masked.
pub(crate) fn masked_example(mut group: CauseGroup) -> CauseGroup {
    group.example = crate::letter::mask_words(&group.example).0;
    group
}

/// `trace` with the likely secrets of its dead letters' errors masked.
pub(crate) fn masked_trace(
    mut trace: tidings_core::inspect::MessageTrace,
) -> tidings_core::inspect::MessageTrace {
    for d in &mut trace.dead_letters {
        d.last_error = d.last_error.take().map(|e| crate::letter::mask_words(&e).0);
    }
    trace
}
