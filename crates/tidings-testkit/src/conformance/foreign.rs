//! Other teams' clients: the official CloudEvents SDK for Python, over the
//! plain Kafka, RabbitMQ, NATS, SNS + SQS and Pub/Sub clients, reading
//! what Tidings publishes and writing what Tidings reads.

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Child, ChildStdout, Command, Stdio};

use chrono::{DateTime, Utc};
use serde_json::Value;
use tidings_core::OutgoingMessage;
use tidings_core::cloudevents::ContentMode;

use super::{TransportUnderTest, fresh_topic, probe, subscribe};

/// Where a foreign client finds what a transport writes for one topic.
#[derive(Debug, Clone)]
pub struct ForeignAddress {
    /// `kafka`, `rabbitmq`, `nats`, `sqs` or `pubsub`.
    pub broker: &'static str,
    /// The broker's URL, as the foreign client takes it (SNS + SQS: the
    /// endpoint; Pub/Sub: the emulator's host and port).
    pub url: String,
    /// The Kafka topic, the RabbitMQ exchange, the NATS subject prefix, the
    /// SNS topic's name, or the Pub/Sub topic paths
    /// (`projects/P/topics/T`) of the topic's partitions, separated by
    /// commas (a foreign producer writes to the first).
    pub address: String,
}

/// The Python the test command installs the foreign clients into (the
/// official CloudEvents SDK, plain broker clients, an OpenAPI validator).
pub fn python() -> PathBuf {
    let path = std::env::var_os("TIDINGS_FOREIGN_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/foreign-venv/bin/python")
        });
    assert!(
        path.exists(),
        "the foreign clients' Python is missing at {} (scripts/test installs it; or set TIDINGS_FOREIGN_PYTHON)",
        path.display()
    );
    path
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("foreign/cloudevents_client.py")
}

/// Where a foreign client's stderr goes: a file, read once it is done (a
/// pipe nobody reads while it runs could fill and stall it).
fn stderr_file(what: &str) -> (PathBuf, std::fs::File) {
    let path = std::env::temp_dir().join(format!("tidings-foreign-{}.log", uuid::Uuid::new_v4().simple()));
    let file = std::fs::File::create(&path).unwrap_or_else(|e| panic!("cannot log {what}: {e}"));
    (path, file)
}

/// A foreign reader, listening. Killed when dropped (a failing test
/// leaves no process behind); the script also ends itself after 90 s.
struct ForeignReader {
    child: Child,
    stdout: BufReader<ChildStdout>,
    stderr: PathBuf,
    what: String,
}

impl Drop for ForeignReader {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.stderr);
    }
}

impl ForeignReader {
    /// Starts the Python reader of `at` and waits until it listens.
    async fn start(at: &ForeignAddress, count: usize) -> ForeignReader {
        let what = format!("the Python CloudEvents SDK reading {} {}", at.broker, at.address);
        let mut command = Command::new(python());
        command
            .arg(script())
            .args(["read", at.broker, &at.url, &at.address, &count.to_string()]);
        ForeignReader::spawn(what, command).await
    }

    /// Starts `command`, a reader printing `ready` once it listens, then
    /// one JSON line per event, and waits until it listens.
    async fn spawn(what: String, mut command: Command) -> ForeignReader {
        let (stderr, file) = stderr_file(&what);
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(file)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
        let stdout = BufReader::new(child.stdout.take().expect("piped"));
        let mut reader = ForeignReader {
            child,
            stdout,
            stderr,
            what,
        };
        let (reader, line) = tokio::task::spawn_blocking(move || {
            let mut line = String::new();
            let _ = reader.stdout.read_line(&mut line);
            (reader, line)
        })
        .await
        .expect("reading the foreign reader");
        if line.trim() != "ready" {
            panic!("{} did not start: {}", reader.what, reader.stderr());
        }
        reader
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Every event it read, once it has read its count (or given up).
    async fn finish(mut self) -> Vec<Value> {
        tokio::task::spawn_blocking(move || {
            let mut out = Vec::new();
            let _ = self.stdout.read_to_end(&mut out);
            let status = self.child.wait().expect("waiting for the foreign reader");
            assert!(
                status.success(),
                "{} failed ({status}): {}",
                self.what,
                self.stderr()
            );
            String::from_utf8_lossy(&out)
                .lines()
                .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{}: {l:?}: {e}", self.what)))
                .collect()
        })
        .await
        .expect("the foreign reader's output")
    }
}

/// What Tidings publishes, in binary and in structured mode (each mode the
/// transport writes: `modes_written`), is read by the official
/// CloudEvents SDK for Python over the broker's plain client: every event
/// recognised, in the mode it was written, with its attributes, extensions
/// and data intact, and with its key where the broker carries one (the
/// Kafka record key, the SQS message group, the Pub/Sub ordering key).
pub async fn foreign_readers_recognise_what_tidings_publishes<T: TransportUnderTest>(t: &T) {
    read_by_a_foreign_sdk(t, Sdk::Python).await;
}

/// What Tidings publishes on Kafka, in binary and in structured mode, is
/// read by the official CloudEvents SDK for Rust with its rdkafka binding
/// (`interop/cloudevents-rust`, outside the workspace: it builds its own
/// rdkafka): every event recognised, with its attributes, extensions and
/// data intact.
pub async fn the_rust_sdk_reads_what_tidings_publishes<T: TransportUnderTest>(t: &T) {
    read_by_a_foreign_sdk(t, Sdk::Rust).await;
}

/// Which official CloudEvents SDK reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sdk {
    Python,
    Rust,
}

