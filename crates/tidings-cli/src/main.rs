//! `tidings`: the operator's command.

/// Writes a line on stdout as `println!` does, but hands back a write
/// error (`?`) rather than panicking: a closed pipe (`tidings lag | head`)
/// then ends the command quietly (see [`closed_pipe`]).
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($arg)*)?
    }};
}

/// [`say!`] without the line's end.
macro_rules! say_part {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let mut out = std::io::stdout().lock();
        write!(out, $($arg)*)?;
        out.flush()?
    }};
}

mod audit;
mod cdc;
mod console;
mod daemon;
mod daemon_client;
mod demo;
mod dlq;
mod doctor;
mod lag;
mod outbox;
mod replay;
mod schema;

use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use tidings::secret::redact_url;
use tidings::{AnyStore, CancellationToken, LagSource, shutdown_on_signal, with_store};
use tidings_config::{Loaded, Schemes};
use tidings_example_checkout::demo::DEFAULT_DATABASE;

/// Reliable events for Rust backends: transactional outbox, relay, idempotent consumers.
#[derive(Debug, Parser)]
#[command(name = "tidings", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the relay daemon: the relay, the database log's housekeeping,
    /// lag sampling and the Prometheus endpoint, until SIGTERM or Ctrl-C.
    Run {
        /// The configuration file (every key: docs/tidings.toml); without
        /// one, every default, with overrides from TIDINGS_SECTION__KEY variables.
        #[arg(long, env = "TIDINGS_CONFIG")]
        config: Option<std::path::PathBuf>,
        /// Check the configuration and exit.
        #[arg(long)]
        check: bool,
    },
    /// Run a reference system in one process.
    #[command(subcommand)]
    Demo(demo::Demo),
    /// Create or upgrade Tidings' tables.
    Migrate(DatabaseArg),
    /// Measure what Tidings costs, beside the raw limits measured in the same run.
    #[command(subcommand)]
    Bench(tidings_bench::Bench),
    /// Dead letters: list them grouped by cause, show one, redrive or skip them.
    Dlq {
        #[command(flatten)]
        database: DatabaseArg,
        #[command(flatten)]
        daemon: DaemonArg,
        #[command(subcommand)]
        command: dlq::Dlq,
    },
    /// The replication slot of a CDC relay group (`relay.mode = "cdc"`):
    /// its state, or dropping it.
    Cdc {
        #[command(flatten)]
        database: DatabaseArg,
        #[command(flatten)]
        daemon: DaemonArg,
        #[command(subcommand)]
        command: cdc::CdcCommand,
    },
    /// The outbox: pending records per partition, rates, and the relays holding them.
    Outbox {
        #[command(flatten)]
        database: DatabaseArg,
        #[command(flatten)]
        daemon: DaemonArg,
        #[command(subcommand)]
        command: outbox::OutboxCommand,
    },
    /// Checks a live deployment against the production checklist: each item
    /// pass, warn or fail with its evidence; exit code 1 if one fails.
    Doctor {
        #[command(flatten)]
        database: DatabaseArg,
        #[command(flatten)]
        daemon: DaemonArg,
        #[command(flatten)]
        args: doctor::DoctorArgs,
    },
    /// Re-delivers a time range of retained events to one consumer, at a
    /// bounded rate: what it processed is suppressed by its processed
    /// markers, what it missed is handled. A running member carries it out.
    Replay {
        #[command(flatten)]
        database: DatabaseArg,
        #[command(flatten)]
        daemon: DaemonArg,
        #[command(flatten)]
        args: replay::ReplayArgs,
    },
    /// Event contracts: generate the schema registry, check the types against it.
    #[command(subcommand)]
    Schema(schema::SchemaCommand),
    /// Serve the web console alone: the overview, dead letters by cause,
    /// one letter in full, and the JSON API, over a database.
    Console {
        #[command(flatten)]
        database: DatabaseArg,
        #[command(flatten)]
        args: console::ConsoleArgs,
    },
    /// The audit trail, newest first: who redrove, skipped, purged or
    /// edited what, and when.
    Audit {
        #[command(flatten)]
        database: DatabaseArg,
        #[command(flatten)]
        daemon: DaemonArg,
        /// Only the entries of this target (a dead letter's id).
        #[arg(long)]
        target: Option<String>,
        /// At most this many entries.
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// Print the entries as one JSON array.
        #[arg(long)]
        json: bool,
    },
    /// Outbox backlog, consumer lag, dead letters, and keys held behind them.
    Lag {
        #[command(flatten)]
        database: DatabaseArg,
        #[command(flatten)]
        daemon: DaemonArg,
        /// Print the figures as one JSON object.
        #[arg(long)]
        json: bool,
    },
}

/// A running daemon to ask instead of the database.
#[derive(Debug, Args)]
struct DaemonArg {
    /// Ask a running daemon's console (`http://host:9470`) rather than
    /// the database; sends the token of TIDINGS_CONSOLE_TOKEN.
    #[arg(long = "daemon", global = true)]
    url: Option<String>,
}

