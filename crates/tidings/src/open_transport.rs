//! Opening a transport from its URL: each broker crate declares the
//! schemes it opens (`SCHEMES`), `log` is the store's own database log, and
//! this is the one place that chooses.

use std::fmt;
use std::sync::Arc;

use tidings_core::log::LogBackend;
use tidings_core::secret::redact_url;
use tidings_core::{Error, Publisher, Result, Subscriber, Topology};
use tidings_log::{LogPublisher, LogReaderConfig, LogSubscriber};

/// A transport opened by [`open_transport`]: what the relay publishes
/// through and what consumers read, one object for both.
#[derive(Clone)]
pub struct Transport {
    /// What the relay publishes through.
    pub publisher: Arc<dyn Publisher>,
    /// What the consumers read (and what the broker-lag sampler asks).
    pub subscriber: Arc<dyn Subscriber>,
    /// Which transport it is, for what only that one does.
    pub broker: AnyBroker,
    label: String,
}

impl fmt::Debug for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Transport")
            .field("broker", &self.broker)
            .field("label", &self.label)
            .finish_non_exhaustive()
    }
}

impl Transport {
    /// What it is and where, without credentials (`NATS JetStream at
    /// nats://127.0.0.1:4222`, `the database log`).
    pub fn label(&self) -> &str {
        &self.label
    }
}

/// The concrete transport behind a [`Transport`]: one variant per broker
/// this build includes, and the database log.
#[derive(Clone)]
#[non_exhaustive]
pub enum AnyBroker {
    /// The store's own database log (`log`).
    Log,
    /// NATS JetStream (`nats://`, `tls://`).
    #[cfg(feature = "nats")]
    Nats(Box<crate::nats::NatsTransport>),
    /// RabbitMQ (`amqp://`, `amqps://`).
    #[cfg(feature = "rabbitmq")]
    RabbitMq(crate::rabbitmq::RabbitTransport),
    /// Kafka (`kafka://`).
    #[cfg(feature = "kafka")]
    Kafka(crate::kafka::KafkaTransport),
    /// Amazon SNS + SQS (`sqs://`).
    #[cfg(feature = "sqs")]
    Sqs(crate::sqs::SqsTransport),
    /// Google Cloud Pub/Sub (`pubsub://`).
    #[cfg(feature = "pubsub")]
    PubSub(crate::pubsub::PubSubTransport),
}

impl fmt::Debug for AnyBroker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl AnyBroker {
    /// The transport's name (`log`, `nats`, `rabbitmq`, `kafka`, `sqs`, `pubsub`).
    pub fn name(&self) -> &'static str {
        match self {
            AnyBroker::Log => "log",
            #[cfg(feature = "nats")]
            AnyBroker::Nats(_) => "nats",
            #[cfg(feature = "rabbitmq")]
            AnyBroker::RabbitMq(_) => "rabbitmq",
            #[cfg(feature = "kafka")]
            AnyBroker::Kafka(_) => "kafka",
            #[cfg(feature = "sqs")]
            AnyBroker::Sqs(_) => "sqs",
            #[cfg(feature = "pubsub")]
            AnyBroker::PubSub(_) => "pubsub",
        }
    }

    /// Whether it is a broker, not the database log.
    pub fn is_broker(&self) -> bool {
        !matches!(self, AnyBroker::Log)
    }
}

