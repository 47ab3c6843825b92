//! What an operator may do to dead letters, whoever asks: the API and the
//! pages' forms both come here. Each action is logged with who took it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::{DateTime, Utc};

use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use tidings_core::{
    AuditEntry, AuditStore, DeadLetter, Edit, Envelope, OutgoingMessage, PublishGuard as _, RELAY_LETTERS,
    Redrive, Skip, redrive_envelope,
};
use tidings_schema::{Registry, SchemaError, SchemaGuard};
use uuid::Uuid;

use crate::ConsoleStore;
use crate::access::Caller;
use crate::api::ApiError;
use crate::triage::{self, Selection};

/// Which dead letters to redrive, and how.
#[derive(Debug, Clone, Default, Serialize, Deserialize, schemars::JsonSchema)]
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
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
        let mut chosen: Vec<DeadLetter> = Vec::new();
        let mut ids = request.ids.clone();
        ids.sort_unstable();
        ids.dedup();
        for id in &ids {
            let letter = store.letter(*id).await?.ok_or_else(|| not_found(*id))?;
            if !letter.is_pending() {
                return Err(settled(&letter, "redriven"));
            }
            chosen.push(letter);
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
    let oldest = letters.iter().filter_map(DeadLetter::reaches_back_to).min();
    if let Some((oldest, horizon)) = past_horizon(store, oldest, request.force).await? {
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

/// `oldest` and the dedupe horizon, when `oldest` is before it and the
/// caller did not `force`: the processed markers from before it were
/// deleted, so a redrive reaching back there would be handled again by
/// consumers that handled it.
async fn past_horizon<S: ConsoleStore>(
    store: &S,
    oldest: Option<DateTime<Utc>>,
    force: bool,
) -> Result<Option<(DateTime<Utc>, DateTime<Utc>)>, ApiError> {
    let (Some(oldest), false) = (oldest, force) else {
        return Ok(None);
    };
    Ok(store
        .past_dedupe_horizon(Some(oldest))
        .await?
        .map(|h| (oldest, h)))
}

/// No dead letter has `id`.
pub(crate) fn not_found(id: Uuid) -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, format!("no dead letter has id {id}"))
}

/// `letter` is settled already: nothing `done`.
fn settled(letter: &DeadLetter, done: &str) -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        format!(
            "dead letter {} is {} already: nothing {done}. It is pending again if its message fails again",
            letter.id,
            triage::state(letter)
        ),
    )
}

/// The dead letter `id` was set aside by the relay.
fn not_editable(id: Uuid) -> ApiError {
    ApiError::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        format!(
            "dead letter {id} is a record the relay set aside: it never reached a consumer, so it is not \
             edited here. Fix it in the outbox or at its source, then redrive it as it stands; nothing was changed"
        ),
    )
}

/// The dead letter `id`'s body is not an envelope.
fn undecodable(id: Uuid) -> ApiError {
    ApiError::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        format!(
            "dead letter {id}'s body is not a valid envelope, so there is no payload to edit: fix it at the \
             source and publish it anew; nothing was changed"
        ),
    )
}

/// The schemas an edited payload must match ([`Console::schemas`](crate::Console::schemas)):
/// a registry directory, read and compiled once, when the console starts.
pub struct Schemas {
    dir: PathBuf,
    registry: Registry,
    guard: SchemaGuard,
}

impl std::fmt::Debug for Schemas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Schemas")
            .field("dir", &self.dir)
            .field("schemas", &self.registry.docs().count())
            .finish()
    }
}

impl Schemas {
    /// The registry in `dir` (`tidings schema generate`'s). Refused if the
    /// directory cannot be read (a misspelt path would otherwise refuse
    /// every edit), or holds a file that is not a schema.
    pub fn load(dir: &Path) -> Result<Schemas, SchemaError> {
        std::fs::read_dir(dir).map_err(|source| SchemaError::Io {
            path: dir.to_owned(),
            source,
        })?;
        let registry = Registry::load(dir)?;
        let guard = SchemaGuard::new(&registry)?;
        Ok(Schemas {
            dir: dir.to_owned(),
            registry,
            guard,
        })
    }

    /// Whether `data` may replace the payload of `envelope`: its type and
    /// version have a schema, which it matches, and it holds no likely
    /// secret. Refused with 422 saying why and what to do.
    fn check(&self, envelope: &Envelope, data: &serde_json::Value) -> Result<(), ApiError> {
        let (t, v) = (&envelope.message_type, envelope.version);
        let dir = self.dir.display();
        if self.registry.get(t, v).is_none() {
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                format!(
                    "the schema registry at {dir} has no schema of {t} v{v}, and an edit is accepted only \
                     against its schema: generate it there (`tidings schema generate`) and restart the \
                     console; nothing was changed"
                ),
            ));
        }
        let mut edited = envelope.clone();
        edited.payload = serde_json::to_vec(data).expect("a JSON value to bytes");
        edited.content_type = tidings_core::envelope::JSON.to_owned();
        let message = OutgoingMessage {
            topic: String::new(),
            envelope: edited,
        };
        self.guard.check(&message).map_err(|e| {
            let reason = match e {
                tidings_core::Error::Refused { reason, .. } => reason,
                other => other.to_string(),
            };
            ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                format!(
                    "the edited payload does not pass the schema of {t} v{v} ({dir}): {reason}; nothing was changed"
                ),
            )
        })
    }
}

