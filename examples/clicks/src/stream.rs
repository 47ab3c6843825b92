//! The click stream: made up (sessions of people and of bots, a few
//! malformed clicks), written by the web tier through the outbox or
//! straight to Kafka by a plain producer, and read back from Kafka to
//! check that every click in the topic was scored.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use rand::Rng;
use rdkafka::Message as _;
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, Headers as _, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};
use tidings_broker_kafka::KafkaTransport;
use tidings_core::RawMessage;
use tokio::task::JoinSet;

use crate::messages::Click;
use crate::system::{ClicksStore, SOURCE, outgoing};

/// Clicks per session, on average.
pub const CLICKS_PER_SESSION: usize = 20;
/// Fraction of sessions that are bots.
pub const BOT_RATE: f64 = 0.05;

/// `clicks` clicks over `clicks / 20` sessions, in the order the web tier
/// sees them: sessions interleaved, each session's clicks in order. A
/// `poison_rate` fraction are malformed (a page that is no path).
pub fn generate(clicks: usize, poison_rate: f64) -> Vec<Click> {
    let mut rng = rand::rng();
    let sessions = (clicks / CLICKS_PER_SESSION).max(1);
    let start = chrono::Utc::now().timestamp_millis() - 3_600_000;
    let run = uuid::Uuid::now_v7().simple().to_string();
    // (bot, next seq, last click) per session.
    let mut state: Vec<(bool, i64, i64)> = (0..sessions)
        .map(|_| (rng.random_bool(BOT_RATE), 1, start + rng.random_range(0..600_000)))
        .collect();
    (0..clicks)
        .map(|i| {
            let s = rng.random_range(0..sessions);
            let (bot, seq, last) = &mut state[s];
            let gap = if *bot {
                rng.random_range(60..200)
            } else {
                rng.random_range(200..8_000)
            };
            *last += gap;
            let click = Click {
                click_id: format!("clk_{}_{i}", &run[..16]),
                session_id: format!("sess_{}_{s}", &run[..16]),
                seq: *seq,
                page: if rng.random_bool(poison_rate.clamp(0.0, 1.0)) {
                    String::new()
                } else {
                    format!("/products/{}", rng.random_range(1..500))
                },
                at_ms: *last,
            };
            *seq += 1;
            click
        })
        .collect()
}

