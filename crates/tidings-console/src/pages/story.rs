//! A message's story, by id (`/messages/ID`) or by key (`/keys/KEY`):
//! where each message is (in the outbox, set aside by the relay, handled
//! by which consumers, dead-lettered or parked behind whom), the answer to
//! "why has order XYZ not been handled yet" on one page.

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};
use tidings_core::inspect::MessageTrace;
use uuid::Uuid;

use super::{Page, PageError, layout, urlencode, when};
use crate::api::{ApiError, Reading};
use crate::{Console, ConsoleStore};

/// The most messages a key page shows.
pub(crate) const KEY_LIMIT: u32 = 200;

/// Where the search box goes: a message id, else a key.
#[derive(Debug, serde::Deserialize)]
pub(super) struct Find {
    #[serde(default)]
    q: String,
}

pub(super) async fn find(reading: Result<Reading, ApiError>, Query(find): Query<Find>) -> Response {
    if let Err(e) = reading {
        return PageError::from(e).into_response();
    }
    let q = find.q.trim();
    match Uuid::parse_str(q) {
        Ok(id) => Redirect::to(&format!("/messages/{id}")).into_response(),
        Err(_) if q.is_empty() => Redirect::to("/").into_response(),
        Err(_) => Redirect::to(&format!("/keys/{}", urlencode(q))).into_response(),
    }
}

pub(super) async fn message<S: ConsoleStore>(
    reading: Result<Reading, ApiError>,
    State(console): State<Console<S>>,
    Path(id): Path<Uuid>,
) -> Page {
    let Reading(viewer) = reading?;
    let trace = console.store.trace_message(id).await?.ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            format!(
                "the database knows nothing of message {id}: no outbox record, processed marker, effect, dead letter or parked copy (sent records and markers are kept for their retentions only)"
            ),
        )
    })?;
    let count = console.partition_count().await?;
    Ok(layout(
        "Message",
        "",
        &viewer,
        html! {
            h1 { "Message " code { (id) } " " (trace.message_type.as_deref().unwrap_or("")) }
            section.story data-message=(id) { (story(&trace, count)) }
        },
    ))
}

pub(super) async fn key<S: ConsoleStore>(
    reading: Result<Reading, ApiError>,
    State(console): State<Console<S>>,
    Path(key): Path<String>,
) -> Page {
    let Reading(viewer) = reading?;
    let traces = console.store.trace_key(&key, KEY_LIMIT).await?;
    let count = console.partition_count().await?;
    Ok(layout(
        "Key",
        "",
        &viewer,
        html! {
            h1 { "Key " code { (key) } }
            p #message-count {
                (traces.len()) " message(s)"
                @if traces.len() as u32 == KEY_LIMIT { " (the first " (KEY_LIMIT) ")" }
            }
            @if traces.is_empty() {
                p.muted { "The database knows no message of this key: none waits in the outbox, none was dead-lettered or parked (sent records are kept for the outbox retention only)." }
            }
            @for trace in &traces {
                section.story data-message=(trace.message_id) {
                    h2 { a href={ "/messages/" (trace.message_id) } { code { (trace.message_id) } } " " (trace.message_type.as_deref().unwrap_or("")) }
                    (story(trace, count))
                }
            }
        },
    ))
}

/// Where a message stands, in one line.
pub(crate) fn verdict(t: &MessageTrace) -> String {
    let pending_letters: Vec<&str> = t
        .dead_letters
        .iter()
        .filter(|d| d.state == "pending")
        .map(|d| d.consumer.as_str())
        .collect();
    let parked: Vec<&str> = t
        .parked
        .iter()
        .filter(|p| !p.released)
        .map(|p| p.consumer.as_str())
        .collect();
    if t.held_by_relay {
        "set aside by the relay: it and the later records of its key wait for a redrive or a skip".into()
    } else if !pending_letters.is_empty() {
        format!("dead-lettered by {}", pending_letters.join(", "))
    } else if !parked.is_empty() {
        format!(
            "parked by {} behind an earlier message of its key",
            parked.join(", ")
        )
    } else if t.outbox.as_ref().is_some_and(|o| o.published_at.is_none()) {
        "waiting in the outbox for the relay".into()
    } else if !t.handled.is_empty() {
        let by: Vec<&str> = t.handled.iter().map(|h| h.consumer.as_str()).collect();
        format!("handled by {}", by.join(", "))
    } else {
        "sent; no consumer has handled it yet".into()
    }
}

