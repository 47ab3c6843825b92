//! The audit trail: who did what to the deployment, newest first.

use async_trait::async_trait;
use tidings_core::{AuditEntry, AuditStore, Result};

use crate::db::{Record, Stmt};
use crate::store::{from_micros, micros};
use crate::{Dialect, SqlStore};

/// An entry read back from `audit_trail`'s columns. A detail that does not
/// read as JSON (written to the table by other means) is kept as a string.
fn entry<D: Dialect>(r: &Record<D>) -> Result<AuditEntry> {
    let detail: String = r.get(4)?;
    Ok(AuditEntry {
        at: from_micros(r.get(0)?),
        actor: r.get(1)?,
        action: r.get(2)?,
        target: r.get(3)?,
        detail: serde_json::from_str(&detail).unwrap_or(serde_json::Value::String(detail)),
    })
}

#[async_trait]
impl<D: Dialect> AuditStore for SqlStore<D> {
    async fn audit(&self, entry: &AuditEntry) -> Result<()> {
        let what = "writing an audit entry";
        let detail = serde_json::to_string(&entry.detail).expect("JSON value to text");
        let mut conn = self.conn(what).await?;
        Stmt::<D>::new(D::SQL.audit_insert, what)
            .bind(micros(entry.at))
            .bind(entry.actor.as_str())
            .bind(entry.action.as_str())
            .bind(entry.target.as_str())
            .bind(detail.as_str())
            .execute(&mut *conn)
            .await?;
        Ok(())
    }

    async fn audit_trail(&self, target: Option<&str>, limit: u32) -> Result<Vec<AuditEntry>> {
        let what = "reading the audit trail";
        let mut conn = self.conn(what).await?;
        let rows = Stmt::<D>::new(D::SQL.audit_trail, what)
            .bind(target)
            .bind(i64::from(limit))
            .fetch_all(&mut *conn)
            .await?;
        rows.iter().map(entry::<D>).collect()
    }
}
