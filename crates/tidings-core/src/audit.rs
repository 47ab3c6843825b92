//! The audit trail: what people and tools did to a deployment (a redrive,
//! a skip, a purge, an edit), kept in the store for whoever asks later who
//! did what, and when.

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use crate::Result;

/// One action a person or a tool took on a deployment (a redrive, a skip,
/// an edit), kept for whoever asks later who did what.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct AuditEntry {
    /// When it was done. Stores keep at least milliseconds.
    pub at: DateTime<Utc>,
    /// Who did it: a token's name, a user.
    pub actor: String,
    /// What was done: `redrive`, `skip`, `purge`, `edit`.
    pub action: String,
    /// What it was done to: a dead letter's id, a selection.
    pub target: String,
    /// The rest, as JSON: whatever the action has to say beyond the above.
    pub detail: serde_json::Value,
}

/// The store's audit trail: written one entry at a time, read newest first.
#[async_trait]
pub trait AuditStore: Send + Sync + 'static {
    /// Writes one entry.
    async fn audit(&self, entry: &AuditEntry) -> Result<()>;

    /// Entries newest first, at most `limit`, only those of `target` when given.
    async fn audit_trail(&self, target: Option<&str>, limit: u32) -> Result<Vec<AuditEntry>>;
}
