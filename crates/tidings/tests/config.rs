//! The configuration structs read from a file (feature `serde`) mean what
//! the same values given to their builders mean: durations written `30s`,
//! counts kept in the setters' ranges, unknown keys refused.
#![cfg(feature = "serde")]

use std::time::Duration;

use serde::Deserialize;
use tidings::consumer::{ConsumerConfig, OnDeadLetter};
use tidings::log::LogReaderConfig;
use tidings::relay::RelayConfig;
use tidings::sql::StoreOptions;
use tidings::{Backoff, Topology};

/// A service's own configuration file, embedding Tidings' sections.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ServiceConfig {
    store: StoreOptions,
    relay: RelayConfig,
    consumer: ConsumerConfig,
    log: LogReaderConfig,
    topology: Topology,
}

const FILE: &str = r#"
[store]
retention = "7d"
source = "checkout"
max_connections = 16

[relay]
batch_size = 200
poll_interval = "250ms"
lease_ttl = "5s"

[consumer]
max_attempts = 3
lanes = 0
backoff = { base = "50ms", max = "2s" }
handler_timeout = "1m"
on_dead_letter = "continue"
lease_ttl = "100ms"

[log]
batch_size = 100
poll_interval = "100ms"
partitions = 4

[topology]
partitions = 4
prefix = "shop"
"#;

#[test]
fn a_file_means_what_the_builders_mean() {
    let read: ServiceConfig = toml::from_str(FILE).unwrap();
    let debug = |v: &dyn std::fmt::Debug| format!("{v:?}");
    assert_eq!(
        debug(&read.store),
        debug(
            &StoreOptions::default()
                .retention(Duration::from_secs(7 * 86_400))
                .source("checkout")
                .max_connections(16)
        )
    );
    assert_eq!(
        read.relay,
        RelayConfig::default()
            .batch_size(200)
            .poll_interval(Duration::from_millis(250))
            .lease_ttl(Duration::from_secs(5))
    );
    assert_eq!(
        debug(&read.consumer),
        debug(
            &ConsumerConfig::default()
                .max_attempts(3)
                .lanes(0)
                .backoff(Backoff::new(Duration::from_millis(50), Duration::from_secs(2)))
                .handler_timeout(Duration::from_secs(60))
                .on_dead_letter(OnDeadLetter::Continue)
                .lease_ttl(Duration::from_millis(100))
        ),
        "lanes = 0 is one lane and a lease of 100ms is 300ms, as with the setters"
    );
    assert_eq!(
        debug(&read.log),
        debug(
            &LogReaderConfig::default()
                .batch_size(100)
                .poll_interval(Duration::from_millis(100))
                .partitions(4)
        )
    );
    assert_eq!(read.topology, Topology::default().partitions(4).prefix("shop"));
}

#[test]
fn an_empty_section_is_the_defaults() {
    let read: ServiceConfig = toml::from_str("[store]\n[relay]\n[consumer]\n[log]\n[topology]\n").unwrap();
    assert_eq!(read.relay, RelayConfig::default());
    assert_eq!(
        format!("{:?}", read.consumer),
        format!("{:?}", ConsumerConfig::default())
    );
    assert_eq!(read.topology, Topology::default());
}

#[test]
fn unknown_keys_and_bad_durations_are_refused_naming_them() {
    let e =
        toml::from_str::<ServiceConfig>(&FILE.replace("max_attempts = 3", "max_atempts = 3")).unwrap_err();
    assert!(e.to_string().contains("unknown field `max_atempts`"), "{e}");
    let e = toml::from_str::<ServiceConfig>(&FILE.replace("\"250ms\"", "\"soon\"")).unwrap_err();
    assert!(e.to_string().contains("\"soon\" is not a duration"), "{e}");
    let e = toml::from_str::<ServiceConfig>(&FILE.replace("\"continue\"", "\"ignore\"")).unwrap_err();
    assert!(e.to_string().contains("hold_key"), "{e}");
}

/// Built with the brokers (as the workspace's own tests are): their
/// options read the same way.
#[cfg(all(feature = "nats", feature = "rabbitmq", feature = "kafka"))]
#[test]
fn broker_options_read_from_a_file() {
    #[derive(Debug, Deserialize)]
    struct Brokers {
        nats: tidings::nats::NatsOptions,
        rabbitmq: tidings::rabbitmq::RabbitOptions,
        kafka: tidings::kafka::KafkaOptions,
    }
    let read: Brokers = toml::from_str(
        r#"
[nats]
ack_wait = "5s"
partitions = 0
foreign = { payments = "payments.>" }
[rabbitmq]
prefetch = 16
foreign = { payments = { exchange = "billing", routing_key = "payment.*" }, refunds = { exchange = "billing" } }
[kafka]
replication = 3
commit_interval = "1s"
foreign = { payments = "billing.payments.v1" }
"#,
    )
    .unwrap();
    let debug = |v: &dyn std::fmt::Debug| format!("{v:?}");
    assert_eq!(
        debug(&read.nats),
        debug(
            &tidings::nats::NatsOptions::default()
                .ack_wait(Duration::from_secs(5))
                .partitions(0)
                .foreign("payments", "payments.>")
        )
    );
    assert_eq!(
        debug(&read.rabbitmq),
        debug(
            &tidings::rabbitmq::RabbitOptions::default()
                .prefetch(16)
                .foreign("payments", "billing", "payment.*")
                .foreign("refunds", "billing", "#")
        ),
        "a foreign exchange's binding key is # unless given"
    );
    assert_eq!(
        debug(&read.kafka),
        debug(
            &tidings::kafka::KafkaOptions::default()
                .replication(3)
                .commit_interval(Duration::from_secs(1))
                .foreign("payments", "billing.payments.v1")
        )
    );
}
