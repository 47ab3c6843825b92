//! SNS and SQS for tests: the shared moto server's endpoint, and private
//! moto servers a test may freeze and thaw without touching the shared one.
//!
//! moto keeps its state in memory: a killed server comes back empty, as
//! SQS never does. A private server is taken away by freezing it
//! (SIGSTOP): clients see their requests time out, as in a network
//! outage, and everything is still there when it thaws.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The endpoint tests use: `SQS_ENDPOINT`, else `AWS_ENDPOINT_URL`, else
/// moto on `http://127.0.0.1:5000` (what `scripts/test` starts).
pub fn sqs_endpoint() -> String {
    std::env::var("SQS_ENDPOINT")
        .or_else(|_| std::env::var("AWS_ENDPOINT_URL"))
        .unwrap_or_else(|_| "http://127.0.0.1:5000".to_owned())
}

/// The URL of the shared moto server for `SqsTransport::connect`.
pub fn sqs_url() -> String {
    format!("sqs://us-east-1?endpoint={}", sqs_endpoint())
}

/// Where moto's server is: `MOTO_SERVER_BIN`, else the virtualenv
/// `scripts/test` makes under `target/`.
fn binary() -> String {
    std::env::var("MOTO_SERVER_BIN").unwrap_or_else(|_| {
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../target/moto-venv/bin/moto_server"
        )
        .to_owned()
    })
}

/// A moto server of a test's own, on a free loopback port.
#[derive(Debug)]
pub struct PrivateMoto {
    child: Child,
    port: u16,
    frozen: bool,
}

impl PrivateMoto {
    /// Starts a server and waits until it answers.
    ///
    /// # Panics
    ///
    /// If it cannot be started, naming the binary.
    pub fn start() -> PrivateMoto {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .expect("a free port")
            .local_addr()
            .unwrap()
            .port();
        let bin = binary();
        let child = Command::new(&bin)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start moto's server ({bin}; run scripts/test once, or set MOTO_SERVER_BIN): {e}"
                )
            });
        let mut moto = PrivateMoto {
            child,
            port,
            frozen: false,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(status)) = moto.child.try_wait() {
                panic!("private moto server on port {port} exited ({status})");
            }
            assert!(
                Instant::now() < deadline,
                "private moto server on port {port} did not start within 60 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        moto.frozen = false;
        moto
    }

    /// Its endpoint.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The URL for `SqsTransport::connect`.
    pub fn url(&self) -> String {
        format!("sqs://us-east-1?endpoint={}", self.endpoint())
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(
            status.success(),
            "kill {signal} of the private moto server failed"
        );
    }
}

impl crate::outage::PrivateBroker for PrivateMoto {
    /// Freezes the server (SIGSTOP): its state would not survive a kill.
    fn stop(&mut self) {
        self.signal("-STOP");
        self.frozen = true;
    }

    fn resume(&mut self) {
        if self.frozen {
            self.signal("-CONT");
            self.frozen = false;
        }
    }
}

impl Drop for PrivateMoto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
