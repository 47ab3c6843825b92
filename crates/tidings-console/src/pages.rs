//! The pages: rendered on the server, readable without JavaScript, every
//! value escaped.

use axum::Form;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use chrono::{DateTime, Utc};
use maud::{DOCTYPE, Markup, html};
use serde::Deserialize;
use uuid::Uuid;

use crate::access::{Caller, Role};
use crate::actions::{self, RedriveRequest};
use crate::api::{ApiError, Reading, operator};
use crate::letter::LetterView;
use crate::overview::Overview;
use crate::session;
use crate::triage::{self, Selection};
use crate::{Console, ConsoleStore};

/// Who is looking: nobody said, or a caller (with the session's
/// anti-forgery token when signed in through the page).
type Viewer = Option<(Caller, Option<String>)>;

/// The anti-forgery token the viewer's forms carry, if the viewer may act.
fn csrf_of(viewer: &Viewer) -> Option<&str> {
    match viewer {
        Some((caller, Some(csrf))) if caller.role >= Role::Operator => Some(csrf),
        _ => None,
    }
}

const STYLE: &str = include_str!("console.css");

pub(crate) fn routes<S: ConsoleStore>() -> axum::Router<Console<S>> {
    axum::Router::new()
        .route("/", get(overview::<S>))
        .route("/dead-letters", get(dead_letters::<S>))
        .route("/dead-letters/{id}", get(letter::<S>))
        .route("/dead-letters/redrive", post(redrive::<S>))
        .route("/dead-letters/{id}/skip", post(skip::<S>))
        .route("/login", get(login_page).post(login::<S>))
        .route("/logout", post(logout::<S>))
        .route("/assets/console.css", get(style))
}

async fn style() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/css; charset=utf-8"),
            (header::CACHE_CONTROL, "max-age=300"),
        ],
        STYLE,
    )
}

/// A page, or the refusal or failure in its place.
type Page = Result<Markup, PageError>;

/// A refusal or failure, as a page.
#[derive(Debug)]
pub(crate) struct PageError(ApiError);

impl From<ApiError> for PageError {
    fn from(e: ApiError) -> Self {
        PageError(e)
    }
}

impl From<tidings_core::Error> for PageError {
    fn from(e: tidings_core::Error) -> Self {
        PageError(e.into())
    }
}

impl IntoResponse for PageError {
    fn into_response(self) -> Response {
        let status = self.0.status();
        let page = layout(
            status.canonical_reason().unwrap_or("Error"),
            "",
            &None,
            html! {
                h1 { (status.as_u16()) " " (status.canonical_reason().unwrap_or("")) }
                p.error #problem { (self.0.message()) }
                @if status == StatusCode::UNAUTHORIZED { p { a href="/login" { "Sign in" } } }
            },
        );
        (status, page).into_response()
    }
}

fn layout(title: &str, here: &str, viewer: &Viewer, main: Markup) -> Markup {
    let tab = |path: &str, name: &str| {
        html! { a href=(path) aria-current=[(here == path).then_some("page")] { (name) } }
    };
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · Tidings" }
                link rel="stylesheet" href="/assets/console.css";
            }
            body {
                header {
                    span.brand { "Tidings" }
                    nav { (tab("/", "Overview")) (tab("/dead-letters", "Dead letters")) }
                    div.who {
                        @match viewer {
                            Some((caller, csrf)) => {
                                span #signed-in { (caller.name) " (" (caller.role) ")" }
                                @if let Some(csrf) = csrf {
                                    form.inline method="post" action="/logout" {
                                        input type="hidden" name="csrf" value=(csrf);
                                        button type="submit" { "Sign out" }
                                    }
                                }
                            }
                            None => a href="/login" { "Sign in" },
                        }
                    }
                }
                main { (main) }
            }
        }
    }
}

/// `12.3 s`, `4 min`, `2.1 h`, or `-`.
fn age(seconds: Option<f64>) -> String {
    match seconds {
        None => "-".to_owned(),
        Some(s) if s < 120.0 => format!("{s:.1} s"),
        Some(s) if s < 7200.0 => format!("{:.0} min", s / 60.0),
        Some(s) => format!("{:.1} h", s / 3600.0),
    }
}

fn when(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}

