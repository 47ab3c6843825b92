//! The quickstart as a user runs it: the binary, in a fresh directory,
//! stopped with Ctrl-C once it printed its receipt; then again, in the same
//! directory, where it must send the new order's receipt and not resend
//! the first one.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// Runs the quickstart in `dir` until it prints a receipt, then interrupts
/// it; returns every line it printed.
fn run_once(dir: &Path) -> Vec<String> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tidings-example-quickstart"))
        .current_dir(dir)
        .stdout(Stdio::piped())
        .spawn()
        .expect("the quickstart starts");
    let stdout = child.stdout.take().expect("piped stdout");
    let (lines_tx, lines) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let line = line.expect("utf-8 output");
            lines_tx.send(line).ok();
        }
    });
    let mut seen = Vec::new();
    loop {
        match lines.recv_timeout(Duration::from_secs(60)) {
            Ok(line) => {
                let receipt = line.starts_with("receipt for ");
                seen.push(line);
                if receipt {
                    break;
                }
            }
            Err(e) => {
                child.kill().ok();
                panic!("no receipt within 60 s ({e}); printed: {seen:?}");
            }
        }
    }
    let interrupted = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(interrupted.success());
    let status = child.wait().expect("the quickstart exits");
    reader.join().expect("the reader ends");
    seen.extend(lines.try_iter());
    assert!(
        status.success(),
        "the quickstart stops cleanly on Ctrl-C: {status}; printed {seen:?}"
    );
    seen
}

fn receipts(lines: &[String]) -> Vec<&str> {
    lines
        .iter()
        .filter_map(|l| l.strip_prefix("receipt for "))
        .map(|rest| rest.split(' ').next().unwrap_or(rest))
        .collect()
}

#[test]
fn the_quickstart_sends_each_receipt_once() {
    let dir = std::env::temp_dir().join(format!("tidings-quickstart-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();

    let first = run_once(&dir);
    let first_receipts = receipts(&first);
    assert_eq!(first_receipts.len(), 1, "one order, one receipt: {first:?}");
    assert!(
        dir.join("quickstart.db").exists(),
        "the store is a file in the working directory"
    );

    let second = run_once(&dir);
    let second_receipts = receipts(&second);
    assert_eq!(
        second_receipts.len(),
        1,
        "the second run sends only its own order's receipt: {second:?}"
    );
    assert_ne!(
        first_receipts[0], second_receipts[0],
        "the first order's receipt is not sent again"
    );

    std::fs::remove_dir_all(&dir).ok();
}

/// The quickstart stays within 40 lines of Rust (rustfmt'd; blank lines and
/// comments not counted), the README's promise.
#[test]
fn the_quickstart_is_at_most_40_lines() {
    let source = include_str!("../src/main.rs");
    let code: Vec<&str> = source
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("//"))
        .collect();
    assert!(
        code.len() <= 40,
        "{} lines of code:\n{}",
        code.len(),
        code.join("\n")
    );
}

/// The README's "Use it in a service" shows the quickstart whole: the same
/// text as the file that compiles and runs here.
#[test]
fn the_readme_shows_the_quickstart_whole() {
    let readme = include_str!("../../../README.md");
    let source = include_str!("../src/main.rs");
    assert!(
        readme.contains(&format!("```rust\n{source}```")),
        "README.md's quickstart block differs from examples/quickstart/src/main.rs: copy the file into it"
    );
}
