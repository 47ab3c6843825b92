//! Tidings' own migration runner, one for every database.
//!
//! Migrations are tracked in `tidings_migrations`, apart from the
//! application's own (`_sqlx_migrations`), so the two never collide. Each
//! dialect lists its SQL files in a [`MigrationPlan`]; [`run`] applies the
//! missing ones in one transaction.

use sqlx::Pool;
use tidings_core::{Error, Result};

use crate::Dialect;
use crate::db::{SqlDb, Stmt};
use crate::errors::db_error;

/// One migration: never edit a shipped one, add another.
#[derive(Debug, Clone, Copy)]
pub struct Migration {
    /// Increasing from 1.
    pub version: i64,
    /// A short name.
    pub name: &'static str,
    /// The SQL, possibly several statements.
    pub sql: &'static str,
}

/// Tidings' migrations, in order: every dialect ships the same list, each
/// file in its own SQL, in a `migrations/` folder beside its `src/`. Call
/// it from the dialect's `src/*.rs` (paths resolve from there).
#[macro_export]
macro_rules! migrations {
    () => {
        &[
            $crate::migrate::Migration {
                version: 1,
                name: "tidings",
                sql: include_str!("../migrations/0001_tidings.sql"),
            },
            $crate::migrate::Migration {
                version: 2,
                name: "redrive",
                sql: include_str!("../migrations/0002_redrive.sql"),
            },
            $crate::migrate::Migration {
                version: 3,
                name: "partitions",
                sql: include_str!("../migrations/0003_partitions.sql"),
            },
            $crate::migrate::Migration {
                version: 4,
                name: "relay partitions",
                sql: include_str!("../migrations/0004_relay_partitions.sql"),
            },
            $crate::migrate::Migration {
                version: 5,
                name: "parking",
                sql: include_str!("../migrations/0005_parking.sql"),
            },
            $crate::migrate::Migration {
                version: 6,
                name: "replays",
                sql: include_str!("../migrations/0006_replays.sql"),
            },
            $crate::migrate::Migration {
                version: 7,
                name: "handlings",
                sql: include_str!("../migrations/0007_handlings.sql"),
            },
            $crate::migrate::Migration {
                version: 8,
                name: "horizons",
                sql: include_str!("../migrations/0008_horizons.sql"),
            },
            $crate::migrate::Migration {
                version: 9,
                name: "relay holds",
                sql: include_str!("../migrations/0009_relay_holds.sql"),
            },
            $crate::migrate::Migration {
                version: 10,
                name: "inbox",
                sql: include_str!("../migrations/0010_inbox.sql"),
            },
            $crate::migrate::Migration {
                version: 11,
                name: "audit",
                sql: include_str!("../migrations/0011_audit.sql"),
            },
            $crate::migrate::Migration {
                version: 12,
                name: "trace",
                sql: include_str!("../migrations/0012_trace.sql"),
            },
            $crate::migrate::Migration {
                version: 13,
                name: "dead letter edits",
                sql: include_str!("../migrations/0013_edits.sql"),
            },
        ]
    };
}

/// How one database runs migrations.
#[derive(Debug, Clone, Copy)]
pub struct MigrationPlan {
    /// A statement that serializes concurrent migrators, run first in the
    /// transaction (PostgreSQL: an advisory lock; SQLite: none needed, its
    /// first write takes the database lock).
    pub lock: Option<&'static str>,
    /// The lock belongs to the session, not to the transaction (MySQL's
    /// `GET_LOCK`, which outlives the commit each DDL statement makes
    /// there): the runner then migrates on a connection of its own and
    /// closes it afterwards, which releases the lock whatever happened.
    /// The lock statement then answers 1 once it holds the lock, anything
    /// else when it gave up waiting.
    pub session_lock: bool,
    /// Creates `tidings_migrations (version, name, applied_at)` if missing.
    pub create_table: &'static str,
    /// ($1 version) -> a row if applied.
    pub applied: &'static str,
    /// Records a version: ($1 version, $2 name).
    pub record: &'static str,
    /// The migrations, in order.
    pub migrations: &'static [Migration],
}

impl MigrationPlan {
    /// The latest migration this build ships.
    pub fn latest(&self) -> i64 {
        self.migrations.last().map_or(0, |m| m.version)
    }
}

/// Applies the migrations `pool`'s database lacks, in one transaction.
pub async fn run<D: Dialect>(pool: &Pool<D::Db>) -> Result<()> {
    let plan = &D::MIGRATIONS;
    let mut conn = pool
        .acquire()
        .await
        .map_err(db_error::<D>("starting Tidings migrations"))?;
    if !plan.session_lock {
        return apply::<D>(&mut conn).await;
    }
    // The lock is the session's: closing the connection releases it. Close
    // it here, before returning, whatever happened: a dropped connection
    // closes only once the runtime gets round to it, and a caller that
    // blocks its thread next (starting another migrator, say) would wait
    // for a lock nobody frees.
    conn.close_on_drop();
    let applied = apply::<D>(&mut conn).await;
    let _ = sqlx::Connection::close(conn.detach()).await;
    applied
}

/// The migrations, in one transaction on `conn`, under the plan's lock.
async fn apply<D: Dialect>(conn: &mut <D::Db as sqlx::Database>::Connection) -> Result<()> {
    let plan = &D::MIGRATIONS;
    let mut tx = sqlx::Connection::begin(conn)
        .await
        .map_err(db_error::<D>("starting Tidings migrations"))?;
    if let Some(lock) = plan.lock {
        let lock = Stmt::<D>::new(lock, "locking Tidings migrations");
        if plan.session_lock {
            let held: Option<i64> = lock.fetch_one(&mut tx).await?.get(0)?;
            if held != Some(1) {
                return Err(Error::Config {
                    key: "database".into(),
                    reason: "another session held the Tidings migration lock for as long as this one \
                             waited: find it in the server's process list, let it finish or end it, \
                             then migrate again"
                        .into(),
                });
            }
        } else {
            lock.execute(&mut tx).await?;
        }
    }
    Stmt::<D>::new(plan.create_table, "creating tidings_migrations")
        .execute(&mut tx)
        .await?;
    for m in plan.migrations {
        let done = Stmt::<D>::new(plan.applied, "reading tidings_migrations")
            .bind(m.version)
            .fetch_optional(&mut tx)
            .await?;
        if done.is_some() {
            continue;
        }
        <D::Db as SqlDb>::script(&mut tx, sqlx::SqlSafeStr::into_sql_str(m.sql))
            .await
            .map_err(db_error::<D>("applying a Tidings migration"))?;
        Stmt::<D>::new(plan.record, "recording a Tidings migration")
            .bind(m.version)
            .bind(m.name)
            .execute(&mut tx)
            .await?;
        tracing::info!(version = m.version, name = m.name, "applied Tidings migration");
    }
    tx.commit()
        .await
        .map_err(db_error::<D>("committing Tidings migrations"))
}
