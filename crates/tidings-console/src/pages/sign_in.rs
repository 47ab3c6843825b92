//! Signing in and out of the pages (see [`crate::session`]).

use axum::Form;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};
use serde::Deserialize;

use super::{TokenForm, layout};
use crate::session;
use crate::{Console, ConsoleStore};

pub(super) async fn login_page() -> Markup {
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
pub(super) struct LoginForm {
    #[serde(default)]
    token: String,
}

impl std::fmt::Debug for LoginForm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LoginForm { .. }")
    }
}

/// A sign-in or sign-out sent by a page of another site: 403, with why.
fn cross_site(headers: &HeaderMap) -> Option<Response> {
    let origin = session::foreign_origin(headers)?;
    tracing::warn!(%origin, "a sign-in or sign-out to the console from another site, refused");
    Some(
        (
            StatusCode::FORBIDDEN,
            format!(
                "Refused: this request came from a page of {origin}, not from the console's own \
                 pages. Sign in and out at the console's /login page.\n"
            ),
        )
            .into_response(),
    )
}

pub(super) async fn login<S: ConsoleStore>(
    State(console): State<Console<S>>,
    headers: HeaderMap,
    Form(form): Form<LoginForm>,
) -> Response {
    if let Some(refused) = cross_site(&headers) {
        return refused;
    }
    match console.access.caller(form.token.trim()) {
        Some(caller) => {
            tracing::info!(who = %caller.name, role = %caller.role, "signed in to the console");
            let id = console.sessions.open(caller);
            (
                [(
                    header::SET_COOKIE,
                    session::set_cookie(&id, session::over_https(&headers)),
                )],
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

pub(super) async fn logout<S: ConsoleStore>(
    State(console): State<Console<S>>,
    headers: HeaderMap,
    Form(form): Form<TokenForm>,
) -> Response {
    if let Some(refused) = cross_site(&headers) {
        return refused;
    }
    if let Some(s) = console.sessions.of(&headers)
        && session::same(&form.csrf, &s.csrf)
    {
        console.sessions.close(&headers);
    }
    (
        [(
            header::SET_COOKIE,
            session::clear_cookie(session::over_https(&headers)),
        )],
        Redirect::to("/"),
    )
        .into_response()
}
