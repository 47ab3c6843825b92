//! `tidings.toml`: the daemon's configuration.
//!
//! Every key, its default and its meaning are in `docs/tidings.toml`, the
//! reference file (a test keeps it parsing to the defaults). A key can be
//! overridden by an environment variable named after its path:
//! `TIDINGS_` + section + `__` + key, upper case (`TIDINGS_RELAY__BATCH_SIZE=1000`).
//! Credentials come only from the environment or from files: a database or
//! broker URL with a password in the file itself is refused.
//!
//! Loading refuses, with the key's path and why: an unknown key, a value of
//! the wrong type, a value out of range, and a malformed file.

use std::collections::BTreeSet;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use serde::de::Deserializer;
use tidings_core::duration::Humane;
use tidings_core::secret::{Secret, has_password, redact_url};
use tidings_relay::RelayConfig;

/// The prefix of environment overrides.
pub const ENV_PREFIX: &str = "TIDINGS_";

/// Why a configuration was refused: where, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The file (or `environment`).
    pub source: String,
    /// The key's path (`relay.batch_size`), empty for the file as a whole.
    pub path: String,
    /// What is wrong.
    pub reason: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            write!(f, "{}: {}", self.source, self.reason)
        } else {
            write!(f, "{}: {}: {}", self.source, self.path, self.reason)
        }
    }
}

impl std::error::Error for ConfigError {}

/// How the relay learns what was committed (`relay.mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RelayMode {
    /// It looks for unsent outbox records, woken by producers: any database.
    #[default]
    Poll,
    /// It reads the outbox's inserts from PostgreSQL's logical replication
    /// (`wal_level = logical`), one relay of the group at a time.
    Cdc,
}

/// The whole file.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Where Tidings' tables are.
    pub database: DatabaseConfig,
    /// Where the relay publishes.
    pub broker: BrokerConfig,
    /// The relay: the relay's own configuration, read as it reads itself.
    pub relay: RelayConfig,
    /// `relay.enabled`: whether this process runs the relay, one of the
    /// keys of `[relay]` that are the daemon's rather than the relay's.
    #[serde(skip)]
    pub relay_enabled: bool,
    /// `relay.mode`: how the relay learns what was committed.
    #[serde(skip)]
    pub relay_mode: RelayMode,
    /// `relay.group`: the relay group of CDC mode, which names the
    /// replication slot and the publication (`tidings_<group>`).
    #[serde(skip)]
    pub relay_group: String,
    /// `relay.slot_wal_cap_mib`: in CDC mode, the write-ahead log the slot
    /// may hold past what its relay confirmed, in MiB (0: no cap); past it
    /// the relay drops the slot and polls until caught up, then makes a new
    /// one.
    #[serde(skip)]
    pub relay_slot_wal_cap_mib: u64,
    /// The database-log transport's housekeeping.
    pub log: LogConfig,
    /// The consumers' records' housekeeping.
    pub consumer: ConsumerSection,
    /// The metrics endpoint and lag sampling.
    pub metrics: MetricsConfig,
    /// The webhook inbox.
    pub inbox: InboxConfig,
    /// The console.
    pub console: ConsoleConfig,
}

/// `[database]`
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DatabaseConfig {
    /// `postgres://user@host/db` or `sqlite://path`.
    pub url: Option<Secret>,
    /// A file holding the URL (a mounted secret), instead of `url`.
    pub url_file: Option<PathBuf>,
    /// Connections in the pool.
    pub max_connections: u32,
    /// Create or upgrade Tidings' tables at start.
    pub migrate: bool,
    /// Keep sent outbox records this long (0: delete them once sent).
    pub outbox_retention: Dur,
}

impl Default for DatabaseConfig {
    fn default() -> Self {
        DatabaseConfig {
            url: None,
            url_file: None,
            max_connections: 8,
            migrate: true,
            outbox_retention: Dur(Duration::ZERO),
        }
    }
}

/// `[broker]`
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BrokerConfig {
    /// `log` (the database log, the default), `nats://host:4222`, `amqp://user@host:5672/%2f`,
    /// `kafka://host:9092`, `sqs://`, `pubsub://PROJECT`.
    pub url: Option<Secret>,
    /// A file holding the URL, instead of `url`.
    pub url_file: Option<PathBuf>,
    /// The prefix of the broker's streams (NATS) or exchanges (RabbitMQ):
    /// the consumers must use the same.
    pub prefix: Option<String>,
    /// Partitions of every topic on the broker: the consumers must use the same.
    pub partitions: u32,
    /// How the relay writes events: CloudEvents `binary` mode (attributes
    /// as headers) or `structured` mode (one JSON document). Consumers read both.
    pub content_mode: tidings_core::cloudevents::ContentMode,
}

impl Default for BrokerConfig {
    fn default() -> Self {
        BrokerConfig {
            url: None,
            url_file: None,
            prefix: None,
            partitions: 1,
            content_mode: tidings_core::cloudevents::ContentMode::Binary,
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            database: DatabaseConfig::default(),
            broker: BrokerConfig::default(),
            relay: RelayConfig::default(),
            relay_enabled: true,
            relay_mode: RelayMode::Poll,
            relay_group: "relay".into(),
            relay_slot_wal_cap_mib: 4096,
            log: LogConfig::default(),
            consumer: ConsumerSection::default(),
            metrics: MetricsConfig::default(),
            inbox: InboxConfig::default(),
            console: ConsoleConfig::default(),
        }
    }
}

/// `[log]`
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    /// Delete database-log entries older than this once every group has
    /// read past them (0: keep them forever). Replay reaches back this far.
    pub retention: Dur,
    /// How often to look for entries to delete.
    pub cleanup_interval: Dur,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            retention: Dur(Duration::from_secs(7 * 86_400)),
            cleanup_interval: Dur(Duration::from_secs(300)),
        }
    }
}

