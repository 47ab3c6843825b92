//! SNS and SQS for tests: the shared moto server's endpoint, and private
//! moto servers a test may freeze and thaw without touching the shared one.
//!
//! moto keeps its state in memory: a killed server comes back empty, as
//! SQS never does. A private server is taken away by freezing it
//! (SIGSTOP): clients see their requests time out, as in a network
//! outage, and everything is still there when it thaws.

use std::time::Duration;

use crate::freezable::FreezableServer;

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
pub struct PrivateMoto(FreezableServer);

impl PrivateMoto {
    /// Starts a server and waits until it answers.
    ///
    /// # Panics
    ///
    /// If it cannot be started, naming the binary.
    pub fn start() -> PrivateMoto {
        PrivateMoto(FreezableServer::start(
            "moto server",
            &binary(),
            |port| vec!["-H".into(), "127.0.0.1".into(), "-p".into(), port.to_string()],
            Duration::from_secs(60),
            "run scripts/test once, or set MOTO_SERVER_BIN",
        ))
    }

    /// Its endpoint.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.0.port())
    }

    /// The URL for `SqsTransport::connect`.
    pub fn url(&self) -> String {
        format!("sqs://us-east-1?endpoint={}", self.endpoint())
    }
}

impl crate::outage::PrivateBroker for PrivateMoto {
    /// Freezes the server (SIGSTOP): its state would not survive a kill.
    fn stop(&mut self) {
        self.0.stop();
    }

    fn resume(&mut self) {
        self.0.resume();
    }
}
