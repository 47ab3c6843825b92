//! Google Cloud Pub/Sub for tests: the shared emulator's URL, and private
//! emulators a test may freeze and thaw without touching the shared one.
//!
//! The emulator keeps its state in memory: a killed emulator comes back
//! empty, as Pub/Sub never does. A private one is taken away by freezing
//! it ([`FreezableServer`]).

use std::time::Duration;

use crate::freezable::FreezableServer;

/// The project tests use.
pub const PROJECT: &str = "tidings-test";

/// The emulator tests use: `PUBSUB_EMULATOR_HOST`, else `127.0.0.1:8085`
/// (what `scripts/test` starts).
pub fn emulator_host() -> String {
    std::env::var("PUBSUB_EMULATOR_HOST")
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "127.0.0.1:8085".to_owned())
}

/// The URL of the shared emulator for `PubSubTransport::connect`.
pub fn pubsub_url() -> String {
    format!("pubsub://{PROJECT}?endpoint=http://{}", emulator_host())
}

/// Where the emulator is: `PUBSUB_EMULATOR_BIN`, else where Debian's
/// `google-cloud-cli-pubsub-emulator` puts it.
fn binary() -> String {
    std::env::var("PUBSUB_EMULATOR_BIN").unwrap_or_else(|_| {
        "/usr/lib/google-cloud-sdk/platform/pubsub-emulator/bin/cloud-pubsub-emulator".to_owned()
    })
}

/// A Pub/Sub emulator of a test's own, on a free loopback port.
#[derive(Debug)]
pub struct PrivateEmulator(FreezableServer);

impl PrivateEmulator {
    /// Starts an emulator and waits until it answers.
    ///
    /// # Panics
    ///
    /// If it cannot be started, naming the binary.
    pub fn start() -> PrivateEmulator {
        PrivateEmulator(FreezableServer::start(
            "Pub/Sub emulator",
            &binary(),
            |port| vec!["--host=127.0.0.1".into(), format!("--port={port}")],
            Duration::from_secs(60),
            "apt-get install google-cloud-cli-pubsub-emulator and Java 17, or set PUBSUB_EMULATOR_BIN",
        ))
    }

    /// The URL for `PubSubTransport::connect`.
    pub fn url(&self) -> String {
        format!("pubsub://{PROJECT}?endpoint=http://127.0.0.1:{}", self.0.port())
    }
}

impl crate::outage::PrivateBroker for PrivateEmulator {
    /// Freezes the emulator (SIGSTOP): its state would not survive a kill.
    fn stop(&mut self) {
        self.0.stop();
    }

    fn resume(&mut self) {
        self.0.resume();
    }
}
