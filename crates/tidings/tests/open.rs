//! `open_store` chooses the database by the URL's scheme, and refuses a URL
//! no database of the build opens, naming the ones it does.

use std::path::PathBuf;

use tidings::sqlite::SqliteStore;
use tidings::{AnyStore, LagSource, open_store, store_schemes, with_store};

/// A SQLite file of this test's own, deleted (with its journal) on drop.
struct TempDb(PathBuf);

impl TempDb {
    fn new(name: &str) -> TempDb {
        TempDb(std::env::temp_dir().join(format!("tidings-open-{name}-{}.db", std::process::id())))
    }

    fn url(&self) -> String {
        format!("sqlite://{}", self.0.display())
    }

    async fn store(&self) -> SqliteStore {
        SqliteStore::connect(&self.url())
            .await
            .expect("a SQLite file opens")
    }
}

impl Drop for TempDb {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm"] {
            std::fs::remove_file(format!("{}{suffix}", self.0.display())).ok();
        }
    }
}

#[tokio::test]
async fn a_sqlite_url_opens_the_embedded_store() {
    let db = TempDb::new("sqlite");
    let store = open_store(&db.url()).await.expect("a sqlite: URL opens");
    assert!(matches!(store, AnyStore::Sqlite(_)), "{store:?}");
    assert_eq!(store.database(), "SQLite");
    store.migrate().await.unwrap();
    let lag = with_store!(&store, |s| s.lag().await).unwrap();
    assert_eq!(lag.outbox_pending, 0);
}

/// A plain path is a SQLite file, the embedded default, as `sqlite://path` is.
#[tokio::test]
async fn a_plain_path_opens_the_embedded_store() {
    let db = TempDb::new("path");
    let store = open_store(&db.0.display().to_string())
        .await
        .expect("a path opens");
    assert!(matches!(store, AnyStore::Sqlite(_)), "{store:?}");
    assert_eq!(tidings::database_named("tidings.db"), Some("SQLite"));
}

#[tokio::test]
async fn an_unknown_scheme_is_refused_naming_the_known_ones() {
    let err = open_store("oracle://app:hunter2@db/shop").await.unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("oracle://app:***@db/shop") || text.contains("oracle://app@db/shop"),
        "{text}"
    );
    assert!(
        !text.contains("hunter2"),
        "the password stays out of the error: {text}"
    );
    for scheme in store_schemes() {
        assert!(text.contains(scheme), "{text} names {scheme}");
    }
    assert!(!err.class().is_retryable());
}

