//! What an operator may do to dead letters, whoever asks: the API and the
//! pages' forms both come here. Each action is logged with who took it.

use std::time::Duration;

use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use tidings_core::{AuditEntry, Redrive, Skip};
use uuid::Uuid;

use crate::ConsoleStore;
use crate::access::Caller;
use crate::api::ApiError;
use crate::triage::{self, Selection};

/// Which dead letters to redrive, and how.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct RedriveRequest {
    /// These dead letters (pending ones); or, when empty, the selection.
    pub ids: Vec<Uuid>,
    /// Which dead letters, when no id is given.
    pub selection: Selection,
    /// Every pending dead letter, when the selection is empty.
    pub all: bool,
    /// Redrive letters older than the dedupe horizon anyway.
    pub force: bool,
    /// Redrives per second at most (100 by default).
    pub rate: Option<f64>,
}

/// What one redrive did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Redriven {
    /// The dead letter.
    pub id: Uuid,
    /// `enqueued` (back in the outbox), `edited` (back in the outbox with
    /// an operator's data), `released` (the relay tries it again), `gone`
    /// (no longer stored), `undecodable` (its body is not an envelope: fix
    /// it at the source), `settled` (already redriven or skipped: nothing
    /// done) or `not-editable` (set aside by the relay: fixed in the outbox
    /// or at the source, not edited).
    pub outcome: String,
    /// The message's id, when it went back.
    pub message_id: Option<Uuid>,
    /// Which redrive of the letter this was, when it went back.
    pub redrive: Option<u32>,
}

impl Redriven {
    /// What the store's redrive of `id` did.
    pub fn of(id: Uuid, redrive: Redrive) -> Redriven {
        let (outcome, message_id, redrive) = match redrive {
            Redrive::Enqueued { message_id, redrive } => ("enqueued", Some(message_id), Some(redrive)),
            Redrive::Edited {
                message_id, redrive, ..
            } => ("edited", Some(message_id), Some(redrive)),
            Redrive::Released { message_id, redrive } => ("released", Some(message_id), Some(redrive)),
            Redrive::NotFound => ("gone", None, None),
            Redrive::Undecodable => ("undecodable", None, None),
            Redrive::Settled => ("settled", None, None),
            Redrive::NotEditable => ("not-editable", None, None),
        };
        Redriven {
            id,
            outcome: outcome.to_owned(),
            message_id,
            redrive,
        }
    }
}

/// What a redrive request did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RedriveReport {
    /// How many went back.
    pub redriven: usize,
    /// Each letter's outcome.
    pub letters: Vec<Redriven>,
}

/// Redrives what `request` names, at its rate; refused past the dedupe
/// horizon unless forced.
pub(crate) async fn redrive<S: ConsoleStore>(
    store: &S,
    caller: &Caller,
    request: &RedriveRequest,
) -> Result<RedriveReport, ApiError> {
    let rate = request.rate.unwrap_or(100.0);
    if !(rate > 0.0 && rate.is_finite()) {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "rate must be a positive number of redrives per second",
        ));
    }
    let letters = if request.ids.is_empty() {
        if !request.all && request.selection.is_empty() {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "say which dead letters: ids, a selection (consumer, type, cause, error, since, until), or all",
            ));
        }
        let selection = Selection {
            include_settled: false,
            ..request.selection.clone()
        };
        selection.letters_within(store, Some(crate::READ_LIMIT)).await?
    } else {
        let pending = Selection::default()
            .letters_within(store, Some(crate::READ_LIMIT))
            .await?;
        let mut chosen: Vec<tidings_core::DeadLetter> = Vec::new();
        let mut ids = request.ids.clone();
        ids.sort_unstable();
        ids.dedup();
        for id in &ids {
            match pending.iter().find(|l| l.id == *id) {
                Some(l) => chosen.push(l.clone()),
                None => {
                    return Err(ApiError::new(
                        StatusCode::NOT_FOUND,
                        format!("no pending dead letter has id {id}"),
                    ));
                }
            }
        }
        chosen
    };
    if letters.is_empty() {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "no pending dead letter matches; nothing redriven",
        ));
    }
    // A redrive delivers the message to every group of its topic again:
    // past the dedupe horizon, those that handled it would handle it twice.
    let oldest = letters
        .iter()
        .filter(|l| l.consumer != tidings_core::RELAY_LETTERS)
        .map(|l| l.created_at)
        .min();
    if let (Some(oldest), false) = (oldest, request.force)
        && let Some(horizon) = store.dedupe_horizon().await?
        && oldest < horizon
    {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!(
                "redriving reaches back to {oldest}, past the dedupe horizon ({horizon}): the processed markers \
                 from before it were deleted, so consumers that handled these messages would handle them again. \
                 Pass force to do it anyway"
            ),
        ));
    }
    // At most one every 10 s; at least 1 ms apart.
    let pause = Duration::from_secs_f64((1.0 / rate).clamp(0.001, 10.0));
    let mut report = RedriveReport {
        redriven: 0,
        letters: Vec::with_capacity(letters.len()),
    };
    for (i, l) in letters.iter().enumerate() {
        if i > 0 {
            tokio::time::sleep(pause).await;
        }
        let outcome = Redriven::of(l.id, store.redrive(l.id).await?);
        report.redriven += usize::from(outcome.message_id.is_some());
        tracing::info!(by = %caller.name, dead_letter = %l.id, outcome = %outcome.outcome, "redrive from the console");
        audit(
            store,
            caller,
            "redrive",
            l.id.to_string(),
            serde_json::json!({
                "outcome": outcome.outcome,
                "message_id": outcome.message_id,
                "redrive": outcome.redrive,
                "consumer": l.consumer,
            }),
        )
        .await?;
        report.letters.push(outcome);
    }
    Ok(report)
}