/// `[consumer]`
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ConsumerSection {
    /// Delete processed markers and effects records older than this (0:
    /// keep them forever); replays and redrives stop at it.
    pub dedupe_retention: Dur,
    /// How often to look for markers to delete.
    pub cleanup_interval: Dur,
}

impl Default for ConsumerSection {
    fn default() -> Self {
        ConsumerSection {
            dedupe_retention: Dur(Duration::from_secs(30 * 86_400)),
            cleanup_interval: Dur(Duration::from_secs(300)),
        }
    }
}

/// `[metrics]`
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsConfig {
    /// Serve `GET /metrics` here (empty: no endpoint).
    pub listen: String,
    /// How often to measure lag (outbox, consumers, dead letters).
    pub lag_interval: Dur,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig {
            listen: "127.0.0.1:9464".into(),
            lag_interval: Dur(Duration::from_secs(5)),
        }
    }
}

/// `[inbox]`: the webhook inbox `tidings run` serves, off unless it listens.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct InboxConfig {
    /// Serve the inbox here (empty: no inbox).
    pub listen: String,
    /// Where the routes are: each provider at `POST <path>/<name>`.
    pub path: String,
    /// The largest body accepted, in bytes.
    pub body_limit: usize,
    /// How long a delivery may take, from its body to the commit.
    pub timeout: Dur,
    /// How long accepted deliveries are remembered (0: forever).
    pub retention: Dur,
    /// The providers, each `[[inbox.providers]]`.
    pub providers: Vec<tidings_inbox::ProviderConfig>,
}

impl Default for InboxConfig {
    fn default() -> Self {
        InboxConfig {
            listen: String::new(),
            path: "/webhooks".into(),
            body_limit: 1024 * 1024,
            timeout: Dur(Duration::from_secs(10)),
            retention: Dur(Duration::from_secs(30 * 86_400)),
            providers: Vec::new(),
        }
    }
}

/// `[console]`: the web console `tidings run` serves, off unless it listens.
/// Its tokens are never in this file: `TIDINGS_CONSOLE_TOKENS` or the file
/// `tokens_file` names hold them.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ConsoleConfig {
    /// Serve the console here, e.g. "127.0.0.1:9470" (empty: no console).
    pub listen: String,
    /// A file of tokens, one `role:name:token` per line (role `reader` or
    /// `operator`; a token holds no `,`, `#` or whitespace); empty for none
    /// but the environment's.
    pub tokens_file: String,
    /// Whether reading needs a token too (it always does on an address
    /// other than the loopback interface).
    pub reads_need_token: bool,
    /// The schema registry directory (`tidings schema generate`'s) that
    /// edited dead letters are checked against; empty for none, and then
    /// no dead letter can be edited.
    pub schemas: String,
}

/// A duration written `500ms`, `30s`, `5m`, `2h` or `7d` (`0` for none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dur(pub Duration);

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        tidings_core::duration::deserialize(d).map(Dur)
    }
}

impl fmt::Display for Dur {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        Humane(self.0).fmt(f)
    }
}

/// Which URLs the program reading the configuration opens: a URL it
/// cannot open is refused with the others' mistakes, at load.
#[derive(Debug, Clone, Copy)]
pub struct Schemes {
    /// Whether a database URL names a database it opens.
    pub database: fn(&str) -> bool,
    /// Whether a broker URL names a transport it opens (`log` included).
    pub broker: fn(&str) -> bool,
}

/// A configuration as loaded, and which keys the environment set.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// The configuration.
    pub config: Config,
    /// The database URL, read from wherever it was given.
    pub database_url: Secret,
    /// The broker URL, read from wherever it was given.
    pub broker_url: Secret,
    /// Where the metrics endpoint listens, if anywhere.
    pub metrics_listen: Option<SocketAddr>,
    /// Where the webhook inbox listens, if anywhere.
    pub inbox_listen: Option<SocketAddr>,
    /// Where the console listens, if anywhere.
    pub console_listen: Option<SocketAddr>,
}

impl Loaded {
    /// Reads `path` (no file: every default), applies the overrides in
    /// `env` (`TIDINGS_SECTION__KEY=value`), and checks the result.
    pub fn from_file(
        path: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
        schemes: Schemes,
    ) -> Result<Loaded, ConfigError> {
        let source = path.map_or("configuration".to_owned(), |p| p.display().to_string());
        let text = match path {
            Some(p) => std::fs::read_to_string(p).map_err(|e| ConfigError {
                source: source.clone(),
                path: String::new(),
                reason: format!("cannot read it: {e}"),
            })?,
            None => String::new(),
        };
        Loaded::from_text(&source, &text, env, schemes)
    }

    /// Reads `text`, the content of `source`, as [`Loaded::from_file`] reads a file.
    ///
    /// A refusal never shows a password: a URL holding one that it quotes
    /// (a URL given where a duration or an address belongs) is redacted.
    pub fn from_text(
        source: &str,
        text: &str,
        env: impl IntoIterator<Item = (String, String)>,
        schemes: Schemes,
    ) -> Result<Loaded, ConfigError> {
        let env: Vec<(String, String)> = env.into_iter().collect();
        Self::read(source, text, env.iter().cloned(), schemes).map_err(|mut e| {
            let file = toml::Value::Table(toml::from_str(text).unwrap_or_default());
            let mut given: Vec<&str> = env.iter().map(|(_, v)| v.as_str()).collect();
            strings(&file, &mut |s| given.push(s));
            for url in given.into_iter().filter(|s| has_password(s)) {
                e.reason = hide(&e.reason, url);
            }
            // And any URL the reason quotes in another form (trimmed, unquoted).
            e.reason = hide_urls(&e.reason);
            e
        })
    }

