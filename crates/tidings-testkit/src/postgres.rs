//! Private PostgreSQL servers: a cluster of a test's own, on a free
//! loopback port, that the test may kill (SIGKILL, as a crash) and start
//! again on the same data, without touching the shared server.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A PostgreSQL cluster of the test's own (trust authentication, user
/// `postgres`), deleted when dropped.
#[derive(Debug)]
pub struct PrivatePostgres {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
    bin: PathBuf,
    max_connections: u32,
    /// Settings of the test's own (`name=value`), after the defaults.
    settings: Vec<String>,
}

/// The newest server binaries installed: `PG_BIN`, else
/// `/usr/lib/postgresql/<version>/bin`.
fn binaries() -> PathBuf {
    if let Ok(bin) = std::env::var("PG_BIN") {
        return bin.into();
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path().join("bin"))))
        .filter(|(_, bin)| bin.join("postgres").exists())
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin).unwrap_or_else(|| {
        panic!("no PostgreSQL server binaries under /usr/lib/postgresql (install postgresql, or set PG_BIN)")
    })
}

/// `program` run as the `postgres` user when this is root (the server
/// refuses to run as root), as this user otherwise.
fn as_server_user(program: PathBuf) -> Command {
    use std::os::unix::fs::MetadataExt;
    // /proc/self belongs to the process's user.
    if std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0) {
        let mut command = Command::new("runuser");
        command.args(["-u", "postgres", "--"]).arg(program);
        command
    } else {
        Command::new(program)
    }
}

impl PrivatePostgres {
    /// Creates a cluster and starts it, waiting until it accepts connections.
    ///
    /// # Panics
    ///
    /// If the cluster cannot be created or started, naming the step.
    pub fn start() -> PrivatePostgres {
        Self::with_max_connections(200)
    }

    /// [`PrivatePostgres::start`] with settings of the test's own
    /// (`wal_level=replica`), which win over the defaults.
    pub fn with_settings(settings: &[&str]) -> PrivatePostgres {
        Self::create(200, settings.iter().map(|s| (*s).to_owned()).collect())
    }

    /// [`PrivatePostgres::start`] with the server's `max_connections`.
    pub fn with_max_connections(max_connections: u32) -> PrivatePostgres {
        Self::create(max_connections, Vec::new())
    }

    fn create(max_connections: u32, settings: Vec<String>) -> PrivatePostgres {
        let bin = binaries();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .expect("a free port")
            .local_addr()
            .unwrap()
            .port();
        let dir = std::env::temp_dir().join(format!("tidings-pg-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("a data directory");
        // The server's user must own its directory.
        let _ = Command::new("chown")
            .args(["postgres:postgres"])
            .arg(&dir)
            .status();
        let out = as_server_user(bin.join("initdb"))
            .args(["-A", "trust", "-U", "postgres", "--no-sync", "-D"])
            .arg(dir.join("data"))
            .output()
            .expect("running initdb");
        assert!(
            out.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut pg = PrivatePostgres {
            child: None,
            port,
            dir,
            bin,
            max_connections,
            settings,
        };
        pg.resume();
        pg
    }

    /// The URL of its `postgres` database.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Kills the server and every backend with SIGKILL, as a crash: the
    /// next start recovers from its write-ahead log.
    pub fn crash(&mut self) {
        if let Some(mut child) = self.child.take() {
            // The server runs in a process group of its own: the postmaster,
            // its backends and the runuser in front of them.
            let group = child.id() as i32;
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{group}")])
                .status();
            let _ = child.wait();
            // Backends notice their postmaster's death; wait for them to go.
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline
                && Command::new("pgrep")
                    .args(["-g", &group.to_string()])
                    .stdout(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success())
            {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    /// Starts the server on the same port and data, waiting until it
    /// accepts connections (after recovery, if it crashed).
    pub fn resume(&mut self) {
        assert!(self.child.is_none(), "already running");
        let child = as_server_user(self.bin.join("postgres"))
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["-p", &self.port.to_string(), "-c", "listen_addresses=127.0.0.1"])
            .args(["-c", "unix_socket_directories=", "-c", "fsync=off"])
            .args(["-c", &format!("max_connections={}", self.max_connections)])
            // What the CDC relay needs: logical decoding of the write-ahead log.
            .args(["-c", "wal_level=logical", "-c", "max_replication_slots=16"])
            .args(["-c", "max_wal_senders=16"])
            .args(self.settings.iter().flat_map(|s| ["-c", s.as_str()]))
            .process_group(0)
            // Into a file: a pipe nobody reads fills up with the server's
            // log (a line per client killed) and stalls it.
            .stdout(Stdio::null())
            .stderr(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(self.dir.join("server.log"))
                    .expect("the server's log file"),
            )
            .spawn()
            .expect("starting postgres");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let ready = Command::new(self.bin.join("pg_isready"))
                .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-q"])
                .status()
                .is_ok_and(|s| s.success());
            if ready {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the private PostgreSQL on port {} did not start within 60 s; its log:\n{}",
                self.port,
                std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        self.crash();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A fresh, migrated store on a [`PrivatePostgres`] of its own: a
/// [`TestDb`](crate::services::TestDb) whose server a test may crash.
pub struct PrivatePgTestDb {
    server: std::sync::Mutex<Option<PrivatePostgres>>,
    store: tidings_store_postgres::PgStore,
    url: String,
}

impl std::fmt::Debug for PrivatePgTestDb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrivatePgTestDb").field("url", &self.url).finish()
    }
}

impl PrivatePgTestDb {
    /// Crashes the server ([`PrivatePostgres::crash`]), keeps it down for
    /// `down`, then starts it again; returns once it accepts connections.
    pub async fn crash_for(&self, down: Duration) {
        let mut server = self.server.lock().unwrap().take().expect("the private server");
        let server = tokio::task::spawn_blocking(move || {
            server.crash();
            std::thread::sleep(down);
            server.resume();
            server
        })
        .await
        .expect("crashing the private server");
        *self.server.lock().unwrap() = Some(server);
    }
}

#[async_trait::async_trait]
impl crate::services::TestDb for PrivatePgTestDb {
    type Dialect = tidings_store_postgres::Pg;

    const LOG_APPEND_RAW: &'static str =
        <crate::services::PgTestDb as crate::services::TestDb>::LOG_APPEND_RAW;

    const GIVE_UP_ON_LOCKS: &'static str =
        <crate::services::PgTestDb as crate::services::TestDb>::GIVE_UP_ON_LOCKS;

    async fn create() -> Self {
        let server = tokio::task::spawn_blocking(PrivatePostgres::start)
            .await
            .expect("starting a private PostgreSQL");
        let url = server.url();
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(20)
            .connect(&url)
            .await
            .unwrap_or_else(|e| panic!("the private PostgreSQL at {url} does not answer: {e}"));
        let store = tidings_store_postgres::PgStore::new(pool);
        store.migrate().await.expect("migrating the private database");
        PrivatePgTestDb {
            server: std::sync::Mutex::new(Some(server)),
            store,
            url,
        }
    }

    fn store(&self) -> &tidings_store_postgres::PgStore {
        &self.store
    }

    fn url(&self) -> String {
        self.url.clone()
    }

    async fn teardown(&self) {
        self.store.pool().close().await;
    }
}
