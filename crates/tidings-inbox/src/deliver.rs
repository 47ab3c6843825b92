//! One delivery, from the request to the answer: the body read within its
//! limit, the signature verified, the delivery recorded and enqueued in one
//! transaction, and the answer given only after the commit.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::Utc;
use serde_json::{Value, json};
use tidings_core::envelope::{Envelope, Headers, JSON};
use tidings_core::{Error, ErrorClass, InboxStore, Kind, OutgoingMessage, cloudevents};
use tokio::time::{Instant, timeout_at};
use uuid::Uuid;

use crate::provider::{Provider, Reads};
use crate::{FORGET_BATCH, FORGET_EVERY, MAX_ID_CHARS, Shared};

/// What a provider is told when the delivery could not be recorded now.
const NOT_NOW: &str = "the delivery could not be recorded now; deliver it again later";

/// How one delivery ended: the answer, and the outcome counted in metrics.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// Recorded and enqueued, committed.
    Accepted(Uuid),
    /// Recorded before: acknowledged, nothing changed.
    Duplicate(Uuid),
    /// A batch of CloudEvents, committed: each event's id, and whether it
    /// was new (`false`: recorded before, nothing changed).
    Batch(Vec<(Uuid, bool)>),
    /// Refused for what the delivery is: the provider should not retry it
    /// as it is (4xx).
    Refused {
        status: StatusCode,
        outcome: &'static str,
        reason: String,
    },
    /// Not taken for now: the provider should retry (5xx).
    Failed { status: StatusCode, reason: String },
}

/// Every outcome a delivery can have, as `tidings_inbox_deliveries_total`
/// labels it.
pub(crate) const OUTCOMES: &[&str] = &[
    "accepted",
    "duplicate",
    "unsigned",
    "malformed",
    "unsupported",
    "conflict",
    "replayed",
    "too_large",
    "timeout",
    "refused",
    "failed",
];

/// Sets each provider's counters at zero, so that the first delivery of an
/// outcome is an increase Prometheus sees (a series born at 1 shows none).
pub(crate) fn count_from_zero<'a>(providers: impl Iterator<Item = &'a str>) {
    for provider in providers {
        for outcome in OUTCOMES {
            metrics::counter!(
                tidings_core::metrics::INBOX_DELIVERIES,
                "provider" => provider.to_owned(),
                "outcome" => *outcome,
            )
            .increment(0);
        }
    }
}

impl Outcome {
    pub(crate) fn refused(status: StatusCode, outcome: &'static str, reason: impl Into<String>) -> Outcome {
        Outcome::Refused {
            status,
            outcome,
            reason: reason.into(),
        }
    }

    /// The label of `tidings_inbox_deliveries_total`.
    fn label(&self) -> &'static str {
        match self {
            Outcome::Accepted(_) => "accepted",
            Outcome::Duplicate(_) => "duplicate",
            Outcome::Batch(events) if events.iter().any(|(_, new)| *new) => "accepted",
            Outcome::Batch(_) => "duplicate",
            Outcome::Refused { outcome, .. } => outcome,
            Outcome::Failed { .. } => "failed",
        }
    }
}

impl IntoResponse for Outcome {
    fn into_response(self) -> Response {
        match self {
            Outcome::Accepted(id) => (
                StatusCode::OK,
                axum_json(json!({"status": "accepted", "message_id": id})),
            )
                .into_response(),
            Outcome::Duplicate(id) => (
                StatusCode::OK,
                axum_json(json!({"status": "duplicate", "message_id": id})),
            )
                .into_response(),
            Outcome::Batch(events) => {
                let events: Vec<Value> = events
                    .iter()
                    .map(|(id, new)| {
                        json!({"message_id": id, "status": if *new { "accepted" } else { "duplicate" }})
                    })
                    .collect();
                (
                    StatusCode::OK,
                    axum_json(json!({"status": "accepted", "events": events})),
                )
                    .into_response()
            }
            Outcome::Refused { status, reason, .. } => {
                (status, axum_json(json!({"error": reason}))).into_response()
            }
            Outcome::Failed { status, reason } => {
                let mut response = (status, axum_json(json!({"error": reason}))).into_response();
                response
                    .headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
                response
            }
        }
    }
}