    fn read(
        source: &str,
        text: &str,
        env: impl IntoIterator<Item = (String, String)>,
        schemes: Schemes,
    ) -> Result<Loaded, ConfigError> {
        let refuse = |path: &str, reason: String| ConfigError {
            source: source.to_owned(),
            path: path.to_owned(),
            reason,
        };
        let mut table: toml::Table = toml::from_str(text).map_err(|e| refuse("", one_line(text, &e)))?;
        let from_env = apply_env(&mut table, env).map_err(|(var, reason)| ConfigError {
            source: "environment".into(),
            path: var,
            reason,
        })?;
        let daemon_key = |key: &str, reason: String| {
            let path = format!("relay.{key}");
            let source = if from_env.contains(&path) {
                format!("environment ({})", env_name(&path))
            } else {
                source.to_owned()
            };
            ConfigError { source, path, reason }
        };
        let relay_enabled = take_enabled(&mut table).map_err(|reason| daemon_key("enabled", reason))?;
        let relay_mode = match take_relay_key(&mut table, "mode") {
            None => RelayMode::Poll,
            Some(toml::Value::String(mode)) if mode == "poll" => RelayMode::Poll,
            Some(toml::Value::String(mode)) if mode == "cdc" => RelayMode::Cdc,
            Some(other) => {
                return Err(daemon_key(
                    "mode",
                    format!("{other} is not a mode: \"poll\" or \"cdc\""),
                ));
            }
        };
        let relay_slot_wal_cap_mib = match take_relay_key(&mut table, "slot_wal_cap_mib") {
            None => 4096,
            Some(toml::Value::Integer(mib)) if mib >= 0 => mib as u64,
            Some(other) => {
                return Err(daemon_key(
                    "slot_wal_cap_mib",
                    format!("{other} is not a size in MiB (0 or more; 0: no cap)"),
                ));
            }
        };
        let relay_group = match take_relay_key(&mut table, "group") {
            None => "relay".to_owned(),
            Some(toml::Value::String(group)) => group,
            Some(other) => {
                return Err(daemon_key(
                    "group",
                    format!("invalid type: {}, expected a string", other.type_str()),
                ));
            }
        };
        let mut config: Config =
            serde_path_to_error::deserialize(toml::Value::Table(table)).map_err(|e| {
                let key = e.path().to_string();
                let var = env_name(&key);
                let source = if from_env.contains(&key) {
                    format!("environment ({var})")
                } else {
                    source.to_owned()
                };
                ConfigError {
                    source,
                    path: key,
                    reason: e.into_inner().message().trim().to_owned(),
                }
            })?;
        config.relay_enabled = relay_enabled;
        config.relay_mode = relay_mode;
        config.relay_group = relay_group;
        config.relay_slot_wal_cap_mib = relay_slot_wal_cap_mib;
        let database_url = secret_url(
            &config.database.url,
            &config.database.url_file,
            "database",
            &from_env,
        )
        .map_err(|(path, reason)| refuse(&path, reason))?
        .ok_or_else(|| {
            refuse(
                "database.url",
                "no database: set TIDINGS_DATABASE__URL, database.url or database.url_file".into(),
            )
        })?;
        let broker_url = secret_url(&config.broker.url, &config.broker.url_file, "broker", &from_env)
            .map_err(|(path, reason)| refuse(&path, reason))?
            .unwrap_or_else(|| Secret::new("log"));
        let metrics_listen = match config.metrics.listen.trim() {
            "" => None,
            addr => Some(addr.parse().map_err(|_| {
                refuse(
                    "metrics.listen",
                    format!("{addr:?} is not an address (write 127.0.0.1:9464, or \"\" for no endpoint)"),
                )
            })?),
        };
        let inbox_listen = match config.inbox.listen.trim() {
            "" => None,
            addr => Some(addr.parse().map_err(|_| {
                refuse(
                    "inbox.listen",
                    format!("{addr:?} is not an address (write 0.0.0.0:9480, or \"\" for no inbox)"),
                )
            })?),
        };
        let console_listen = match config.console.listen.trim() {
            "" => None,
            addr => Some(addr.parse().map_err(|_| {
                refuse(
                    "console.listen",
                    format!("{addr:?} is not an address (write 127.0.0.1:9470, or \"\" for no console)"),
                )
            })?),
        };
        let loaded = Loaded {
            config,
            database_url,
            broker_url,
            metrics_listen,
            inbox_listen,
            console_listen,
        };
        loaded
            .check(schemes)
            .map_err(|(path, reason)| refuse(&path, reason))?;
        Ok(loaded)
    }

    /// The inbox: served with providers, or not at all. Each provider's
    /// secret is read when the daemon starts, not here.
    fn check_inbox(&self) -> Result<(), (String, String)> {
        let inbox = &self.config.inbox;
        match (self.inbox_listen, inbox.providers.is_empty()) {
            (Some(_), true) => {
                return Err((
                    "inbox.providers".into(),
                    "the inbox listens but accepts no provider: add an [[inbox.providers]] entry".into(),
                ));
            }
            (None, false) => {
                return Err((
                    "inbox.listen".into(),
                    "providers are configured but the inbox does not listen: set inbox.listen".into(),
                ));
            }
            _ => {}
        }
        if !inbox.path.starts_with('/') || inbox.path.len() < 2 || inbox.path.ends_with('/') {
            return Err((
                "inbox.path".into(),
                format!(
                    "{:?} is not a path to mount the inbox on (write /webhooks)",
                    inbox.path
                ),
            ));
        }
        if !(1024..=64 * 1024 * 1024).contains(&inbox.body_limit) {
            return Err((
                "inbox.body_limit".into(),
                format!("{} is out of range (1024 to 67108864 bytes)", inbox.body_limit),
            ));
        }
        if inbox.timeout.0.is_zero() {
            return Err(("inbox.timeout".into(), "must be more than 0".into()));
        }
        let mut names = std::collections::HashSet::new();
        for p in &inbox.providers {
            if !names.insert(p.name.as_str()) {
                return Err((
                    "inbox.providers".into(),
                    format!("two providers are named {:?}", p.name),
                ));
            }
            p.validate().map_err(|e| match e {
                tidings_core::Error::Config { key, reason } => (key, reason),
                other => (format!("inbox.providers.{}", p.name), other.to_string()),
            })?;
        }
        Ok(())
    }

