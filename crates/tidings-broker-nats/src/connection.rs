//! [`NatsTransport`]: the client and its JetStream context.

use std::collections::HashSet;
use std::fmt;
use std::sync::{Arc, Mutex};

use async_nats::jetstream;
use tidings_core::secret::redact_url;
use tidings_core::{Error, Result};

use crate::options::{Credentials, split_credentials};
use crate::{NatsOptions, TRANSPORT};

/// A connection to NATS JetStream, usable as publisher and subscriber. Cheap to clone.
#[derive(Clone)]
pub struct NatsTransport {
    pub(crate) client: async_nats::Client,
    pub(crate) js: jetstream::Context,
    pub(crate) options: NatsOptions,
    pub(crate) streams: Arc<Mutex<HashSet<String>>>,
}

impl fmt::Debug for NatsTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The connect options may hold credentials: never printed.
        f.debug_struct("NatsTransport")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl NatsTransport {
    /// Connects to `url` (`nats://host:4222`, credentials in the URL if any).
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, NatsOptions::default()).await
    }

    /// Connects with options.
    ///
    /// Credentials in the URL are taken out and handed to the client
    /// separately: the client logs the server address it dials, and a
    /// password must never reach a log.
    pub async fn connect_with(url: &str, options: NatsOptions) -> Result<Self> {
        let (address, credentials) = split_credentials(url);
        let connect = match credentials {
            Some(Credentials::UserPassword(user, password)) => {
                async_nats::ConnectOptions::with_user_and_password(user, password)
            }
            Some(Credentials::Token(token)) => async_nats::ConnectOptions::with_token(token),
            None => async_nats::ConnectOptions::new(),
        };
        let client = connect.connect(address.as_str()).await.map_err(|e| {
            Error::transport(
                TRANSPORT,
                format!("connecting to NATS at {}", redact_url(&address)),
                e,
                true,
            )
        })?;
        Ok(Self::new(client, options))
    }

    /// A transport on an existing client.
    pub fn new(client: async_nats::Client, options: NatsOptions) -> Self {
        let js = jetstream::new(client.clone());
        NatsTransport {
            client,
            js,
            options,
            streams: Arc::default(),
        }
    }

    /// The largest message the server accepts (its `max_payload`, 1 MiB by
    /// default), for [`StoreOptions::max_event_bytes`] of the store whose
    /// outbox this transport relays: an event larger than it is then
    /// refused by `enqueue`, not by the server after the commit. Headers
    /// count too: leave them a few KiB.
    ///
    /// [`StoreOptions::max_event_bytes`]: https://docs.rs/tidings-sql/latest/tidings_sql/struct.StoreOptions.html#method.max_event_bytes
    pub fn max_payload(&self) -> usize {
        self.client.server_info().max_payload
    }
}
