//! `tidings schema`: the registry of the checkout reference system's
//! message types. A service runs the same commands over its own types with
//! `tidings_schema::command::main` (see docs/SCHEMAS.md).

use std::path::PathBuf;
use std::process::ExitCode;

use tidings_schema::asyncapi::Server;
use tidings_schema::command;

/// The host and port of a broker URL, without its scheme, credentials,
/// path or query (`kafka://a:9092,b:9092` -> `a:9092,b:9092`).
fn host(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    authority.rsplit('@').next().unwrap_or_default().to_owned()
}

/// What `tidings schema` does.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum SchemaCommand {
    /// Write the schema of every message type into the registry directory
    /// (one file per type and version), for committing. Refuses a breaking
    /// change within a committed version.
    Generate {
        #[command(flatten)]
        dir: DirArg,
    },
    /// Compare the types against the committed registry: exit code 1 on a
    /// breaking change within a version, a type or version missing from the
    /// registry, a registry out of date, or a field named like a secret.
    Check {
        #[command(flatten)]
        dir: DirArg,
    },
    /// Print the AsyncAPI 3.0 document of the registry and the system's
    /// topology (channels, messages, payload schemas, who sends and who
    /// receives each); with `--broker`, the broker as its server and each
    /// channel's real address and bindings on it.
    Asyncapi {
        #[command(flatten)]
        dir: DirArg,
        /// The broker (`kafka://host:9092`, `nats://host:4222`,
        /// `amqp://host:5672/%2f`), named without connecting to it.
        #[arg(long)]
        broker: Option<String>,
        /// Partitions of every topic on the broker, as the relay is configured.
        #[arg(long, default_value_t = 1)]
        partitions: u32,
        /// The prefix of the broker's names, as `[broker] prefix` sets it.
        #[arg(long)]
        prefix: Option<String>,
        /// The server's name in the document.
        #[arg(long, default_value = "production")]
        server: String,
        /// Write it to this file instead of standard output.
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

#[derive(Debug, clap::Args)]
pub(crate) struct DirArg {
    /// The registry directory.
    #[arg(long, default_value = "examples/checkout/schemas")]
    dir: PathBuf,
}

pub(crate) fn run(schema: SchemaCommand) -> anyhow::Result<ExitCode> {
    let current = tidings_example_checkout::schemas();
    Ok(match schema {
        SchemaCommand::Generate { dir } => command::generate(&current, &dir.dir)?,
        SchemaCommand::Check { dir } => command::check(&current, &dir.dir)?,
        SchemaCommand::Asyncapi {
            dir,
            out,
            broker,
            partitions,
            prefix,
            server,
        } => {
            let mut topology = tidings_example_checkout::topology();
            if let Some(url) = broker {
                let mut layout = tidings::Topology::default().partitions(partitions);
                if let Some(prefix) = prefix {
                    layout = layout.prefix(prefix);
                }
                let options = tidings::TransportOptions::new(layout);
                let addresses = tidings::transport_addresses(&url, &options)?.ok_or_else(|| {
                    anyhow::anyhow!("--broker log: the database log is a table, not a server to describe")
                })?;
                topology = topology.server(Server::new(server, host(&url), addresses));
            }
            command::asyncapi(&dir.dir, &topology, out.as_deref())?
        }
    })
}
