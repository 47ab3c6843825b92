//! The last hour of the overview's figures, sampled in memory by the
//! process serving the console, for the overview's small charts and
//! `GET /api/history`. Nothing is stored: a restart starts a new hour.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tidings_core::inspect::Inspect;
use tidings_core::metrics::BrokerLag;

/// How far back the history reaches.
pub const SPAN: Duration = Duration::from_secs(3600);

/// The most samples kept, whatever the interval.
const MAX_SAMPLES: usize = 3600;

/// The window a group's handling rate is measured over.
const HANDLING_WINDOW: Duration = Duration::from_secs(60);

/// The figures at one moment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Sample {
    /// When they were read.
    pub at: DateTime<Utc>,
    /// Outbox records not yet sent.
    pub outbox_pending: u64,
    /// Age of the oldest of them, in seconds (0 when none).
    pub oldest_unsent_seconds: f64,
    /// Dead letters waiting for a decision.
    pub dead_letters: u64,
    /// Records written per second since the sample before (none for the first).
    pub written_per_second: Option<f64>,
    /// Records published per second since the sample before.
    pub published_per_second: Option<f64>,
    /// Messages each consumer group (`group@topic`) has not handled, where
    /// the store (the database log) or the broker (as last counted) knows.
    pub groups: BTreeMap<String, u64>,
    /// Messages each consumer group handled per second over the last
    /// minute, over every topic it reads; `None` when it could not be read.
    pub handled_per_second: Option<BTreeMap<String, f64>>,
    #[serde(skip)]
    high_water: i64,
}

/// The samples of the last [`SPAN`], oldest first.
#[derive(Debug, Clone, Default)]
pub struct History(Arc<Mutex<VecDeque<Sample>>>);

impl History {
    /// The samples held now, oldest first.
    pub fn samples(&self) -> Vec<Sample> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .cloned()
            .collect()
    }

    /// The last sample, if any.
    pub fn last(&self) -> Option<Sample> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).back().cloned()
    }

    /// Reads the figures from `store`, and the groups' counts on the broker
    /// from `broker`, and adds them.
    pub async fn sample<S: Inspect + ?Sized>(
        &self,
        store: &S,
        broker: &BrokerLag,
    ) -> tidings_core::Result<()> {
        let lag = store.lag().await?;
        let high_water = store.outbox_high_water().await?;
        // A rate that cannot be read leaves the other figures standing.
        let handled = match store.handled_recently(HANDLING_WINDOW).await {
            Ok(counts) => Some(
                counts
                    .into_iter()
                    .map(|(group, n)| (group, n as f64 / HANDLING_WINDOW.as_secs_f64()))
                    .collect(),
            ),
            Err(e) => {
                tracing::warn!(error = %e.report(), "the console could not read the groups' handling rates");
                None
            }
        };
        let mut groups: BTreeMap<String, u64> = broker
            .measured()
            .into_iter()
            .filter_map(|m| Some((format!("{}@{}", m.group, m.topic), m.pending?)))
            .collect();
        groups.extend(
            lag.consumers
                .iter()
                .map(|c| (format!("{}@{}", c.consumer, c.topic), c.pending)),
        );
        let at = Utc::now();
        let mut samples = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let (written, published) = match samples.back() {
            Some(last) => {
                let seconds = (at - last.at).as_seconds_f64().max(1e-3);
                let written = (high_water - last.high_water).max(0) as f64;
                // What waited before, plus what was written since, less what waits now.
                let published = (last.outbox_pending as f64 + written - lag.outbox_pending as f64).max(0.0);
                (Some(written / seconds), Some(published / seconds))
            }
            None => (None, None),
        };
        samples.push_back(Sample {
            at,
            outbox_pending: lag.outbox_pending,
            oldest_unsent_seconds: lag.oldest_unsent_age.map_or(0.0, |d| d.as_secs_f64()),
            dead_letters: lag.dead_letters_pending(),
            written_per_second: written,
            published_per_second: published,
            groups,
            handled_per_second: handled,
            high_water,
        });
        let horizon = at - chrono::Duration::from_std(SPAN).unwrap_or_default();
        while samples.front().is_some_and(|s| s.at < horizon) || samples.len() > MAX_SAMPLES {
            samples.pop_front();
        }
        Ok(())
    }

    /// Samples `store` and `broker` every `every` until `stop` completes;
    /// a failed reading is logged and the next one tried.
    pub async fn run<S: Inspect + ?Sized>(
        &self,
        store: &S,
        broker: &BrokerLag,
        every: Duration,
        stop: impl std::future::Future<Output = ()>,
    ) {
        let mut stop = std::pin::pin!(stop);
        loop {
            if let Err(e) = self.sample(store, broker).await {
                tracing::warn!(error = %e.report(), "the console could not sample the overview's figures");
            }
            tokio::select! {
                _ = &mut stop => return,
                _ = tokio::time::sleep(every) => {}
            }
        }
    }
}

/// A small line chart of `values` (oldest first), as inline SVG.
pub(crate) fn sparkline(values: &[f64]) -> maud::Markup {
    const WIDTH: f64 = 160.0;
    const HEIGHT: f64 = 32.0;
    let max = values.iter().copied().fold(0.0_f64, f64::max);
    let step = if values.len() > 1 {
        WIDTH / (values.len() - 1) as f64
    } else {
        0.0
    };
    let points: Vec<String> = values
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let y = if max > 0.0 {
                HEIGHT - 2.0 - (v / max) * (HEIGHT - 4.0)
            } else {
                HEIGHT - 2.0
            };
            format!("{:.1},{:.1}", i as f64 * step, y)
        })
        .collect();
    maud::html! {
        svg.spark width=(WIDTH) height=(HEIGHT) viewBox={ "0 0 " (WIDTH) " " (HEIGHT) } role="img"
            aria-label={ (values.len()) " samples, highest " (format!("{max:.0}")) } {
            @if values.len() > 1 {
                polyline points=(points.join(" ")) fill="none" stroke="currentColor" stroke-width="1.5";
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sparkline_scales_to_its_highest_value() {
        let svg = sparkline(&[0.0, 5.0, 10.0]).into_string();
        assert!(svg.contains(r#"points="0.0,30.0 80.0,16.0 160.0,2.0""#), "{svg}");
        assert!(svg.contains("3 samples, highest 10"), "{svg}");
        let flat = sparkline(&[0.0, 0.0]).into_string();
        assert!(flat.contains(r#"points="0.0,30.0 160.0,30.0""#), "{flat}");
        assert!(
            !sparkline(&[7.0]).into_string().contains("polyline"),
            "one sample draws no line"
        );
    }
}
