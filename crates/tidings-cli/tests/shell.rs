//! The commands as a shell sees them: a reader that closes the pipe early,
//! a database that is not there, one environment for every command, and
//! passwords in URLs never shown.

mod common;

use std::process::{Command, Stdio};

use tidings_testkit::services::{PgTestDb, SqliteTestDb};

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

/// Every command that takes `--database`, as an operator would run it.
fn every_command() -> Vec<Vec<&'static str>> {
    let id = "0193c1a2-8f3e-7cc1-9a6b-2f1d3e4c5b6a";
    vec![
        vec!["outbox", "status", "--window", "100ms"],
        vec!["outbox", "status", "--window", "100ms", "--json"],
        vec!["lag"],
        vec!["lag", "--json"],
        vec!["dlq", "list"],
        vec!["dlq", "list", "--each"],
        vec!["dlq", "show", id],
        vec!["dlq", "redrive", "--all", "--dry-run"],
        vec!["dlq", "redrive", id],
        vec!["dlq", "skip", id],
        vec!["doctor"],
        vec![
            "replay",
            "--consumer",
            "billing",
            "--since",
            "2020-01-01T00:00:00Z",
            "--dry-run",
        ],
        // Last: against a server that is not there, it waits longest.
        vec!["migrate"],
    ]
}

/// No output of any command, succeeding or failing, shows a password given
/// in the URL's userinfo or in its query string; against a database that
/// is not there, each says so within seconds, naming the refused connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_command_shows_a_password_given_in_its_url() {
    let pg = PgTestDb::new().await;
    // Local connections are trusted here: the passwords are accepted and ignored.
    let in_userinfo = pg
        .url
        .replacen("://postgres@", "://postgres:planted-userinfo-pw@", 1);
    assert_ne!(
        in_userinfo, pg.url,
        "DATABASE_URL should be postgres://postgres@..."
    );
    let separator = if pg.url.contains('?') { '&' } else { '?' };
    let in_query = format!("{}{separator}password=planted-query-pw", pg.url);
    let live = [in_userinfo, in_query];
    let gone = [
        "postgres://u:planted-userinfo-pw@127.0.0.1:1/x".to_owned(),
        "postgres://u@127.0.0.1:1/x?sslmode=disable&password=planted-query-pw".to_owned(),
        "mysql://u:planted-userinfo-pw@127.0.0.1:1/x".to_owned(),
        "mysql://u@127.0.0.1:1/x?password=planted-query-pw".to_owned(),
    ];
    for url in live.iter().chain(&gone) {
        // Migrating waits longer for a server that may be starting: once is enough.
        let commands: Vec<_> = every_command()
            .into_iter()
            .filter(|args| args[0] != "migrate" || !gone.contains(url) || url == &gone[0])
            .collect();
        // The commands of one URL at once: against a server that is not
        // there, each spends its time waiting.
        let started = std::time::Instant::now();
        let children: Vec<_> = commands
            .iter()
            .map(|args| {
                tidings()
                    .env("RUST_LOG", "debug")
                    .args(args)
                    .args(["--database", url])
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        for (args, child) in commands.iter().zip(children) {
            let out = child.wait_with_output().unwrap();
            // At most: the commands before it may have ended later.
            let took = started.elapsed();
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(
                !text.contains("planted"),
                "{args:?} on {url} showed a password:\n{text}"
            );
            assert!(!text.contains("panicked"), "{args:?}: {text}");
            if gone.contains(url) {
                assert!(!out.status.success(), "{args:?} on {url}");
                assert!(text.contains("Connection refused"), "{args:?} on {url}: {text}");
                if args[0] != "migrate" {
                    assert!(
                        took < std::time::Duration::from_secs(5),
                        "{args:?} on {url} took {took:?}"
                    );
                }
            }
        }
    }
    pg.drop_schema().await;
}
