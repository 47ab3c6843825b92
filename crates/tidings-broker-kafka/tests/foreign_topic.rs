//! A Kafka topic another team created and fills: six partitions, records
//! placed by their client's partitioner. Declared as theirs
//! (`KafkaOptions::foreign`), under a Tidings name of its own and with no
//! partition count configured, it is read whole by a group of two members:
//! its six partitions found on the broker, every record handled once, the
//! one its handler gives up on copied to a dead-letter topic of Tidings'
//! own with as many partitions, its key not held (the other team's
//! partitioner placed the keys: a hold could not follow them). Read as a topic of Tidings' own by a
//! transport configured for another count, it is refused at start, naming
//! both counts, instead of read in part in silence.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tidings_broker_kafka::{KafkaOptions, KafkaTransport};
use tidings_consumer::{Consumer, ConsumerConfig, Context, Handler, HandlerError};
use tidings_core::{Publisher, Subscriber};
use tidings_testkit::conformance::foreign_kafka_topic;
use tidings_testkit::kafka::kafka_url;
use tidings_testkit::services::PgTestDb;
use tokio_util::sync::CancellationToken;

const RECORDS: usize = 120;

/// The event its handler gives up on.
const REFUSED: &str = "evt_fill_7";

/// Counts the handlings of each event, by its id as written; refuses one.
#[derive(Debug, Clone, Default)]
struct Count(Arc<Mutex<HashMap<String, usize>>>);

#[async_trait::async_trait]
impl<DB: sqlx::Database> Handler<DB> for Count {
    async fn handle(&self, ctx: &mut Context<'_, DB>) -> Result<(), HandlerError> {
        let id = ctx.envelope().event_id();
        *self.0.lock().unwrap().entry(id.clone()).or_default() += 1;
        if id == REFUSED {
            return Err(HandlerError::permanent("this payment is refused"));
        }
        Ok(())
    }
}

async fn transport(url: &str, partitions: u32) -> KafkaTransport {
    KafkaTransport::connect_with(url, KafkaOptions::default().partitions(partitions))
        .await
        .unwrap_or_else(|e| panic!("Kafka is not reachable at {url} (set KAFKA_URL): {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_six_partition_topic_is_discovered_read_whole_and_a_wrong_count_is_refused() {
    let url = kafka_url();
    let topic = format!("payments-{}", uuid::Uuid::new_v4().simple());
    let placed = foreign_kafka_topic(&url, &topic, RECORDS, 6).await;
    assert_eq!(placed.values().sum::<usize>(), RECORDS);
    assert!(
        placed.len() > 1,
        "the foreign partitioner used one partition: {placed:?}"
    );
    let db = PgTestDb::new().await;

    // Configured for four: refused before reading anything.
    let four = transport(&url, 4).await;
    let count = Count::default();
    let refused = Consumer::new("ledger-four", db.store.clone(), count.clone())
        .topic(topic.clone())
        .run(&four, CancellationToken::new())
        .await
        .expect_err("a transport configured for 4 partitions of a 6-partition topic");
    let reason = refused.to_string();
    assert!(
        reason.contains("6 partitions on the broker") && reason.contains("configured for 4"),
        "{reason}"
    );
    assert!(count.0.lock().unwrap().is_empty());
    // Nor is it written to: a relay so configured keeps its records and says why.
    let refused = four
        .publish(&[tidings_testkit::conformance::probe(&topic, "k", 1)])
        .await
        .expect_err("publishing as to a 4-partition topic");
    let reason = refused.to_string();
    assert!(
        reason.contains("6 partitions on the broker") && reason.contains("configured for 4"),
        "{reason}"
    );
    assert!(
        refused.class().is_retryable(),
        "the relay keeps the records: {reason}"
    );

    // Declared as another team's, no count configured: two members share
    // the partitions found on the broker and read all.
    let tidings_topic = format!("ledger-in-{}", uuid::Uuid::new_v4().simple());
    let theirs = Arc::new(
        KafkaTransport::connect_with(&url, KafkaOptions::default().foreign(&tidings_topic, &topic))
            .await
            .unwrap(),
    );
    let stop = CancellationToken::new();
    let count = Count::default();
    let members: Vec<_> = ["a", "b"]
        .into_iter()
        .map(|member| {
            // The default, OnDeadLetter::HoldKey: not applied here, as the
            // other team's partitioner placed the keys.
            let config = ConsumerConfig::default().member(member).max_attempts(1);
            let consumer = Consumer::new("ledger", db.store.clone(), count.clone())
                .topic(tidings_topic.clone())
                .config(config);
            let (theirs, stop) = (theirs.clone(), stop.clone());
            tokio::spawn(async move { consumer.run(theirs.as_ref(), stop).await })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    while count.0.lock().unwrap().len() < RECORDS {
        assert!(
            Instant::now() < deadline,
            "{} of {RECORDS} records handled after 60 s",
            count.0.lock().unwrap().len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.cancel();
    for member in members {
        member.await.unwrap().unwrap();
    }
    let seen = count.0.lock().unwrap().clone();
    assert_eq!(seen.len(), RECORDS);
    assert!(seen.values().all(|n| *n == 1), "an event handled twice: {seen:?}");
    assert!((0..RECORDS).all(|n| seen.contains_key(&format!("evt_fill_{n}"))));
    assert_eq!(theirs.partitions(&tidings_topic), 6, "found on the broker");
    assert!(
        !theirs.places_keys(&tidings_topic),
        "another partitioner placed the keys: the refused event's key is not held, its later \
         events (evt_fill_47, evt_fill_87) were handled"
    );

    let dead = theirs.dead_letter_records(&tidings_topic).await.unwrap();
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].decode().unwrap().event_id(), REFUSED);
    let dead_topic = theirs.dead_letter_topic(&tidings_topic);
    assert_eq!(
        dead_topic,
        format!("{tidings_topic}.tidings.dlq"),
        "Tidings' own name"
    );
    assert_eq!(theirs.broker_partitions(&dead_topic).await.unwrap(), Some(6));

    // Deleting the Tidings topic leaves the other team's topic alone.
    theirs.delete_topic(&tidings_topic).await.unwrap();
    assert_eq!(theirs.broker_partitions(&topic).await.unwrap(), Some(6));
    four.delete_topic(&topic).await.unwrap();
    db.drop_schema().await;
}