async fn overview<S: ConsoleStore>(
    reading: Result<Reading, ApiError>,
    State(console): State<Console<S>>,
) -> Page {
    let Reading(viewer) = reading?;
    let o = Overview::read(&*console.store, console.partitions).await?;
    Ok(layout("Overview", "/", &viewer, overview_page(&o)))
}

fn overview_page(o: &Overview) -> Markup {
    let waiting = o.dead_letters_pending();
    html! {
        h1 { "Overview" }
        p.muted { "Read at " (when(o.at)) ". " a href="/" { "Refresh" } }
        section.figures {
            div.figure data-figure="outbox-pending" { span.value { (o.outbox_pending) } span.label { "outbox pending" } }
            div.figure data-figure="oldest-unsent" { span.value { (age(o.oldest_unsent_seconds)) } span.label { "oldest unsent" } }
            div.figure.warn[waiting > 0] data-figure="dead-letters" {
                span.value { a href="/dead-letters" { (waiting) } } span.label { "dead letters waiting" }
            }
            div.figure data-figure="relays" { span.value { (o.relays.len()) } span.label { "relays running" } }
        }
        h2 { "Outbox partitions" }
        table #partitions {
            thead { tr { th { "partition" } th.num { "pending" } th.num { "oldest" } th { "relay" } } }
            tbody {
                @for p in &o.partitions {
                    tr {
                        td { (p.partition) }
                        td.num { (p.pending) }
                        td.num { (age(p.oldest_seconds)) }
                        td { @match &p.relay { Some(r) => code { (r) }, None => span.warn { "none" } } }
                    }
                }
            }
        }
        h2 { "Consumer groups" }
        @if o.groups.is_empty() {
            p.muted { "No consumer group has a member, a lag figure or a held key." }
        } @else {
            table #groups {
                thead { tr { th { "group" } th { "topic" } th.num { "pending" } th.num { "held keys" } th.num { "parked" } th { "members (partitions)" } } }
                tbody {
                    @for g in &o.groups {
                        tr {
                            td { (g.group) }
                            td { (g.topic) }
                            td.num { @match g.pending { Some(n) => (n), None => span.muted { "-" } } }
                            td.num.warn[g.held_keys > 0] { (g.held_keys) }
                            td.num { (g.parked) }
                            td {
                                @if g.members.is_empty() { span.warn { "none running" } }
                                @for m in &g.members {
                                    div { code { (m.member) } " " span.muted { (partitions(&m.partitions)) } }
                                }
                            }
                        }
                    }
                }
            }
        }
        h2 { "Dead letters waiting" }
        @if o.dead_letters.is_empty() {
            p.muted { "None." }
        } @else {
            table #dead-letters {
                thead { tr { th { "consumer" } th.num { "waiting" } th.num { "oldest" } } }
                tbody {
                    @for d in &o.dead_letters {
                        tr {
                            td { a href={ "/dead-letters?consumer=" (urlencode(&d.consumer)) } { (d.consumer) } }
                            td.num { (d.pending) }
                            td.num { (age(d.oldest_seconds)) }
                        }
                    }
                }
            }
        }
        h2 { "Relays" }
        @if o.relays.is_empty() {
            p.warn { "No relay is running: nothing committed is being published." }
        } @else {
            table #relays {
                thead { tr { th { "relay" } th { "partitions" } th.num { "lease left" } } }
                tbody {
                    @for r in &o.relays {
                        tr {
                            td { code { (r.member) } }
                            td { (partitions(&r.partitions)) }
                            td.num { (age(Some(r.expires_in_seconds))) }
                        }
                    }
                }
            }
        }
        @if !o.relay_holds.is_empty() {
            h2 { "Keys the relay holds" }
            table #relay-holds {
                thead { tr { th { "record" } th { "topic" } th { "key" } th.num { "waiting behind" } } }
                tbody {
                    @for h in &o.relay_holds {
                        tr { td { (h.seq) } td { (h.topic) } td { (h.aggregate_key) } td.num { (h.waiting) } }
                    }
                }
            }
        }
        @if !o.slots.is_empty() {
            h2 { "Replication slots" }
            table #slots {
                thead { tr { th { "slot" } th { "reader" } th.num { "log kept" } } }
                tbody {
                    @for s in &o.slots {
                        tr {
                            td { (s.name) }
                            td { @if s.active { "connected" } @else { span.warn { "none" } } }
                            td.num { (format!("{:.1} MiB", s.retained_bytes as f64 / 1048576.0)) }
                        }
                    }
                }
            }
        }
    }
}

