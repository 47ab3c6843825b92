//! Helpers of the tests that run `tidings` processes.
#![allow(dead_code, unreachable_pub)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The `tidings` binary, with none of the machine's `TIDINGS_*` variables.
pub fn tidings() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_tidings"));
    // Only what the test sets: no override from the machine's environment.
    for (var, _) in std::env::vars().filter(|(v, _)| v.starts_with("TIDINGS_")) {
        command.env_remove(var);
    }
    command
}

/// The JSON summary a demo printed on stdout; the demo must have said its
/// invariants held (exit 0).
pub fn summary_of(out: &std::process::Output) -> serde_json::Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let summary: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
        panic!(
            "summary is not JSON ({e}): {stdout}\nstderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert!(out.status.success(), "the demo reported a failure: {summary:#}");
    summary
}

/// The whole number `key` of a summary.
pub fn n(v: &serde_json::Value, key: &str) -> i64 {
    v[key]
        .as_i64()
        .unwrap_or_else(|| panic!("{key} missing in {v:#}"))
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A child process killed when dropped, its stderr in a file.
pub struct Process {
    pub child: Child,
    log: PathBuf,
}

impl Process {
    pub fn start(mut command: Command, name: &str) -> Process {
        let log = std::env::temp_dir().join(format!("tidings-{name}-{}.log", uuid::Uuid::new_v4().simple()));
        let child = command
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("starting tidings");
        Process { child, log }
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM, then the exit status (within 20 s).
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        assert!(
            Command::new("kill")
                .args(["-TERM", &pid])
                .status()
                .unwrap()
                .success()
        );
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "no exit 20 s after SIGTERM:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

pub fn scrape(port: u16) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    response.starts_with("HTTP/1.1 200").then_some(response)
}

/// The value of `series` (name and labels as rendered); 0 if absent.
pub fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// The sum of every series of `name`.
pub fn total(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

pub fn wait_for_endpoint(port: u16, process: &mut Process) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(text) = scrape(port) {
            return text;
        }
        if let Some(status) = process.child.try_wait().unwrap() {
            panic!(
                "tidings exited ({status}) before serving metrics:\n{}",
                process.stderr()
            );
        }
        assert!(
            Instant::now() < deadline,
            "no metrics endpoint on {port}:\n{}",
            process.stderr()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `tidings run` on `database`, with `env` (`TIDINGS_SECTION__KEY` overrides).
pub fn start_daemon(database: &str, env: &[(&str, String)]) -> Process {
    let mut daemon = tidings();
    daemon
        .arg("run")
        .env("TIDINGS_DATABASE__URL", database)
        .env("TIDINGS_RELAY__PARTITIONS", "4")
        .env("TIDINGS_RELAY__POLL_INTERVAL", "100ms")
        .env("TIDINGS_METRICS__LAG_INTERVAL", "200ms")
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())));
    Process::start(daemon, "daemon")
}

/// The checkout demo's consumers on `database`, once they say `ready`.
pub fn start_consumers(database: &str, extra: &[&str]) -> Process {
    start_consumers_with(database, extra, &[])
}

/// [`start_consumers`] with more environment (a broker's credentials).
pub fn start_consumers_with(database: &str, extra: &[&str], env: &[(&str, String)]) -> Process {
    use std::io::BufRead;
    let mut consumers = tidings();
    consumers
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .args(["demo", "checkout", "--role", "consumers", "--database", database])
        // Tests run side by side on one server of 100 connections: each
        // process keeps to a few (the demo's default is 32).
        .args(["--max-connections", "8"])
        .args(extra);
    let mut consumers = Process::start(consumers, "consumers");
    let mut ready = String::new();
    std::io::BufReader::new(consumers.child.stdout.take().unwrap())
        .read_line(&mut ready)
        .unwrap();
    assert_eq!(ready.trim(), "ready", "{}", consumers.stderr());
    consumers
}

/// Places `orders` checkout orders on `database` (a fraction `poison` poisoned) and waits.
pub fn produce(database: &str, orders: u32, poison: f64) {
    let out = tidings()
        .args([
            "demo",
            "checkout",
            "--role",
            "producer",
            "--orders",
            &orders.to_string(),
        ])
        .args(["--poison-rate", &poison.to_string(), "--database", database])
        .args(["--max-connections", "4"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// Waits until the outbox is empty and every group on the log has caught up.
pub fn wait_drained(database: &str) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let out = tidings()
            .args(["lag", "--json", "--database", database])
            .output()
            .unwrap();
        let lag: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let groups = lag["consumers"].as_array().unwrap();
        if lag["outbox_pending"] == 0 && groups.len() >= 5 && groups.iter().all(|g| g["pending"] == 0) {
            return;
        }
        assert!(Instant::now() < deadline, "not drained: {lag:#}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The one count `sql` returns, on any dialect's store.
pub async fn count<D: tidings::sql::Dialect>(store: &tidings::sql::SqlStore<D>, sql: &'static str) -> i64 {
    let mut conn = store.conn("counting").await.unwrap();
    tidings::sql::db::Stmt::<D>::new(sql, "counting")
        .fetch_one(&mut conn)
        .await
        .unwrap()
        .get(0)
        .unwrap()
}

/// Column 0 of every row `sql` returns, as text.
pub async fn texts<D: tidings::sql::Dialect>(
    store: &tidings::sql::SqlStore<D>,
    sql: &'static str,
) -> Vec<String> {
    let mut conn = store.conn("reading the test's figures").await.unwrap();
    let rows = tidings::sql::db::Stmt::<D>::new(sql, "reading the test's figures")
        .fetch_all(&mut conn)
        .await
        .unwrap();
    rows.iter().map(|r| r.get(0).unwrap()).collect()
}

/// An operator's token of [`ConsoleProcess`].
pub const OPERATOR: &str = "ops-0123456789abcdef01234567";
/// A reader's token of [`ConsoleProcess`].
pub const READER: &str = "dash-0123456789abcdef0123456";

/// `tidings console` over a database, killed when dropped.
pub struct ConsoleProcess {
    child: std::process::Child,
    pub url: String,
}

impl ConsoleProcess {
    pub fn start(database: &str) -> ConsoleProcess {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut child = Command::new(env!("CARGO_BIN_EXE_tidings"))
            .args([
                "console",
                "--database",
                database,
                "--listen",
                &format!("127.0.0.1:{port}"),
            ])
            .env(
                "TIDINGS_CONSOLE_TOKENS",
                format!("operator:ops:{OPERATOR},reader:dash:{READER}"),
            )
            .env("RUST_LOG", "warn")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("starting tidings console");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Some(status) = child.try_wait().unwrap() {
                let mut stderr = String::new();
                std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
                panic!("tidings console exited ({status}): {stderr}");
            }
            assert!(
                std::time::Instant::now() < deadline,
                "tidings console did not listen within 30 s"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        ConsoleProcess {
            child,
            url: format!("http://127.0.0.1:{port}"),
        }
    }

    /// Runs `tidings args --daemon <this console>`, with `token` if given.
    pub fn tidings(&self, args: &[&str], token: Option<&str>) -> (bool, String, String) {
        let mut command = Command::new(env!("CARGO_BIN_EXE_tidings"));
        command
            .env("RUST_LOG", "error")
            .env_remove("TIDINGS_CONSOLE_TOKEN")
            .args(args)
            .args(["--daemon", &self.url]);
        if let Some(token) = token {
            command.env("TIDINGS_CONSOLE_TOKEN", token);
        }
        let out = command.output().expect("running tidings");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}

impl Drop for ConsoleProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
