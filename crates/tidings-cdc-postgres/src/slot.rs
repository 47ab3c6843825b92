//! The replication slot and the publication a CDC relay reads, named
//! after its relay group (`tidings_<group>`): made on first start (or by
//! `tidings migrate`), taken over by the relay that holds the lease, looked
//! at by the slot guard and `tidings doctor`, dropped by `tidings cdc drop`.

use sqlx::{PgPool, Row};
use tidings_core::{Error, Result};
use tidings_sql::db_error;
use tidings_store_postgres::Pg;

/// The names of one relay group's slot and publication (the same).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotName(String);

impl SlotName {
    /// `tidings_<group>`. A group is 1 to 50 lower-case letters, digits and
    /// underscores (slot names allow nothing else, and at most 63 bytes).
    pub fn of_group(group: &str) -> Result<SlotName> {
        let valid = !group.is_empty()
            && group.len() <= 50
            && group
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
        if !valid {
            return Err(Error::Config {
                key: "relay.cdc.group".into(),
                reason: format!(
                    "{group:?} cannot name a replication slot: use 1 to 50 lower-case letters, digits and underscores"
                ),
            });
        }
        Ok(SlotName(format!("tidings_{group}")))
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for SlotName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Refuses a server whose write-ahead log cannot be decoded, saying how to
/// change it.
pub async fn check_wal_level(pool: &PgPool) -> Result<()> {
    let level: String = sqlx::query_scalar("SELECT current_setting('wal_level')")
        .fetch_one(pool)
        .await
        .map_err(db_error::<Pg>("reading wal_level"))?;
    if level != "logical" {
        return Err(Error::Config {
            key: "relay.mode".into(),
            reason: format!(
                "cdc needs PostgreSQL's wal_level = logical, and this server runs with wal_level = {level}: \
                 ALTER SYSTEM SET wal_level = logical, then restart the server (or use relay.mode = \"poll\")"
            ),
        });
    }
    Ok(())
}

/// Makes the publication of the outbox's inserts and the slot, where
/// missing; returns whether the slot was made now. `tidings_outbox` is the
/// one the pool's search path finds.
pub async fn ensure(pool: &PgPool, name: &SlotName) -> Result<bool> {
    check_wal_level(pool).await?;
    let published: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)")
            .bind(name.as_str())
            .fetch_one(pool)
            .await
            .map_err(db_error::<Pg>("looking for the CDC publication"))?;
    if !published {
        // Only inserts: sending rows marks or deletes them, which the
        // relay need not read back.
        let create = format!("CREATE PUBLICATION {name} FOR TABLE tidings_outbox WITH (publish = 'insert')");
        if let Err(e) = sqlx::raw_sql(sqlx::AssertSqlSafe(create)).execute(pool).await
            && !already_exists(&e)
        {
            return Err(db_error::<Pg>("creating the CDC publication")(e));
        }
    } else {
        // Exactly this outbox: a publication left by a deployment in
        // another schema would stream another table's seqs.
        let (ours, all): (i64, i64) = sqlx::query_as(
            "SELECT count(*) FILTER (WHERE schemaname = current_schema() AND tablename = 'tidings_outbox'),
                    count(*)
             FROM pg_publication_tables WHERE pubname = $1",
        )
        .bind(name.as_str())
        .fetch_one(pool)
        .await
        .map_err(db_error::<Pg>("reading the CDC publication's tables"))?;
        if (ours, all) != (1, 1) {
            tracing::warn!(publication = %name, tables = all, "the CDC publication named other tables: it now names this outbox alone");
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                "ALTER PUBLICATION {name} SET TABLE tidings_outbox"
            )))
            .execute(pool)
            .await
            .map_err(db_error::<Pg>("setting the CDC publication's table"))?;
        }
    }
    let slotted: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1)")
            .bind(name.as_str())
            .fetch_one(pool)
            .await
            .map_err(db_error::<Pg>("looking for the CDC replication slot"))?;
    if slotted {
        return Ok(false);
    }
    // Making a slot waits for every transaction running to end: bounded,
    // so that a long transaction is an error to retry, not a relay stuck.
    let made = async {
        let mut tx = pool.begin().await?;
        sqlx::raw_sql("SET LOCAL statement_timeout = '30s'")
            .execute(&mut *tx)
            .await?;
        let row = sqlx::query("SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput')")
            .bind(name.as_str())
            .fetch_one(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok::<_, sqlx::Error>(row)
    };
    match made.await {
        Ok(row) => {
            let lsn: String = row.get(0);
            tracing::info!(slot = %name, consistent_at = %lsn, "made the CDC replication slot");
            Ok(true)
        }
        Err(e) if already_exists(&e) => Ok(false),
        Err(e) => Err(db_error::<Pg>("creating the CDC replication slot")(e)),
    }
}