/// The web tier writing through the outbox: eight clients, each with its
/// own sessions (so each session's clicks are committed in order), 100
/// clicks a transaction.
pub async fn write_through_outbox<S: ClicksStore>(
    store: &S,
    clicks: Arc<Vec<Click>>,
    written: Arc<AtomicUsize>,
) -> anyhow::Result<()> {
    const CLIENTS: usize = 8;
    let mut tasks = JoinSet::new();
    for client in 0..CLIENTS {
        let (store, clicks, written) = (store.clone(), clicks.clone(), written.clone());
        tasks.spawn(async move {
            let mine: Vec<Click> = clicks
                .iter()
                .filter(|c| owner(&c.session_id, CLIENTS) == client)
                .cloned()
                .collect();
            for batch in mine.chunks(100) {
                let messages = outgoing(batch)?;
                tidings_core::retry::transaction(&tidings_core::retry::Retry::default(), || {
                    store.write_clicks(&messages)
                })
                .await?;
                written.fetch_add(batch.len(), Ordering::Relaxed);
            }
            anyhow::Ok(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    Ok(())
}

fn owner(session: &str, clients: usize) -> usize {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    session.hash(&mut h);
    (h.finish() % clients as u64) as usize
}

/// A click as the web tier writes it to Kafka: CloudEvents in binary mode
/// per the Kafka protocol binding (`ce_` headers, the session as the
/// record key and as `partitionkey`), the click as JSON.
pub fn record_headers(click: &Click) -> OwnedHeaders {
    let time = chrono::DateTime::from_timestamp_millis(click.at_ms)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    [
        ("ce_specversion", "1.0"),
        ("ce_id", click.click_id.as_str()),
        ("ce_source", SOURCE),
        ("ce_type", "Click"),
        ("ce_time", time.as_str()),
        ("ce_partitionkey", click.session_id.as_str()),
        ("content-type", "application/json"),
    ]
    .into_iter()
    .fold(OwnedHeaders::new(), |headers, (key, value)| {
        headers.insert(Header {
            key,
            value: Some(value),
        })
    })
}

/// The web tier writing straight to Kafka, with no outbox: a plain
/// idempotent producer (`acks=all`), every click confirmed by the broker.
/// With `partitions`, each session goes to the partition Tidings would
/// place it on ([`Partition::of`](tidings_core::Partition::of)), as on a
/// topic of Tidings' own; without (another team's topic), librdkafka's
/// partitioner places it.
pub async fn produce_to_kafka(
    kafka: &KafkaTransport,
    topic: &str,
    partitions: Option<u32>,
    clicks: Arc<Vec<Click>>,
    written: Arc<AtomicUsize>,
) -> anyhow::Result<()> {
    const IN_FLIGHT: usize = 2_000;
    let producer: FutureProducer = kafka
        .client_config()
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "5")
        .set("message.timeout.ms", "30000")
        .create()
        .context("creating the web tier's Kafka producer")?;
    let mut pending = VecDeque::new();
    for click in clicks.iter() {
        let payload = serde_json::to_vec(click)?;
        let mut record = FutureRecord::to(topic)
            .key(click.session_id.as_str())
            .payload(&payload)
            .headers(record_headers(click));
        if let Some(n) = partitions {
            record = record.partition(tidings_core::Partition::of(&click.session_id, n).index as i32);
        }
        // Enqueued in order (each session's clicks stay in order on its partition).
        let delivery = loop {
            match producer.send_result(record) {
                Ok(delivery) => break delivery,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    record = back;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Err((e, _)) => return Err(e).context(format!("producing a click to {topic}")),
            }
        };
        pending.push_back(delivery);
        while pending.len() >= IN_FLIGHT {
            confirm(pending.pop_front(), topic, &written).await?;
        }
    }
    while !pending.is_empty() {
        confirm(pending.pop_front(), topic, &written).await?;
    }
    Ok(())
}

async fn confirm(
    delivery: Option<rdkafka::producer::DeliveryFuture>,
    topic: &str,
    written: &AtomicUsize,
) -> anyhow::Result<()> {
    if let Some(delivery) = delivery {
        delivery
            .await
            .context("the producer went away")?
            .map_err(|(e, _)| e)
            .with_context(|| format!("Kafka refused a click on {topic}"))?;
        written.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}

/// How long a topic read back stays quiet before it is taken as read to its end.
const QUIET: Duration = Duration::from_secs(3);

/// What a Kafka topic holds, read from its start to its end by a plain client.
#[derive(Debug, Clone, Default)]
pub struct TopicContents {
    /// Records in the topic.
    pub records: u64,
    /// The clicks' ids.
    pub ids: HashSet<String>,
    /// Records that are no click (their reasons, up to five).
    pub unreadable: Vec<String>,
    /// Records that are no click.
    pub unreadable_count: u64,
}

/// Reads every record of the Kafka topic `kafka_topic` (the Tidings topic
/// `topic`), as any client would: the check behind "every click in the
/// topic was scored". The end is when nothing more comes for a while; a
/// topic still being written after `deadline` is an error.
pub async fn read_topic(
    kafka: &KafkaTransport,
    kafka_topic: &str,
    topic: &str,
    deadline: Duration,
) -> anyhow::Result<TopicContents> {
    let mut config = kafka.client_config();
    config
        .set(
            "group.id",
            format!("{kafka_topic}.check-{}", uuid::Uuid::new_v4().simple()),
        )
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false");
    let consumer: BaseConsumer = config.create().context("creating a reader")?;
    let (kafka_topic, topic) = (kafka_topic.to_owned(), topic.to_owned());
    tokio::task::spawn_blocking(move || {
        let timeout = Duration::from_secs(10);
        let metadata = consumer
            .fetch_metadata(Some(&kafka_topic), timeout)
            .with_context(|| format!("reading the metadata of {kafka_topic}"))?;
        let partitions = metadata
            .topics()
            .iter()
            .find(|t| t.name() == kafka_topic)
            .map(|t| t.partitions().len())
            .unwrap_or(0);
        anyhow::ensure!(partitions > 0, "the Kafka topic {kafka_topic} does not exist");
        let mut assignment = TopicPartitionList::new();
        for p in 0..partitions as i32 {
            assignment.add_partition_offset(&kafka_topic, p, Offset::Beginning)?;
        }
        consumer.assign(&assignment)?;
        // The end is when nothing more comes for a while: watermarks are
        // not trusted, some Kafka-compatible brokers report them wrong.
        let mut contents = TopicContents::default();
        let mut last_record = Instant::now();
        let started = Instant::now();
        loop {
            let quiet = last_record.elapsed();
            // The first fetch may take a while: give it longer.
            if quiet >= if contents.records == 0 { 4 * QUIET } else { QUIET } {
                break;
            }
            anyhow::ensure!(
                started.elapsed() < deadline,
                "reading {kafka_topic}: still reading after {} s ({} records): the demo reads what a topic \
                 holds, stop its producer first (or give a longer --timeout)",
                deadline.as_secs(),
                contents.records
            );
            let Some(polled) = consumer.poll(Duration::from_millis(200)) else {
                continue;
            };
            let m = polled.with_context(|| format!("reading {kafka_topic} back"))?;
            last_record = Instant::now();
            contents.records += 1;
            let headers = m
                .headers()
                .map(|h| h.iter().map(|h| (h.key, h.value)).collect::<Vec<_>>())
                .unwrap_or_default();
            let raw = RawMessage::from_record(&topic, m.key(), headers, m.payload().unwrap_or_default());
            match raw
                .decode()
                .map_err(|e| e.to_string())
                .and_then(|envelope| envelope.decode::<Click>().map_err(|e| e.to_string()))
            {
                Ok(click) => {
                    contents.ids.insert(click.click_id);
                }
                Err(reason) => {
                    contents.unreadable_count += 1;
                    if contents.unreadable.len() < 5 {
                        contents.unreadable.push(reason);
                    }
                }
            }
        }
        tracing::debug!(records = contents.records, took = ?started.elapsed(), "read the topic back");
        Ok(contents)
    })
    .await?
}