/// Each transport's options, for [`open_transport_with`]: the one
/// [`Topology`] of the system, applied over every transport's own options.
/// The topology's partitions replace each transport's own (set them on the
/// topology, once); its prefix replaces a transport's only when set, so
/// each transport may keep a prefix of its own spelling.
///
/// With the `serde` feature it reads from a configuration file:
/// `topology = { partitions = 8 }`, `[nats]`, `[rabbitmq]`, `[kafka]`, `[sqs]`, `[pubsub]`,
/// `[log]`, every key optional.
#[derive(Debug, Clone, Default)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Deserialize),
    serde(default, deny_unknown_fields)
)]
#[non_exhaustive]
pub struct TransportOptions {
    /// The partitions and prefix every transport of the system shares.
    pub topology: Topology,
    /// The database log's reader.
    pub log: LogReaderConfig,
    /// NATS JetStream's.
    #[cfg(feature = "nats")]
    pub nats: crate::nats::NatsOptions,
    /// RabbitMQ's.
    #[cfg(feature = "rabbitmq")]
    pub rabbitmq: crate::rabbitmq::RabbitOptions,
    /// Kafka's.
    #[cfg(feature = "kafka")]
    pub kafka: crate::kafka::KafkaOptions,
    /// SNS and SQS's.
    #[cfg(feature = "sqs")]
    pub sqs: crate::sqs::SqsOptions,
    /// Pub/Sub's.
    #[cfg(feature = "pubsub")]
    pub pubsub: crate::pubsub::PubSubOptions,
}

impl TransportOptions {
    /// Every transport's defaults, laid out by `topology`.
    pub fn new(topology: Topology) -> Self {
        TransportOptions {
            topology,
            ..TransportOptions::default()
        }
    }
}

/// Opens the transport at `url` with `topology` (its partitions and
/// prefix) and every transport's default options: `log` for the database
/// log of `store`, `nats://host:4222`, `amqp://user@host:5672/%2f`,
/// `kafka://host:9092`, `sqs://` (SNS and SQS) or `pubsub://PROJECT`, as the build's features allow
/// ([`transport_schemes`]).
///
/// A URL no transport of this build opens is refused, naming the schemes
/// that are: each broker is a feature of this crate.
pub async fn open_transport<S: LogBackend + Clone>(
    url: &str,
    topology: &Topology,
    store: &S,
) -> Result<Transport> {
    open_transport_with(url, &TransportOptions::new(topology.clone()), store).await
}

/// Opens the transport at `url` with `options` ([`open_transport`]).
pub async fn open_transport_with<S: LogBackend + Clone>(
    url: &str,
    options: &TransportOptions,
    store: &S,
) -> Result<Transport> {
    let topology = &options.topology;
    if url == "log" {
        let reader = options.log.clone().topology(topology);
        return Ok(Transport {
            publisher: Arc::new(LogPublisher::new(Arc::new(store.clone()))),
            subscriber: Arc::new(LogSubscriber::new(Arc::new(store.clone()), reader)),
            broker: AnyBroker::Log,
            label: "the database log".into(),
        });
    }
    #[cfg(feature = "nats")]
    if opens(crate::nats::SCHEMES, url) {
        let nats_options = options.nats.clone().topology(topology);
        let nats = crate::nats::NatsTransport::connect_with(url, nats_options).await?;
        return Ok(Transport {
            publisher: Arc::new(nats.clone()),
            subscriber: Arc::new(nats.clone()),
            broker: AnyBroker::Nats(Box::new(nats)),
            label: format!("NATS JetStream at {}", redact_url(url)),
        });
    }
    #[cfg(feature = "rabbitmq")]
    if opens(crate::rabbitmq::SCHEMES, url) {
        let rabbit_options = options.rabbitmq.clone().topology(topology);
        let rabbit = crate::rabbitmq::RabbitTransport::connect_with(url, rabbit_options).await?;
        return Ok(Transport {
            publisher: Arc::new(rabbit.clone()),
            subscriber: Arc::new(rabbit.clone()),
            broker: AnyBroker::RabbitMq(rabbit),
            label: format!("RabbitMQ at {}", redact_url(url)),
        });
    }
    #[cfg(feature = "kafka")]
    if opens(crate::kafka::SCHEMES, url) {
        let kafka_options = options.kafka.clone().topology(topology);
        let kafka = crate::kafka::KafkaTransport::connect_with(url, kafka_options).await?;
        return Ok(Transport {
            publisher: Arc::new(kafka.clone()),
            subscriber: Arc::new(kafka.clone()),
            broker: AnyBroker::Kafka(kafka),
            label: format!("Kafka at {}", redact_url(url)),
        });
    }
    #[cfg(feature = "sqs")]
    if opens(crate::sqs::SCHEMES, url) {
        let sqs_options = options.sqs.clone().topology(topology);
        let sqs = crate::sqs::SqsTransport::connect_with(url, sqs_options).await?;
        return Ok(Transport {
            publisher: Arc::new(sqs.clone()),
            subscriber: Arc::new(sqs.clone()),
            label: format!("SNS and SQS at {}", sqs.place()),
            broker: AnyBroker::Sqs(sqs),
        });
    }
    #[cfg(feature = "pubsub")]
    if opens(crate::pubsub::SCHEMES, url) {
        let pubsub_options = options.pubsub.clone().topology(topology);
        let pubsub = crate::pubsub::PubSubTransport::connect_with(url, pubsub_options).await?;
        return Ok(Transport {
            publisher: Arc::new(pubsub.clone()),
            subscriber: Arc::new(pubsub.clone()),
            label: format!("Pub/Sub at {}", pubsub.place()),
            broker: AnyBroker::PubSub(pubsub),
        });
    }
    Err(Error::Config {
        key: "transport URL".into(),
        reason: format!(
            "no transport of this build opens {:?}; it opens {} (each broker is a feature of the \
             tidings crate: nats, rabbitmq, kafka, sqs, pubsub)",
            redact_url(url),
            transport_schemes().join(", ")
        ),
    })
}

