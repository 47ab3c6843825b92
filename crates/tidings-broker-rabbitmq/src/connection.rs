//! [`RabbitTransport`]: the connection, opened again when lost, and its
//! confirm-mode channel.

use std::collections::HashSet;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lapin::options::ConfirmSelectOptions;
use lapin::{Channel, Connection, ConnectionProperties};
use tidings_core::secret::redact_url;
use tidings_core::{Error, Result};

use crate::{RabbitOptions, TRANSPORT};

/// How long the broker may take to answer the opening of a connection or
/// a channel before the attempt counts as failed and is made again: a node
/// still booting may accept a connection and never answer on it, and every
/// user of the transport waits for the connection being opened.
pub(crate) const SETUP_TIMEOUT: Duration = Duration::from_secs(10);

/// `setup`, failed (transient) when the broker has not answered within [`SETUP_TIMEOUT`].
pub(crate) async fn within<T>(what: &str, setup: impl Future<Output = Result<T>>) -> Result<T> {
    tokio::time::timeout(SETUP_TIMEOUT, setup)
        .await
        .unwrap_or_else(|_| {
            Err(Error::transport_reason(
                TRANSPORT,
                format!(
                    "{what}: no answer from the broker within {} s",
                    SETUP_TIMEOUT.as_secs()
                ),
                true,
            ))
        })
}

/// A connection to RabbitMQ, usable as publisher and subscriber. Cheap to clone.
///
/// A lost connection is opened again on next use: the relay's next publish
/// reconnects, and each subscription re-establishes its consumer (messages
/// unacknowledged on the lost channel are redelivered by the broker).
#[derive(Clone)]
pub struct RabbitTransport {
    url: Arc<str>,
    link: Arc<tokio::sync::Mutex<Link>>,
    pub(crate) options: RabbitOptions,
    /// Exchanges (`x:<name>`) and queues (`q:<name>`) declared so far.
    pub(crate) declared: Arc<Mutex<HashSet<String>>>,
}

/// The current connection and its confirm-mode channel, if alive.
#[derive(Default)]
struct Link {
    connection: Option<Arc<Connection>>,
    /// Publisher confirms are on: every publish is acknowledged by the broker.
    confirms: Option<Channel>,
}

impl fmt::Debug for RabbitTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The connection URI holds the password: never printed.
        f.debug_struct("RabbitTransport")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl RabbitTransport {
    /// Connects to `url` (`amqp://user:pw@host:5672/%2f`).
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, RabbitOptions::default()).await
    }

    /// Connects with options.
    pub async fn connect_with(url: &str, options: RabbitOptions) -> Result<Self> {
        let transport = RabbitTransport {
            url: url.into(),
            link: Arc::default(),
            options,
            declared: Arc::default(),
        };
        transport.confirms().await?;
        Ok(transport)
    }

    /// The live connection, opened again if it was lost.
    pub(crate) async fn connection(&self) -> Result<Arc<Connection>> {
        let mut link = self.link.lock().await;
        self.live_connection(&mut link).await
    }

    /// A new channel on the connection (opened again if it was lost).
    pub(crate) async fn channel(&self) -> Result<lapin::Channel> {
        open_channel(&*self.connection().await?).await
    }

    async fn live_connection(&self, link: &mut Link) -> Result<Arc<Connection>> {
        if let Some(c) = link.connection.as_ref().filter(|c| c.status().connected()) {
            return Ok(c.clone());
        }
        link.confirms = None;
        let mut properties = ConnectionProperties::default();
        if let Some(name) = &self.options.connection_name {
            properties = properties.with_connection_name(name.as_str().into());
        }
        let what = format!("connecting to {}", redact_url(&self.url));
        let connection = within(&what, async {
            Connection::connect(&self.url, properties)
                .await
                .map_err(|e| Error::transport(TRANSPORT, what.clone(), e, true))
        })
        .await?;
        let connection = Arc::new(connection);
        link.connection = Some(connection.clone());
        Ok(connection)
    }

    /// The live confirm-mode channel, opened again if it was lost.
    pub(crate) async fn confirms(&self) -> Result<Channel> {
        let mut link = self.link.lock().await;
        if let Some(c) = link.confirms.as_ref().filter(|c| c.status().connected()) {
            return Ok(c.clone());
        }
        let connection = self.live_connection(&mut link).await?;
        let channel = within("opening a channel for publishing", async {
            let channel = open_channel(&connection).await?;
            channel
                .confirm_select(ConfirmSelectOptions::default())
                .await
                .map_err(|e| Error::transport(TRANSPORT, "enabling publisher confirms", e, true))?;
            Ok(channel)
        })
        .await?;
        link.confirms = Some(channel.clone());
        Ok(channel)
    }
}

/// Opens a channel on `connection`.
pub(crate) async fn open_channel(connection: &Connection) -> Result<lapin::Channel> {
    connection
        .create_channel()
        .await
        .map_err(|e| Error::transport(TRANSPORT, "opening a channel", e, true))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            redact_url("amqp://guest:secret@127.0.0.1:5672/%2f"),
            "amqp://guest@127.0.0.1:5672/%2f"
        );
    }
}