#[derive(Debug, Args)]
struct DatabaseArg {
    /// `postgres://user@host/db`, `mysql://user@host/db`, or `sqlite://path`;
    /// else TIDINGS_DATABASE__URL (the daemon's spelling), else the embedded
    /// default, `sqlite://tidings-demo.db`.
    #[arg(long = "database", global = true, env = "TIDINGS_DATABASE_URL")]
    given: Option<String>,
}

impl DatabaseArg {
    /// The database URL, from wherever it was given.
    fn url(&self) -> String {
        or_env(self.given.as_deref(), "TIDINGS_DATABASE__URL").unwrap_or_else(|| DEFAULT_DATABASE.to_owned())
    }
}

/// The databases and transports this build opens, for `tidings.toml`.
const SCHEMES: Schemes = Schemes {
    database: |url| tidings::database_named(url).is_some(),
    broker: tidings::opens_transport,
};

/// `given` (a flag, or its `TIDINGS_X_URL` variable), else the variable
/// `var`: the daemon's `TIDINGS_SECTION__KEY` spelling of the same setting,
/// so that one environment serves every command.
pub(crate) fn or_env(given: Option<&str>, var: &str) -> Option<String> {
    given
        .map(str::to_owned)
        .or_else(|| std::env::var(var).ok().filter(|v| !v.is_empty()))
}

