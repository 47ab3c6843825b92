//! The topics this process's consumers are fetching from, so that
//! [`KafkaTransport::delete_topic`](crate::KafkaTransport::delete_topic)
//! deletes a topic only once none of them reads it any more.
//!
//! A consumer fetching a partition whose topic was just deleted is not
//! merely an error over Tansu: Tansu answers the fetch of an unknown topic
//! with a leader hint (KIP-951 `CurrentLeader`) and a zero topic id, and
//! librdkafka (2.12) looks that hint up in its metadata cache by a null
//! topic name, a segmentation fault in its main thread
//! (`rd_kafka_metadata_update_op` -> `rd_kafka_metadata_cache_find`).
//! A consumer counts as reading from its creation until it is destroyed
//! (`rd_kafka_destroy` has joined its threads: no fetch response is
//! handled after that).

use std::collections::BTreeMap;
use std::ops::Deref;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// (bootstrap servers, Kafka topic) -> consumers of this process reading it.
static READING: Mutex<BTreeMap<(String, String), usize>> = Mutex::new(BTreeMap::new());

fn reading() -> std::sync::MutexGuard<'static, BTreeMap<(String, String), usize>> {
    // The map holds plain counts: a panic elsewhere leaves it consistent.
    READING.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A consumer of this process reading `topic`, counted until it is dropped.
pub(crate) struct Reader<C> {
    // Dropped first (fields drop in declaration order): the topic stays
    // counted until the client is destroyed.
    consumer: C,
    _reading: Reading,
}

impl<C> Reader<C> {
    pub(crate) fn new(brokers: &str, topic: &str, consumer: C) -> Self {
        let key = (brokers.to_owned(), topic.to_owned());
        *reading().entry(key.clone()).or_default() += 1;
        Reader {
            consumer,
            _reading: Reading { key },
        }
    }
}

impl<C> Deref for Reader<C> {
    type Target = C;

    fn deref(&self) -> &C {
        &self.consumer
    }
}

struct Reading {
    key: (String, String),
}

impl Drop for Reading {
    fn drop(&mut self) {
        let mut reading = reading();
        if let Some(count) = reading.get_mut(&self.key) {
            *count -= 1;
            if *count == 0 {
                reading.remove(&self.key);
            }
        }
    }
}

/// Waits up to `timeout` until no consumer of this process reads any of
/// `topics` at `brokers`; the first topic still read otherwise.
pub(crate) async fn unread<'a>(brokers: &str, topics: &[&'a str], timeout: Duration) -> Result<(), &'a str> {
    let deadline = Instant::now() + timeout;
    loop {
        let still = {
            let reading = reading();
            topics
                .iter()
                .find(|topic| reading.contains_key(&(brokers.to_owned(), (**topic).to_owned())))
                .copied()
        };
        match still {
            None => return Ok(()),
            Some(topic) if Instant::now() >= deadline => return Err(topic),
            Some(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_topic_is_unread_once_its_readers_are_dropped() {
        let (brokers, topic) = ("reading-test:9092", "reading-test.topic");
        let first = Reader::new(brokers, topic, ());
        let second = Reader::new(brokers, topic, ());
        assert_eq!(
            unread(brokers, &["other", topic], Duration::from_millis(20)).await,
            Err(topic),
            "two readers"
        );
        drop(first);
        assert_eq!(
            unread(brokers, &[topic], Duration::from_millis(20)).await,
            Err(topic),
            "one reader left"
        );
        assert_eq!(
            unread("elsewhere:9092", &[topic], Duration::ZERO).await,
            Ok(()),
            "another cluster's topic"
        );
        let dropping = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            drop(second);
        });
        assert_eq!(unread(brokers, &[topic], Duration::from_secs(5)).await, Ok(()));
        dropping.await.unwrap();
        assert!(!reading().contains_key(&(brokers.to_owned(), topic.to_owned())));
    }
}
