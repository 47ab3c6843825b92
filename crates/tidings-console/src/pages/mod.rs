//! The pages: rendered on the server, readable without JavaScript, every
//! value escaped. One file per page or family of pages; the layout and
//! what they share here.

mod dead_letters;
mod overview;
mod sign_in;
pub(crate) mod story;

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use chrono::{DateTime, Utc};
use maud::{DOCTYPE, Markup, html};

use crate::access::{Caller, Role};
use crate::api::ApiError;
use crate::{Console, ConsoleStore};

/// Who is looking: nobody said, or a caller (with the session's
/// anti-forgery token when signed in through the page).
pub(crate) type Viewer = Option<(Caller, Option<String>)>;

/// The anti-forgery token the viewer's forms carry, if the viewer may act.
pub(crate) fn csrf_of(viewer: &Viewer) -> Option<&str> {
    match viewer {
        Some((caller, Some(csrf))) if caller.role >= Role::Operator => Some(csrf),
        _ => None,
    }
}

const STYLE: &str = include_str!("../console.css");
const SCRIPT: &str = include_str!("../console.js");

pub(crate) fn routes<S: ConsoleStore>() -> axum::Router<Console<S>> {
    axum::Router::new()
        .route("/", get(overview::overview::<S>))
        .route("/dead-letters", get(dead_letters::dead_letters::<S>))
        .route("/dead-letters/{id}", get(dead_letters::letter::<S>))
        .route("/dead-letters/redrive", post(dead_letters::redrive::<S>))
        .route("/dead-letters/{id}/skip", post(dead_letters::skip::<S>))
        .route(
            "/dead-letters/{id}/edit",
            post(dead_letters::edit::<S>).layer(axum::extract::DefaultBodyLimit::max(crate::EDIT_BODY_LIMIT)),
        )
        .route("/find", get(story::find))
        .route("/messages/{id}", get(story::message::<S>))
        .route("/keys/{key}", get(story::key::<S>))
        .route("/login", get(sign_in::login_page).post(sign_in::login::<S>))
        .route("/logout", post(sign_in::logout::<S>))
        .route("/assets/console.css", get(style))
        .route("/assets/console.js", get(script))
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

async fn script() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/javascript; charset=utf-8"),
            (header::CACHE_CONTROL, "max-age=300"),
        ],
        SCRIPT,
    )
}

/// A page, or the refusal or failure in its place.
pub(crate) type Page = Result<Markup, PageError>;

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

pub(crate) fn layout(title: &str, here: &str, viewer: &Viewer, main: Markup) -> Markup {
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
                script src="/assets/console.js" defer {}
            }
            body {
                header {
                    span.brand { "Tidings" }
                    nav { (tab("/", "Overview")) (tab("/dead-letters", "Dead letters")) }
                    form.find method="get" action="/find" role="search" {
                        input type="search" name="q" placeholder="message id or key" aria-label="Find a message by id, or the messages of a key";
                    }
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
                // The overview refreshes itself in place where scripts run.
                main data-refresh=[(here == "/").then_some("5")] { (main) }
            }
        }
    }
}

/// `12.3 s`, `4 min`, `2.1 h`, or `-`.
pub(crate) fn age(seconds: Option<f64>) -> String {
    match seconds {
        None => "-".to_owned(),
        Some(s) if s < 120.0 => format!("{s:.1} s"),
        Some(s) if s < 7200.0 => format!("{:.0} min", s / 60.0),
        Some(s) => format!("{:.1} h", s / 3600.0),
    }
}

pub(crate) fn when(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}

/// `text` for a query string.
pub(crate) fn urlencode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A form that carries only its anti-forgery token.
#[derive(Debug, serde::Deserialize)]
pub(crate) struct TokenForm {
    #[serde(default)]
    pub(crate) csrf: String,
}
