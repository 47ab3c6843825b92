//! A service of a test's own that keeps its state in memory (moto, the
//! Pub/Sub emulator): started on a free loopback port, taken away by
//! freezing it (SIGSTOP), so that clients see their requests time out as
//! in a network outage and everything is still there when it thaws. A
//! kill would bring it back empty, as the real service never comes back.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A private server process a test may freeze and thaw.
#[derive(Debug)]
pub struct FreezableServer {
    name: &'static str,
    child: Child,
    port: u16,
    frozen: bool,
    /// Its standard error.
    log: std::path::PathBuf,
}

impl FreezableServer {
    /// Starts `program` with the arguments `args` makes of a free port,
    /// and waits up to `within` for the port to answer.
    ///
    /// # Panics
    ///
    /// If it cannot be started, or does not answer in time, naming `name`
    /// and `hint` (how to get it).
    pub fn start(
        name: &'static str,
        program: &str,
        args: impl FnOnce(u16) -> Vec<String>,
        within: Duration,
        hint: &str,
    ) -> FreezableServer {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .expect("a free port")
            .local_addr()
            .unwrap()
            .port();
        let log = std::env::temp_dir().join(format!(
            "tidings-private-{}-{port}.log",
            name.replace([' ', '/'], "-").to_lowercase()
        ));
        let output =
            std::fs::File::create(&log).unwrap_or_else(|e| panic!("cannot write {}: {e}", log.display()));
        let child = Command::new(program)
            .args(args(port))
            .stdout(Stdio::null())
            .stderr(output)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start the private {name} ({program}; {hint}): {e}"));
        let mut server = FreezableServer {
            name,
            child,
            port,
            frozen: false,
            log,
        };
        let deadline = Instant::now() + within;
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            server.assert_alive();
            assert!(
                Instant::now() < deadline,
                "the private {name} on port {port} did not start within {within:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        server
    }

    /// Its loopback port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Where its output goes.
    pub fn log(&self) -> &std::path::Path {
        &self.log
    }

    /// # Panics
    ///
    /// If the server exited, with its status and where its output is.
    pub fn assert_alive(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!(
                "the private {} on port {} exited ({status}); its output is in {}",
                self.name,
                self.port,
                self.log.display()
            );
        }
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(
            status.success(),
            "kill {signal} of the private {} failed",
            self.name
        );
    }
}

impl crate::outage::PrivateBroker for FreezableServer {
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
        self.assert_alive();
    }
}

impl Drop for FreezableServer {
    fn drop(&mut self) {
        if self.frozen {
            let _ = Command::new("kill")
                .args(["-CONT", &self.child.id().to_string()])
                .status();
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        if !std::thread::panicking() {
            let _ = std::fs::remove_file(&self.log);
        }
    }
}
