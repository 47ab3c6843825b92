//! SQL that reads the same on every supported database, run generically.
//!
//! Store crates keep the SQL that differs (claims, the log, upserts of
//! JSON); what is identical lives here once.

use sqlx::{ColumnIndex, Database, Decode, Encode, Executor, IntoArguments, Type};
use uuid::Uuid;

use crate::error::{Error, Result};

/// Records that `consumer` processed `message_id`; `false` if it already had.
///
/// On PostgreSQL a concurrent duplicate blocks on the first one's
/// uncommitted row, then sees the conflict once it commits (or takes over
/// if it rolls back); SQLite runs one writer at a time.
pub async fn mark_processed<'c, DB>(
    conn: &'c mut DB::Connection,
    consumer: &str,
    message_id: Uuid,
) -> Result<bool>
where
    DB: Database,
    &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> Uuid: Encode<'q, DB> + Type<DB>,
    for<'r> i32: Decode<'r, DB> + Type<DB>,
    usize: ColumnIndex<DB::Row>,
{
    let inserted: Option<i32> = sqlx::query_scalar(
        "INSERT INTO tidings_processed (consumer, message_id) VALUES ($1, $2) ON CONFLICT DO NOTHING RETURNING 1",
    )
    .bind(consumer)
    .bind(message_id)
    .fetch_optional(conn)
    .await
    .map_err(Error::db("recording a processed marker"))?;
    Ok(inserted.is_some())
}

/// Whether the effect is recorded as done.
pub async fn effect_recorded<'c, DB>(
    conn: &'c mut DB::Connection,
    consumer: &str,
    message_id: Uuid,
    effect: &str,
) -> Result<bool>
where
    DB: Database,
    &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> Uuid: Encode<'q, DB> + Type<DB>,
    for<'r> i32: Decode<'r, DB> + Type<DB>,
    usize: ColumnIndex<DB::Row>,
{
    let found: Option<i32> = sqlx::query_scalar(
        "SELECT 1 FROM tidings_effects WHERE consumer = $1 AND message_id = $2 AND effect = $3",
    )
    .bind(consumer)
    .bind(message_id)
    .bind(effect)
    .fetch_optional(conn)
    .await
    .map_err(Error::db("reading the effects ledger"))?;
    Ok(found.is_some())
}

/// Records the effect as done.
pub async fn record_effect<'c, DB>(
    conn: &'c mut DB::Connection,
    consumer: &str,
    message_id: Uuid,
    effect: &str,
    idempotency_key: &str,
) -> Result<()>
where
    DB: Database,
    &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> Uuid: Encode<'q, DB> + Type<DB>,
{
    sqlx::query::<DB>(
        "INSERT INTO tidings_effects (consumer, message_id, effect, idempotency_key) VALUES ($1, $2, $3, $4)
         ON CONFLICT DO NOTHING",
    )
    .bind(consumer)
    .bind(message_id)
    .bind(effect)
    .bind(idempotency_key)
    .execute(conn)
    .await
    .map_err(Error::db("recording an effect"))?;
    Ok(())
}