/// A JSON body with its content type.
fn axum_json(value: Value) -> ([(header::HeaderName, &'static str); 1], String) {
    ([(header::CONTENT_TYPE, "application/json")], value.to_string())
}

/// `POST /{provider}`.
pub(crate) async fn handle<S: InboxStore + Clone>(
    State(shared): State<Arc<Shared<S>>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let Some(provider) = shared.providers.get(&name) else {
        // The name comes from the request: not a metrics label.
        return Outcome::refused(
            StatusCode::NOT_FOUND,
            "unknown",
            "no webhook provider of this name is configured here",
        )
        .into_response();
    };
    let outcome = deliver(&shared, provider, &headers, body).await;
    metrics::counter!(
        tidings_core::metrics::INBOX_DELIVERIES,
        "provider" => provider.name.clone(),
        "outcome" => outcome.label(),
    )
    .increment(1);
    match &outcome {
        Outcome::Accepted(id) => {
            tracing::info!(provider = %provider.name, message_id = %id, "webhook delivery accepted")
        }
        Outcome::Duplicate(id) => {
            tracing::debug!(provider = %provider.name, message_id = %id, "webhook delivery seen before, acknowledged")
        }
        Outcome::Batch(events) => {
            let new = events.iter().filter(|(_, new)| *new).count();
            tracing::info!(provider = %provider.name, events = events.len(), new, "batch of CloudEvents taken")
        }
        // Anyone can send a refused delivery: a warning for each would let
        // them flood the log (the counter shows them all).
        Outcome::Refused { status, reason, .. } => {
            tracing::debug!(provider = %provider.name, status = status.as_u16(), %reason, "webhook delivery refused")
        }
        // Logged with its cause where it failed.
        Outcome::Failed { status, .. } => {
            tracing::debug!(provider = %provider.name, status = status.as_u16(), "webhook delivery not taken")
        }
    }
    outcome.into_response()
}

/// The delivery's whole flow, within the request timeout.
async fn deliver<S: InboxStore + Clone>(
    shared: &Shared<S>,
    provider: &Provider,
    headers: &HeaderMap,
    body: Body,
) -> Outcome {
    let deadline = Instant::now() + shared.timeout;
    let limit = shared.body_limit;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return too_large(limit);
    }
    let body = match timeout_at(deadline, axum::body::to_bytes(body, limit)).await {
        Err(_) => {
            return Outcome::refused(
                StatusCode::REQUEST_TIMEOUT,
                "timeout",
                format!("the body did not arrive within {:?}", shared.timeout),
            );
        }
        Ok(Err(e)) if is_length_limit(&e) => return too_large(limit),
        Ok(Err(_)) => {
            return Outcome::refused(StatusCode::BAD_REQUEST, "malformed", "the body could not be read");
        }
        Ok(Ok(body)) => body,
    };
    if let Err(e) = crate::signature::verify(
        &provider.scheme,
        &provider.secrets,
        headers,
        &body,
        Utc::now().timestamp(),
    ) {
        return Outcome::refused(StatusCode::UNAUTHORIZED, "unsigned", e.to_string());
    }
    let taken = match provider.reads {
        Reads::Webhook => build(provider, headers, &body).map(|one| Taken {
            events: vec![one],
            batch: false,
        }),
        Reads::CloudEvents => from_cloudevents(provider, headers, &body),
    };
    let taken = match taken {
        Ok(taken) => taken,
        Err(refused) => return refused,
    };
    match timeout_at(deadline, record(shared, provider, &taken)).await {
        Err(_) => {
            tracing::error!(provider = %provider.name, timeout = ?shared.timeout, "the database did not record a webhook delivery in time");
            Outcome::Failed {
                status: StatusCode::SERVICE_UNAVAILABLE,
                reason: NOT_NOW.into(),
            }
        }
        Ok(outcome) => outcome,
    }
}

fn too_large(limit: usize) -> Outcome {
    Outcome::refused(
        StatusCode::PAYLOAD_TOO_LARGE,
        "too_large",
        format!("the body is larger than this inbox's {limit} bytes"),
    )
}

/// Whether reading the body stopped at its length limit.
fn is_length_limit(error: &axum::Error) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = cause {
        if e.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        cause = e.source();
    }
    false
}

