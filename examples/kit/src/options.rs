//! What every reference system is run with, and how its figures print.

use std::collections::BTreeMap;
use std::time::Duration;

use tidings::AnyStore;
use tidings::sql::StoreOptions;

use crate::{Progress, Scale};

/// The embedded default database, shared by the reference systems.
pub const DEFAULT_DATABASE: &str = "sqlite://tidings-demo.db";

/// How to run a reference system.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// `postgres://...`, `mysql://...` or `sqlite://path` (default: [`DEFAULT_DATABASE`]).
    pub database: Option<String>,
    /// A broker URL, or `None` for the database log.
    pub broker: Option<String>,
    /// Members, relays, partitions, duplicated deliveries.
    pub scale: Scale,
    /// How to show progress on stderr.
    pub progress: Progress,
    /// Give up waiting for the system to drain this long after its
    /// producers are done.
    pub drain_timeout: Duration,
    /// The store's pool size (default: the store's).
    pub max_connections: Option<u32>,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            database: None,
            broker: None,
            scale: Scale::default(),
            progress: Progress::Off,
            drain_timeout: Duration::from_secs(300),
            max_connections: None,
        }
    }
}

impl RunOptions {
    /// The database's URL: the one given, else the embedded default.
    pub fn database_url(&self) -> String {
        self.database
            .clone()
            .unwrap_or_else(|| DEFAULT_DATABASE.to_owned())
    }

    /// Opens the store with `options` (and the pool size asked for), and
    /// says which database it is, without credentials.
    pub async fn open_store(&self, mut options: StoreOptions) -> anyhow::Result<(AnyStore, String)> {
        let url = self.database_url();
        if let Some(n) = self.max_connections {
            options = options.max_connections(n);
        }
        Ok((crate::open_store(&url, options).await?, crate::label(&url)))
    }
}

/// Counts per name as a summary prints them: `a 3 · b 5`, or `0` when none.
pub fn counts(m: &BTreeMap<String, i64>) -> String {
    if m.is_empty() {
        "0".to_owned()
    } else {
        m.iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(" · ")
    }
}

/// The last lines of every summary: whether the system drained, the
/// invariants it broke (none: no line), how long the run took.
pub fn outcome(
    f: &mut std::fmt::Formatter<'_>,
    drained: bool,
    broken: &[String],
    elapsed_ms: u64,
) -> std::fmt::Result {
    writeln!(
        f,
        "  drained              {}",
        if drained { "yes" } else { "NO (timed out)" }
    )?;
    if !broken.is_empty() {
        writeln!(f, "  BROKEN               {}", broken.join("; "))?;
    }
    write!(f, "  elapsed              {:.1} s", elapsed_ms as f64 / 1000.0)
}