/// Installs the Prometheus recorder and serves it on `addr` for the rest of the process.
pub(crate) async fn serve_metrics(addr: std::net::SocketAddr) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("--metrics: cannot listen on {addr}"))?;
    let handle = tidings_prometheus::install()?;
    tokio::spawn(tidings_prometheus::serve(
        listener,
        handle,
        CancellationToken::new(),
    ));
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    // The daemon says what it does; one-shot commands only warn.
    let default_filter = match cli.command {
        // lapin logs the broker's refusal of a passive declare (a group's queue
        // not on this broker) as an error of its own: the daemon reports lag itself.
        Command::Run { .. } => "info,sqlx=warn,lapin::returned_messages=error,lapin::channel=off",
        _ => "warn,sqlx=error,lapin::returned_messages=error",
    };
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let log = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| default_filter.into()),
        );
    // Spans go to the collector whatever the log's verbosity.
    #[cfg(feature = "otel")]
    let otel = match std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT") {
        Ok(endpoint) if !endpoint.trim().is_empty() => {
            let service = std::env::var("OTEL_SERVICE_NAME").unwrap_or_else(|_| "tidings".into());
            match tidings_otel::install(&endpoint, &service) {
                Ok(otel) => Some(otel),
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::from(2);
                }
            }
        }
        _ => None,
    };
    #[cfg(feature = "otel")]
    let spans = otel.as_ref().map(|o| {
        o.layer()
            .with_filter(tracing_subscriber::filter::LevelFilter::INFO)
    });
    #[cfg(not(feature = "otel"))]
    let spans: Option<tracing_subscriber::layer::Identity> = None;
    tracing_subscriber::registry().with(log).with(spans).init();
    match run(cli).await {
        Ok(code) => code,
        // Whoever reads the output has gone (`| head`): nothing left to say.
        Err(e) if closed_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            // Each cause once, where a cause's text is already in its error's.
            let e: &(dyn std::error::Error + 'static) = e.as_ref();
            eprintln!("error: {}", tidings_core::Report(e));
            ExitCode::from(2)
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Run { config, check } => {
            let loaded = Loaded::from_file(config.as_deref(), std::env::vars(), SCHEMES)?;
            if check {
                say!(
                    "configuration ok: database {}, broker {}, relay {}, metrics {}, inbox {}, console {}",
                    redact_url(loaded.database_url.expose()),
                    redact_url(loaded.broker_url.expose()),
                    if loaded.config.relay_enabled { "on" } else { "off" },
                    loaded
                        .metrics_listen
                        .map_or("off".to_owned(), |a| format!("on {a}")),
                    loaded.inbox_listen.map_or("off".to_owned(), |a| format!(
                        "on {a}{} ({} providers)",
                        loaded.config.inbox.path,
                        loaded.config.inbox.providers.len()
                    )),
                    loaded
                        .console_listen
                        .map_or("off".to_owned(), |a| format!("on {a}")),
                );
                return Ok(ExitCode::SUCCESS);
            }
            daemon::run(loaded, shutdown_on_signal()?).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Demo(shape) => demo::run(shape).await,
        Command::Bench(bench) => bench.run().await,
        Command::Dlq {
            database,
            daemon: DaemonArg { url: Some(daemon) },
            command,
        } => {
            drop(database);
            dlq::run_remote(&daemon_client::Daemon::new(&daemon)?, command).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Dlq {
            database,
            daemon: DaemonArg { url: None },
            command,
        } => {
            with_store!(open_existing(&database.url()).await?, |s| dlq::run(&s, command)
                .await?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Cdc {
            database,
            daemon,
            command,
        } => {
            match daemon.url {
                Some(url) => cdc::remote(&daemon_client::Daemon::new(&url)?, command).await?,
                None => cdc::run(open_existing(&database.url()).await?, command).await?,
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Outbox {
            database,
            daemon,
            command: outbox::OutboxCommand::Status(args),
        } => {
            let status = match daemon.url {
                Some(url) => outbox::remote(&daemon_client::Daemon::new(&url)?, &args).await?,
                None => with_store!(open_existing(&database.url()).await?, |s| outbox::local(
                    &s, &args
                )
                .await?),
            };
            outbox::print(&status, args.json)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Doctor {
            database,
            daemon,
            args,
        } => {
            let checks = match daemon.url {
                Some(url) => doctor::remote(&daemon_client::Daemon::new(&url)?, &args).await?,
                None => {
                    let store = open_existing(&database.url()).await?;
                    let cdc = doctor::cdc(&store, &args).await?;
                    with_store!(store, |s| doctor::local(&s, &args, cdc).await?)
                }
            };
            let healthy = doctor::print(&checks, args.json)?;
            Ok(if healthy {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Command::Replay {
            database,
            daemon,
            args,
        } => {
            let done = match daemon.url {
                Some(url) => replay::remote(&daemon_client::Daemon::new(&url)?, args).await?,
                None => with_store!(open_existing(&database.url()).await?, |s| replay::local(&s, args)
                    .await?),
            };
            Ok(if done {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Command::Schema(command) => schema::run(command),
        Command::Console { database, args } => {
            let store = open_existing(&database.url()).await?;
            console::run(store, args, shutdown_on_signal()?).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Migrate(db) => {
            let url = db.url();
            open(&url).await?.migrate().await?;
            say!("migrated {}", redact_url(&url));
            Ok(ExitCode::SUCCESS)
        }
        Command::Audit {
            database,
            daemon,
            target,
            limit,
            json,
        } => {
            let entries = match daemon.url {
                Some(url) => {
                    audit::remote(&daemon_client::Daemon::new(&url)?, target.as_deref(), limit).await?
                }
                None => with_store!(open_existing(&database.url()).await?, |s| audit::read(
                    &s,
                    target.as_deref(),
                    limit
                )
                .await?),
            };
            audit::print(&entries, json)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Lag {
            database,
            daemon,
            json,
        } => {
            let report = match daemon.url {
                Some(url) => lag::remote(&daemon_client::Daemon::new(&url)?).await?,
                None => with_store!(open_existing(&database.url()).await?, |s| s.lag().await?),
            };
            lag::print(&report, json)?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Refuses to deliver again, unless `force`, what is older than the dedupe
/// horizon: the processed markers that would suppress what was handled
/// before it are gone, so it would be handled, and its effects done, twice.
/// `what` says what would reach back (`replaying from ...`).
pub(crate) async fn within_dedupe_horizon<S: tidings_core::ConsumerStore>(
    store: &S,
    oldest: chrono::DateTime<chrono::Utc>,
    what: &str,
    force: bool,
) -> anyhow::Result<()> {
    let Some(horizon) = store.past_dedupe_horizon(Some(oldest)).await? else {
        return Ok(());
    };
    if force {
        eprintln!(
            "warning: {what} reaches back past the dedupe horizon ({horizon}): what was handled before it will be handled again"
        );
        return Ok(());
    }
    anyhow::bail!(
        "{what} reaches back to {oldest}, past the dedupe horizon ({horizon}): the processed markers from \
         before it were deleted (consumer.dedupe_retention), so what was handled then would be handled again \
         and its effects done twice. Start at {horizon} or later, or pass --force to do it anyway"
    )
}

/// What opening the store at `url` is, for an error's context.
pub(crate) fn connecting_to(url: &str) -> String {
    let database = tidings::database_named(url).unwrap_or("the database");
    format!("connecting to {database} at {}", redact_url(url))
}

/// The store at `url`, chosen by its scheme.
/// Whether `e` comes from writing to a pipe whose reader has closed it.
fn closed_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// Opens the store at `url` for a command that reads or settles what is
/// there: a SQLite file that does not exist is an error, not a new, empty
/// database left behind.
async fn open_existing(url: &str) -> anyhow::Result<AnyStore> {
    if url.starts_with("sqlite:") {
        let options: tidings::sqlx::sqlite::SqliteConnectOptions =
            url.parse().with_context(|| connecting_to(url))?;
        let file = options.get_filename();
        anyhow::ensure!(
            file == std::path::Path::new(":memory:") || file.exists(),
            "no database at {}: pass --database (or set TIDINGS_DATABASE_URL), or create it with `tidings migrate --database {}`",
            file.display(),
            redact_url(url)
        );
    }
    // Run by hand: a server that is not there is said within seconds.
    let options = tidings::sql::StoreOptions::default().connect_timeout(READ_CONNECT_TIMEOUT);
    tidings::open_store_with(url, options)
        .await
        .with_context(|| connecting_to(url))
}

/// How long a command that reads what is there waits for its database.
const READ_CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

/// Opens the store at `url` for `migrate`, which deployments run beside a
/// database that may still be starting: it waits the default 10 s for it.
async fn open(url: &str) -> anyhow::Result<AnyStore> {
    tidings::open_store(url).await.with_context(|| connecting_to(url))
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_well_formed() {
        super::Cli::command().debug_assert();
    }
}
