//! A replay from code, as `tidings replay` asks for one: recorded, carried
//! out by a running member of the consumer, followed until it ends.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use chrono::{DateTime, Utc};
use tidings_core::replay::{Replay, ReplayRequest, ReplaySource, ReplayStore};

/// Re-delivers to `consumer` what `topics` retained in `source` between
/// `since` and `until`, at `rate` events per second at most, and waits
/// (until `timeout`) for a running member of the consumer to carry it out.
/// `None` if the range retained nothing.
pub async fn replay_and_wait<S: ReplayStore>(
    store: &S,
    consumer: &str,
    topics: &[&str],
    source: ReplaySource,
    (since, until): (DateTime<Utc>, DateTime<Utc>),
    rate: f64,
    timeout: Duration,
) -> anyhow::Result<Option<Replay>> {
    let topics: Vec<String> = topics.iter().map(|t| (*t).to_owned()).collect();
    let total = store.count_retained(source, &topics, since, until).await?;
    if total == 0 {
        return Ok(None);
    }
    let request = ReplayRequest {
        consumer: consumer.to_owned(),
        topics,
        source,
        since,
        until,
        rate,
        total,
    };
    let id = store.request_replay(&request).await?;
    let deadline = Instant::now() + timeout;
    loop {
        let replay = store
            .replay(id)
            .await?
            .with_context(|| format!("replay {id} disappeared"))?;
        if replay.state.is_final() {
            return Ok(Some(replay));
        }
        if Instant::now() > deadline {
            store.cancel_replay(id).await?;
            anyhow::bail!(
                "replay {id} to {consumer} did not finish within {} s ({} of {total} re-delivered): cancelled",
                timeout.as_secs(),
                replay.counts.delivered
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