    /// Ranges and the URLs' schemes.
    fn check(&self, schemes: Schemes) -> Result<(), (String, String)> {
        let c = &self.config;
        let range = |path: &str, v: u64, lo: u64, hi: u64| {
            if (lo..=hi).contains(&v) {
                Ok(())
            } else {
                Err((path.to_owned(), format!("{v} is out of range ({lo} to {hi})")))
            }
        };
        let positive = |path: &str, d: Dur| {
            if d.0.is_zero() {
                Err((path.to_owned(), "must be more than 0".to_owned()))
            } else {
                Ok(())
            }
        };
        range(
            "database.max_connections",
            c.database.max_connections.into(),
            1,
            1000,
        )?;
        if c.relay_mode == RelayMode::Cdc {
            let url = self.database_url.expose();
            if !["postgres://", "postgresql://"]
                .iter()
                .any(|p| url.starts_with(p))
            {
                return Err((
                    "relay.mode".into(),
                    "cdc reads PostgreSQL's logical replication: database.url must be a postgres:// URL (or use mode = \"poll\")".into(),
                ));
            }
            if c.relay.partition_count() != 1 {
                return Err((
                    "relay.partitions".into(),
                    "cdc streams one replication slot, from one relay at a time: partitions must be 1".into(),
                ));
            }
            let valid = !c.relay_group.is_empty()
                && c.relay_group.len() <= 50
                && c.relay_group
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
            if !valid {
                return Err((
                    "relay.group".into(),
                    format!(
                        "{:?} cannot name a replication slot: use 1 to 50 lower-case letters, digits and underscores",
                        c.relay_group
                    ),
                ));
            }
        }
        c.relay.check().map_err(|e| match e {
            tidings_core::Error::Config { key, reason } => (format!("relay.{key}"), reason),
            other => ("relay".to_owned(), other.to_string()),
        })?;
        // Each batch in flight holds a connection until it ends, and over
        // the database log its publish appends on a second one; the
        // wake-up listener, the leases and the cleanup need three more.
        let window = c.relay.window();
        if window > 1 {
            let log = self.broker_url.expose() == "log";
            let each = if log { 2 } else { 1 };
            let needed = window * each + 3;
            if (c.database.max_connections as usize) < needed {
                return Err((
                    "relay.max_in_flight_batches".into(),
                    format!(
                        "{window} batches in flight need {needed} connections of the pool ({each} each{}, and 3 for the wake-ups, \
                         the leases and the cleanup), and database.max_connections is {}: raise it to {needed}, or lower relay.max_in_flight_batches",
                        if log { " over the database log" } else { "" },
                        c.database.max_connections
                    ),
                ));
            }
        }
        range("broker.partitions", c.broker.partitions.into(), 1, 1024)?;
        positive("log.cleanup_interval", c.log.cleanup_interval)?;
        positive("consumer.cleanup_interval", c.consumer.cleanup_interval)?;
        // Markers must outlive what can be delivered again.
        let dedupe = c.consumer.dedupe_retention;
        if !dedupe.0.is_zero() {
            for (path, reach) in [
                ("log.retention", c.log.retention),
                ("database.outbox_retention", c.database.outbox_retention),
            ] {
                if reach.0.is_zero() && path == "log.retention" || reach.0 > dedupe.0 {
                    let reach = if reach.0.is_zero() {
                        "forever".to_owned()
                    } else {
                        reach.to_string()
                    };
                    return Err((
                        "consumer.dedupe_retention".to_owned(),
                        format!(
                            "{dedupe} is shorter than {path} ({reach}): a replay could reach events whose \
                             processed markers are gone; make it longer, or 0 to keep them forever"
                        ),
                    ));
                }
            }
        }
        positive("metrics.lag_interval", c.metrics.lag_interval)?;
        self.check_inbox()?;
        let db = self.database_url.expose();
        if !(schemes.database)(db) {
            return Err((
                "database.url".to_owned(),
                format!(
                    "{:?} is not a database URL (postgres://user@host/db or sqlite://path)",
                    redact_url(db)
                ),
            ));
        }
        let broker = self.broker_url.expose();
        if !(schemes.broker)(broker) {
            return Err((
                "broker.url".to_owned(),
                format!(
                    "{:?} is not a broker (log, nats://host:4222, amqp://user@host:5672/%2f or kafka://host:9092)",
                    redact_url(broker)
                ),
            ));
        }
        Ok(())
    }
}

/// Calls `f` with every string in `value`, however deep.
fn strings<'v>(value: &'v toml::Value, f: &mut impl FnMut(&'v str)) {
    match value {
        toml::Value::String(s) => f(s),
        toml::Value::Array(items) => items.iter().for_each(|v| strings(v, f)),
        toml::Value::Table(table) => table.values().for_each(|v| strings(v, f)),
        _ => {}
    }
}

/// `text` with `url`, as given or as quoted (`{url:?}`), in its redacted form.
fn hide(text: &str, url: &str) -> String {
    let redacted = redact_url(url);
    let quoted = format!("{url:?}");
    let quoted = &quoted[1..quoted.len() - 1];
    text.replace(url, &redacted).replace(quoted, &redacted)
}