/// The Rust SDK's reader, as the test command builds it.
fn rust_reader() -> PathBuf {
    let path = std::env::var_os("TIDINGS_CLOUDEVENTS_RUST")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../../target/interop/debug/tidings-interop-cloudevents-rust")
        });
    assert!(
        path.exists(),
        "the Rust CloudEvents SDK's reader is missing at {} (scripts/test builds it: cargo build \
         --manifest-path interop/cloudevents-rust/Cargo.toml --target-dir target/interop, with cmake \
         on the PATH; or set TIDINGS_CLOUDEVENTS_RUST)",
        path.display()
    );
    path
}

/// The modes a broker's transport writes CloudEvents in: SNS + SQS only
/// structured (the event whole in the body, a few attributes repeated as
/// message attributes), Pub/Sub binary (its binding's `ce-` attributes;
/// structured only for an event past Pub/Sub's attribute limits), the
/// others the mode they are opened in.
fn modes_written(broker: &str) -> &'static [ContentMode] {
    match broker {
        "sqs" => &[ContentMode::Structured],
        "pubsub" => &[ContentMode::Binary],
        _ => &[ContentMode::Binary, ContentMode::Structured],
    }
}

/// The brokers whose foreign reader prints each message's key: the Kafka
/// record key, the SQS message group, the Pub/Sub ordering key.
fn carries_key(broker: &str) -> bool {
    matches!(broker, "kafka" | "sqs" | "pubsub")
}

async fn read_by_a_foreign_sdk<T: TransportUnderTest>(t: &T, sdk: Sdk) {
    // A fixture names the addresses of what it opened: one publisher open,
    // its foreign address names the broker, and so the modes it writes.
    let _opened = t.publisher().await;
    let broker = t
        .foreign_address(&fresh_topic())
        .expect("the transport names where foreign clients read")
        .broker;
    for &mode in modes_written(broker) {
        let topic = fresh_topic();
        let publisher = t.publisher_in(mode).await;
        // The topic's resources exist before the reader listens: a group
        // of Tidings' own (RabbitMQ refuses what no queue would take),
        // and a first message.
        let own = subscribe(t, "own", &topic).await;
        let warm_up = probe(&topic, "warm-up", 0);
        publisher.publish(std::slice::from_ref(&warm_up)).await.unwrap();
        let at = t
            .foreign_address(&topic)
            .expect("the transport names where foreign clients read");
        let sent: Vec<OutgoingMessage> = (1..=3)
            .map(|i| {
                let mut m = probe(&topic, &format!("key-{i}"), i);
                m.envelope.headers.insert("tenant".into(), "acme".into());
                m
            })
            .collect();
        // Kafka's reader starts from the beginning: it reads the warm-up too.
        let count = sent.len() + usize::from(at.broker == "kafka");
        let reader = match sdk {
            Sdk::Python => ForeignReader::start(&at, count).await,
            Sdk::Rust => {
                assert_eq!(at.broker, "kafka", "the Rust SDK's reader reads Kafka");
                let mut command = Command::new(rust_reader());
                command.args([&at.url, &at.address, &count.to_string()]);
                let what = format!("the Rust CloudEvents SDK reading {}", at.address);
                ForeignReader::spawn(what, command).await
            }
        };
        publisher.publish(&sent).await.unwrap();
        let events = reader.finish().await;
        own.close().await.unwrap();
        let mode_name = match mode {
            ContentMode::Binary => "binary",
            ContentMode::Structured => "structured",
        };
        for m in &sent {
            let e = &m.envelope;
            let id = e.id.to_string();
            let got = events
                .iter()
                .find(|ev| ev["attributes"]["id"] == id.as_str())
                .unwrap_or_else(|| panic!("the SDK did not see event {id} ({mode_name} mode): {events:#?}"));
            let a = &got["attributes"];
            assert_eq!(got["mode"], mode_name, "{got}");
            assert_eq!(a["specversion"], "1.0", "{got}");
            assert_eq!(a["source"], e.source.as_str(), "{got}");
            assert_eq!(a["type"], e.message_type.as_str(), "{got}");
            assert_eq!(a["subject"], e.aggregate_key.as_str(), "{got}");
            assert_eq!(a["partitionkey"], e.aggregate_key.as_str(), "{got}");
            assert_eq!(a["datacontenttype"], "application/json", "{got}");
            assert_eq!(a["dataschema"], e.dataschema().as_str(), "{got}");
            assert_eq!(a["correlationid"], e.correlation_id.to_string().as_str(), "{got}");
            assert_eq!(a["aggregatetype"], e.aggregate_type.as_str(), "{got}");
            assert_eq!(a["tenant"], "acme", "{got}");
            assert_eq!(
                a["traceparent"].as_str(),
                e.headers.get("traceparent").map(String::as_str),
                "{got}"
            );
            // Python keeps microseconds; the Rust SDK nanoseconds.
            let time: DateTime<Utc> = a["time"]
                .as_str()
                .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
                .unwrap_or_else(|| panic!("the SDK read no time: {got}"))
                .into();
            assert_eq!(time.timestamp_micros(), e.occurred_at.timestamp_micros(), "{got}");
            let payload: Value = serde_json::from_slice(&e.payload).unwrap();
            assert_eq!(got["data"], payload, "{got}");
            if carries_key(at.broker) {
                assert_eq!(got["key"], e.aggregate_key.as_str(), "the broker's key: {got}");
            }
        }
    }
}

