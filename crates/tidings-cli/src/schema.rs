//! `tidings schema`: the registries of the reference systems' message
//! types (checkout's by default, `--system payments` for the payments one). A service runs the same commands over its own types with
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

/// The server a broker URL names: its host, and where the URL says more
/// than the transport's options, the protocol (`amqps`) and the path (a
/// RabbitMQ virtual host).
fn server(name: String, url: &str, addresses: std::sync::Arc<dyn tidings::addresses::Addresses>) -> Server {
    let mut server = Server::new(name, host(url), addresses);
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    if scheme == "amqps" {
        server = server.protocol("amqps");
    }
    if scheme.starts_with("amqp") {
        let path = rest.split(['?', '#']).next().unwrap_or_default();
        if let Some(vhost) = path.find('/').map(|i| &path[i..]).filter(|p| p.len() > 1) {
            server = server.pathname(vhost);
        }
    }
    server
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
        /// How the relay writes events, as `[broker] content_mode` sets it:
        /// `binary` (attributes as headers) or `structured`.
        #[arg(long, default_value = "binary", value_parser = ["binary", "structured"])]
        content_mode: String,
        /// Write it to this file instead of standard output.
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

#[derive(Debug, clap::Args)]
pub(crate) struct DirArg {
    /// Which reference system's types.
    #[arg(long, value_enum, default_value_t = System::Checkout)]
    system: System,
    /// The registry directory (default: `examples/<system>/schemas`).
    #[arg(long)]
    dir: Option<PathBuf>,
}

/// The reference systems with a registry.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub(crate) enum System {
    Checkout,
    Payments,
    Upload,
    Clicks,
}

impl DirArg {
    fn registry(
        &self,
    ) -> (
        tidings_schema::Registry,
        tidings_schema::asyncapi::Topology,
        PathBuf,
    ) {
        let (current, topology, name) = match self.system {
            System::Checkout => (
                tidings_example_checkout::schemas(),
                tidings_example_checkout::topology(),
                "checkout",
            ),
            System::Payments => (
                tidings_example_payments::schemas(),
                tidings_example_payments::topology(),
                "payments",
            ),
            System::Upload => (
                tidings_example_upload::schemas(),
                tidings_example_upload::topology(),
                "upload",
            ),
            System::Clicks => (
                tidings_example_clicks::schemas(),
                tidings_example_clicks::topology(),
                "clicks",
            ),
        };
        let dir = self
            .dir
            .clone()
            .unwrap_or_else(|| PathBuf::from(format!("examples/{name}/schemas")));
        (current, topology, dir)
    }
}

pub(crate) fn run(schema: SchemaCommand) -> anyhow::Result<ExitCode> {
    Ok(match schema {
        SchemaCommand::Generate { dir } => {
            let (current, _, dir) = dir.registry();
            command::generate(&current, &dir)?
        }
        SchemaCommand::Check { dir } => {
            let (current, _, dir) = dir.registry();
            command::check(&current, &dir)?
        }
        SchemaCommand::Asyncapi {
            dir,
            out,
            broker,
            partitions,
            prefix,
            server: name,
            content_mode,
        } => {
            let (_, mut topology, dir) = dir.registry();
            if let Some(url) = broker {
                let mut layout = tidings::Topology::default().partitions(partitions);
                if let Some(prefix) = prefix {
                    layout = layout.prefix(prefix);
                }
                if content_mode == "structured" {
                    layout = layout.content_mode(tidings::cloudevents::ContentMode::Structured);
                }
                let options = tidings::TransportOptions::new(layout);
                let addresses = tidings::transport_addresses(&url, &options)?.ok_or_else(|| {
                    anyhow::anyhow!("--broker log: the database log is a table, not a server to describe")
                })?;
                topology = topology.server(server(name, &url, addresses));
            }
            command::asyncapi(&dir, &topology, out.as_deref())?
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The document `tidings schema asyncapi --broker <url>` describes.
    fn described(url: &str, structured: bool) -> serde_json::Value {
        let mut layout = tidings::Topology::default();
        if structured {
            layout = layout.content_mode(tidings::cloudevents::ContentMode::Structured);
        }
        let options = tidings::TransportOptions::new(layout);
        let addresses = tidings::transport_addresses(url, &options).unwrap().unwrap();
        let topology =
            tidings_example_checkout::topology().server(server("production".into(), url, addresses));
        let registry = tidings_schema::Registry::load(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../examples/checkout/schemas"
        ))
        .unwrap();
        tidings_schema::asyncapi::document(&registry, &topology).unwrap()
    }

    #[test]
    fn a_broker_url_names_its_servers_protocol_and_virtual_host() {
        let doc = described("amqps://app:secret@rabbit.internal:5671/shop", false);
        let server = &doc["servers"]["production"];
        assert_eq!(server["host"], "rabbit.internal:5671", "no credentials");
        assert_eq!(server["protocol"], "amqps");
        assert_eq!(server["pathname"], "/shop");
        assert_eq!(server["protocolVersion"], "0.9.1");
        assert!(!doc.to_string().contains("secret"));

        let doc = described("amqp://rabbit.internal:5672/", false);
        assert_eq!(doc["servers"]["production"]["protocol"], "amqp");
        assert!(doc["servers"]["production"].get("pathname").is_none());

        let doc = described("kafka://k1:9092,k2:9092", true);
        assert_eq!(doc["servers"]["production-2"]["host"], "k2:9092");
        assert_eq!(
            doc["components"]["messages"]["OrderPlaced.v1"]["contentType"],
            "application/cloudevents+json"
        );
    }
}
