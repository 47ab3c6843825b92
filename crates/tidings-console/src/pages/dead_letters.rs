//! The dead letters: grouped by cause, one letter in full, and the forms
//! that redrive, skip, or edit and redrive them.

use axum::Form;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use chrono::{DateTime, Utc};
use maud::{Markup, html};
use serde::Deserialize;
use tidings_core::{DeadLetter, RELAY_LETTERS, cloudevents, redrive_envelope};
use uuid::Uuid;

use super::{Page, PageError, TokenForm, Viewer, csrf_of, layout, urlencode, when};
use crate::access::Caller;
use crate::actions::{self, EditRequest, RedriveRequest};
use crate::api::{ApiError, Reading, operator};
use crate::letter::{LetterView, mask_words};
use crate::session;
use crate::triage::{self, Selection};
use crate::{Console, ConsoleStore};

pub(super) async fn dead_letters<S: ConsoleStore>(
    reading: Result<Reading, ApiError>,
    State(console): State<Console<S>>,
    selection: Result<Query<Selection>, axum::extract::rejection::QueryRejection>,
) -> Page {
    let Reading(viewer) = reading?;
    let csrf = csrf_of(&viewer);
    let Query(selection) = selection
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("the filter: {}", e.body_text())))?;
    let letters = selection
        .letters_within(&*console.store, Some(crate::READ_LIMIT))
        .await?;
    let causes: Vec<_> = triage::by_cause(&letters)
        .into_iter()
        .map(crate::api::masked_example)
        .collect();
    let capped = letters.len() as u32 >= crate::READ_LIMIT;
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
            @if capped {
                p.warn { "Only the newest " (crate::READ_LIMIT) " dead letters are read: narrow the filter (consumer, type) to see the others, or use `tidings dlq list`." }
            }
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
                                                // The filters the count was made with: the button redrives what it says.
                                                @if let Some(c) = &selection.consumer { input type="hidden" name="consumer" value=(c); }
                                                @if let Some(t) = &selection.message_type { input type="hidden" name="type" value=(t); }
                                                @if let Some(e) = &selection.error { input type="hidden" name="error" value=(e); }
                                                @if let Some(t) = selection.since { input type="hidden" name="since" value=(t.to_rfc3339()); }
                                                @if let Some(t) = selection.until { input type="hidden" name="until" value=(t.to_rfc3339()); }
                                                (force_box())
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
                                td.error { (mask_words(l.errors.last().map_or("", |f| f.error.as_str())).0) }
                            }
                        }
                    }
                }
            }
        },
    ))
}

pub(super) async fn letter<S: ConsoleStore>(
    reading: Result<Reading, ApiError>,
    State(console): State<Console<S>>,
    Path(id): Path<Uuid>,
) -> Page {
    let Reading(viewer) = reading?;
    let csrf = csrf_of(&viewer);
    let letter = console
        .store
        .letter(id)
        .await?
        .ok_or_else(|| actions::not_found(id))?;
    let edits = console.store.edits(id).await?;
    let v = LetterView::masked(&letter).with_edits(&letter, &edits);
    let editable = csrf.and_then(|_| editable_payload(&letter));
    let pretty = |v: &serde_json::Value| match v {
        serde_json::Value::String(text) => text.clone(),
        json => serde_json::to_string_pretty(json).unwrap_or_default(),
    };
    let trail = console.store.audit_trail(Some(&id.to_string()), 50).await?;
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
                        (force_box())
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
            @if !trail.is_empty() {
                h2 { "What was done" }
                table #trail {
                    thead { tr { th { "when" } th { "action" } th { "by" } th { "detail" } } }
                    tbody {
                        @for e in &trail {
                            tr { td { (when(e.at)) } td { (e.action) } td { (e.actor) } td { code { (e.detail.to_string()) } } }
                        }
                    }
                }
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
            @if let (Some(csrf), Some(payload)) = (csrf, &editable) {
                h2 { "Edit and redrive" }
                p.muted {
                    "The payload as stored, unmasked: shown here to operators only. The edit is checked against its schema, "
                    "then the message is redriven with it in place of its own; the original is kept beside it."
                }
                form.edit method="post" action={ "/dead-letters/" (v.id) "/edit" } {
                    input type="hidden" name="csrf" value=(csrf);
                    textarea #edit-data name="data" rows="16" spellcheck="false" aria-label="The payload to redrive" { (payload) }
                    (force_box())
                    button.redrive type="submit" { "Redrive edited" }
                }
            }
            @if !v.edits.is_empty() {
                h2 { "Edits" }
                table #edits {
                    thead { tr { th { "when" } th { "by" } th { "original payload" } th { "edited payload" } } }
                    tbody {
                        @for e in &v.edits {
                            tr data-edit=(e.id) {
                                td { (when(e.at)) br; code.muted { (e.id) } }
                                td { (e.by) }
                                td { pre.original { (pretty(&e.original)) } }
                                td { pre.edited { (pretty(&e.edited)) } }
                            }
                        }
                    }
                }
                @for e in v.edits.iter().filter(|e| !e.masked.is_empty()) {
                    p.warn { "Masked in edit " code { (e.id) } " as likely secrets: " (e.masked.join("; ")) }
                }
            }
        },
    ))
}