/// An edited redrive: the payload that replaces the message's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct EditRequest {
    /// The new payload (the message's `data`).
    pub data: serde_json::Value,
    /// Redrive it even if it is older than the dedupe horizon.
    #[serde(default)]
    pub force: bool,
}

/// What an edited redrive did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Edited {
    /// The dead letter.
    pub id: Uuid,
    /// The edit's id: the `tidingsedit` header of the message sent.
    pub edit: Uuid,
    /// The message's id (unchanged).
    pub message_id: Uuid,
    /// Which redrive of the letter this was.
    pub redrive: u32,
}

/// Redrives the dead letter `id` with `request`'s payload in place of its
/// message's, once the payload passes its schema in `schemas`; refused,
/// changing nothing, without a registry, for a payload that does not pass,
/// for a letter settled, set aside by the relay or undecodable, and past
/// the dedupe horizon unless forced. Audited as `edit-redrive`.
pub(crate) async fn edit<S: ConsoleStore>(
    store: &S,
    schemas: Option<&Schemas>,
    caller: &Caller,
    id: Uuid,
    request: &EditRequest,
) -> Result<Edited, ApiError> {
    let letter = store.letter(id).await?.ok_or_else(|| not_found(id))?;
    if !letter.is_pending() {
        return Err(settled(&letter, "edited"));
    }
    if letter.consumer == RELAY_LETTERS {
        return Err(not_editable(id));
    }
    let envelope = redrive_envelope(&letter).ok_or_else(|| undecodable(id))?;
    let schemas = schemas.ok_or_else(|| {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "this console has no schema registry to check an edit against, so it accepts none: start it \
             with --schemas DIR (or [console] schemas in tidings.toml), DIR the registry `tidings schema \
             generate` writes; nothing was changed",
        )
    })?;
    schemas.check(&envelope, &request.data)?;
    // Like a redrive, it reaches every group of its topic again.
    if let Some((oldest, horizon)) = past_horizon(store, letter.reaches_back_to(), request.force).await? {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!(
                "dead letter {id}'s message is from {oldest}, before the dedupe horizon ({horizon}): consumers \
                 that handled it would handle it again. Pass force to do it anyway; nothing was changed"
            ),
        ));
    }
    let edit = Edit {
        data: request.data.clone(),
        by: caller.name.clone(),
    };
    match store.redrive_edited(id, &edit).await? {
        Redrive::Edited {
            message_id,
            redrive,
            edit,
        } => {
            tracing::info!(by = %caller.name, dead_letter = %id, %edit, %message_id, "edited redrive from the console");
            let detail = serde_json::json!({
                "dead_letter": id,
                "edit": edit,
                "message_id": message_id,
                "redrive": redrive,
                "consumer": letter.consumer,
            });
            audit(store, caller, "edit-redrive", id.to_string(), detail).await?;
            Ok(Edited {
                id,
                edit,
                message_id,
                redrive,
            })
        }
        // It changed since it was read: a redrive or an edit came first.
        Redrive::Settled => Err(settled(&store.letter(id).await?.unwrap_or(letter), "edited")),
        Redrive::NotFound => Err(not_found(id)),
        Redrive::Undecodable => Err(undecodable(id)),
        Redrive::NotEditable => Err(not_editable(id)),
        other @ (Redrive::Enqueued { .. } | Redrive::Released { .. }) => {
            tracing::error!(dead_letter = %id, outcome = ?other, "the store redrove a letter without its edit");
            Err(ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("dead letter {id} was redriven, but without the edit"),
            ))
        }
    }
}

/// What a skip did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
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
        Skip::NotFound => Err(not_found(id)),
        Skip::Settled => Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("dead letter {id} is already redriven or skipped; nothing done"),
        )),
    }
}

/// Which settled dead letters to delete.
#[derive(Debug, Clone, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default)]
pub struct PurgeRequest {
    /// Which dead letters (only settled ones go).
    pub selection: Selection,
    /// Every settled dead letter, when the selection is empty.
    pub all: bool,
}

/// What a purge did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
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
    detail: serde_json::Value,
) -> Result<(), ApiError> {
    record(
        store,
        &caller.name,
        &caller.role.to_string(),
        action,
        target,
        detail,
    )
    .await
}

/// Writes to the audit trail that `actor`, in `role`, did `action` to
/// `target` (`detail` gains the role): the console's actions, and those
/// `tidings dlq` takes on the database directly. Done already, the action
/// stays done if this fails (answered 503), and the error says so.
pub async fn record<S: AuditStore + ?Sized>(
    store: &S,
    actor: &str,
    role: &str,
    action: &str,
    target: String,
    mut detail: serde_json::Value,
) -> Result<(), ApiError> {
    detail["role"] = serde_json::Value::String(role.to_owned());
    let entry = AuditEntry {
        at: chrono::Utc::now(),
        actor: actor.to_owned(),
        action: action.to_owned(),
        target,
        detail,
    };
    store.audit(&entry).await.map_err(|e| {
        tracing::error!(error = %e.report(), action, target = %entry.target, by = %actor, "an action was done but its audit entry could not be written");
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the {action} of {} was done, but its audit entry could not be written: {}", entry.target, e.report()),
        )
    })
}
