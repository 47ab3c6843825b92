//! `tidings console`, and the daemon's `[console]`: the web console over a
//! database, with the tokens of the environment and a file.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use clap::Args;
use tidings::{AnyStore, with_store};
use tidings_console::{Access, Console, Schemas};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// How often `tidings console` samples the overview's figures for its charts.
const SAMPLE_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// `tidings console`'s options.
#[derive(Debug, Args)]
pub(crate) struct ConsoleArgs {
    /// Where to serve the console.
    #[arg(long, default_value = "127.0.0.1:9470")]
    listen: SocketAddr,
    /// A file of tokens, one `role:name:token` per line (a token holds no
    /// `,`, `#` or whitespace; else only TIDINGS_CONSOLE_TOKENS'); redrive,
    /// skip and purge need an operator's.
    #[arg(long)]
    tokens_file: Option<PathBuf>,
    /// Reading needs a token too (always so off the loopback interface).
    #[arg(long)]
    reads_need_token: bool,
    /// The outbox's partition count (default: as the live relays hold them).
    #[arg(long)]
    partitions: Option<u32>,
    /// The schema registry directory (`tidings schema generate`'s): an
    /// operator may edit a dead letter's payload and redrive it only if it
    /// matches its type's schema there. Without it, nothing is edited.
    #[arg(long, value_name = "DIR")]
    schemas: Option<PathBuf>,
    /// The broker the consumers read (`nats://`, `amqp://`, `kafka://`,
    /// `sqs://`, `pubsub://`; else TIDINGS_BROKER__URL): the overview then
    /// shows each group's count there, as the daemon does.
    #[arg(long, value_name = "URL")]
    broker: Option<String>,
    /// With --broker: the prefix of its topics and groups (`broker.prefix`).
    #[arg(long, value_name = "PREFIX", env = "TIDINGS_BROKER__PREFIX")]
    broker_prefix: Option<String>,
    /// With --broker: partitions per topic (`broker.partitions`; 1, as there).
    #[arg(long, default_value_t = 1, env = "TIDINGS_BROKER__PARTITIONS")]
    broker_partitions: u32,
}

/// The schema registry in `dir`, if one is named; `setting` names where,
/// for a directory that cannot be read.
pub(crate) fn schemas(dir: Option<&Path>, setting: &str) -> anyhow::Result<Option<Schemas>> {
    dir.map(|dir| {
        Schemas::load(dir)
            .with_context(|| format!("{setting}: reading the schema registry {}", dir.display()))
    })
    .transpose()
}

/// Who may use a console on `listen`: the tokens of the environment and of
/// `file`. Off the loopback interface, reading needs a token too, and a
/// console without any is refused.
pub(crate) fn access(
    listen: SocketAddr,
    file: Option<&Path>,
    reads_need_token: bool,
) -> anyhow::Result<Access> {
    let access = Access::from_env_and_file(file)?;
    let public = !listen.ip().is_loopback();
    anyhow::ensure!(
        !(public && access.is_empty()),
        "the console would listen on {listen}, which is not a loopback address, with no token: \
         give tokens ({}, or a tokens file) or listen on 127.0.0.1",
        tidings_console::access::TOKENS_VAR
    );
    Ok(access.reads_need_token(public || reads_need_token))
}

/// Binds the console's socket, naming the setting on failure.
pub(crate) async fn bind(listen: SocketAddr, setting: &str) -> anyhow::Result<TcpListener> {
    TcpListener::bind(listen)
        .await
        .with_context(|| format!("{setting}: cannot listen on {listen}"))
}

/// Serves the console over `store` until `shutdown`.
pub(crate) async fn run(
    store: AnyStore,
    args: ConsoleArgs,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let access = access(args.listen, args.tokens_file.as_deref(), args.reads_need_token)?;
    let schemas = schemas(args.schemas.as_deref(), "--schemas")?;
    let listener = bind(args.listen, "--listen").await?;
    let broker = crate::or_env(args.broker.as_deref(), "TIDINGS_BROKER__URL");
    eprintln!(
        "console on http://{} ({} token(s){})",
        listener.local_addr()?,
        access.len(),
        if access.reading_needs_token() {
            ", reading needs one"
        } else {
            ""
        }
    );
    with_store!(store, |s| {
        let mut console = Console::new(s.clone(), access);
        if let Some(schemas) = schemas {
            console = console.schemas(schemas);
        }
        if let Some(n) = args.partitions {
            console = console.partitions(n);
        }
        // The database log's lag is read from the store: `log` needs no sampler.
        if let Some(url) = broker.as_deref().filter(|u| *u != "log") {
            let mut topology = tidings_core::Topology::default().partitions(args.broker_partitions);
            if let Some(prefix) = &args.broker_prefix {
                topology = topology.prefix(prefix);
            }
            // A console is what one opens when things go wrong: a broker
            // that does not answer leaves its lag unknown, not the page.
            match tidings::open_transport(url, &topology, &s).await {
                Ok(opened) if opened.broker.is_broker() => {
                    let lag = tidings_core::metrics::BrokerLag::default();
                    console = console.broker_lag(lag.clone());
                    tokio::spawn(tidings_core::metrics::sample_broker_lag(
                        s.clone(),
                        opened.subscriber.clone(),
                        SAMPLE_EVERY,
                        lag,
                        shutdown.clone(),
                    ));
                }
                Ok(_) => {}
                Err(e) => eprintln!(
                    "warning: --broker: cannot open {} ({}): serving without the groups' lag on the broker",
                    tidings::secret::redact_url(url),
                    e.report()
                ),
            }
        }
        let sampler = tokio::spawn(console.sample(SAMPLE_EVERY, shutdown.clone().cancelled_owned()));
        tidings_console::serve(listener, console.router(), shutdown.cancelled_owned()).await;
        let _ = sampler.await;
    });
    Ok(())
}