fn partitions(p: &[u32]) -> String {
    if p.is_empty() {
        return "standing by".to_owned();
    }
    p.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
}

/// `text` for a query string.
fn urlencode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

async fn dead_letters<S: ConsoleStore>(
    reading: Result<Reading, ApiError>,
    State(console): State<Console<S>>,
    selection: Result<Query<Selection>, axum::extract::rejection::QueryRejection>,
) -> Page {
    let Reading(viewer) = reading?;
    let csrf = csrf_of(&viewer);
    let Query(selection) = selection
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("the filter: {}", e.body_text())))?;
    let letters = selection.letters(&*console.store).await?;
    let causes = triage::by_cause(&letters);
    let text = |v: &Option<String>| v.clone().unwrap_or_default();
    let time = |v: &Option<DateTime<Utc>>| v.map(|t| t.to_rfc3339()).unwrap_or_default();
    Ok(layout(
        "Dead letters",
        "/dead-letters",
        &viewer,
        html! {
            h1 { "Dead letters" }
            form.filters method="get" action="/dead-letters" {
                label { "consumer " input name="consumer" value=(text(&selection.consumer)); }
                label { "type " input name="type" value=(text(&selection.message_type)); }
                label { "error contains " input name="error" value=(text(&selection.error)); }
                label { "cause " input name="cause" size="12" value=(text(&selection.cause)); }
                label { "since " input name="since" placeholder="2026-01-31T00:00:00Z" value=(time(&selection.since)); }
                label { "until " input name="until" placeholder="RFC 3339" value=(time(&selection.until)); }
                label { input type="checkbox" name="include_settled" value="on" checked[selection.include_settled]; " settled too" }
                button type="submit" { "Filter" }
                " " a href="/dead-letters" { "Clear" }
            }
            p #dead-letter-count { (letters.len()) " dead letter(s), " (causes.len()) " cause(s)" }
            @if !causes.is_empty() {
                h2 { "By cause" }
                table #causes {
                    thead { tr { th.num { "count" } th { "cause" } th { "consumer" } th { "type" } th { "first" } th { "last" } th { "example" } @if csrf.is_some() { th {} } } }
                    tbody {
                        @for g in &causes {
                            tr data-fingerprint=(g.fingerprint) {
                                td.num.count { (g.count) }
                                td { a href={ "/dead-letters?cause=" (g.fingerprint) } { code { (g.fingerprint) } } br; (g.cause) }
                                td { (g.cause.consumer) }
                                td { (g.cause.message_type.as_deref().unwrap_or("?")) }
                                td { (when(g.first_at)) }
                                td { (when(g.last_at)) }
                                td.error { (g.example) }
                                @if let Some(csrf) = csrf {
                                    td {
                                        @if !selection.include_settled {
                                            form method="post" action="/dead-letters/redrive" {
                                                input type="hidden" name="csrf" value=(csrf);
                                                input type="hidden" name="cause" value=(g.fingerprint);
                                                button.redrive type="submit" { "Redrive " (g.count) }
                                            }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
            @if !selection.is_empty() && !letters.is_empty() {
                h2 { "Letters" }
                table #letters {
                    thead { tr { th { "dead letter" } th { "state" } th { "consumer" } th { "type" } th { "key" } th { "when" } th { "last error" } } }
                    tbody {
                        @for l in &letters {
                            tr {
                                td { a href={ "/dead-letters/" (l.id) } { code { (l.id) } } }
                                td { (triage::state(l)) }
                                td { (l.consumer) }
                                td { (l.message_type.as_deref().unwrap_or("?")) }
                                td { (l.aggregate_key.as_deref().unwrap_or("")) }
                                td { (when(l.created_at)) }
                                td.error { (l.errors.last().map_or("", |f| f.error.as_str())) }
                            }
                        }
                    }
                }
            }
        },
    ))
}

async fn letter<S: ConsoleStore>(
    reading: Result<Reading, ApiError>,
    State(console): State<Console<S>>,
    Path(id): Path<Uuid>,
) -> Page {
    let Reading(viewer) = reading?;
    let csrf = csrf_of(&viewer);
    let letter = triage::find(&*console.store, id)
        .await?
        .ok_or_else(|| ApiError::new(StatusCode::NOT_FOUND, format!("no dead letter has id {id}")))?;
    let v = LetterView::masked(&letter);
    let body = match (&v.body, &v.body_hex) {
        (_, Some(hex)) => format!("({} bytes, not text; in hex)\n{hex}", letter.body.len()),
        (serde_json::Value::String(text), None) => text.clone(),
        (json, None) => serde_json::to_string_pretty(json).unwrap_or_default(),
    };
    Ok(layout(
        "Dead letter",
        "/dead-letters",
        &viewer,
        html! {
            h1 { "Dead letter " code { (v.id) } }
            @if let (Some(csrf), "pending") = (csrf, v.state.as_str()) {
                div.actions {
                    form.inline method="post" action="/dead-letters/redrive" {
                        input type="hidden" name="csrf" value=(csrf);
                        input type="hidden" name="id" value=(v.id);
                        button.redrive type="submit" { "Redrive" }
                    }
                    form.inline method="post" action={ "/dead-letters/" (v.id) "/skip" } {
                        input type="hidden" name="csrf" value=(csrf);
                        button type="submit" { "Skip" }
                    }
                }
            }
            dl.facts {
                dt { "state" } dd #state { (v.state) }
                dt { "consumer" } dd { a href={ "/dead-letters?consumer=" (urlencode(&v.consumer)) } { (v.consumer) } }
                dt { "topic" } dd { (v.topic) }
                dt { "message" } dd { (v.message_id.map_or("?".to_owned(), |m| m.to_string())) " " (v.message_type.as_deref().unwrap_or("?")) }
                dt { "key" } dd { (v.aggregate_key.as_deref().unwrap_or("?")) }
                dt { "cause" } dd { a href={ "/dead-letters?cause=" (v.fingerprint) } { code { (v.fingerprint) } } " " (v.cause) }
                dt { "dead-lettered" } dd { (when(v.created_at)) " after " (v.attempts) " attempt(s)" }
                @if v.redrives > 0 {
                    dt { "redriven" } dd { (v.redrives) " time(s), last " (v.redriven_at.map_or("-".to_owned(), when)) }
                }
                @if let Some(t) = v.skipped_at { dt { "skipped" } dd { (when(t)) } }
            }
            h2 { "Errors" }
            table #errors {
                thead { tr { th.num { "attempt" } th { "when" } th { "class" } th { "error" } } }
                tbody {
                    @for f in &v.errors {
                        tr { td.num { (f.attempt) } td { (when(f.at)) } td { (f.class) } td.error { (f.error) } }
                    }
                }
            }
            h2 { "Headers" }
            @if v.headers.is_empty() {
                p.muted { "None." }
            } @else {
                table #headers {
                    tbody { @for (name, value) in &v.headers { tr { th { (name) } td { code { (value) } } } } }
                }
            }
            h2 { "Body" }
            @if !v.masked.is_empty() {
                p.warn #masked { "Masked as likely secrets: " (v.masked.join("; ")) }
            }
            pre #body { (body) }
        },
    ))
}

/// A form that changes something: who may send it, checked against its
/// anti-forgery token when it comes from a signed-in page.
fn form_operator(viewer: Viewer, sent: &str) -> Result<Caller, ApiError> {
    match viewer {
        None => Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "sign in as an operator to change dead letters",
        )),
        Some((caller, Some(expected))) if !session::same(sent, &expected) => {
            tracing::warn!(who = %caller.name, "a form came without its page's anti-forgery token; refused");
            Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "the form's anti-forgery token is not this session's: reload the page and try again",
            ))
        }
        Some((caller, _)) => operator(caller),
    }
}