fn already_exists(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.code().as_deref() == Some("42710"))
}

/// Ends another session's stream of the slot (a relay that lost its lease
/// and has not noticed yet): returns whether there was one.
pub async fn take_over(pool: &PgPool, name: &SlotName) -> Result<bool> {
    let ended: Option<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots
         WHERE slot_name = $1 AND active_pid IS NOT NULL AND active_pid <> pg_backend_pid()",
    )
    .bind(name.as_str())
    .fetch_optional(pool)
    .await
    .map_err(db_error::<Pg>("ending another stream of the CDC slot"))?;
    Ok(ended.unwrap_or(false))
}

/// Drops the slot and the publication, ending whatever streams the slot:
/// what `tidings cdc drop` does. Returns whether a slot was there. The
/// outbox keeps every record not sent; a relay started afterwards makes
/// both again and sends those records first.
pub async fn drop(pool: &PgPool, name: &SlotName) -> Result<bool> {
    let mut dropped = false;
    for _ in 0..50 {
        take_over(pool, name).await?;
        match sqlx::query(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1",
        )
        .bind(name.as_str())
        .fetch_optional(pool)
        .await
        {
            Ok(found) => {
                dropped = found.is_some();
                break;
            }
            // 55006: still active, its session not gone yet.
            Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some("55006") => {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            Err(e) => return Err(db_error::<Pg>("dropping the CDC replication slot")(e)),
        }
    }
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP PUBLICATION IF EXISTS {name}")))
        .execute(pool)
        .await
        .map_err(db_error::<Pg>("dropping the CDC publication"))?;
    Ok(dropped)
}

/// What the server says of a slot.
#[derive(Debug, Clone, PartialEq)]
pub struct SlotStatus {
    /// Whether a session streams it now.
    pub active: bool,
    /// Write-ahead log the server keeps for it: from the oldest position it
    /// may need to the server's current one, in bytes.
    pub retained_bytes: i64,
    /// From the position the relay confirmed to the server's current one,
    /// in bytes: what the relay has not acknowledged yet.
    pub unconfirmed_bytes: i64,
}

/// The slot's state, or `None` if there is no such slot.
pub async fn status(pool: &PgPool, name: &SlotName) -> Result<Option<SlotStatus>> {
    let row = sqlx::query(
        "SELECT active,
                COALESCE(pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn), 0)::int8,
                COALESCE(pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn), 0)::int8
         FROM pg_replication_slots WHERE slot_name = $1",
    )
    .bind(name.as_str())
    .fetch_optional(pool)
    .await
    .map_err(db_error::<Pg>("reading the CDC slot's state"))?;
    Ok(row.map(|r| SlotStatus {
        active: r.get(0),
        retained_bytes: r.get(1),
        unconfirmed_bytes: r.get(2),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_names_a_slot_or_is_refused_with_the_rule() {
        assert_eq!(
            SlotName::of_group("orders_2").unwrap().as_str(),
            "tidings_orders_2"
        );
        for bad in ["", "Orders", "a-b", "a b", &"x".repeat(51), "a;drop"] {
            let e = SlotName::of_group(bad).unwrap_err().to_string();
            assert!(e.contains("lower-case letters, digits and underscores"), "{e}");
        }
    }
}