/// The payload of `letter` for the edit form: its message's data as stored,
/// formatted JSON, unmasked. The page shows it to operators only (those
/// who may redrive the letter as it stands anyway): readers, and anyone
/// not signed in, see the masked body alone. `None` where there is nothing
/// to edit: a letter settled, set aside by the relay, whose body is not an
/// envelope, or whose payload is not JSON.
fn editable_payload(letter: &DeadLetter) -> Option<String> {
    if !letter.is_pending() || letter.consumer == RELAY_LETTERS {
        return None;
    }
    let envelope = redrive_envelope(letter)?;
    if !cloudevents::is_json(&envelope.content_type) {
        return None;
    }
    let data: serde_json::Value = serde_json::from_slice(&envelope.payload).ok()?;
    serde_json::to_string_pretty(&data).ok()
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

/// The box that lets a redrive reach past the dedupe horizon, refused without it.
fn force_box() -> Markup {
    html! {
        label.force title="A letter older than the dedupe retention may have been handled already: its processed markers are gone, so a redrive could handle it twice. Tick to redrive it anyway." {
            input type="checkbox" name="force";
            " past the dedupe horizon"
        }
    }
}

/// The redrive form: one letter, or a selection.
#[derive(Debug, Deserialize)]
pub(super) struct RedriveForm {
    #[serde(default)]
    csrf: String,
    #[serde(default, deserialize_with = "triage::blank_is_none")]
    id: Option<Uuid>,
    #[serde(flatten)]
    selection: Selection,
    #[serde(default, deserialize_with = "triage::flag")]
    force: bool,
}

/// Redrives one letter (its page's button), answered with a redirect to
/// its page, which shows what was done; or a selection (a cause's button),
/// answered with the outcome of each.
pub(super) async fn redrive<S: ConsoleStore>(
    reading: Result<Reading, ApiError>,
    State(console): State<Console<S>>,
    form: Result<Form<RedriveForm>, axum::extract::rejection::FormRejection>,
) -> Result<Response, PageError> {
    let Reading(viewer) = reading?;
    let Form(form) = form.map_err(form_refused)?;
    let caller = form_operator(viewer.clone(), &form.csrf)?;
    let one = form.id;
    let request = RedriveRequest {
        ids: form.id.into_iter().collect(),
        selection: form.selection,
        all: false,
        force: form.force,
        rate: None,
    };
    let report = actions::redrive(&*console.store, &caller, &request).await?;
    if let Some(id) = one {
        return Ok(Redirect::to(&format!("/dead-letters/{id}")).into_response());
    }
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
    )
    .into_response())
}

pub(super) async fn skip<S: ConsoleStore>(
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

/// The edit form: the payload, as JSON text.
#[derive(Debug, Deserialize)]
pub(super) struct EditForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    data: String,
    #[serde(default, deserialize_with = "triage::flag")]
    force: bool,
}

/// Redrives the letter with the form's payload, once it passes its
/// schema; answered with a redirect to the letter's page, which shows the
/// edit, or with the refusal (nothing changed).
pub(super) async fn edit<S: ConsoleStore>(
    reading: Result<Reading, ApiError>,
    State(console): State<Console<S>>,
    Path(id): Path<Uuid>,
    form: Result<Form<EditForm>, axum::extract::rejection::FormRejection>,
) -> Result<Redirect, PageError> {
    let Reading(viewer) = reading?;
    let Form(form) = form.map_err(form_refused)?;
    let caller = form_operator(viewer, &form.csrf)?;
    let data = serde_json::from_str(&form.data).map_err(|e| {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("the edited payload is not JSON ({e}); nothing was changed"),
        )
    })?;
    let request = EditRequest {
        data,
        force: form.force,
    };
    actions::edit(&*console.store, console.schemas.as_deref(), &caller, id, &request).await?;
    Ok(Redirect::to(&format!("/dead-letters/{id}")))
}

/// A form that does not parse (400), or is over its size limit (413).
fn form_refused(e: axum::extract::rejection::FormRejection) -> ApiError {
    let status = match e.status() {
        StatusCode::PAYLOAD_TOO_LARGE => StatusCode::PAYLOAD_TOO_LARGE,
        _ => StatusCode::BAD_REQUEST,
    };
    ApiError::new(status, format!("the form: {}", e.body_text()))
}