/// The events a delivery becomes.
struct Taken {
    events: Vec<Event>,
    batch: bool,
}

/// One event of a delivery, with what the inbox records it under.
struct Event {
    message: OutgoingMessage,
    /// Unique per event of the provider: the provider's event id, or for
    /// a CloudEvent the id derived from its (`source`, `id`).
    event_id: String,
    /// A CloudEvent whose `id` is a UUID keeps it as its message id, which
    /// consumers deduplicate on: it may be taken under one source only.
    uuid: Option<Uuid>,
}

/// `value`, unless it is too long or holds control characters.
fn checked(value: String, what: &str) -> Result<String, Outcome> {
    let malformed = |reason: String| Outcome::refused(StatusCode::BAD_REQUEST, "malformed", reason);
    if value.chars().count() > MAX_ID_CHARS {
        return Err(malformed(format!(
            "its {what} is longer than {MAX_ID_CHARS} characters"
        )));
    }
    if value.chars().any(char::is_control) {
        return Err(malformed(format!("its {what} holds control characters")));
    }
    Ok(value)
}

/// The CloudEvents a verified request carries, each as its producer wrote it.
fn from_cloudevents(provider: &Provider, headers: &HeaderMap, body: &[u8]) -> Result<Taken, Outcome> {
    let read = crate::cloudevents::read(headers, body)?;
    let mut events = Vec::with_capacity(read.envelopes.len());
    for mut envelope in read.envelopes {
        envelope.message_type = checked(envelope.message_type, "type")?;
        envelope.aggregate_key = checked(envelope.aggregate_key, "key")?;
        let written = checked(envelope.event_id(), "id")?;
        envelope
            .headers
            .entry(tidings_core::trace::TRACEPARENT.to_owned())
            .or_insert_with(|| tidings_core::trace::current_or_new().to_header());
        // Unique per (source, id), as the spec defines it, even where the
        // id is a UUID another source might use too.
        let event_id = cloudevents::foreign_id(&envelope.source, &written).to_string();
        let uuid = Uuid::try_parse(&written).ok().filter(|u| *u == envelope.id);
        events.push(Event {
            uuid,
            message: OutgoingMessage {
                topic: provider.topic.clone(),
                envelope,
            },
            event_id,
        });
    }
    Ok(Taken {
        events,
        batch: read.batch,
    })
}

/// The event a verified delivery becomes, or why it cannot be one.
fn build(provider: &Provider, headers: &HeaderMap, body: &[u8]) -> Result<Event, Outcome> {
    let malformed = |reason: String| Outcome::refused(StatusCode::BAD_REQUEST, "malformed", reason);
    let json: Value = serde_json::from_slice(body).map_err(|e| {
        let form = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("application/x-www-form-urlencoded"));
        malformed(if form {
            "the body is form-encoded: set the webhook's content type to application/json at the provider"
                .into()
        } else {
            format!("the body is not JSON: {e}")
        })
    })?;
    let header = |name: &str| headers.get(name)?.to_str().ok();
    let read = |field: &crate::Field, what: &str| -> Result<String, Outcome> {
        let value = field
            .read(header, &json)
            .ok_or_else(|| malformed(format!("the delivery has no {what} ({field})")))?;
        checked(value, what)
    };
    let event_id = read(&provider.event_id, "event id")?;
    let message_type = read(&provider.message_type, "message type")?;
    let key = match &provider.key {
        Some(field) => checked(field.read(header, &json).unwrap_or_default(), "key")?,
        None => String::new(),
    };
    let source = provider.source();
    let id = cloudevents::foreign_id(&source, &event_id);
    let envelope = Envelope {
        id,
        message_type,
        version: 1,
        kind: Kind::Event,
        source,
        aggregate_type: provider.name.clone(),
        aggregate_key: key,
        occurred_at: Utc::now(),
        correlation_id: id,
        causation_id: None,
        headers: Headers::from([
            (cloudevents::FOREIGN_ID_HEADER.to_owned(), event_id.clone()),
            (
                tidings_core::trace::TRACEPARENT.to_owned(),
                tidings_core::trace::current_or_new().to_header(),
            ),
        ]),
        content_type: JSON.to_owned(),
        payload: body.to_vec(),
    };
    Ok(Event {
        message: OutgoingMessage {
            topic: provider.topic.clone(),
            envelope,
        },
        event_id,
        uuid: None,
    })
}

