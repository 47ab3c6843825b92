//! The slot guard's figures: how much log the server keeps for the slot,
//! whether a relay streams it, and for how long its position has not moved
//! while the server's log has (`tidings_cdc_slot_*`, alerted on by
//! `deploy/prometheus/tidings-alerts.yml`).

use std::time::{Duration, Instant};

use sqlx::{PgPool, Row};
use tidings_core::Result;
use tidings_core::metrics::{CDC_SLOT_ACTIVE, CDC_SLOT_RETAINED, CDC_SLOT_STALLED, LAG_SAMPLE_ERRORS};
use tidings_sql::db_error;
use tidings_store_postgres::Pg;
use tokio_util::sync::CancellationToken;

use crate::slot::SlotName;

/// One look at the slot: whether it exists and is streamed, the log kept
/// for it, and its confirmed position with the server's (bytes from 0/0).
struct Look {
    active: bool,
    retained: i64,
    confirmed: i64,
    current: i64,
}

async fn look(pool: &PgPool, slot: &SlotName) -> Result<Option<Look>> {
    let row = sqlx::query(
        "SELECT active,
                COALESCE(pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn), 0)::int8,
                COALESCE(pg_wal_lsn_diff(confirmed_flush_lsn, '0/0'), 0)::int8,
                pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::int8
         FROM pg_replication_slots WHERE slot_name = $1",
    )
    .bind(slot.as_str())
    .fetch_optional(pool)
    .await
    .map_err(db_error::<Pg>("reading the CDC slot's state"))?;
    Ok(row.map(|r| Look {
        active: r.get(0),
        retained: r.get(1),
        confirmed: r.get(2),
        current: r.get(3),
    }))
}

/// Measures the slot every `every` into the `tidings_cdc_slot_*` gauges,
/// until `shutdown`. A slot that is not there reads as not streamed.
pub async fn sample_slot(pool: PgPool, slot: SlotName, every: Duration, shutdown: CancellationToken) {
    let label = slot.as_str().to_owned();
    let active = metrics::gauge!(CDC_SLOT_ACTIVE, "slot" => label.clone());
    let retained = metrics::gauge!(CDC_SLOT_RETAINED, "slot" => label.clone());
    let stalled = metrics::gauge!(CDC_SLOT_STALLED, "slot" => label);
    let errors = metrics::counter!(LAG_SAMPLE_ERRORS);
    // The confirmed position last seen, and since when.
    let mut last: Option<(i64, Instant)> = None;
    while !shutdown.is_cancelled() {
        match look(&pool, &slot).await {
            Ok(Some(l)) => {
                active.set(f64::from(u8::from(l.active)));
                retained.set(l.retained as f64);
                let since = match last {
                    Some((confirmed, since)) if confirmed == l.confirmed => since,
                    _ => Instant::now(),
                };
                last = Some((l.confirmed, since));
                let behind = l.current > l.confirmed;
                stalled.set(if behind {
                    since.elapsed().as_secs_f64()
                } else {
                    0.0
                });
            }
            Ok(None) => {
                active.set(0.0);
                retained.set(0.0);
                stalled.set(0.0);
                last = None;
            }
            Err(e) => {
                errors.increment(1);
                tracing::warn!(error = %e.report(), slot = %slot, "measuring the CDC slot failed");
            }
        }
        tidings_core::lease::sleep_unless(&shutdown, every).await;
    }
}
