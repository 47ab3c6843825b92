//! [`PubSubTransport`]: the Pub/Sub client, configured as Google's client
//! libraries are (Application Default Credentials, or the emulator named
//! by `PUBSUB_EMULATOR_HOST`), and what this transport declared so far.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gcloud_gax::conn::{ConnectionOptions, Environment};
use gcloud_gax::grpc::{Code, Status};
use gcloud_pubsub::client::{Client, ClientConfig};
use gcloud_pubsub::publisher::{Publisher, PublisherConfig};
use tidings_core::{Error, Result};

use crate::{PubSubOptions, TRANSPORT};

/// The longest any one request to Pub/Sub may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Google Cloud Pub/Sub, usable as publisher and subscriber. Cheap to clone.
#[derive(Clone)]
pub struct PubSubTransport {
    pub(crate) client: Client,
    pub(crate) options: PubSubOptions,
    pub(crate) declared: Arc<Declared>,
}

/// What this transport made or found, so that each is asked for once.
#[derive(Default)]
pub(crate) struct Declared {
    /// Topic ids made or found.
    pub(crate) topics: Mutex<HashSet<String>>,
    /// Topic ids known to have a subscription.
    pub(crate) subscribed: Mutex<HashSet<String>>,
    /// `(topic, group)` whose subscriptions are in place.
    pub(crate) groups: Mutex<HashSet<(String, String)>>,
    /// Tidings topics whose partition count was found to agree with the
    /// project's Pub/Sub topics.
    pub(crate) counted: Mutex<HashSet<String>>,
    /// A publisher per topic id.
    pub(crate) publishers: Mutex<HashMap<String, Publisher>>,
}

impl Declared {
    /// Forgets topic `id`: it was deleted while in use.
    pub(crate) fn forget_topic(&self, id: &str) {
        self.topics.lock().unwrap().remove(id);
        self.subscribed.lock().unwrap().remove(id);
    }
}

impl fmt::Debug for PubSubTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PubSubTransport")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl PubSubTransport {
    /// Connects to the project `url` names (`pubsub://PROJECT`,
    /// `pubsub://PROJECT?endpoint=http://127.0.0.1:8085`).
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, PubSubOptions::default()).await
    }

    /// Connects with options; checks that Pub/Sub answers with the
    /// credentials found.
    pub async fn connect_with(url: &str, options: PubSubOptions) -> Result<Self> {
        let options = options.with_url(url)?;
        let place = place(&options);
        let mut config = ClientConfig {
            project_id: options.project.clone(),
            // A request never waits on a connection that died unseen (a
            // frozen host, a dropped route): pings find it out.
            connection_option: ConnectionOptions {
                timeout: Some(REQUEST_TIMEOUT),
                connect_timeout: Some(Duration::from_secs(5)),
                http2_keep_alive_interval: Some(Duration::from_secs(10)),
                keep_alive_timeout: Some(Duration::from_secs(10)),
                keep_alive_while_idle: Some(true),
            },
            ..ClientConfig::default()
        };
        if options.emulated() {
            let host = options.endpoint.as_deref().unwrap_or_default();
            config.environment = Environment::Emulator(host.trim_start_matches("http://").to_owned());
        } else {
            if let Some(endpoint) = &options.endpoint {
                config.endpoint = endpoint.trim_start_matches("https://").to_owned();
            }
            config = config.with_auth().await.map_err(|e| {
                Error::transport_reason(
                    TRANSPORT,
                    format!(
                        "finding credentials for Pub/Sub at {place}: {e} (they come from Application \
                         Default Credentials: GOOGLE_APPLICATION_CREDENTIALS, gcloud's login, or the \
                         instance's service account; for the emulator set PUBSUB_EMULATOR_HOST)"
                    ),
                    true,
                )
            })?;
        }
        let client = Client::new(config).await.map_err(|e| {
            Error::transport_reason(TRANSPORT, format!("connecting to Pub/Sub at {place}: {e}"), true)
        })?;
        let transport = PubSubTransport {
            client,
            options,
            declared: Arc::default(),
        };
        transport
            .client
            .topic("tidings-connection-check")
            .exists(None)
            .await
            .map_err(|e| transport.error(&format!("reaching Pub/Sub at {place}"), e))?;
        Ok(transport)
    }

    /// Where the service is, for messages: the endpoint and the project.
    pub fn place(&self) -> String {
        place(&self.options)
    }

    /// The publisher of topic `id`, made on first use. Only its
    /// `publish_immediately` (one `Publish` request, answered) is used:
    /// it starts none of the batching workers, which would wake ten times
    /// a second for every topic.
    pub(crate) fn publisher(&self, id: &str) -> Publisher {
        let mut publishers = self.declared.publishers.lock().unwrap();
        publishers
            .entry(id.to_owned())
            .or_insert_with(|| {
                let unbatched = PublisherConfig {
                    workers: 0,
                    ..PublisherConfig::default()
                };
                self.client.topic(id).new_publisher(Some(unbatched))
            })
            .clone()
    }

    /// A Pub/Sub error as a transport error: what was being done, the
    /// service's code and message; retryable unless the request itself was
    /// at fault (a message Pub/Sub will never take).
    pub(crate) fn error(&self, what: &str, e: Status) -> Error {
        let retryable = e.code() != Code::InvalidArgument;
        Error::transport_reason(
            TRANSPORT,
            format!("{what}: {:?}: {}", e.code(), e.message()),
            retryable,
        )
    }
}

fn place(options: &PubSubOptions) -> String {
    format!(
        "{} (project {})",
        options.endpoint.as_deref().unwrap_or("Google's endpoint"),
        options.project.as_deref().unwrap_or_default()
    )
}