fn story(t: &MessageTrace, partitions: u32) -> Markup {
    html! {
        p.verdict { (verdict(t)) }
        dl.facts {
            dt { "topic" } dd { (t.topic.as_deref().unwrap_or("?")) }
            dt { "key" } dd {
                @match &t.aggregate_key {
                    Some(k) => { a href={ "/keys/" (urlencode(k)) } { (k) } }
                    None => { "?" }
                }
            }
            dt { "outbox" } dd.outbox {
                @match &t.outbox {
                    Some(o) => {
                        "record " (o.seq) ", partition " (o.partition(partitions).index) ", written " (when(o.created_at))
                        @match o.published_at {
                            Some(p) => { ", published " (when(p)) }
                            None => { ", not yet published" }
                        }
                    }
                    None => span.muted { "no record (sent and deleted, or never here)" },
                }
            }
        }
        @if !t.handled.is_empty() {
            h3 { "Handled" }
            table.handled {
                thead { tr { th { "consumer" } th { "when" } } }
                tbody { @for h in &t.handled { tr { td { (h.consumer) } td { (when(h.at)) } } } }
            }
        }
        @if !t.effects.is_empty() {
            h3 { "Effects" }
            table.effects {
                thead { tr { th { "consumer" } th { "effect" } th { "idempotency key" } th { "when" } } }
                tbody {
                    @for e in &t.effects {
                        tr { td { (e.consumer) } td { (e.effect) } td { code { (e.idempotency_key) } } td { (when(e.at)) } }
                    }
                }
            }
        }
        @if !t.dead_letters.is_empty() {
            h3 { "Dead letters" }
            table.dead-letters {
                thead { tr { th { "dead letter" } th { "consumer" } th { "state" } th.num { "attempts" } th { "last error" } } }
                tbody {
                    @for d in &t.dead_letters {
                        tr {
                            td { a href={ "/dead-letters/" (d.id) } { code { (d.id) } } }
                            td { (d.consumer) }
                            td { (d.state) }
                            td.num { (d.attempts) }
                            td.error { (crate::letter::mask_words(d.last_error.as_deref().unwrap_or("")).0) }
                        }
                    }
                }
            }
        }
        @if !t.parked.is_empty() {
            h3 { "Parked" }
            table.parked {
                thead { tr { th { "consumer" } th { "since" } th { "behind" } } }
                tbody {
                    @for p in &t.parked {
                        tr {
                            td { (p.consumer) }
                            td { (when(p.since)) }
                            td {
                                @if p.released { "released by a skip" }
                                @else if let Some(m) = p.held_by_message {
                                    "message " a href={ "/messages/" (m) } { code { (m) } }
                                    @if let Some(d) = p.held_by_dead_letter {
                                        " (" a href={ "/dead-letters/" (d) } { "its dead letter" } ")"
                                    }
                                } @else { "a hold now gone" }
                            }
                        }
                    }
                }
            }
        }
    }
}

impl<S: ConsoleStore> Console<S> {
    /// The outbox's partition count: as configured, else as the live
    /// relays hold them, else 1.
    pub(crate) async fn partition_count(&self) -> tidings_core::Result<u32> {
        if let Some(n) = self.partitions {
            return Ok(n);
        }
        Ok(tidings_core::inspect::held_partitions(
            &self.store.members().await?,
        ))
    }
}
