//! The commands as a shell sees them: a reader that closes the pipe early,
//! a database that is not there, and one environment for every command.

mod common;

use std::process::{Command, Stdio};

use tidings_testkit::services::SqliteTestDb;

/// The binary with none of the machine's `TIDINGS_*` variables, quiet.
fn tidings() -> Command {
    let mut command = common::tidings();
    command.env("RUST_LOG", "error");
    command
}

fn url(db: &SqliteTestDb) -> String {
    format!("sqlite://{}", db.path.display())
}

/// `tidings lag | head -0`: the reader is gone before the first line. The
/// command ends quietly and successfully, without a panic.
#[tokio::test]
async fn a_closed_pipe_ends_a_command_quietly() {
    let db = SqliteTestDb::new().await;
    for args in [
        vec!["lag"],
        vec!["lag", "--json"],
        vec!["dlq", "list"],
        vec!["outbox", "status"],
        vec!["doctor"],
    ] {
        let mut child = tidings()
            .args(&args)
            .args(["--database", &url(&db)])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Close the read end at once: every write the command makes fails.
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert!(stderr.trim().is_empty(), "{args:?}: {stderr}");
        // Doctor exits 1 on a failed check whoever reads it; the rest succeed.
        if args[0] != "doctor" {
            assert!(out.status.success(), "{args:?}: {:?}", out.status);
        }
    }
}

/// A command that reads what is there never creates a database: without
/// `--database`, `doctor` looks for the embedded default and says it is not
/// there, leaving no file behind.
#[test]
fn a_missing_database_is_an_error_not_a_new_file() {
    let dir = std::env::temp_dir().join(format!("tidings-shell-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    for args in [
        vec!["doctor"],
        vec!["lag"],
        vec!["dlq", "list"],
        vec!["outbox", "status"],
    ] {
        let out = tidings().args(&args).current_dir(&dir).output().unwrap();
        assert!(!out.status.success(), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.starts_with("error: no database at tidings-demo.db: pass --database"),
            "{args:?}: {stderr}"
        );
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
        assert!(left.is_empty(), "{args:?} left {left:?}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Both spellings of the database URL reach every command: the operator
/// commands' `TIDINGS_DATABASE_URL` and the daemon's `TIDINGS_DATABASE__URL`.
#[tokio::test]
async fn both_spellings_of_the_database_variable_reach_every_command() {
    let db = SqliteTestDb::new().await;
    for var in ["TIDINGS_DATABASE_URL", "TIDINGS_DATABASE__URL"] {
        let out = tidings()
            .args(["lag", "--json"])
            .env(var, url(&db))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{var}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let lag: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(lag["outbox_pending"], 0, "{var}: {lag:#}");

        let out = tidings()
            .args(["run", "--check"])
            .env(var, url(&db))
            .env("TIDINGS_BROKER_URL", "nats://127.0.0.1:4222")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{var}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            stdout.contains(&format!("database {}", url(&db)))
                && stdout.contains("broker nats://127.0.0.1:4222"),
            "{var}: {stdout}"
        );
    }
    // Two spellings that disagree: refused, naming both.
    let out = tidings()
        .args(["run", "--check"])
        .env("TIDINGS_DATABASE_URL", url(&db))
        .env("TIDINGS_DATABASE__URL", "sqlite://elsewhere.db")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("TIDINGS_DATABASE__URL") && stderr.contains("TIDINGS_DATABASE_URL says otherwise"),
        "{stderr}"
    );
}
