//! Appending to the database log on MySQL: multi-row inserts in one
//! transaction, confirmed when it commits. The log's sequencer (the
//! migration's trigger) holds the next appender back until then.

use sqlx::QueryBuilder;
use tidings_core::partition::key_hash;
use tidings_core::{OutgoingMessage, Result, cloudevents};
use tidings_sql::log_error;

use crate::{My, MySqlStore};

/// Rows per statement: well under the server's packet limit for ordinary
/// messages, and few round trips for a relay's batch.
const ROWS_PER_INSERT: usize = 100;

pub(crate) async fn append(store: &MySqlStore, batch: &[OutgoingMessage]) -> Result<()> {
    let failed = log_error::<My>(format!("appending {} messages failed", batch.len()));
    let mut tx = store.pool().begin().await.map_err(&failed)?;
    for chunk in batch.chunks(ROWS_PER_INSERT) {
        let mut insert = QueryBuilder::new("INSERT INTO tidings_log (topic, aggregate_key, key_hash, body) ");
        insert.push_values(chunk, |mut row, m| {
            row.push_bind(m.topic.as_str())
                .push_bind(m.envelope.aggregate_key.as_str())
                .push_bind(i64::from(key_hash(&m.envelope.aggregate_key)))
                .push_bind(cloudevents::to_json(&m.envelope));
        });
        insert.build().execute(&mut *tx).await.map_err(&failed)?;
    }
    tx.commit().await.map_err(&failed)?;
    Ok(())
}