/// Records the delivery and enqueues its events in one transaction.
async fn record<S: InboxStore + Clone>(shared: &Shared<S>, provider: &Provider, taken: &Taken) -> Outcome {
    let store = &shared.store;
    let attempt = async {
        let mut tx = store.begin().await?;
        let mut recorded = Vec::with_capacity(taken.events.len());
        for event in &taken.events {
            let id = event.message.envelope.id;
            if !store
                .record_delivery(&mut *tx, &provider.name, &event.event_id, id)
                .await?
            {
                recorded.push((id, false));
                continue;
            }
            // Another source's event with this UUID would be the same message
            // downstream, and one of them lost: refused, nothing stored.
            if let Some(uuid) = event.uuid
                && !store
                    .record_delivery(&mut *tx, &provider.name, &format!("uuid:{uuid}"), id)
                    .await?
            {
                return Ok(Outcome::refused(
                    StatusCode::CONFLICT,
                    "conflict",
                    format!(
                        "the id {uuid} is another source's event already: a UUID id must be unique \
                         across sources (consumers deduplicate on it)"
                    ),
                ));
            }
            // An id the signature does not cover (a header) could be changed to
            // replay a signed body as a new event: the body is recorded too, and
            // dropping the transaction forgets the id just recorded.
            if provider.id_unsigned() {
                let body = format!(
                    "sha256:{}",
                    crate::signature::sha256_hex(&event.message.envelope.payload)
                );
                if !store.record_delivery(&mut *tx, &provider.name, &body, id).await? {
                    return Ok(Outcome::refused(
                        StatusCode::CONFLICT,
                        "replayed",
                        "this body was delivered before under another id",
                    ));
                }
            }
            store.enqueue_outgoing(&mut *tx, &event.message).await?;
            recorded.push((id, true));
        }
        store.commit(tx).await?;
        Ok::<_, Error>(match recorded[..] {
            [(id, true)] if !taken.batch => Outcome::Accepted(id),
            [(id, false)] if !taken.batch => Outcome::Duplicate(id),
            _ => Outcome::Batch(recorded),
        })
    };
    let outcome = match attempt.await {
        Ok(outcome) => outcome,
        Err(Error::Refused { reason, .. }) => Outcome::refused(
            StatusCode::UNPROCESSABLE_ENTITY,
            "refused",
            format!("the outbox refused the event: {reason}"),
        ),
        Err(e) => {
            // The detail is for the operator: the provider gets a fixed reason.
            tracing::error!(provider = %provider.name, error = %e.report(), "recording a webhook delivery failed");
            Outcome::Failed {
                status: match e.class() {
                    ErrorClass::Transient => StatusCode::SERVICE_UNAVAILABLE,
                    _ => StatusCode::INTERNAL_SERVER_ERROR,
                },
                reason: NOT_NOW.into(),
            }
        }
    };
    if matches!(outcome, Outcome::Accepted(_) | Outcome::Batch(_)) {
        forget_now_and_then(shared);
    }
    outcome
}

/// Deletes deliveries past the retention, at most once per
/// [`FORGET_EVERY`], in the background.
fn forget_now_and_then<S: InboxStore + Clone>(shared: &Shared<S>) {
    let Some(retention) = shared.retention else { return };
    let now = Utc::now().timestamp();
    let last = shared.last_forget.load(Ordering::Relaxed);
    if now - last < FORGET_EVERY.as_secs() as i64
        || shared
            .last_forget
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
    {
        return;
    }
    let store = shared.store.clone();
    tokio::spawn(async move {
        // Batch after batch, until one is short: the table never falls behind.
        let mut deleted = 0;
        loop {
            match store.forget_deliveries(retention, FORGET_BATCH).await {
                Ok(n) => {
                    deleted += n;
                    if n < FORGET_BATCH as u64 {
                        break;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e.report(), "deleting inbox deliveries past the retention failed");
                    break;
                }
            }
        }
        if deleted > 0 {
            tracing::debug!(deleted, "inbox deliveries past the retention deleted");
        }
    });
}