/// `text` with every `scheme://…` in it (up to a space or a quote) that
/// holds a password in its redacted form.
fn hide_urls(text: &str) -> String {
    let stops = |c: char| c.is_whitespace() || c == '"' || c == '\'' || c == '`';
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let scheme = rest[..at]
            .chars()
            .rev()
            .take_while(|c| c.is_ascii_alphanumeric() || "+-.".contains(*c))
            .count();
        // The scheme's characters are ASCII: one byte each.
        let start = at - scheme;
        let end = rest[at..].find(stops).map_or(rest.len(), |i| at + i);
        let url = &rest[start..end];
        out.push_str(&rest[..start]);
        if has_password(url) {
            out.push_str(&redact_url(url));
        } else {
            out.push_str(url);
        }
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// Takes a key of the daemon's out of the file's `[relay]`, so that the
/// rest of the section is the relay's own configuration.
fn take_relay_key(table: &mut toml::Table, key: &str) -> Option<toml::Value> {
    table
        .get_mut("relay")
        .and_then(toml::Value::as_table_mut)
        .and_then(|relay| relay.remove(key))
}

/// Takes `relay.enabled` out of the file's `[relay]` (default: on).
fn take_enabled(table: &mut toml::Table) -> Result<bool, String> {
    match take_relay_key(table, "enabled") {
        None => Ok(true),
        Some(toml::Value::Boolean(on)) => Ok(on),
        Some(other) => Err(format!("invalid type: {}, expected a boolean", other.type_str())),
    }
}

/// A URL from `url` or `url_file`; refused if the file's own text holds a password.
fn secret_url(
    url: &Option<Secret>,
    file: &Option<PathBuf>,
    section: &str,
    from_env: &BTreeSet<String>,
) -> Result<Option<Secret>, (String, String)> {
    let key = format!("{section}.url");
    match (url, file) {
        (Some(url), None) => {
            if has_password(url.expose()) && !from_env.contains(&key) {
                return Err((
                    key.clone(),
                    format!(
                        "holds a password: give it through {} or {section}.url_file, not in the file",
                        env_name(&key)
                    ),
                ));
            }
            Ok(Some(url.clone()))
        }
        (Some(_), Some(_)) => Err((key, format!("give {section}.url or {section}.url_file, not both"))),
        (None, Some(path)) => {
            let text = std::fs::read_to_string(path).map_err(|e| {
                (
                    format!("{section}.url_file"),
                    format!("cannot read {}: {e}", path.display()),
                )
            })?;
            Ok(Some(Secret::new(text.trim())))
        }
        (None, None) => Ok(None),
    }
}

/// `relay.batch_size` -> `TIDINGS_RELAY__BATCH_SIZE`.
pub fn env_name(path: &str) -> String {
    format!("{ENV_PREFIX}{}", path.replace('.', "__").to_uppercase())
}

/// Applies `TIDINGS_SECTION__KEY=value` overrides; returns the paths set.
/// A value reads as TOML (`1000`, `true`, `"text"`), or else as a string.
fn apply_env(
    table: &mut toml::Table,
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<BTreeSet<String>, (String, String)> {
    let mut set = BTreeSet::new();
    let mut aliased: Vec<(String, String, String)> = Vec::new();
    for (var, raw) in env {
        // The other commands' names for the two URLs, accepted here too.
        let var = match ALIASES.iter().find(|(alias, _)| *alias == var) {
            Some((alias, canonical)) => {
                aliased.push(((*alias).to_owned(), (*canonical).to_owned(), raw.clone()));
                (*canonical).to_owned()
            }
            None => var,
        };
        let Some(rest) = var.strip_prefix(ENV_PREFIX) else {
            continue;
        };
        if !rest.contains("__") {
            continue;
        }
        let parts: Vec<String> = rest.split("__").map(str::to_lowercase).collect();
        if parts.len() != 2 || parts.iter().any(String::is_empty) {
            return Err((var, "write TIDINGS_SECTION__KEY (one section, one key)".into()));
        }
        let value = toml::from_str::<toml::Table>(&format!("v = {raw}"))
            .ok()
            .and_then(|mut t| t.remove("v"))
            .unwrap_or_else(|| toml::Value::String(raw.clone()));
        let section = table
            .entry(parts[0].clone())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        let Some(section) = section.as_table_mut() else {
            return Err((var, format!("{} is not a section", parts[0])));
        };
        if let Some(previous) = section.insert(parts[1].clone(), value.clone())
            && set.contains(&parts.join("."))
            && previous != value
        {
            let alias = aliased
                .iter()
                .find(|(_, canonical, _)| *canonical == var)
                .map_or(var.clone(), |(alias, _, _)| alias.clone());
            return Err((var, format!("{alias} says otherwise: set one of the two")));
        }
        set.insert(parts.join("."));
    }
    Ok(set)
}

/// Variables read as another's: (alias, canonical). The operator commands
/// read `TIDINGS_DATABASE_URL` and `TIDINGS_BROKER_URL`; the daemon reads
/// them too, as `database.url` and `broker.url`.
const ALIASES: [(&str, &str); 2] = [
    ("TIDINGS_DATABASE_URL", "TIDINGS_DATABASE__URL"),
    ("TIDINGS_BROKER_URL", "TIDINGS_BROKER__URL"),
];

/// A TOML syntax error on one line: `line L, column C: message`.
fn one_line(text: &str, e: &toml::de::Error) -> String {
    let message = e.message().trim().replace('\n', " ");
    match e.span() {
        Some(span) => {
            let before = &text[..span.start.min(text.len())];
            let line = before.matches('\n').count() + 1;
            let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
            format!("line {line}, column {column}: {message}")
        }
        None => message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The daemon's schemes, as far as these tests go.
    const SCHEMES: Schemes = Schemes {
        database: |url| {
            ["postgres://", "mysql://", "sqlite:"]
                .iter()
                .any(|s| url.starts_with(s))
        },
        broker: |url| {
            url == "log"
                || ["nats://", "amqp://", "kafka://"]
                    .iter()
                    .any(|s| url.starts_with(s))
        },
    };

    fn load(text: &str, env: &[(&str, &str)]) -> Result<Loaded, ConfigError> {
        let path =
            std::env::temp_dir().join(format!("tidings-config-{}.toml", uuid::Uuid::new_v4().simple()));
        std::fs::write(&path, text).unwrap();
        let loaded = Loaded::from_file(
            Some(&path),
            env.iter().map(|(k, v)| (k.to_string(), v.to_string())),
            SCHEMES,
        )
        .map_err(|e| ConfigError {
            source: "file".into(),
            ..e
        });
        std::fs::remove_file(&path).unwrap();
        loaded
    }

    fn refused(text: &str, env: &[(&str, &str)]) -> (String, String) {
        let e = load(text, env).expect_err("refused");
        (e.path, e.reason)
    }

    #[test]
    fn the_reference_file_is_the_defaults() {
        let reference = include_str!("../../../docs/tidings.toml");
        let loaded = load(reference, &[("TIDINGS_DATABASE__URL", "sqlite://x.db")]).unwrap();
        let defaults = load("", &[("TIDINGS_DATABASE__URL", "sqlite://x.db")]).unwrap();
        assert_eq!(format!("{:?}", loaded.config), format!("{:?}", defaults.config));
        // Every key of the configuration appears in the reference file.
        for key in [
            "url",
            "url_file",
            "max_connections",
            "migrate",
            "outbox_retention",
            "prefix",
            "partitions",
            "content_mode",
            "enabled",
            "mode",
            "group",
            "slot_wal_cap_mib",
            "batch_size",
            "poll_interval",
            "publish_timeout",
            "lease_ttl",
            "cleanup_interval",
            "member",
            "retention",
            "dedupe_retention",
            "listen",
            "lag_interval",
            "path",
            "body_limit",
            "timeout",
            "tokens_file",
            "reads_need_token",
            "schemas",
        ] {
            assert!(
                reference.contains(&format!("\n{key} =")) || reference.contains(&format!("\n# {key} =")),
                "{key}"
            );
        }
    }

    #[test]
    fn the_inbox_listens_with_providers_or_not_at_all() {
        let db = "[database]\nurl = \"sqlite://x.db\"\n";
        let stripe = "[[inbox.providers]]\nname = \"stripe\"\nscheme = \"stripe\"\nsecret_env = \"STRIPE_WEBHOOK_SECRET\"\n";
        let loaded = load(
            &format!("{db}[inbox]\nlisten = \"127.0.0.1:9480\"\n{stripe}"),
            &[],
        )
        .unwrap();
        assert_eq!(loaded.inbox_listen, Some("127.0.0.1:9480".parse().unwrap()));
        assert_eq!(loaded.config.inbox.providers[0].name, "stripe");
        assert_eq!(load(db, &[]).unwrap().inbox_listen, None);

        let (path, reason) = refused(&format!("{db}[inbox]\nlisten = \"127.0.0.1:9480\"\n"), &[]);
        assert_eq!(path, "inbox.providers");
        assert!(reason.contains("no provider"), "{reason}");
        let (path, _) = refused(&format!("{db}{stripe}"), &[]);
        assert_eq!(path, "inbox.listen");
        let (path, _) = refused(
            &format!("{db}[inbox]\nlisten = \"127.0.0.1:9480\"\n{stripe}{stripe}"),
            &[],
        );
        assert_eq!(path, "inbox.providers");
        let (path, reason) = refused(
            &format!(
                "{db}[inbox]\nlisten = \"127.0.0.1:9480\"\n[[inbox.providers]]\nname = \"s\"\nscheme = \"stripe\"\n"
            ),
            &[],
        );
        assert_eq!(path, "inbox.providers.s");
        assert!(reason.contains("exactly one of secret_env"), "{reason}");
        // What the daemon would refuse at start, --check refuses too.
        let (path, reason) = refused(
            &format!(
                "{db}[inbox]\nlisten = \"127.0.0.1:9480\"\n[[inbox.providers]]\nname = \"acme\"\nscheme = \"hmac\"\nsecret_env = \"ACME\"\n"
            ),
            &[],
        );
        assert_eq!(path, "inbox.providers.acme");
        assert!(reason.contains("names the header"), "{reason}");
        let (_, reason) = refused(
            &format!(
                "{db}[inbox]\nlisten = \"127.0.0.1:9480\"\n[[inbox.providers]]\nname = \"Stripe EU\"\nscheme = \"stripe\"\nsecret_env = \"S\"\n"
            ),
            &[],
        );
        assert!(reason.contains("path segment"), "{reason}");
        let (path, reason) = refused(
            &format!(
                "{db}[inbox]\nlisten = \"127.0.0.1:9480\"\n[[inbox.providers]]\nname = \"s\"\nscheme = \"stripe\"\nsecret = \"whsec_x\"\n"
            ),
            &[],
        );
        assert!(path.starts_with("inbox.providers"), "{path}");
        assert!(reason.contains("unknown field `secret`"), "{reason}");
    }

    #[test]
    fn environment_overrides_the_file() {
        let loaded = load(
            "[relay]\nbatch_size = 100\n[database]\nurl = \"sqlite://a.db\"\n",
            &[
                ("TIDINGS_RELAY__BATCH_SIZE", "1000"),
                ("TIDINGS_METRICS__LISTEN", ""),
            ],
        )
        .unwrap();
        // The batch size from the environment, the poll interval its default (500ms).
        assert_eq!(loaded.config.relay, RelayConfig::default().batch_size(1000));
        assert_eq!(loaded.metrics_listen, None);
        assert_eq!(loaded.database_url.expose(), "sqlite://a.db");
    }

    #[test]
    fn bad_keys_and_values_are_refused_with_their_path() {
        let db = "[database]\nurl = \"sqlite://a.db\"\n";
        let (path, reason) = refused(&format!("{db}[relay]\nbatchsize = 10\n"), &[]);
        assert_eq!(path, "relay.batchsize");
        assert!(
            reason.contains("unknown field") && reason.contains("batch_size"),
            "{reason}"
        );
        let (path, reason) = refused(&format!("{db}[relay]\nbatch_size = \"many\"\n"), &[]);
        assert_eq!(path, "relay.batch_size");
        assert!(reason.contains("invalid type"), "{reason}");
        let (path, reason) = refused(&format!("{db}[relay]\nbatch_size = 0\n"), &[]);
        assert_eq!(
            (path.as_str(), reason.as_str()),
            ("relay.batch_size", "0 is out of range (1 to 100000)")
        );
        let (path, reason) = refused(&format!("{db}[relay]\npoll_interval = \"soon\"\n"), &[]);
        assert_eq!(path, "relay.poll_interval");
        assert!(reason.contains("not a duration"), "{reason}");
        let (path, _) = refused(&format!("{db}[metrics]\nlisten = \"everywhere\"\n"), &[]);
        assert_eq!(path, "metrics.listen");
        let (path, _) = refused(&format!("{db}[broker]\nurl = \"pulsar://p:6650\"\n"), &[]);
        assert_eq!(path, "broker.url");
        let (path, reason) = refused(&format!("{db}[broker]\ncontent_mode = \"sideways\"\n"), &[]);
        assert_eq!(path, "broker.content_mode");
        assert!(
            reason.contains("binary") && reason.contains("structured"),
            "{reason}"
        );
        let loaded = load(db, &[("TIDINGS_BROKER__CONTENT_MODE", "structured")]).unwrap();
        assert_eq!(
            loaded.config.broker.content_mode,
            tidings_core::cloudevents::ContentMode::Structured
        );
        let (path, reason) = refused("[relay\n", &[]);
        assert_eq!(path, "");
        assert!(reason.starts_with("line 1, column"), "{reason}");
        let e = load(db, &[("TIDINGS_RELAY__PARTITIONS", "lots")]).unwrap_err();
        assert_eq!(e.path, "relay.partitions");
        let (path, _) = refused(db, &[("TIDINGS_RELAY__NOPE", "1")]);
        assert_eq!(path, "relay.nope");
        let (path, reason) = refused("", &[]);
        assert_eq!(path, "database.url");
        assert!(reason.contains("TIDINGS_DATABASE__URL"), "{reason}");
    }

    #[test]
    fn a_window_of_batches_needs_its_connections_in_the_pool() {
        let db = "[database]\nurl = \"postgres://u@db/app\"\nmax_connections = 8\n";
        let nats = "[broker]\nurl = \"nats://n:4222\"\n";
        let (path, reason) = refused(
            &format!("{db}{nats}[relay]\npartitions = 8\nmax_in_flight_batches = 6\n"),
            &[],
        );
        assert_eq!(path, "relay.max_in_flight_batches");
        assert!(
            reason.contains("6 batches in flight need 9 connections of the pool (1 each,")
                && reason.contains("database.max_connections is 8: raise it to 9"),
            "{reason}"
        );
        let fits = load(
            &format!("{db}{nats}[relay]\npartitions = 8\nmax_in_flight_batches = 5\n"),
            &[],
        )
        .unwrap();
        assert_eq!(fits.config.relay.window(), 5);
        let (_, reason) = refused(
            &format!("{db}[relay]\npartitions = 8\nmax_in_flight_batches = 3\n"),
            &[],
        );
        assert!(
            reason.contains(
                "3 batches in flight need 9 connections of the pool (2 each over the database log,"
            ),
            "{reason}"
        );
        let one_partition = load(&format!("{db}[relay]\nmax_in_flight_batches = 64\n"), &[]).unwrap();
        assert_eq!(
            one_partition.config.relay.window(),
            1,
            "one partition: one batch at a time"
        );
    }

    #[test]
    fn cdc_mode_needs_postgresql_one_partition_and_a_group_that_names_a_slot() {
        let pg = "[database]\nurl = \"postgres://u@db/app\"\n";
        let loaded = load(&format!("{pg}[relay]\nmode = \"cdc\"\ngroup = \"orders\"\n"), &[]).unwrap();
        assert_eq!(loaded.config.relay_mode, RelayMode::Cdc);
        assert_eq!(loaded.config.relay_group, "orders");
        assert_eq!(loaded.config.relay_slot_wal_cap_mib, 4096, "4 GiB unless set");
        let capped = load(
            &format!("{pg}[relay]\nmode = \"cdc\"\nslot_wal_cap_mib = 0\n"),
            &[],
        )
        .unwrap();
        assert_eq!(capped.config.relay_slot_wal_cap_mib, 0);
        let (p, reason) = refused(&format!("{pg}[relay]\nslot_wal_cap_mib = -1\n"), &[]);
        assert_eq!(p, "relay.slot_wal_cap_mib");
        assert!(reason.contains("not a size in MiB"), "{reason}");
        assert_eq!(
            loaded.config.relay,
            RelayConfig::default(),
            "mode and group are the daemon's keys"
        );
        let env = load(pg, &[("TIDINGS_RELAY__MODE", "cdc")]).unwrap();
        assert_eq!(
            (env.config.relay_mode, env.config.relay_group.as_str()),
            (RelayMode::Cdc, "relay")
        );
        for (file, path, why) in [
            (
                "[database]\nurl = \"sqlite://a.db\"\n[relay]\nmode = \"cdc\"\n",
                "relay.mode",
                "must be a postgres:// URL",
            ),
            (
                &format!("{pg}[relay]\nmode = \"cdc\"\npartitions = 4\n"),
                "relay.partitions",
                "partitions must be 1",
            ),
            (
                &format!("{pg}[relay]\nmode = \"cdc\"\ngroup = \"Orders-1\"\n"),
                "relay.group",
                "cannot name a replication slot",
            ),
            (
                &format!("{pg}[relay]\nmode = \"stream\"\n"),
                "relay.mode",
                "\"poll\" or \"cdc\"",
            ),
        ] {
            let (p, reason) = refused(file, &[]);
            assert_eq!(p, path, "{file}");
            assert!(reason.contains(why), "{reason}");
        }
    }

    #[test]
    fn relay_enabled_is_the_daemons_and_the_rest_of_relay_is_the_relays() {
        let db = "[database]\nurl = \"sqlite://a.db\"\n";
        let loaded = load(&format!("{db}[relay]\nenabled = false\nbatch_size = 20\n"), &[]).unwrap();
        assert!(!loaded.config.relay_enabled);
        assert_eq!(loaded.config.relay, RelayConfig::default().batch_size(20));
        assert!(load(db, &[]).unwrap().config.relay_enabled, "on by default");
        let (path, reason) = refused(&format!("{db}[relay]\nenabled = \"yes\"\n"), &[]);
        assert_eq!(path, "relay.enabled");
        assert!(reason.contains("expected a boolean"), "{reason}");
        let e = load(db, &[("TIDINGS_RELAY__ENABLED", "maybe")]).unwrap_err();
        assert_eq!(e.path, "relay.enabled");
        assert_eq!(
            load(db, &[]).unwrap().config.relay_mode,
            RelayMode::Poll,
            "poll by default"
        );
        let (path, reason) = refused(&format!("{db}[relay]\nlease_ttl = \"100ms\"\n"), &[]);
        assert_eq!(
            (path.as_str(), reason.as_str()),
            ("relay.lease_ttl", "must be at least 300ms")
        );
    }

    #[test]
    fn markers_must_outlive_what_can_be_delivered_again() {
        let env = [("TIDINGS_DATABASE__URL", "sqlite://x.db")];
        let (path, reason) = refused("[consumer]\ndedupe_retention = \"1d\"\n", &env);
        assert_eq!(path, "consumer.dedupe_retention");
        assert!(reason.contains("shorter than log.retention (7d)"), "{reason}");
        let (_, reason) = refused("[log]\nretention = \"0\"\n", &env);
        assert!(reason.contains("log.retention (forever)"), "{reason}");
        let (_, reason) = refused("[database]\noutbox_retention = \"60d\"\n", &env);
        assert!(reason.contains("database.outbox_retention (60d)"), "{reason}");
        assert!(
            load(
                "[log]\nretention = \"0\"\n[consumer]\ndedupe_retention = \"0\"\n",
                &env
            )
            .is_ok()
        );
    }

    #[test]
    fn passwords_come_from_the_environment_or_a_file_only() {
        let (path, reason) = refused("[database]\nurl = \"postgres://app:hunter2@db/shop\"\n", &[]);
        assert_eq!(path, "database.url");
        assert!(
            !reason.contains("hunter2") && reason.contains("TIDINGS_DATABASE__URL"),
            "{reason}"
        );
        let (path, reason) = refused(
            "[database]\nurl = \"postgres://app@db/shop?sslmode=require&password=hunter2\"\n",
            &[],
        );
        assert_eq!(path, "database.url");
        assert!(!reason.contains("hunter2"), "{reason}");
        let (path, _) = refused(
            "[database]\nurl = \"sqlite://a.db\"\n[broker]\nurl = \"amqp://guest:guest@mq:5672/%2f\"\n",
            &[],
        );
        assert_eq!(path, "broker.url");
        let loaded = load("", &[("TIDINGS_DATABASE__URL", "postgres://app:hunter2@db/shop")]).unwrap();
        assert!(!format!("{loaded:?}").contains("hunter2"));
        let file = std::env::temp_dir().join(format!("tidings-url-{}", uuid::Uuid::new_v4().simple()));
        std::fs::write(&file, "postgres://app:hunter2@db/shop\n").unwrap();
        let loaded = load(
            &format!("[database]\nurl_file = {:?}\n", file.display().to_string()),
            &[],
        )
        .unwrap();
        std::fs::remove_file(&file).unwrap();
        assert_eq!(loaded.database_url.expose(), "postgres://app:hunter2@db/shop");
    }

    #[test]
    fn a_refusal_quoting_a_url_hides_its_password() {
        // Found by the config_file fuzz target: a URL where a duration
        // belongs was quoted whole.
        let env = [("TIDINGS_DATABASE__URL", "sqlite://x.db")];
        for text in [
            "[consumer]\ndedupe_retention = \"postgres://:hunter2@/db\"\n",
            "[metrics]\nlisten = \"amqp://app:hunter2@mq/%2f\"\n",
            "[relay]\nbatch_size = \"postgres://app@db/shop?password=hunter2\"\n",
        ] {
            let (path, reason) = refused(text, &env);
            assert!(!path.is_empty() && !reason.contains("hunter2"), "{reason}");
        }
        let e = load("", &[("TIDINGS_METRICS__LISTEN", "nats://u:hunter2@h:4222")]).unwrap_err();
        assert!(!e.to_string().contains("hunter2"), "{e}");
        // Quoted as given in neither form: trimmed, or read as TOML from the environment.
        let (_, reason) = refused("[metrics]\nlisten = \" amqp://app:hunter2@mq/%2f \"\n", &env);
        assert!(!reason.contains("hunter2"), "{reason}");
        let e = load("", &[("TIDINGS_METRICS__LISTEN", "\"nats://u:hunter2@h:4222\"")]).unwrap_err();
        assert!(!e.to_string().contains("hunter2"), "{e}");
        // Found by the config_file fuzz target: a URL right after a
        // character of two bytes.
        assert_eq!(
            hide_urls("\u{6cc}qlite://@ and ямqp://u:pw@h"),
            "\u{6cc}qlite://@ and ямqp://u@h"
        );
    }

    #[test]
    fn durations_read_and_print_back() {
        for (text, d) in [
            ("500ms", Duration::from_millis(500)),
            ("30s", Duration::from_secs(30)),
            ("5m", Duration::from_secs(300)),
            ("2h", Duration::from_secs(7200)),
            ("7d", Duration::from_secs(7 * 86_400)),
            ("0", Duration::ZERO),
        ] {
            assert_eq!(tidings_core::duration::parse(text), Ok(d));
            if !d.is_zero() {
                assert_eq!(Dur(d).to_string(), text);
            }
        }
        assert!(tidings_core::duration::parse("5 minutes").is_err());
        assert!(tidings_core::duration::parse("s").is_err());
    }
}
