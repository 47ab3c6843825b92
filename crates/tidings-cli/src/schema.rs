//! `tidings schema`: the registry of the checkout reference system's
//! message types. A service runs the same commands over its own types with
//! `tidings_schema::command::main` (see docs/SCHEMAS.md).

use std::path::PathBuf;
use std::process::ExitCode;

use tidings_schema::command;

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
    /// receives each).
    Asyncapi {
        #[command(flatten)]
        dir: DirArg,
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
        SchemaCommand::Asyncapi { dir, out } => {
            command::asyncapi(&dir.dir, &tidings_example_checkout::topology(), out.as_deref())?
        }
    })
}