/// Where the transport at `url` would put each topic, with `options`,
/// without connecting: what an AsyncAPI document names (its protocol,
/// addresses and bindings). `None` for the database log, which is a table,
/// not a broker.
pub fn transport_addresses(
    url: &str,
    options: &TransportOptions,
) -> Result<Option<Arc<dyn tidings_core::addresses::Addresses>>> {
    let topology = &options.topology;
    if url == "log" {
        return Ok(None);
    }
    #[cfg(feature = "nats")]
    if opens(crate::nats::SCHEMES, url) {
        return Ok(Some(Arc::new(options.nats.clone().topology(topology))));
    }
    #[cfg(feature = "rabbitmq")]
    if opens(crate::rabbitmq::SCHEMES, url) {
        return Ok(Some(Arc::new(options.rabbitmq.clone().topology(topology))));
    }
    #[cfg(feature = "kafka")]
    if opens(crate::kafka::SCHEMES, url) {
        return Ok(Some(Arc::new(options.kafka.clone().topology(topology))));
    }
    #[cfg(feature = "sqs")]
    if opens(crate::sqs::SCHEMES, url) {
        return Ok(Some(Arc::new(options.sqs.clone().topology(topology))));
    }
    #[cfg(feature = "pubsub")]
    if opens(crate::pubsub::SCHEMES, url) {
        return Ok(Some(Arc::new(options.pubsub.clone().topology(topology))));
    }
    let _ = topology;
    Err(Error::Config {
        key: "transport URL".into(),
        reason: format!(
            "no transport of this build opens {:?}; it opens {}",
            redact_url(url),
            transport_schemes().join(", ")
        ),
    })
}

/// The URLs [`open_transport`] opens in this build: `log`, then each
/// broker's schemes.
pub fn transport_schemes() -> Vec<&'static str> {
    #[allow(unused_mut)]
    let mut schemes = vec!["log"];
    #[cfg(feature = "nats")]
    schemes.extend(crate::nats::SCHEMES);
    #[cfg(feature = "rabbitmq")]
    schemes.extend(crate::rabbitmq::SCHEMES);
    #[cfg(feature = "kafka")]
    schemes.extend(crate::kafka::SCHEMES);
    #[cfg(feature = "sqs")]
    schemes.extend(crate::sqs::SCHEMES);
    #[cfg(feature = "pubsub")]
    schemes.extend(crate::pubsub::SCHEMES);
    schemes
}

/// Whether `url` is `log` or begins with a scheme [`open_transport`] opens.
pub fn opens_transport(url: &str) -> bool {
    url == "log"
        || transport_schemes()
            .iter()
            .any(|scheme| scheme.ends_with("://") && url.starts_with(scheme))
}

#[allow(dead_code)]
fn opens(schemes: &[&str], url: &str) -> bool {
    schemes.iter().any(|scheme| url.starts_with(scheme))
}
