//! `tidings audit`: who redrove, skipped, purged or edited what, and when,
//! from the database or through a daemon's console.

use tidings_core::{AuditEntry, AuditStore};

use crate::daemon_client::Daemon;
use crate::dlq::shown;

/// Who this command acts as in the audit trail when it changes the
/// database directly: `cli:` and the user running it (the console writes
/// its token's name).
pub(crate) fn cli_actor() -> String {
    let user = ["USER", "LOGNAME"]
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|u| !u.is_empty()))
        .unwrap_or_else(|| "unknown".to_owned());
    format!("cli:{user}")
}

/// The role written beside [`cli_actor`].
pub(crate) const CLI_ROLE: &str = "cli";

/// The newest `limit` entries (of `target` only, when given), from the database.
pub(crate) async fn read(
    store: &impl AuditStore,
    target: Option<&str>,
    limit: u32,
) -> anyhow::Result<Vec<AuditEntry>> {
    Ok(store.audit_trail(target, limit).await?)
}

/// The same, as the daemon's console reads them.
pub(crate) async fn remote(
    daemon: &Daemon,
    target: Option<&str>,
    limit: u32,
) -> anyhow::Result<Vec<AuditEntry>> {
    let limit = limit.to_string();
    let mut query = vec![("limit", limit.as_str())];
    query.extend(target.map(|t| ("target", t)));
    daemon.get("/audit", &query).await
}

/// Prints `entries`, newest first, one a line; as a JSON array with `json`.
pub(crate) fn print(entries: &[AuditEntry], json: bool) -> anyhow::Result<()> {
    if json {
        say!("{}", serde_json::to_string(entries)?);
        return Ok(());
    }
    if entries.is_empty() {
        say!("no audit entry");
    }
    for e in entries {
        say!(
            "{}  {:<16} {:<13} {}  {}",
            e.at.format("%Y-%m-%d %H:%M:%S%.3fZ"),
            shown(&e.actor),
            shown(&e.action),
            shown(&e.target),
            shown(&e.detail.to_string())
        );
    }
    Ok(())
}