/// The redrive form: one letter, or a selection.
#[derive(Debug, Deserialize)]
struct RedriveForm {
    #[serde(default)]
    csrf: String,
    #[serde(default, deserialize_with = "triage::blank_is_none")]
    id: Option<Uuid>,
    #[serde(flatten)]
    selection: Selection,
    #[serde(default, deserialize_with = "triage::flag")]
    force: bool,
}

async fn redrive<S: ConsoleStore>(
    reading: Result<Reading, ApiError>,
    State(console): State<Console<S>>,
    form: Result<Form<RedriveForm>, axum::extract::rejection::FormRejection>,
) -> Page {
    let Reading(viewer) = reading?;
    let Form(form) =
        form.map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("the form: {}", e.body_text())))?;
    let caller = form_operator(viewer.clone(), &form.csrf)?;
    let request = RedriveRequest {
        ids: form.id.into_iter().collect(),
        selection: form.selection,
        all: false,
        force: form.force,
        rate: None,
    };
    let report = actions::redrive(&*console.store, &caller, &request).await?;
    Ok(layout(
        "Redriven",
        "/dead-letters",
        &viewer,
        html! {
            h1 { "Redrive" }
            p #outcome { (report.redriven) " of " (report.letters.len()) " dead letter(s) redriven." }
            table #redriven {
                thead { tr { th { "dead letter" } th { "outcome" } th { "message" } th.num { "redrive" } } }
                tbody {
                    @for l in &report.letters {
                        tr {
                            td { a href={ "/dead-letters/" (l.id) } { code { (l.id) } } }
                            td { (l.outcome) }
                            td { (l.message_id.map_or("-".to_owned(), |m| m.to_string())) }
                            td.num { (l.redrive.map_or("-".to_owned(), |r| r.to_string())) }
                        }
                    }
                }
            }
            p { a href="/dead-letters" { "Back to the dead letters" } }
        },
    ))
}