/// What a handler saw of each event: its source, its id as written, its
/// key and its `tenant` extension.
type Seen = (String, String, String, Option<String>);

/// Records every event it handles.
#[derive(Debug, Clone, Default)]
struct Recorder {
    seen: std::sync::Arc<std::sync::Mutex<Vec<Seen>>>,
    types: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

#[async_trait::async_trait]
impl<DB: sqlx::Database> tidings_consumer::Handler<DB> for Recorder {
    async fn handle(
        &self,
        ctx: &mut tidings_consumer::Context<'_, DB>,
    ) -> Result<(), tidings_consumer::HandlerError> {
        let e = ctx.envelope();
        self.seen.lock().expect("lock").push((
            e.source.clone(),
            e.event_id(),
            e.aggregate_key.clone(),
            e.headers.get("tenant").cloned(),
        ));
        self.types.lock().expect("lock").push(e.message_type.clone());
        Ok(())
    }
}

/// Runs the foreign producer's `command` (`write`, `write-plain`) against
/// `at`, waiting for the broker's confirmations.
async fn foreign_write(at: &ForeignAddress, command_name: &str) {
    let what = format!("the Python CloudEvents SDK writing {} {}", at.broker, at.address);
    run_client(&what, &[command_name, at.broker, &at.url, &at.address]).await;
}

/// Runs the foreign client with `args` to its end, failing with `what`
/// and its stderr unless it succeeds; returns what it printed.
pub async fn run_client(what: &str, args: &[&str]) -> Vec<u8> {
    let mut command = Command::new(python());
    command.arg(script()).args(args);
    let output = tokio::task::spawn_blocking(move || command.output())
        .await
        .expect("the foreign client")
        .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
    assert!(
        output.status.success(),
        "{what} failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    output.stdout
}

/// What another team's producer writes with the official CloudEvents SDK
/// for Python onto the topic a Tidings group reads (binary and structured
/// mode, ids that are not UUIDs, no `time`, an extension of its own, an
/// event without a key) is handled once each; the producer's retry of an
/// event is recognised as a duplicate (on SNS, SNS itself drops it: the
/// producer sends it again with the same deduplication id within five
/// minutes, see `retries_delivered`), while the same id from another
/// source is another event; a record that is not an event is dead-lettered
/// with its raw bytes, and holds nothing back.
pub async fn foreign_producers_are_read_once<T: TransportUnderTest>(t: &T) {
    let topic = fresh_topic();
    let group = super::fresh_group("foreign");
    let subscriber = t.subscriber().await;
    subscriber.ensure_group(&group, &topic).await.unwrap();
    let at = t
        .foreign_address(&topic)
        .expect("the transport names where foreign clients write");
    foreign_write(&at, "write").await;
    read_foreign_events(subscriber, group, topic, retries_delivered(at.broker)).await;
}

/// How many of the foreign producer's retries reach a Tidings group: none
/// on SNS, which drops a FIFO message whose deduplication id it saw within
/// five minutes (the foreign client gives a retry the id of its first
/// send), one elsewhere.
fn retries_delivered(broker: &str) -> u64 {
    if broker == "sqs" { 0 } else { 1 }
}

/// A topic another team's producer writes under names of its own (a NATS
/// stream and subjects it made, a RabbitMQ exchange it declared), read by
/// those names ([`TransportUnderTest::foreign_subscriber`]): what it
/// writes with the official CloudEvents SDK for Python is handled once
/// each, the retry suppressed, the garbage dead-lettered with its bytes.
pub async fn foreign_names_are_read<T: TransportUnderTest>(t: &T) {
    let topic = fresh_topic();
    let group = super::fresh_group("named");
    let name = format!("payments-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let subscriber = t
        .foreign_subscriber(&topic, &name)
        .await
        .expect("the transport reads other teams' names");
    let at = ForeignAddress {
        address: name,
        ..t.foreign_address(&topic)
            .expect("the transport names where foreign clients write")
    };
    let what = format!("the Python client making {} {}", at.broker, at.address);
    run_client(&what, &["own", at.broker, &at.url, &at.address]).await;
    subscriber.ensure_group(&group, &topic).await.unwrap();
    foreign_write(&at, "write").await;
    read_foreign_events(subscriber, group, topic, retries_delivered(at.broker)).await;
}

/// Reads what `foreign_events` in the foreign client wrote to `topic` with
/// a Tidings group, checking each event was handled once, and that the
/// `retries` of the producer's retry that reached the group were each
/// recognised as a duplicate.
async fn read_foreign_events(
    subscriber: std::sync::Arc<dyn tidings_core::Subscriber>,
    group: String,
    topic: String,
    retries: u64,
) {
    use tidings_core::FailureStore;
    let db = crate::services::SqliteTestDb::new().await;
    let handler = Recorder::default();
    let consumer =
        tidings_consumer::Consumer::new(group, db.store.clone(), handler.clone()).topic(topic.clone());
    let stop = tokio_util::sync::CancellationToken::new();
    let (stats, task) = super::start_on(subscriber, consumer, stop.clone());
    super::eventually(
        &format!("four events handled, {retries} duplicate(s) suppressed, the garbage dead-lettered"),
        || stats.handled() == 4 && stats.duplicates() == retries && stats.dead_lettered() == 1,
    )
    .await;
    stop.cancel();
    task.await.unwrap().unwrap();

    let mut seen = handler.seen.lock().unwrap().clone();
    seen.sort();
    let source = "https://pay.example/hooks";
    let acme = Some("acme".to_owned());
    let expected: Vec<Seen> = vec![
        (
            "https://billing.example".into(),
            "evt_01J8K2A".into(),
            "inv-2".into(),
            acme.clone(),
        ),
        (source.into(), "evt_01J8K2A".into(), "inv-1".into(), acme.clone()),
        (source.into(), "evt_01J8K2B".into(), "inv-1".into(), acme.clone()),
        (source.into(), "evt_01J8K2C".into(), String::new(), acme.clone()),
    ];
    assert_eq!(seen, expected, "each foreign event handled once");

    let letters = db.store.dead_letters(&Default::default()).await.unwrap();
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(
        letters[0].body, b"not an event {",
        "the dead letter keeps the raw bytes"
    );
    assert_eq!(letters[0].message_id, None);
}

/// What a producer that knows nothing of CloudEvents writes (plain JSON,
/// its id in the header `x-event-id`) onto a topic a Tidings group reads
/// as plain JSON of a declared type: each record handled once as that
/// type, the producer's retry recognised as a duplicate (on SNS dropped by
/// SNS, its deduplication id the record's id: `retries_delivered`), a
/// record without its id and one that is not JSON each dead-lettered with
/// the reason and its raw bytes, holding nothing back.
pub async fn foreign_plain_json_is_read_once<T: TransportUnderTest>(t: &T) {
    let topic = fresh_topic();
    let group = super::fresh_group("plain");
    let subscriber = t.subscriber().await;
    subscriber.ensure_group(&group, &topic).await.unwrap();
    let at = t
        .foreign_address(&topic)
        .expect("the transport names where foreign clients write");
    foreign_write(&at, "write-plain").await;
    read_plain_json_once(subscriber, group, topic, retries_delivered(at.broker)).await;
}

/// Reads what `plain_records` in the foreign client wrote to `topic` as
/// plain JSON of type `PaymentSettled`, its id in the header `X-Event-Id`,
/// with a Tidings group: each record handled once, the producer's retry
/// suppressed, the record without an id and the one that is not JSON
/// dead-lettered with the reason and their bytes.
pub async fn read_plain_json(
    subscriber: std::sync::Arc<dyn tidings_core::Subscriber>,
    group: String,
    topic: String,
) {
    read_plain_json_once(subscriber, group, topic, 1).await;
}

/// [`read_plain_json`], with `retries` of the producer's retry reaching
/// the group, each recognised as a duplicate.
async fn read_plain_json_once(
    subscriber: std::sync::Arc<dyn tidings_core::Subscriber>,
    group: String,
    topic: String,
    retries: u64,
) {
    use tidings_core::FailureStore;
    use tidings_core::field::Field;
    use tidings_core::plain::PlainJson;
    let db = crate::services::SqliteTestDb::new().await;
    let handler = Recorder::default();
    let plain = PlainJson::new("PaymentSettled")
        .id(Field::header("X-Event-Id"))
        .source("payments-service");
    let consumer = tidings_consumer::Consumer::new(group, db.store.clone(), handler.clone())
        .json_topic(topic.clone(), plain);
    let stop = tokio_util::sync::CancellationToken::new();
    let (stats, task) = super::start_on(subscriber, consumer, stop.clone());
    super::eventually(
        &format!("two records handled, {retries} duplicate(s) suppressed, two dead-lettered"),
        || stats.handled() == 2 && stats.duplicates() == retries && stats.dead_lettered() == 2,
    )
    .await;
    stop.cancel();
    task.await.unwrap().unwrap();

    let mut seen = handler.seen.lock().unwrap().clone();
    seen.sort();
    let ids: Vec<(String, String)> = seen.into_iter().map(|(source, id, _, _)| (source, id)).collect();
    assert_eq!(
        ids,
        [
            ("payments-service".to_owned(), "pay-1".to_owned()),
            ("payments-service".to_owned(), "pay-2".to_owned())
        ],
        "each record handled once, as the declared type"
    );
    assert!(
        handler
            .types
            .lock()
            .unwrap()
            .iter()
            .all(|t| t == "PaymentSettled")
    );
    let mut letters = db.store.dead_letters(&Default::default()).await.unwrap();
    letters.sort_by_key(|l| l.body.clone());
    assert_eq!(letters.len(), 2, "{letters:?}");
    assert_eq!(letters[0].body, b"not an event {", "the raw bytes are kept");
    assert!(
        letters[0].errors[0].error.contains("not JSON"),
        "{:?}",
        letters[0].errors
    );
    assert_eq!(letters[1].body, br#"{"payment_id": "pay-3", "amount": 300}"#);
    assert!(
        letters[1].errors[0]
            .error
            .contains("no id (the header X-Event-Id)"),
        "{:?}",
        letters[1].errors
    );
}

/// Another team's Kafka topic: created with `partitions` partitions and
/// filled with `count` CloudEvents (ids `evt_fill_<n>`, 40 keys) by the
/// Python client, placed by its own partitioner. Returns how many records
/// each partition got.
pub async fn foreign_kafka_topic(
    url: &str,
    topic: &str,
    count: usize,
    partitions: u32,
) -> std::collections::BTreeMap<u32, usize> {
    fill_kafka_topic("fill", url, topic, count, partitions).await
}

/// Another team's Kafka topic of clicks, as the clicks reference system
/// reads them: created with `partitions` partitions and filled with
/// `count` clicks (ids `clk_py_<n>`, `count / 20` sessions as keys, each
/// session's clicks in order) by the Python client. Returns how many
/// records each partition got.
pub async fn foreign_kafka_clicks(
    url: &str,
    topic: &str,
    count: usize,
    partitions: u32,
) -> std::collections::BTreeMap<u32, usize> {
    fill_kafka_topic("fill-clicks", url, topic, count, partitions).await
}

async fn fill_kafka_topic(
    command: &str,
    url: &str,
    topic: &str,
    count: usize,
    partitions: u32,
) -> std::collections::BTreeMap<u32, usize> {
    let what = format!("the Python Kafka client creating and filling {topic}");
    let (count, partitions) = (count.to_string(), partitions.to_string());
    let stdout = run_client(&what, &[command, "kafka", url, topic, &count, &partitions]).await;
    let placed: std::collections::BTreeMap<String, usize> = serde_json::from_slice(&stdout)
        .unwrap_or_else(|e| panic!("{what} printed {:?}: {e}", String::from_utf8_lossy(&stdout)));
    placed
        .into_iter()
        .map(|(p, n)| (p.parse().expect("a partition number"), n))
        .collect()
}
