//! `tidings schema`: the registry of the checkout reference system's
//! message types. A service keeps its own registry the same way, with
//! `tidings_schema::Registry` over its types (see docs/SCHEMAS.md).

use std::path::PathBuf;
use std::process::ExitCode;

use tidings_schema::Registry;

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

pub(crate) fn run(command: SchemaCommand) -> anyhow::Result<ExitCode> {
    let current = tidings_example_checkout::schemas();
    match command {
        SchemaCommand::Generate { dir } => generate(&current, &dir.dir),
        SchemaCommand::Check { dir } => check(&current, &dir.dir),
        SchemaCommand::Asyncapi { dir, out } => {
            let registry = Registry::load(&dir.dir)?;
            let doc = tidings_schema::asyncapi::document(&registry, &tidings_example_checkout::topology())?;
            let text = serde_json::to_string_pretty(&doc)? + "\n";
            match out {
                Some(path) => std::fs::write(&path, text)?,
                None => print!("{text}"),
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn generate(current: &Registry, dir: &std::path::Path) -> anyhow::Result<ExitCode> {
    match current.generate(dir) {
        Ok(written) if written.is_empty() => {
            println!(
                "{}: up to date ({} schemas)",
                dir.display(),
                current.docs().count()
            );
            Ok(ExitCode::SUCCESS)
        }
        Ok(written) => {
            for path in written {
                println!("wrote {}", path.display());
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(tidings_schema::SchemaError::Breaking { problems }) => {
            for problem in problems {
                eprintln!("{problem}");
            }
            eprintln!("refused: nothing written");
            Ok(ExitCode::from(1))
        }
        Err(e) => Err(e.into()),
    }
}

fn check(current: &Registry, dir: &std::path::Path) -> anyhow::Result<ExitCode> {
    let committed = Registry::load(dir)?;
    let report = current.check(&committed);
    for note in &report.notes {
        println!("note: {note}");
    }
    if report.passed() {
        println!(
            "{}: {} schemas, no breaking change, no secrets",
            dir.display(),
            current.docs().count()
        );
        return Ok(ExitCode::SUCCESS);
    }
    for problem in &report.problems {
        eprintln!("{problem}");
    }
    eprintln!("{} problem(s) in {}", report.problems.len(), dir.display());
    Ok(ExitCode::from(1))
}
