//! [`KafkaTransport`]: the producer and admin client, and the settings of
//! every client it makes.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use rdkafka::admin::AdminClient;
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::BaseConsumer;
use rdkafka::producer::FutureProducer;
use tidings_core::{Error, Result};

use crate::options::bootstrap_servers;
use crate::{ADMIN_TIMEOUT, KafkaOptions, TRANSPORT};

/// A Kafka cluster, as a Tidings transport. Cheap to clone.
#[derive(Clone)]
pub struct KafkaTransport {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) brokers: String,
    pub(crate) options: KafkaOptions,
    pub(crate) producer: FutureProducer,
    pub(crate) admin: AdminClient<DefaultClientContext>,
    /// Kafka topics known to exist, with their partitions.
    pub(crate) topics: Mutex<HashMap<String, u32>>,
}

impl fmt::Debug for KafkaTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaTransport")
            .field("brokers", &self.inner.brokers)
            .field("options", &self.inner.options)
            .finish_non_exhaustive()
    }
}

impl KafkaTransport {
    /// Connects to the cluster at `url` (`kafka://host:port`, several
    /// brokers separated by commas) with default options.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, KafkaOptions::default()).await
    }

    /// Connects to the cluster at `url` and checks it answers.
    pub async fn connect_with(url: &str, options: KafkaOptions) -> Result<Self> {
        let brokers = bootstrap_servers(url);
        let mut config = client_config(&brokers, &options);
        config
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("linger.ms", "2")
            .set("message.timeout.ms", "30000");
        let producer: FutureProducer = config
            .create()
            .map_err(|e| Error::transport(TRANSPORT, "creating the producer", e, false))?;
        let admin: AdminClient<DefaultClientContext> = client_config(&brokers, &options)
            .create()
            .map_err(|e| Error::transport(TRANSPORT, "creating the admin client", e, false))?;
        let transport = KafkaTransport {
            inner: Arc::new(Inner {
                brokers,
                options,
                producer,
                admin,
                topics: Mutex::new(HashMap::new()),
            }),
        };
        let producer = transport.inner.producer.clone();
        tokio::task::spawn_blocking(move || {
            use rdkafka::producer::Producer as _;
            producer.client().fetch_metadata(None, ADMIN_TIMEOUT)
        })
        .await
        .map_err(|e| Error::transport(TRANSPORT, "reading the cluster's metadata", e, true))?
        .map_err(|e| {
            Error::transport(
                TRANSPORT,
                format!("reaching Kafka at {}", transport.inner.brokers),
                e,
                true,
            )
        })?;
        Ok(transport)
    }

    /// The settings every client of this transport is made with (the
    /// brokers and the URL's client settings: security, timeouts), for a
    /// client of the application's own: a web tier producing straight to
    /// Kafka, a check reading a topic back.
    pub fn client_config(&self) -> ClientConfig {
        client_config(&self.inner.brokers, &self.inner.options)
    }

    /// A client of `group` for reading and committing its offsets.
    pub(crate) fn group_client(&self, group: &str) -> Result<BaseConsumer> {
        self.consumer_config(group)
            .create()
            .map_err(|e| Error::transport(TRANSPORT, "creating a consumer", e, false))
    }

    pub(crate) fn consumer_config(&self, group: &str) -> ClientConfig {
        let mut config = client_config(&self.inner.brokers, &self.inner.options);
        config
            .set("group.id", self.group_id(group))
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            .set("enable.partition.eof", "false")
            .set("fetch.wait.max.ms", "100");
        config
    }
}

pub(crate) fn client_config(brokers: &str, options: &KafkaOptions) -> ClientConfig {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", brokers);
    for (k, v) in &options.client {
        config.set(k, v);
    }
    config
}
