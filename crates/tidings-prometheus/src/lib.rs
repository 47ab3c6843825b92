//! Tidings' metrics on a Prometheus endpoint.
//!
//! [`install`] installs the Prometheus recorder for the whole process (with
//! buckets suited to Tidings' histograms) and describes every metric of
//! [`tidings_core::metrics::CATALOG`]; [`router`] is an axum route serving
//! `GET /metrics`, to merge into a service's own router; [`serve`] runs it
//! on a listener of its own. The `tidings run` daemon does all three.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use tokio_util::sync::CancellationToken;
//! // Before building relays and consumers: they take their handles when built.
//! let metrics = tidings_prometheus::install()?;
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:9464").await?;
//! tokio::spawn(tidings_prometheus::serve(listener, metrics, CancellationToken::new()));
//! # Ok(()) }
//! ```
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

use std::time::Duration;

use axum::Router;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
pub use metrics_exporter_prometheus::PrometheusHandle;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// The shipped Prometheus alerting rules (`deploy/prometheus/tidings-alerts.yml`).
pub const ALERT_RULES: &str = include_str!("../../../deploy/prometheus/tidings-alerts.yml");

/// The alert names in `rules` (a Prometheus rules file).
pub fn alert_names(rules: &str) -> Vec<&str> {
    rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert:"))
        .map(str::trim)
        .collect()
}

/// The metric names (`tidings_...`) the expressions of `rules` use, each
/// once, histogram series (`_bucket`, `_sum`, `_count`) by their metric's name.
pub fn metrics_named_in(rules: &str) -> std::collections::BTreeSet<String> {
    let mut names = std::collections::BTreeSet::new();
    let mut expression = false;
    for line in rules.lines() {
        let t = line.trim_start();
        // An `expr:` and its folded continuation lines; not summaries or comments.
        if t.starts_with("expr:") {
            expression = true;
        } else if t.contains(':') && !t.starts_with("and ") && !t.starts_with("unless ") {
            expression = false;
        }
        if !expression || t.starts_with('#') {
            continue;
        }
        let mut rest = t;
        while let Some(at) = rest.find("tidings_") {
            let name: String = rest[at..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                .collect();
            rest = &rest[at + name.len()..];
            let base = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| {
                    name.strip_suffix(s)
                        .filter(|b| tidings_core::metrics::info(b).is_some())
                })
                .map_or(name.clone(), str::to_owned);
            names.insert(base);
        }
    }
    names
}

/// Bucket bounds of the `_seconds` histograms: 0.5 ms to 30 s.
pub const SECONDS_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Bucket bounds of the relay's batch sizes.
pub const BATCH_BUCKETS: &[f64] = &[
    1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0,
];

/// Why the recorder could not be installed.
#[derive(Debug, thiserror::Error)]
#[error("installing the Prometheus metrics recorder: {0}")]
pub struct InstallError(String);

/// Installs the Prometheus recorder for the whole process and describes
/// Tidings' metrics. Fails if a recorder is installed already.
pub fn install() -> Result<PrometheusHandle, InstallError> {
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), SECONDS_BUCKETS)
        .and_then(|b| {
            b.set_buckets_for_metric(
                Matcher::Full(tidings_core::metrics::RELAY_BATCH_SIZE.into()),
                BATCH_BUCKETS,
            )
        })
        .map_err(|e| InstallError(e.to_string()))?
        .install_recorder()
        .map_err(|e| InstallError(e.to_string()))?;
    tidings_core::metrics::describe();
    Ok(handle)
}

/// `GET /metrics`: the recorder's figures in Prometheus' text format.
pub fn router(handle: PrometheusHandle) -> Router {
    Router::new().route(
        "/metrics",
        get(move || {
            let handle = handle.clone();
            async move {
                (
                    [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
                    handle.render(),
                )
                    .into_response()
            }
        }),
    )
}

/// Keeps the recorder's histograms trimmed, every few seconds, until `shutdown`.
pub async fn upkeep(handle: PrometheusHandle, shutdown: CancellationToken) {
    while !shutdown.is_cancelled() {
        handle.run_upkeep();
        tidings_core::lease::sleep_unless(&shutdown, Duration::from_secs(5)).await;
    }
}

/// Serves `GET /metrics` on `listener` until `shutdown`, with
/// `tidings-http`'s limits: a scraper slow to send its headers is cut off,
/// connections are capped, a shutdown waits a bounded time.
pub async fn serve(listener: TcpListener, handle: PrometheusHandle, shutdown: CancellationToken) {
    tokio::spawn(upkeep(handle.clone(), shutdown.clone()));
    tidings_http::serve(listener, router(handle), shutdown.cancelled_owned()).await;
}