/// Built with the `mysql` feature (as the workspace's own tests are): a
/// `mysql://` or `mariadb://` URL opens MySQL (MariaDB here).
#[cfg(feature = "mysql")]
#[tokio::test]
async fn a_mysql_url_opens_mysql() {
    let url = std::env::var("MYSQL_URL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_owned());
    let store = open_store(&url)
        .await
        .unwrap_or_else(|e| panic!("MySQL at {url} (set MYSQL_URL): {}", e.report()));
    assert!(matches!(store, AnyStore::MySql(_)), "{store:?}");
    assert_eq!(store.database(), "MySQL");
    let mariadb = url.replacen("mysql://", "mariadb://", 1);
    assert_eq!(tidings::database_named(&mariadb), Some("MySQL"));
    let store = open_store(&mariadb)
        .await
        .unwrap_or_else(|e| panic!("MariaDB at {mariadb}: {}", e.report()));
    assert!(matches!(store, AnyStore::MySql(_)), "{store:?}");
}

/// Built with the `postgres` feature (as the workspace's own tests are):
/// a `postgres://` URL opens PostgreSQL, and one to a closed port fails
/// after the startup window (10 s), naming the cause.
#[cfg(feature = "postgres")]
#[tokio::test]
async fn a_postgres_url_opens_postgresql() {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let store = open_store(&url)
        .await
        .unwrap_or_else(|e| panic!("PostgreSQL at {url} (set DATABASE_URL): {}", e.report()));
    assert!(matches!(store, AnyStore::Postgres(_)), "{store:?}");
    assert_eq!(store.database(), "PostgreSQL");

    let started = std::time::Instant::now();
    let err = open_store("postgres://postgres@127.0.0.1:1/test")
        .await
        .unwrap_err();
    assert!(
        started.elapsed() < std::time::Duration::from_secs(15),
        "given up after the startup window, not after the pool's 30 s"
    );
    let report = err.report().to_string();
    assert!(
        report.contains("connecting to PostgreSQL") && report.contains("refused"),
        "the cause is named: {report}"
    );
    // sqlx's own message quotes its io error once; Tidings adds no copy.
    assert!(
        report.matches("Connection refused").count() <= 2,
        "each cause once: {report}"
    );
}

/// `log` opens the store's own database log, laid out by the topology.
#[tokio::test]
async fn log_opens_the_database_log_with_the_topology() {
    let db = TempDb::new("log");
    let store = db.store().await;
    store.migrate().await.unwrap();
    let topology = tidings::Topology::default().partitions(3);
    let transport = tidings::open_transport("log", &topology, &store).await.unwrap();
    assert!(!transport.broker.is_broker());
    assert_eq!(transport.label(), "the database log");
    assert_eq!(transport.subscriber.partitions("orders"), 3);
}

#[tokio::test]
async fn an_unknown_transport_is_refused_naming_the_known_ones() {
    let db = TempDb::new("bad");
    let store = db.store().await;
    let err = tidings::open_transport("mqtt://broker:1883", &tidings::Topology::default(), &store)
        .await
        .unwrap_err();
    let text = err.to_string();
    for scheme in tidings::transport_schemes() {
        assert!(text.contains(scheme), "{text} names {scheme}");
    }
    assert!(!tidings::opens_transport("mqtt://broker:1883"));
    assert!(tidings::opens_transport("log"));
}

/// Built with the brokers (as the workspace's own tests are): a broker URL
/// opens that broker, with the topology's partitions.
#[cfg(all(feature = "nats", feature = "rabbitmq"))]
#[tokio::test]
async fn a_broker_url_opens_that_broker_with_the_topology() {
    let db = TempDb::new("brokers");
    let store = db.store().await;
    let topology = tidings::Topology::default()
        .partitions(4)
        .prefix("tidings-open-test");
    let nats_url = std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned());
    let amqp_url =
        std::env::var("AMQP_URL").unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned());
    for (url, name) in [(nats_url, "nats"), (amqp_url, "rabbitmq")] {
        let transport = tidings::open_transport(&url, &topology, &store)
            .await
            .unwrap_or_else(|e| panic!("{name} at {url}: {}", e.report()));
        assert_eq!(transport.broker.name(), name);
        assert!(
            !transport.label().contains("guest:guest"),
            "{}",
            transport.label()
        );
        assert_eq!(transport.subscriber.partitions("orders"), 4, "{name}");
    }
}

/// Told the broker's refusals, `enqueue` refuses an event NATS's
/// `max_payload` could not take, inside the producer's transaction, with
/// the broker's reason, and writes nothing; a smaller one goes in. Told the
/// database log, it refuses nothing more.
#[cfg(feature = "nats")]
#[tokio::test]
async fn enqueue_refuses_what_the_broker_would_refuse() {
    use tidings::{Envelope, Outbox, OutgoingMessage};
    let db = TempDb::new("refuses");
    let store = open_store(&db.url()).await.unwrap();
    store.migrate().await.unwrap();
    let nats_url = std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned());
    let topology = tidings::Topology::default().prefix("tidings-open-refuses");
    let log = with_store!(&store, |s| tidings::open_transport("log", &topology, s).await).unwrap();
    store.refuse_what_it_refuses(&log).unwrap();
    let nats = with_store!(&store, |s| tidings::open_transport(&nats_url, &topology, s).await)
        .unwrap_or_else(|e| panic!("NATS at {nats_url}: {}", e.report()));
    store.refuse_what_it_refuses(&nats).unwrap();
    let second = store.refuse_what_it_refuses(&nats).unwrap_err();
    assert!(second.to_string().contains("one transport"), "{second}");

    #[derive(serde::Serialize, serde::Deserialize)]
    struct Padded {
        pad: String,
    }
    impl tidings::Message for Padded {
        const TYPE: &'static str = "Padded";
        const VERSION: u32 = 1;
        const KIND: tidings::Kind = tidings::Kind::Event;
        const AGGREGATE: &'static str = "order";
        const TOPIC: &'static str = "orders";
        fn key(&self) -> String {
            "o1".to_owned()
        }
    }
    let event = |bytes: usize| OutgoingMessage {
        topic: "orders".to_owned(),
        envelope: Envelope::new(
            "tests",
            &Padded {
                pad: "x".repeat(bytes),
            },
        )
        .unwrap(),
    };
    let AnyStore::Sqlite(sqlite) = &store else {
        unreachable!()
    };
    let mut tx = sqlite.pool().begin().await.unwrap();
    let err = sqlite
        .enqueue_outgoing(&mut tx, &event(2 * 1024 * 1024))
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(text.contains("max_payload"), "names the broker's limit: {text}");
    assert!(
        err.class() == tidings::ErrorClass::Permanent,
        "never worth trying again: {text}"
    );
    sqlite.enqueue_outgoing(&mut tx, &event(1024)).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(
        sqlite.lag().await.unwrap().outbox_pending,
        1,
        "only the small one"
    );
}

