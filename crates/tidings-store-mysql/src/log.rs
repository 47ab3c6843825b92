//! Appending to the database log on MySQL: multi-row inserts in one
//! transaction, confirmed when it commits. The log's sequencer (the
//! migration's trigger) holds the next appender back until then.

use sqlx::QueryBuilder;
use tidings_core::partition::key_hash;
use tidings_core::{OutgoingMessage, Result, cloudevents};
use tidings_sql::log_error;

use crate::{My, MySqlStore};

/// Rows per statement, at most: few round trips for a relay's batch.
const ROWS_PER_INSERT: usize = 64;
/// Body bytes per statement, at most (one larger row goes alone): well
/// under the server's packet limit (16 MiB by default on MariaDB, 64 MiB
/// on MySQL 8).
const BYTES_PER_INSERT: usize = 4 << 20;

pub(crate) async fn append(store: &MySqlStore, batch: &[OutgoingMessage]) -> Result<()> {
    let failed = log_error::<My>(format!("appending {} messages failed", batch.len()));
    let rows: Vec<(&OutgoingMessage, Vec<u8>)> = batch
        .iter()
        .map(|m| (m, cloudevents::to_json(&m.envelope)))
        .collect();
    let mut tx = store.pool().begin().await.map_err(&failed)?;
    for chunk in chunks(&rows) {
        let mut insert = QueryBuilder::new("INSERT INTO tidings_log (topic, aggregate_key, key_hash, body) ");
        insert.push_values(chunk, |mut row, (m, body)| {
            row.push_bind(m.topic.as_str())
                .push_bind(m.envelope.aggregate_key.as_str())
                .push_bind(i64::from(key_hash(&m.envelope.aggregate_key)))
                .push_bind(body.as_slice());
        });
        insert.build().execute(&mut *tx).await.map_err(&failed)?;
    }
    tx.commit().await.map_err(&failed)?;
    Ok(())
}

/// `rows` cut into statements of at most [`ROWS_PER_INSERT`] rows and
/// [`BYTES_PER_INSERT`] body bytes, each of a power of two rows: the
/// statements are prepared, and so few shapes keep the connection's
/// statement cache from filling up and evicting statements (each eviction
/// sends a message the server does not answer, and the request after it
/// waits out a delayed acknowledgement, about 40 ms).
fn chunks<T>(rows: &[(T, Vec<u8>)]) -> impl Iterator<Item = &[(T, Vec<u8>)]> {
    let mut start = 0;
    std::iter::from_fn(move || {
        if start == rows.len() {
            return None;
        }
        let mut end = start;
        let mut bytes = 0;
        while end < rows.len()
            && end - start < ROWS_PER_INSERT
            && (end == start || bytes + rows[end].1.len() <= BYTES_PER_INSERT)
        {
            bytes += rows[end].1.len();
            end += 1;
        }
        // The largest power of two that fits.
        let end = start + (1 << (end - start).ilog2());
        let chunk = &rows[start..end];
        start = end;
        Some(chunk)
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn statements_stay_under_the_row_and_byte_limits() {
        let rows: Vec<((), Vec<u8>)> = [1 << 20, 3 << 20, 1 << 20, 9 << 20, 10, 10]
            .into_iter()
            .map(|n| ((), vec![0u8; n]))
            .collect();
        let sizes: Vec<usize> = super::chunks(&rows).map(<[_]>::len).collect();
        assert_eq!(sizes, [2, 1, 1, 2], "4 MiB at most, one larger row alone");
        let many: Vec<((), Vec<u8>)> = (0..250).map(|_| ((), vec![0u8; 10])).collect();
        let sizes: Vec<usize> = super::chunks(&many).map(<[_]>::len).collect();
        assert_eq!(sizes, [64, 64, 64, 32, 16, 8, 2], "powers of two");
    }
}
