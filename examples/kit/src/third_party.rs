//! A stand-in for a third-party API that honours idempotency keys, as
//! real ones do (an email or SMS sender, a search service): it keeps its
//! own table in a [`SidePool`], outside the calling handler's transaction,
//! and counts every call, so that a summary can tell calls repeated with
//! the same key (absorbed) from effects done twice (duplicated).

use sqlx::Row as _;

use crate::SidePool;

/// One simulated service (`email`, `notifications`...) of the third party.
#[derive(Debug, Clone)]
pub struct ThirdParty {
    pool: SidePool,
    service: &'static str,
}

/// What a service of the third party saw.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Calls {
    /// Distinct effects done (one per idempotency key).
    pub done: i64,
    /// Calls received: a retry with the same key is a call, not an effect.
    pub calls: i64,
    /// (subject, kind) pairs done under more than one key: duplicated effects.
    pub duplicated: i64,
}

const TABLE_PORTABLE: &str = "CREATE TABLE IF NOT EXISTS demo_third_party (
    service TEXT NOT NULL, idempotency_key TEXT NOT NULL, subject TEXT NOT NULL, kind TEXT NOT NULL,
    calls BIGINT NOT NULL, PRIMARY KEY (service, idempotency_key))";
const TABLE_MYSQL: &str = "CREATE TABLE IF NOT EXISTS demo_third_party (
    service VARCHAR(64) NOT NULL, idempotency_key VARCHAR(255) NOT NULL, subject VARCHAR(255) NOT NULL,
    kind VARCHAR(64) NOT NULL, calls BIGINT NOT NULL, PRIMARY KEY (service, idempotency_key))
    DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin";
const CALL_PORTABLE: &str = "INSERT INTO demo_third_party (service, idempotency_key, subject, kind, calls)
    VALUES ($1, $2, $3, $4, 1)
    ON CONFLICT (service, idempotency_key) DO UPDATE SET calls = demo_third_party.calls + 1";
const CALL_MYSQL: &str = "INSERT INTO demo_third_party (service, idempotency_key, subject, kind, calls)
    VALUES (?, ?, ?, ?, 1) ON DUPLICATE KEY UPDATE calls = calls + 1";
const CALLS_PORTABLE: &str = "SELECT count(*), CAST(COALESCE(sum(calls), 0) AS BIGINT),
    (SELECT count(*) FROM (SELECT subject, kind FROM demo_third_party WHERE service = $1
                           GROUP BY subject, kind HAVING count(*) > 1) d)
    FROM demo_third_party WHERE service = $1";
const CALLS_MYSQL: &str = "SELECT count(*), CAST(COALESCE(sum(calls), 0) AS SIGNED),
    (SELECT count(*) FROM (SELECT subject, kind FROM demo_third_party WHERE service = ?
                           GROUP BY subject, kind HAVING count(*) > 1) d)
    FROM demo_third_party WHERE service = ?";

impl ThirdParty {
    /// The service `service` of the third party kept in `pool`.
    pub fn new(pool: SidePool, service: &'static str) -> ThirdParty {
        ThirdParty { pool, service }
    }

    /// Creates the third party's table.
    pub async fn setup(&self) -> Result<(), sqlx::Error> {
        match &self.pool {
            SidePool::Postgres(p) => sqlx::query(TABLE_PORTABLE).execute(p).await.map(drop),
            SidePool::MySql(p) => sqlx::query(TABLE_MYSQL).execute(p).await.map(drop),
            SidePool::Sqlite(p) => sqlx::query(TABLE_PORTABLE).execute(p).await.map(drop),
        }
    }

    /// Does `kind` (`receipt`) for `subject` (`pi_123`) once per `key`: a
    /// call with a key seen before is counted and does nothing more.
    pub async fn call(&self, key: &str, subject: &str, kind: &str) -> Result<(), sqlx::Error> {
        macro_rules! call {
            ($pool:expr, $sql:expr) => {
                sqlx::query($sql)
                    .bind(self.service)
                    .bind(key)
                    .bind(subject)
                    .bind(kind)
                    .execute($pool)
                    .await
                    .map(drop)
            };
        }
        match &self.pool {
            SidePool::Postgres(p) => call!(p, CALL_PORTABLE),
            SidePool::MySql(p) => call!(p, CALL_MYSQL),
            SidePool::Sqlite(p) => call!(p, CALL_PORTABLE),
        }
    }

    /// What the service saw.
    pub async fn calls(&self) -> Result<Calls, sqlx::Error> {
        let (done, calls, duplicated): (i64, i64, i64) = match &self.pool {
            SidePool::Postgres(p) => {
                let r = sqlx::query(CALLS_PORTABLE)
                    .bind(self.service)
                    .fetch_one(p)
                    .await?;
                (r.try_get(0)?, r.try_get(1)?, r.try_get(2)?)
            }
            SidePool::MySql(p) => {
                let r = sqlx::query(CALLS_MYSQL)
                    .bind(self.service)
                    .bind(self.service)
                    .fetch_one(p)
                    .await?;
                (r.try_get(0)?, r.try_get(1)?, r.try_get(2)?)
            }
            SidePool::Sqlite(p) => {
                let r = sqlx::query(CALLS_PORTABLE)
                    .bind(self.service)
                    .fetch_one(p)
                    .await?;
                (r.try_get(0)?, r.try_get(1)?, r.try_get(2)?)
            }
        };
        Ok(Calls {
            done,
            calls,
            duplicated,
        })
    }
}
