//! `tidings run`: the relay daemon.
//!
//! One process next to the database: the relay (publishing the outbox to
//! the configured transport), the housekeeping of the database log and of
//! the consumers' processed markers (their retentions),
//! lag sampling into gauges, the Prometheus endpoint, and the webhook
//! inbox when it is configured. SIGTERM or Ctrl-C
//! stops it gracefully: the batch being published is finished or released,
//! the partition leases are handed back.

use std::time::Duration;

use anyhow::Context as _;
use futures::FutureExt as _;
use tidings::inbox::{Inbox, Provider};
use tidings::sql::StoreOptions;
use tidings::{Topology, with_store};
use tidings_core::lease::sleep_unless;
use tidings_core::log::LogBackend;
use tidings_core::secret::redact_url;
use tidings_core::{
    AuditStore, ConsumerStore, FailureStore, InboxStore, Inspect, LagSource, LeaseStore, RelayStore,
};
use tidings_relay::Relay;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::connecting_to;
use tidings_cdc_postgres::{CdcOptions, CdcStore};
use tidings_config::{Loaded, RelayMode};

/// Log entries deleted per statement by the housekeeping.
const TRIM_BATCH: usize = 5000;

/// Runs the daemon until `shutdown`; returns early with the error of a part that failed.
pub(crate) async fn run(loaded: Loaded, shutdown: CancellationToken) -> anyhow::Result<()> {
    // The endpoint first: a taken port is refused before anything starts.
    let metrics = match loaded.metrics_listen {
        Some(addr) => {
            let listener = TcpListener::bind(addr)
                .await
                .with_context(|| format!("metrics.listen: cannot listen on {addr}"))?;
            let handle = tidings_prometheus::install()?;
            Some((listener, handle))
        }
        None => None,
    };
    let inbox = match loaded.inbox_listen {
        Some(addr) => {
            let listener = TcpListener::bind(addr)
                .await
                .with_context(|| format!("inbox.listen: cannot listen on {addr}"))?;
            let providers = loaded
                .config
                .inbox
                .providers
                .iter()
                .map(|p| p.provider())
                .collect::<Result<Vec<_>, _>>()
                .context("reading the inbox's providers")?;
            Some((listener, providers))
        }
        None => None,
    };
    let console = match loaded.console_listen {
        Some(addr) => {
            let section = &loaded.config.console;
            let file = Some(section.tokens_file.trim())
                .filter(|f| !f.is_empty())
                .map(std::path::Path::new);
            let access = crate::console::access(addr, file, section.reads_need_token).context("[console]")?;
            let schemas = Some(section.schemas.trim())
                .filter(|d| !d.is_empty())
                .map(std::path::Path::new);
            let schemas = crate::console::schemas(schemas, "console.schemas")?;
            Some((
                crate::console::bind(addr, "console.listen").await?,
                access,
                schemas,
            ))
        }
        None => None,
    };
    let url = loaded.database_url.expose();
    let config = &loaded.config;
    let mut options = StoreOptions::default().max_connections(config.database.max_connections);
    if let Some(retention) = Some(config.database.outbox_retention.0).filter(|d| !d.is_zero()) {
        options = options.retention(retention);
    }
    let store = tidings::open_store_with(url, options)
        .await
        .with_context(|| connecting_to(url))?;
    if config.database.migrate {
        store.migrate().await.context("migrating Tidings' tables")?;
    }
    let cdc = match (config.relay_mode, &store) {
        (RelayMode::Poll, _) => None,
        (RelayMode::Cdc, tidings::AnyStore::Postgres(pg)) => {
            let cap = Some(config.relay_slot_wal_cap_mib * 1024 * 1024).filter(|&b| b > 0);
            let options = CdcOptions::default().group(&config.relay_group).wal_cap(cap);
            let cdc = CdcStore::new(pg.clone(), url, options).context("relay.mode = \"cdc\"")?;
            // The slot is made now, so that what is committed from here on
            // is streamed even if the relay is not running yet.
            cdc.prepare()
                .await
                .context("preparing the CDC relay's slot and publication")?;
            Some(cdc)
        }
        (RelayMode::Cdc, _) => anyhow::bail!("relay.mode = \"cdc\" needs a PostgreSQL database"),
    };
    let listeners = Listeners {
        metrics,
        inbox,
        console,
    };
    with_store!(store, |s| run_on(s, &loaded, listeners, cdc, shutdown).await)
}