/// A form that carries only its anti-forgery token.
#[derive(Debug, Deserialize)]
struct TokenForm {
    #[serde(default)]
    csrf: String,
}

async fn skip<S: ConsoleStore>(
    reading: Result<Reading, ApiError>,
    State(console): State<Console<S>>,
    Path(id): Path<Uuid>,
    Form(form): Form<TokenForm>,
) -> Result<Redirect, PageError> {
    let Reading(viewer) = reading?;
    let caller = form_operator(viewer, &form.csrf)?;
    actions::skip(&*console.store, &caller, id).await?;
    Ok(Redirect::to(&format!("/dead-letters/{id}")))
}

async fn login_page() -> Markup {
    login_form(None)
}

fn login_form(problem: Option<&str>) -> Markup {
    layout(
        "Sign in",
        "/login",
        &None,
        html! {
            h1 { "Sign in" }
            @if let Some(problem) = problem { p.error #problem { (problem) } }
            form.login method="post" action="/login" {
                label { "Token " input type="password" name="token" autocomplete="off" required; }
                button type="submit" { "Sign in" }
            }
            p.muted { "A token of TIDINGS_CONSOLE_TOKENS or the console's tokens file. The browser keeps only a session cookie." }
        },
    )
}

#[derive(Deserialize)]
struct LoginForm {
    #[serde(default)]
    token: String,
}

impl std::fmt::Debug for LoginForm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LoginForm { .. }")
    }
}

async fn login<S: ConsoleStore>(State(console): State<Console<S>>, Form(form): Form<LoginForm>) -> Response {
    match console.access.caller(form.token.trim()) {
        Some(caller) => {
            tracing::info!(who = %caller.name, role = %caller.role, "signed in to the console");
            let id = console.sessions.open(caller);
            (
                [(header::SET_COOKIE, session::set_cookie(&id))],
                Redirect::to("/"),
            )
                .into_response()
        }
        None => {
            tracing::warn!("a sign-in to the console with a token it does not accept");
            (
                StatusCode::UNAUTHORIZED,
                login_form(Some("That is not a token this console accepts.")),
            )
                .into_response()
        }
    }
}

async fn logout<S: ConsoleStore>(
    State(console): State<Console<S>>,
    headers: HeaderMap,
    Form(form): Form<TokenForm>,
) -> Response {
    if let Some(s) = console.sessions.of(&headers)
        && session::same(&form.csrf, &s.csrf)
    {
        console.sessions.close(&headers);
    }
    ([(header::SET_COOKIE, session::clear_cookie())], Redirect::to("/")).into_response()
}
