//! Per-key order, checked where it matters: in each consumer. Every event
//! of a subject (an order, a payment) carries its step in the subject's
//! story; a consumer that sees a step before the last one it saw for that
//! subject records an order violation, which a summary counts.

use sqlx::Database;
use tidings_sql::db::Stmt;

use crate::KitDialect;

/// () -> violations recorded.
pub const COUNT_VIOLATIONS: &str = "SELECT count(*) FROM demo_step_violations";

/// Records that `consumer` saw step `step` of `subject`, and a violation
/// if it is before the last step it saw of that subject. Runs in the
/// handler's transaction: a handling rolled back records nothing.
pub async fn check_step<D: KitDialect>(
    conn: &mut <D::Db as Database>::Connection,
    consumer: &str,
    subject: &str,
    step: i64,
) -> tidings_core::Result<()> {
    let last: Option<i64> = match Stmt::<D>::new(
        "SELECT step FROM demo_steps WHERE consumer = $1 AND subject = $2",
        "reading the subject's last step",
    )
    .bind(consumer)
    .bind(subject)
    .fetch_optional(&mut *conn)
    .await?
    {
        Some(row) => Some(row.get(0)?),
        None => None,
    };
    // The same step again is the same event handled again (its marker
    // gone), not one out of order.
    if let Some(last) = last.filter(|&last| step < last) {
        tracing::error!(consumer, subject, step, last, "order violation");
        Stmt::<D>::new(
            "INSERT INTO demo_step_violations (consumer, subject, step, last_step) VALUES ($1, $2, $3, $4)",
            "recording an order violation",
        )
        .bind(consumer)
        .bind(subject)
        .bind(step)
        .bind(last)
        .execute(&mut *conn)
        .await?;
    }
    Stmt::<D>::new(D::RECORD_STEP, "recording the subject's step")
        .bind(consumer)
        .bind(subject)
        .bind(step)
        .execute(conn)
        .await?;
    Ok(())
}
