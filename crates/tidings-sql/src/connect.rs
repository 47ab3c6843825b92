//! The first connection of a pool, made by hand so that a server that is
//! not there is reported as what it is (refused, no answer, the login
//! refused) within the connect timeout, rather than as a pool timing out.

use std::time::Duration;

use sqlx::{ConnectOptions, Connection};
use tidings_core::Result;

use crate::{Dialect, db_error};

/// What a server with no connection left to give means.
const FULL: &str = "connecting (the server has no connection left: raise its max_connections, or lower the pools \
    of the processes using it: StoreOptions::max_connections, database.max_connections, --max-connections)";

/// Makes one connection with `connect`, trying again while the server is
/// not up yet (`starting`: connection refused or reset, a server still
/// starting), for up to `window`; then returns its last error as `D`'s,
/// for `operation` (`connecting to PostgreSQL`).
pub async fn probe<D, O>(
    connect: &O,
    window: Duration,
    starting: fn(&sqlx::Error) -> bool,
    operation: &'static str,
) -> Result<()>
where
    D: Dialect,
    O: ConnectOptions,
    O::Connection: Sized,
{
    let deadline = tokio::time::Instant::now() + window;
    let mut delay = Duration::from_millis(100);
    loop {
        let error = match tokio::time::timeout_at(deadline, connect.connect()).await {
            Ok(Ok(conn)) => {
                conn.close().await.ok();
                return Ok(());
            }
            Ok(Err(e)) => e,
            Err(_) => sqlx::Error::Io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no answer within {} ms", window.as_millis()),
            )),
        };
        let timed_out = matches!(&error, sqlx::Error::Io(io) if io.kind() == std::io::ErrorKind::TimedOut);
        if !starting(&error) || timed_out || tokio::time::Instant::now() + delay >= deadline {
            // PostgreSQL's "too many clients" (53300), MySQL's "Too many connections" (08004).
            let full = error
                .as_database_error()
                .and_then(|e| e.code())
                .is_some_and(|code| code == "53300" || code == "08004");
            let operation = if full { FULL } else { operation };
            return Err(db_error::<D>(operation)(error));
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(1));
    }
}