/// `sqs://` opens SNS and SQS with the topology and the `[sqs]` options;
/// an endpoint nothing answers on is an error naming it.
#[cfg(feature = "sqs")]
#[tokio::test]
async fn an_sqs_url_opens_sns_and_sqs() {
    let db = TempDb::new("sqs");
    let store = db.store().await;
    let endpoint = std::env::var("SQS_ENDPOINT").unwrap_or_else(|_| "http://127.0.0.1:5000".to_owned());
    let mut options = tidings::TransportOptions::new(tidings::Topology::default().partitions(3));
    options.sqs = tidings::sqs::SqsOptions::default().static_credentials("test", "test");
    let url = format!("sqs://us-east-1?endpoint={endpoint}");
    let transport = tidings::open_transport_with(&url, &options, &store)
        .await
        .unwrap_or_else(|e| panic!("SNS and SQS (moto) at {endpoint}: {}", e.report()));
    assert_eq!(transport.broker.name(), "sqs");
    assert_eq!(transport.subscriber.partitions("orders"), 3);
    assert!(transport.label().contains(&endpoint), "{}", transport.label());

    let nowhere = "sqs://us-east-1?endpoint=http://127.0.0.1:9";
    let err = tidings::open_transport_with(nowhere, &options, &store)
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("http://127.0.0.1:9"),
        "names the endpoint: {err}"
    );
}

/// `pubsub://PROJECT` opens Pub/Sub with the topology and the `[pubsub]`
/// options (the emulator named by the URL's endpoint); an endpoint nothing
/// answers on is an error naming it.
#[cfg(feature = "pubsub")]
#[tokio::test]
async fn a_pubsub_url_opens_pubsub() {
    let db = TempDb::new("pubsub");
    let store = db.store().await;
    let host = std::env::var("PUBSUB_EMULATOR_HOST").unwrap_or_else(|_| "127.0.0.1:8085".to_owned());
    let mut options = tidings::TransportOptions::new(tidings::Topology::default().partitions(3));
    options.pubsub = tidings::pubsub::PubSubOptions::default().prefix("opened");
    let url = format!("pubsub://tidings-test?endpoint=http://{host}");
    let transport = tidings::open_transport_with(&url, &options, &store)
        .await
        .unwrap_or_else(|e| panic!("the Pub/Sub emulator at {host}: {}", e.report()));
    assert_eq!(transport.broker.name(), "pubsub");
    assert_eq!(transport.subscriber.partitions("orders"), 3);
    assert!(transport.label().contains(&host), "{}", transport.label());
    assert!(
        transport.label().contains("tidings-test"),
        "{}",
        transport.label()
    );

    let nowhere = "pubsub://tidings-test?endpoint=http://127.0.0.1:9";
    let err = tidings::open_transport_with(nowhere, &options, &store)
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("http://127.0.0.1:9"),
        "names the endpoint: {err}"
    );
}
