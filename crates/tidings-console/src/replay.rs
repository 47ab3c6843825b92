//! Replays, asked of the database directly (`tidings replay`) or of a
//! running daemon (`POST /api/replays`): one place resolves what a request
//! means (the consumer's topics, where its events are retained, what the
//! range holds), refuses what would reach past the dedupe horizon, counts
//! what a dry run would do, and records the request with its audit entry.
//! A running member of the consumer carries it out
//! ([`tidings_core::replay`]); whoever asked follows it by its id.

use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tidings_core::replay::{Replay, ReplayRequest, ReplaySource};
use uuid::Uuid;

use crate::ConsoleStore;
use crate::actions::record;
use crate::api::ApiError;

/// The rate of a replay that names none, in events per second.
pub const DEFAULT_RATE: f64 = 500.0;

/// What an operator asks: the body of `POST /api/replays`.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ReplayAsk {
    /// The consumer (group) to re-deliver to.
    pub consumer: String,
    /// Events written at or after this...
    pub since: DateTime<Utc>,
    /// ...and before this (default: now).
    #[serde(default)]
    pub until: Option<DateTime<Utc>>,
    /// Only these topics (default: every topic the consumer reads).
    #[serde(default)]
    pub topics: Vec<String>,
    /// Where the events are retained (default: the database log if the
    /// consumer reads it, else the outbox).
    #[serde(default)]
    pub source: Option<ReplaySource>,
    /// Events per second at most (500 by default).
    #[serde(default)]
    pub rate: Option<f64>,
    /// Count what would be re-delivered and what would be suppressed,
    /// and record nothing.
    #[serde(default)]
    pub dry_run: bool,
    /// Replay from before the dedupe horizon anyway: what the consumer
    /// handled before it is handled, and its effects done, again.
    #[serde(default)]
    pub force: bool,
}

/// What a dry run found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct DryRun {
    /// Events in the range: each would be re-delivered.
    pub events: u64,
    /// Of those, already processed: the idempotency store suppresses them.
    pub suppressed: u64,
    /// Of those, not processed yet: they would be handled.
    pub to_handle: u64,
    /// Events that do not decode (skipped).
    pub undecodable: u64,
}

/// The answer to a [`ReplayAsk`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Replayed {
    /// The request as resolved: its topics, source, range and how many
    /// events the range held.
    pub request: ReplayRequest,
    /// The replay's id, to follow at `GET /api/replays/{id}`; none for a
    /// dry run, or when the range holds nothing.
    pub id: Option<Uuid>,
    /// What a dry run found.
    pub dry_run: Option<DryRun>,
    /// What the operator should know: the range is empty, no member is
    /// running to carry it out, it reaches past the dedupe horizon.
    pub notes: Vec<String>,
}

/// Resolves `ask`, then counts it (`dry_run`) or records it, writing the
/// audit entry as `actor` in `role`.
pub async fn ask<S: ConsoleStore + ?Sized>(
    store: &S,
    ask: &ReplayAsk,
    actor: &str,
    role: &str,
) -> Result<Replayed, ApiError> {
    let mut answer = resolve(store, ask).await?;
    if ask.dry_run {
        answer.dry_run = Some(dry_run(store, &answer.request).await?);
        return Ok(answer);
    }
    if answer.request.total == 0 {
        return Ok(answer);
    }
    let members = store.members().await?;
    if !members.iter().any(|m| m.is_in_group(&ask.consumer)) {
        answer.notes.push(format!(
            "no member of {} is running: the replay waits until one starts",
            ask.consumer
        ));
    }
    let id = store.request_replay(&answer.request).await?;
    tracing::info!(by = actor, replay = %id, consumer = %ask.consumer, total = answer.request.total, "replay requested");
    record(
        store,
        actor,
        role,
        "replay",
        id.to_string(),
        serde_json::to_value(&answer.request).unwrap_or_default(),
    )
    .await?;
    answer.id = Some(id);
    Ok(answer)
}

/// The replay `id`, or 404.
pub async fn get<S: ConsoleStore + ?Sized>(store: &S, id: Uuid) -> Result<Replay, ApiError> {
    store.replay(id).await?.ok_or_else(|| not_found(id))
}

/// Cancels the replay `id` (audited as `actor` in `role`); 409 when it had
/// ended already.
pub async fn cancel<S: ConsoleStore + ?Sized>(
    store: &S,
    id: Uuid,
    actor: &str,
    role: &str,
) -> Result<Replay, ApiError> {
    get(store, id).await?;
    if !store.cancel_replay(id).await? {
        let ended = get(store, id).await?;
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!(
                "replay {id} is {} already: nothing to cancel",
                ended.state.as_str()
            ),
        ));
    }
    let after = get(store, id).await?;
    record(
        store,
        actor,
        role,
        "replay-cancel",
        id.to_string(),
        serde_json::json!({ "consumer": after.request.consumer, "delivered": after.counts.delivered }),
    )
    .await?;
    Ok(after)
}