/// What a skip did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Skipped {
    /// The dead letter.
    pub id: Uuid,
    /// Whether its key was held, and is now released.
    pub released_key: bool,
}

/// Skips the dead letter `id`.
pub(crate) async fn skip<S: ConsoleStore>(store: &S, caller: &Caller, id: Uuid) -> Result<Skipped, ApiError> {
    match store.skip(id).await? {
        Skip::Skipped { released_key } => {
            tracing::info!(by = %caller.name, dead_letter = %id, released_key, "skip from the console");
            let detail = serde_json::json!({ "released_key": released_key });
            audit(store, caller, "skip", id.to_string(), detail).await?;
            Ok(Skipped { id, released_key })
        }
        Skip::NotFound => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("no dead letter has id {id}"),
        )),
    }
}

/// Which settled dead letters to delete.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct PurgeRequest {
    /// Which dead letters (only settled ones go).
    pub selection: Selection,
    /// Every settled dead letter, when the selection is empty.
    pub all: bool,
}

/// What a purge did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Purged {
    /// How many settled dead letters were deleted.
    pub purged: u64,
}

/// Deletes the settled dead letters `request` selects.
pub(crate) async fn purge<S: ConsoleStore>(
    store: &S,
    caller: &Caller,
    request: &PurgeRequest,
) -> Result<Purged, ApiError> {
    if !request.all && request.selection.is_empty() {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "say which dead letters: a selection (consumer, type, cause, error, since, until), or all",
        ));
    }
    let selection = Selection {
        include_settled: true,
        ..request.selection.clone()
    };
    let ids: Vec<Uuid> = selection
        .letters_within(store, Some(crate::READ_LIMIT))
        .await?
        .into_iter()
        .filter(|l| triage::state(l) != "pending")
        .map(|l| l.id)
        .collect();
    let purged = if ids.is_empty() {
        0
    } else {
        store.purge(&ids).await?
    };
    tracing::info!(by = %caller.name, purged, "purge from the console");
    let detail = serde_json::json!({
        "purged": purged,
        "selection": request.selection,
        "all": request.all,
        "first_ids": ids.iter().take(100).collect::<Vec<_>>(),
    });
    audit(store, caller, "purge", "dead letters".to_owned(), detail).await?;
    Ok(Purged { purged })
}

/// Writes what `caller` did to the audit trail. Done already, the action
/// stays done if this fails, and the error says so.
async fn audit<S: ConsoleStore>(
    store: &S,
    caller: &Caller,
    action: &str,
    target: String,
    mut detail: serde_json::Value,
) -> Result<(), ApiError> {
    detail["role"] = serde_json::Value::String(caller.role.to_string());
    let entry = AuditEntry {
        at: chrono::Utc::now(),
        actor: caller.name.clone(),
        action: action.to_owned(),
        target,
        detail,
    };
    store.audit(&entry).await.map_err(|e| {
        tracing::error!(error = %e.report(), action, target = %entry.target, by = %caller.name, "an action was done but its audit entry could not be written");
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the {action} of {} was done, but its audit entry could not be written: {}", entry.target, e.report()),
        )
    })
}
