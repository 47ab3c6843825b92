//! Stopping a service on SIGTERM or Ctrl-C.

use tokio_util::sync::CancellationToken;

/// A token cancelled when the process receives SIGTERM (what an orchestrator
/// sends) or SIGINT (Ctrl-C). Relays and consumers given it finish what they
/// hold and return.
///
/// Call it inside the Tokio runtime.
pub fn shutdown_on_signal() -> std::io::Result<CancellationToken> {
    let token = CancellationToken::new();
    let cancel = token.clone();
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut terminate = signal(SignalKind::terminate())?;
        tokio::spawn(async move {
            tokio::select! {
                _ = terminate.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            cancel.cancel();
        });
    }
    #[cfg(not(unix))]
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        cancel.cancel();
    });
    Ok(token)
}