fn not_found(id: Uuid) -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, format!("no replay has id {id}"))
}

fn invalid(message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, message)
}

/// What `ask` means on this store, checked, recording nothing: its topics
/// and source, what the range holds, and whether it reaches past the
/// dedupe horizon (refused then, unless forced or a dry run).
pub async fn resolve<S: ConsoleStore + ?Sized>(store: &S, ask: &ReplayAsk) -> Result<Replayed, ApiError> {
    let until = ask.until.unwrap_or_else(Utc::now);
    if ask.consumer.trim().is_empty() {
        return Err(invalid("consumer: name the consumer group to replay to"));
    }
    if ask.since >= until {
        return Err(invalid(format!(
            "since ({}) must be before until ({until})",
            ask.since
        )));
    }
    let rate = ask.rate.unwrap_or(DEFAULT_RATE);
    if !(rate > 0.0 && rate.is_finite()) {
        return Err(invalid("rate must be a positive number of events per second"));
    }
    let mut notes = Vec::new();
    if let Some(horizon) = store.past_dedupe_horizon(Some(ask.since)).await? {
        if !ask.force && !ask.dry_run {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                format!(
                    "replaying to {} from {} reaches past the dedupe horizon ({horizon}): the processed \
                     markers from before it were deleted (consumer.dedupe_retention), so what was handled \
                     then would be handled again and its effects done twice. Start at {horizon} or later, \
                     or pass force (--force) to do it anyway",
                    ask.consumer, ask.since
                ),
            ));
        }
        notes.push(format!(
            "the range reaches back past the dedupe horizon ({horizon}): what was handled before it will be handled again"
        ));
    }
    let lag = store.lag().await?;
    let reads_log: Vec<String> = lag
        .consumers
        .iter()
        .filter(|c| c.consumer == ask.consumer)
        .map(|c| c.topic.clone())
        .collect();
    let topics = if ask.topics.is_empty() {
        let members = store.members().await?;
        let mut topics: Vec<String> = members
            .iter()
            .filter_map(|m| m.group_and_topic())
            .filter(|(group, _)| *group == ask.consumer)
            .map(|(_, topic)| topic.to_owned())
            .chain(reads_log.iter().cloned())
            .collect();
        topics.sort();
        topics.dedup();
        topics
    } else {
        ask.topics.clone()
    };
    if topics.is_empty() {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!(
                "cannot tell which topics {} reads: no member of it is running and it has no log offsets; name the topics",
                ask.consumer
            ),
        ));
    }
    let source = ask.source.unwrap_or(if reads_log.is_empty() {
        ReplaySource::Outbox
    } else {
        ReplaySource::Log
    });
    let total = store.count_retained(source, &topics, ask.since, until).await?;
    if total == 0 {
        let hint = match source {
            ReplaySource::Log => "",
            ReplaySource::Outbox => {
                " (the outbox keeps sent records only with a retention: database.outbox_retention)"
            }
        };
        notes.push(format!(
            "nothing retained for {} on {} between {} and {until} in the {}{hint}",
            ask.consumer,
            topics.join(", "),
            ask.since,
            source.as_str()
        ));
    }
    Ok(Replayed {
        request: ReplayRequest {
            consumer: ask.consumer.clone(),
            topics,
            source,
            since: ask.since,
            until,
            rate,
            total,
        },
        id: None,
        dry_run: None,
        notes,
    })
}

/// Reads the range page by page, counting what the consumer processed.
async fn dry_run<S: ConsoleStore + ?Sized>(store: &S, request: &ReplayRequest) -> Result<DryRun, ApiError> {
    let (mut events, mut suppressed, mut undecodable, mut after) = (0, 0, 0, 0);
    loop {
        let page = store
            .retained(
                request.source,
                &request.topics,
                request.since,
                request.until,
                after,
                1000,
            )
            .await?;
        let Some(last) = page.last() else { break };
        after = last.position;
        let ids: Vec<Uuid> = page
            .iter()
            .filter_map(|r| r.message.decode().ok().map(|e| e.id))
            .collect();
        undecodable += (page.len() - ids.len()) as u64;
        events += page.len() as u64;
        suppressed += store.count_processed(&request.consumer, &ids).await?;
    }
    Ok(DryRun {
        events,
        suppressed,
        to_handle: events - suppressed - undecodable,
        undecodable,
    })
}
