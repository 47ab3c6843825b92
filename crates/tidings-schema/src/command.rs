//! The registry's commands, for `tidings schema` and for a service's own
//! binary over its own types:
//!
//! ```no_run
//! // src/bin/schemas.rs of a service:
//! # fn registry() -> tidings_schema::Registry { tidings_schema::Registry::new() }
//! # fn topology() -> tidings_schema::asyncapi::Topology { tidings_schema::asyncapi::Topology::new("Shop", "1") }
//! fn main() -> std::process::ExitCode {
//!     tidings_schema::command::main(registry(), topology())
//! }
//! ```
//!
//! `cargo run --bin schemas -- generate|check|asyncapi [--dir schemas] [--out FILE]`
//! then works as `tidings schema` does for the checkout system.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crate::asyncapi::{self, Topology};
use crate::registry::{Registry, SchemaError};

/// Writes the schemas of `current` into `dir`; exit code 1, nothing
/// written, on a breaking change within a committed version.
pub fn generate(current: &Registry, dir: &Path) -> Result<ExitCode, SchemaError> {
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
        Err(SchemaError::Breaking { problems }) => {
            for problem in problems {
                eprintln!("{problem}");
            }
            eprintln!("refused: nothing written");
            Ok(ExitCode::from(1))
        }
        Err(e) => Err(e),
    }
}

/// Checks `current` against the registry in `dir`: each problem on
/// standard error and exit code 1, or a one-line summary.
pub fn check(current: &Registry, dir: &Path) -> Result<ExitCode, SchemaError> {
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

/// The AsyncAPI document of the registry in `dir` and `topology`, to `out`
/// or standard output.
pub fn asyncapi(dir: &Path, topology: &Topology, out: Option<&Path>) -> Result<ExitCode, SchemaError> {
    let registry = Registry::load(dir)?;
    let doc = asyncapi::document(&registry, topology)?;
    let text = serde_json::to_string_pretty(&doc).expect("a document is JSON") + "\n";
    match out {
        Some(path) => std::fs::write(path, text).map_err(|source| SchemaError::Io {
            path: path.to_owned(),
            source,
        })?,
        None => print!("{text}"),
    }
    Ok(ExitCode::SUCCESS)
}

const USAGE: &str = "usage: generate|check|asyncapi [--dir DIR (default: schemas)] [--out FILE (asyncapi)]";

/// A service's schema binary: `generate`, `check` or `asyncapi`, with
/// `--dir` (default `schemas`) and, for `asyncapi`, `--out`.
pub fn main(current: Registry, topology: Topology) -> ExitCode {
    let mut args = std::env::args().skip(1);
    let command = args.next().unwrap_or_default();
    let (mut dir, mut out) = (PathBuf::from("schemas"), None);
    while let Some(arg) = args.next() {
        match (arg.as_str(), args.next()) {
            ("--dir", Some(value)) => dir = value.into(),
            ("--out", Some(value)) => out = Some(PathBuf::from(value)),
            _ => {
                eprintln!("{USAGE}");
                return ExitCode::from(2);
            }
        }
    }
    let result = match command.as_str() {
        "generate" => generate(&current, &dir),
        "check" => check(&current, &dir),
        "asyncapi" => asyncapi(&dir, &topology, out.as_deref()),
        _ => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    result.unwrap_or_else(|e| {
        eprintln!("error: {e}");
        ExitCode::from(2)
    })
}