/// The sockets bound before anything starts, so that a taken port is
/// refused at once.
struct Listeners {
    metrics: Option<(TcpListener, tidings_prometheus::PrometheusHandle)>,
    inbox: Option<(TcpListener, Vec<Provider>)>,
    console: Option<(
        TcpListener,
        tidings_console::Access,
        Option<tidings_console::Schemas>,
    )>,
}

async fn run_on<S>(
    store: S,
    loaded: &Loaded,
    listeners: Listeners,
    cdc: Option<CdcStore>,
    shutdown: CancellationToken,
) -> anyhow::Result<()>
where
    S: RelayStore
        + ConsumerStore
        + FailureStore
        + AuditStore
        + InboxStore
        + LeaseStore
        + LagSource
        + LogBackend
        + Inspect
        + tidings_core::replay::ReplayStore
        + Clone,
{
    let Listeners {
        metrics,
        inbox,
        console,
    } = listeners;
    let config = &loaded.config;
    let mut tasks: JoinSet<anyhow::Result<()>> = JoinSet::new();
    let mut parts = Vec::new();
    if let Some((listener, providers)) = inbox {
        let section = &config.inbox;
        let names: Vec<&str> = providers.iter().map(|p| p.name()).collect();
        let at = format!("http://{}{}", listener.local_addr()?, section.path);
        parts.push(format!("webhook inbox at {at}/{{{}}}", names.join(",")));
        let router = providers
            .into_iter()
            .fold(Inbox::new(store.clone()), Inbox::provider)
            .body_limit(section.body_limit)
            .timeout(section.timeout.0)
            .retention(Some(section.retention.0).filter(|d| !d.is_zero()))
            .router()?;
        let app = axum::Router::new().nest(&section.path, router);
        let stop = shutdown.clone();
        tasks.spawn(async move {
            tidings::inbox::serve(listener, app, stop.cancelled_owned()).await;
            Ok(())
        });
    }
    // The broker's counts of the consumer groups, measured below when the
    // transport is a broker, shown by the console.
    let broker_lag = tidings_core::metrics::BrokerLag::default();
    if let Some((listener, access, schemas)) = console {
        parts.push(format!("console on http://{}", listener.local_addr()?));
        let mut console = tidings_console::Console::new(store.clone(), access)
            .partitions(config.relay.partition_count())
            .broker_lag(broker_lag.clone());
        if let Some(schemas) = schemas {
            console = console.schemas(schemas);
        }
        if cdc.is_some() {
            console = console.cdc_group(&config.relay_group);
        }
        tasks.spawn(
            console
                .sample(config.metrics.lag_interval.0, shutdown.clone().cancelled_owned())
                .map(Ok),
        );
        let app = console.router();
        let stop = shutdown.clone();
        tasks.spawn(async move {
            tidings_console::serve(listener, app, stop.cancelled_owned()).await;
            Ok(())
        });
    }
    // Served once the inbox has set its counters at zero, so that the
    // first scrape already holds every series the alert rules read.
    if let Some((listener, handle)) = metrics {
        parts.push(format!("metrics on http://{}/metrics", listener.local_addr()?));
        let stop = shutdown.clone();
        tasks.spawn(async move {
            tidings_prometheus::serve(listener, handle, stop).await;
            Ok(())
        });
    }
    let broker = &loaded.config.broker;
    let mut topology = Topology::default()
        .partitions(broker.partitions)
        .content_mode(broker.content_mode);
    if let Some(prefix) = &broker.prefix {
        topology = topology.prefix(prefix);
    }
    let url = loaded.broker_url.expose();
    let opened = tidings::open_transport(url, &topology, &store)
        .await
        .with_context(|| format!("opening the transport at {}", redact_url(url)))?;
    if opened.broker.is_broker() {
        let broker = opened.subscriber.clone();
        tasks.spawn(
            tidings_core::metrics::sample_broker_lag(
                store.clone(),
                broker,
                config.metrics.lag_interval.0,
                broker_lag.clone(),
                shutdown.clone(),
            )
            .map(Ok),
        );
    }
    if config.relay_enabled {
        let (publisher, label) = (opened.publisher.clone(), opened.label());
        let stop = shutdown.clone();
        match cdc {
            Some(cdc) => {
                parts.push(format!("relay (cdc, slot {}) to {label}", cdc.slot()));
                let guard = tidings_cdc_postgres::sample_slot(
                    cdc.pg().pool().clone(),
                    cdc.slot().clone(),
                    config.metrics.lag_interval.0,
                    shutdown.clone(),
                );
                tasks.spawn(guard.map(Ok));
                let relay = Relay::new(cdc, publisher).config(config.relay.clone());
                tasks.spawn(async move { relay.run(stop).await.context("the relay stopped") });
            }
            None => {
                parts.push(format!("relay to {label}"));
                let relay = Relay::new(store.clone(), publisher).config(config.relay.clone());
                tasks.spawn(async move { relay.run(stop).await.context("the relay stopped") });
            }
        }
    }
    if !config.log.retention.0.is_zero() {
        parts.push(format!("log retention {}", config.log.retention));
        let (store, retention) = (store.clone(), config.log.retention.0);
        tasks.spawn(housekeeping(
            "database-log entries past log.retention that every group has read",
            config.log.cleanup_interval.0,
            TRIM_BATCH,
            shutdown.clone(),
            move || {
                let store = store.clone();
                async move { store.trim(retention, TRIM_BATCH).await }
            },
        ));
    }
    if !config.consumer.dedupe_retention.0.is_zero() {
        parts.push(format!("dedupe retention {}", config.consumer.dedupe_retention));
        let (store, retention) = (store.clone(), config.consumer.dedupe_retention.0);
        // Each step deletes up to a batch from each of three tables.
        tasks.spawn(housekeeping(
            "processed markers and effects records past consumer.dedupe_retention",
            config.consumer.cleanup_interval.0,
            TRIM_BATCH,
            shutdown.clone(),
            move || {
                let store = store.clone();
                async move { store.forget_processed(retention, TRIM_BATCH).await }
            },
        ));
    }
    let sampler =
        tidings_core::metrics::sample_lag(store.clone(), config.metrics.lag_interval.0, shutdown.clone());
    tasks.spawn(async move {
        sampler.await;
        Ok(())
    });
    tracing::info!(database = %redact_url(loaded.database_url.expose()), "tidings running: {}", parts.join(", "));

    // Biased: every part ends once shut down, and that is not a part failing.
    let ended = tokio::select! {
        biased;
        _ = shutdown.cancelled() => None,
        ended = tasks.join_next() => ended,
    };
    shutdown.cancel();
    let mut first_error = match ended {
        Some(Ok(Err(e))) => Some(e),
        Some(Ok(Ok(()))) => Some(anyhow::anyhow!("a part of the daemon stopped on its own")),
        Some(Err(panic)) => Some(anyhow::anyhow!("a part of the daemon panicked: {panic}")),
        None => None,
    };
    while let Some(joined) = tasks.join_next().await {
        if let Ok(Err(e)) = joined {
            first_error.get_or_insert(e);
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => {
            tracing::info!("tidings stopped");
            Ok(())
        }
    }
}

/// Runs `step`, one bounded batch of a cleanup, until it deletes fewer than
/// `batch`, every `interval`, until shut down: `what` names it in the logs.
async fn housekeeping<F, Fut>(
    what: &'static str,
    interval: Duration,
    batch: usize,
    shutdown: CancellationToken,
    step: F,
) -> anyhow::Result<()>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = tidings_core::Result<u64>>,
{
    while !shutdown.is_cancelled() {
        let mut deleted = 0;
        loop {
            match step().await {
                Ok(n) => {
                    deleted += n;
                    if (n as usize) < batch || shutdown.is_cancelled() {
                        break;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e.report(), "{what}: cleanup failed; trying again later");
                    break;
                }
            }
        }
        if deleted > 0 {
            tracing::info!(deleted, "{what}: deleted");
        }
        sleep_unless(&shutdown, interval).await;
    }
    Ok(())
}
