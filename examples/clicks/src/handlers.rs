//! The fraud scorer, as a Tidings handler: many small handlings, batched
//! by the consumer runtime into one transaction each
//! ([`ConsumerConfig::batch`](tidings_consumer::ConsumerConfig::batch)).
//!
//! For each click, in its session's order: the click is stored, the
//! session's state moves on ([`Session::apply`](crate::score::Session::apply)),
//! and its features are written to the feature store by upsert (the
//! same features written twice change nothing). The state's counters are
//! not idempotent by themselves: the consumer's processed markers keep a
//! click from being scored twice, and the summary's recomputation from
//! the stored clicks would show it if one were.
//!
//! A click whose page is no path, or that is not keyed by its session, is
//! refused: a dead letter (the rest of its session waits behind it, parked,
//! where Tidings placed the keys).

use tidings_consumer::{Context, Handler, HandlerError};
use tidings_demo_kit::{check_step, for_each_database};
use tidings_sql::db::Stmt;

use crate::messages::Click;
use crate::score::Session;
use crate::sql::{ClicksDialect, shared};

/// Scores clicks for fraud.
#[derive(Debug, Clone, Copy)]
pub struct Fraud;

/// Why a click cannot be scored, if it cannot.
pub fn invalid(click: &Click) -> Option<String> {
    if !click.page.starts_with('/') {
        return Some(format!(
            "click {}: page {:?} is no path",
            click.click_id, click.page
        ));
    }
    if click.seq < 1 {
        return Some(format!(
            "click {}: seq {} is not from 1",
            click.click_id, click.seq
        ));
    }
    None
}

for_each_database! {
    #[async_trait::async_trait]
    impl Handler<Db> for Fraud {
        async fn handle(&self, ctx: &mut Context<'_, Db>) -> Result<(), HandlerError> {
            let click: Click = ctx.decode()?;
            if let Some(reason) = invalid(&click) {
                return Err(HandlerError::permanent(reason));
            }
            // A session's clicks are scored one at a time because they share
            // a key: a click keyed otherwise could race another of its session.
            if ctx.envelope().aggregate_key != click.session_id {
                return Err(HandlerError::permanent(format!(
                    "click {}: keyed {:?}, not by its session {:?}",
                    click.click_id,
                    ctx.envelope().aggregate_key,
                    click.session_id
                )));
            }
            let consumer = ctx.consumer().to_owned();
            check_step::<D>(ctx.tx(), &consumer, &click.session_id, click.seq).await?;
            let before = match Stmt::<D>::new(shared::SESSION, "reading the session's state")
                .bind(click.session_id.as_str())
                .fetch_optional(ctx.tx())
                .await?
            {
                Some(row) => Session {
                    clicks: row.get(0)?,
                    fast: row.get(1)?,
                    streak: row.get(2)?,
                    max_streak: row.get(3)?,
                    last_at_ms: row.get(4)?,
                },
                None => Session::default(),
            };
            let after = before.apply(&click);
            let sql = <D as ClicksDialect>::CLICKS;
            Stmt::<D>::new(sql.store_click, "storing the click")
                .bind(click.click_id.as_str())
                .bind(click.session_id.as_str())
                .bind(click.seq)
                .bind(click.page.as_str())
                .bind(click.at_ms)
                .execute(ctx.tx())
                .await?;
            Stmt::<D>::new(sql.save_session, "saving the session's state")
                .bind(click.session_id.as_str())
                .bind(after.clicks)
                .bind(after.fast)
                .bind(after.streak)
                .bind(after.max_streak)
                .bind(after.last_at_ms)
                .execute(ctx.tx())
                .await?;
            Stmt::<D>::new(sql.save_features, "writing the session's features")
                .bind(click.session_id.as_str())
                .bind(after.clicks)
                .bind(after.fast)
                .bind(after.max_streak)
                .bind(after.score())
                .bind(i64::from(after.flagged()))
                .execute(ctx.tx())
                .await?;
            Ok(())
        }
    }
}
