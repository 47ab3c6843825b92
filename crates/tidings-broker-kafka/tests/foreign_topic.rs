//! A Kafka topic another team created and fills: six partitions, records
//! placed by their client's partitioner. A Tidings group of two members
//! configured for six reads it whole, every record once; a transport
//! configured for another count is refused at start, naming both counts,
//! instead of reading a subset in silence.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tidings_broker_kafka::{KafkaOptions, KafkaTransport};
use tidings_consumer::{Consumer, ConsumerConfig, Context, Handler, HandlerError};
use tidings_testkit::conformance::foreign_kafka_topic;
use tidings_testkit::kafka::kafka_url;
use tidings_testkit::services::PgTestDb;
use tokio_util::sync::CancellationToken;

const RECORDS: usize = 120;

/// Counts the handlings of each event, by its id as written.
#[derive(Debug, Clone, Default)]
struct Count(Arc<Mutex<HashMap<String, usize>>>);

#[async_trait::async_trait]
impl<DB: sqlx::Database> Handler<DB> for Count {
    async fn handle(&self, ctx: &mut Context<'_, DB>) -> Result<(), HandlerError> {
        *self
            .0
            .lock()
            .unwrap()
            .entry(ctx.envelope().event_id())
            .or_default() += 1;
        Ok(())
    }
}

async fn transport(url: &str, partitions: u32) -> KafkaTransport {
    KafkaTransport::connect_with(url, KafkaOptions::default().partitions(partitions))
        .await
        .unwrap_or_else(|e| panic!("Kafka is not reachable at {url} (set KAFKA_URL): {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_six_partition_topic_is_read_whole_and_a_wrong_count_is_refused() {
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

    // Configured for six: two members share the partitions and read all.
    let six = Arc::new(transport(&url, 6).await);
    let stop = CancellationToken::new();
    let count = Count::default();
    let members: Vec<_> = ["a", "b"]
        .into_iter()
        .map(|member| {
            let consumer = Consumer::new("ledger", db.store.clone(), count.clone())
                .topic(topic.clone())
                .config(ConsumerConfig::default().member(member));
            let (six, stop) = (six.clone(), stop.clone());
            tokio::spawn(async move { consumer.run(six.as_ref(), stop).await })
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

    six.delete_topic(&topic).await.unwrap();
    db.drop_schema().await;
}
