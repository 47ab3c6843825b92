//! NATS service helpers: the shared server's URL, and private servers that
//! tests may stop and restart without touching the shared one.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The NATS URL tests use: `NATS_URL`, default `nats://127.0.0.1:4222`.
pub fn nats_url() -> String {
    std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned())
}

/// A nats-server with JetStream of a test's own, on a free loopback port,
/// storing in a directory of its own that survives restarts.
#[derive(Debug)]
pub struct PrivateNats {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
}

fn binary() -> String {
    std::env::var("NATS_SERVER_BIN").unwrap_or_else(|_| {
        [
            "/usr/sbin/nats-server",
            "/usr/bin/nats-server",
            "/usr/local/bin/nats-server",
        ]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
        .unwrap_or("nats-server")
        .to_owned()
    })
}

impl PrivateNats {
    /// Starts a server and waits until it accepts connections.
    ///
    /// # Panics
    ///
    /// If nats-server cannot be started, naming the binary.
    pub fn start() -> PrivateNats {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .expect("a free port")
            .local_addr()
            .unwrap()
            .port();
        let dir = std::env::temp_dir().join(format!("tidings-nats-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("a NATS store directory");
        let mut nats = PrivateNats {
            child: None,
            port,
            dir,
        };
        nats.resume();
        nats
    }

    /// The client URL.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Kills the server (SIGKILL): clients see the connection drop.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the server the way an operator does (SIGTERM): it writes its
    /// state out before it exits.
    pub fn stop_gracefully(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(20);
            while child.try_wait().ok().flatten().is_none() {
                if Instant::now() > deadline {
                    let _ = child.kill();
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    /// The server's store directory (`-sd`): streams and consumers' state.
    pub fn store_dir(&self) -> &std::path::Path {
        &self.dir
    }

    /// Starts the server again on the same port and store.
    pub fn resume(&mut self) {
        assert!(self.child.is_none(), "already running");
        let bin = binary();
        let child = Command::new(&bin)
            .args(["-a", "127.0.0.1", "-p", &self.port.to_string(), "-js", "-sd"])
            .arg(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start nats-server ({bin}; set NATS_SERVER_BIN): {e}"));
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let greeted = self.greets();
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                panic!(
                    "private nats-server on port {} exited ({status}): is the port taken by another process?",
                    self.port
                );
            }
            if greeted {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "private nats-server on port {} did not start",
                self.port
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Whether the server on the port answers a connection with its
    /// `INFO` greeting: a port that merely accepts may belong to a server
    /// still starting, or to another process.
    fn greets(&self) -> bool {
        use std::io::Read;
        let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
        let mut greeting = [0u8; 4];
        stream.read_exact(&mut greeting).is_ok() && &greeting == b"INFO"
    }
}

impl crate::outage::PrivateBroker for PrivateNats {
    fn stop(&mut self) {
        PrivateNats::stop(self);
    }

    fn resume(&mut self) {
        PrivateNats::resume(self);
    }
}

impl Drop for PrivateNats {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
