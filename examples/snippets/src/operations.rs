//! `docs/OPERATIONS.md`: the metrics of a service that embeds consumers.

use std::time::Duration;

use axum::Router;
use tidings::prelude::*;

/// The service's routes with `GET /metrics` added, the recorder installed
/// and the lag sampled until `shutdown`.
pub fn with_metrics(
    my_routes: Router,
    store: PgStore,
    shutdown: CancellationToken,
) -> Result<Router, Box<dyn std::error::Error>> {
    // snippet: operations-metrics
    let handle = tidings::prometheus::install()?; // once, at start
    tokio::spawn(tidings::prometheus::upkeep(handle.clone(), shutdown.clone()));
    let app = my_routes.merge(tidings::prometheus::router(handle)); // GET /metrics
    tokio::spawn(tidings::metrics::sample_lag(
        store.clone(),
        Duration::from_secs(5),
        shutdown.clone(),
    ));
    // end snippet
    Ok(app)
}
