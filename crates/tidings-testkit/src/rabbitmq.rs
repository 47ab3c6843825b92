//! RabbitMQ service helpers: the shared broker's URL, and private brokers
//! that tests may kill and restart without touching the shared one.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The AMQP URL tests use: `AMQP_URL`, default `amqp://guest:guest@127.0.0.1:5672/%2f`.
pub fn amqp_url() -> String {
    std::env::var("AMQP_URL").unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned())
}

/// A RabbitMQ node of a test's own: its own node name, a free loopback
/// port, no plugins, and a data directory that survives restarts (durable
/// queues and persistent messages come back with it).
#[derive(Debug)]
pub struct PrivateRabbit {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("a free port")
        .local_addr()
        .unwrap()
        .port()
}

fn binary() -> String {
    std::env::var("RABBITMQ_SERVER_BIN").unwrap_or_else(|_| {
        [
            "/usr/lib/rabbitmq/bin/rabbitmq-server",
            "/usr/sbin/rabbitmq-server",
        ]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
        .unwrap_or("rabbitmq-server")
        .to_owned()
    })
}

impl PrivateRabbit {
    /// Starts a node and waits until it accepts AMQP connections.
    ///
    /// # Panics
    ///
    /// If the node cannot be started, naming the binary.
    pub fn start() -> PrivateRabbit {
        Self::start_with("")
    }

    /// Starts a node whose `rabbitmq.conf` holds `settings`
    /// (`max_message_size = 1048576`), and waits until it accepts connections.
    ///
    /// # Panics
    ///
    /// As [`PrivateRabbit::start`].
    pub fn start_with(settings: &str) -> PrivateRabbit {
        let dir = std::env::temp_dir().join(format!("tidings-rabbit-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("a RabbitMQ data directory");
        std::fs::write(dir.join("enabled_plugins"), "[].\n").expect("a plugins file");
        std::fs::write(dir.join("rabbitmq.conf"), settings).expect("a configuration file");
        let mut rabbit = PrivateRabbit {
            child: None,
            port: free_port(),
            dir,
        };
        rabbit.resume();
        rabbit
    }

    /// The client URL.
    pub fn url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.port)
    }

    /// Kills the node (SIGKILL): clients see their connections drop.
    pub fn stop(&mut self) {
        // The start script may leave the Erlang VM as a process of its own:
        // kill the one the pid file names as well.
        if let Ok(pid) = std::fs::read_to_string(self.dir.join("pid")) {
            let _ = Command::new("kill").args(["-9", pid.trim()]).status();
            let _ = std::fs::remove_file(self.dir.join("pid"));
        }
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the node again on the same port and data, and waits until it
    /// accepts connections (a node takes several seconds to boot).
    pub fn resume(&mut self) {
        assert!(self.child.is_none(), "already running");
        let bin = binary();
        let name = self.dir.file_name().expect("a directory name").to_string_lossy();
        let child = Command::new(&bin)
            .env("RABBITMQ_NODENAME", format!("{name}@localhost"))
            .env("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1")
            .env("RABBITMQ_NODE_PORT", self.port.to_string())
            .env("RABBITMQ_DIST_PORT", free_port().to_string())
            .env("RABBITMQ_MNESIA_BASE", self.dir.join("mnesia"))
            .env("RABBITMQ_LOG_BASE", self.dir.join("log"))
            .env("RABBITMQ_PID_FILE", self.dir.join("pid"))
            .env("RABBITMQ_ENABLED_PLUGINS_FILE", self.dir.join("enabled_plugins"))
            .env("RABBITMQ_CONFIG_FILE", self.dir.join("rabbitmq.conf"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start rabbitmq-server ({bin}; set RABBITMQ_SERVER_BIN): {e}"));
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(90);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                panic!(
                    "private rabbitmq-server on port {} exited ({status}); logs in {}",
                    self.port,
                    self.dir.join("log").display()
                );
            }
            assert!(
                Instant::now() < deadline,
                "private rabbitmq-server on port {} did not start within 90 s; logs in {}",
                self.port,
                self.dir.join("log").display()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl crate::outage::PrivateBroker for PrivateRabbit {
    fn stop(&mut self) {
        PrivateRabbit::stop(self);
    }

    fn resume(&mut self) {
        PrivateRabbit::resume(self);
    }
}

impl Drop for PrivateRabbit {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
