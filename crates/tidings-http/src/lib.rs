//! Serving an HTTP endpoint on a socket others reach (the webhook inbox
//! faces the internet; the metrics endpoint a network): a client that is
//! slow to send its headers is cut off, connections are capped, and a
//! shutdown lets requests in flight finish for a bounded time.
//!
//! `axum::serve` has no header timeout: one client that opens a
//! connection and never finishes its headers holds a connection, and a
//! graceful shutdown, forever.
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;

/// The limits of [`serve_with`].
#[derive(Debug, Clone, Copy)]
pub struct ServeLimits {
    /// How long a client may take to send a request's headers (and, on a
    /// kept-alive connection, the next request's) before it is cut off.
    pub header_timeout: Duration,
    /// Connections open at once; more are closed as they arrive.
    pub max_connections: usize,
    /// How long a shutdown waits for requests in flight.
    pub shutdown_grace: Duration,
}

impl Default for ServeLimits {
    fn default() -> Self {
        ServeLimits {
            header_timeout: Duration::from_secs(10),
            max_connections: 1024,
            shutdown_grace: Duration::from_secs(15),
        }
    }
}

/// Serves `app` on `listener` with the default [`ServeLimits`] (a 10 s
/// header timeout, 1024 connections, a 15 s shutdown grace) until
/// `shutdown` completes.
pub async fn serve(listener: TcpListener, app: Router, shutdown: impl Future<Output = ()> + Send) {
    serve_with(listener, app, shutdown, ServeLimits::default()).await;
}

/// Serves `app` on `listener` within `limits` until `shutdown` completes,
/// then lets the requests in flight finish for up to the grace and returns.
pub async fn serve_with(
    listener: TcpListener,
    app: Router,
    shutdown: impl Future<Output = ()> + Send,
    limits: ServeLimits,
) {
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let (stopping, stop) = watch::channel(false);
    let mut connections = JoinSet::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of file descriptors, say: wait rather than spin.
                tracing::warn!(error = %e, "could not accept a connection");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            tracing::warn!(
                limit = limits.max_connections,
                "at the connection limit: a connection was closed"
            );
            continue;
        };
        let connection = http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(app.clone()));
        let mut stop = stop.clone();
        connections.spawn(async move {
            let mut connection = std::pin::pin!(connection);
            tokio::select! {
                _ = connection.as_mut() => {}
                _ = async { let _ = stop.wait_for(|stopping| *stopping).await; } => {
                    connection.as_mut().graceful_shutdown();
                    let _ = connection.await;
                }
            }
            drop(permit);
        });
        while connections.try_join_next().is_some() {}
    }
    let _ = stopping.send(true);
    let drained = tokio::time::timeout(limits.shutdown_grace, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            open = connections.len(),
            "connections still open after the shutdown grace were closed"
        );
    }
    connections.abort_all();
}
