//! A consumer group that needs no order reads standard queues from the same
//! FIFO topic as the groups that keep it, gets every message, and
//! dead-letters into a standard queue; against moto's server
//! (`SQS_ENDPOINT`).

use std::collections::BTreeSet;
use std::time::Duration;

use futures::StreamExt;
use tidings_broker_sqs::{SqsOptions, SqsTransport};
use tidings_core::{AckKind, Partition, Publisher, Subscriber, Subscription};
use tidings_testkit::conformance::{Probe, fresh_group, fresh_topic, probe};
use tidings_testkit::sqs::sqs_url;

async fn open(unordered: &str) -> SqsTransport {
    let options = SqsOptions::default()
        .static_credentials("test", "test")
        .partitions(2)
        .receive_wait(Duration::from_secs(1))
        .visibility_timeout(Duration::from_secs(5))
        .unordered(unordered);
    SqsTransport::connect_with(&sqs_url(), options)
        .await
        .unwrap_or_else(|e| panic!("moto's SNS/SQS is not reachable (set SQS_ENDPOINT): {e}"))
}

/// The `(key, seq)` of `n` deliveries, each settled as `settle` says.
async fn read(
    sub: &mut Subscription,
    n: usize,
    settle: impl Fn(&Probe) -> AckKind,
) -> BTreeSet<(String, u32)> {
    let mut got = BTreeSet::new();
    while got.len() < n {
        let d = tokio::time::timeout(Duration::from_secs(30), sub.next())
            .await
            .unwrap_or_else(|_| panic!("{} of {n} messages within 30 s", got.len()))
            .expect("a delivery")
            .expect("not an error");
        let p = d.message.decode().unwrap().decode::<Probe>().unwrap();
        d.ack(settle(&p)).await.unwrap();
        got.insert((p.key, p.seq));
    }
    got
}

#[tokio::test]
async fn a_group_that_needs_no_order_reads_standard_queues_of_the_same_topic() {
    let topic = fresh_topic();
    let (ordered, counting) = (fresh_group("ordered"), fresh_group("counting"));
    let t = open(&counting).await;
    for group in [&ordered, &counting] {
        t.ensure_group(group, &topic).await.unwrap();
    }
    for p in Partition::all(2) {
        assert!(t.partition_queue(&topic, &ordered, p).ends_with(".fifo"));
        let standard = t.partition_queue(&topic, &counting, p);
        assert!(!standard.ends_with(".fifo"), "{standard}");
        assert!(
            t.queue_depth(&standard).await.unwrap().is_some(),
            "{standard} exists"
        );
    }

    let sent: Vec<_> = ["a", "b", "c", "d"]
        .iter()
        .flat_map(|key| (1..=5).map(|seq| probe(&topic, key, seq)))
        .collect();
    t.publish(&sent).await.unwrap();
    let all: BTreeSet<(String, u32)> = ["a", "b", "c", "d"]
        .iter()
        .flat_map(|key| (1..=5).map(|seq| (key.to_string(), seq)))
        .collect();

    let mut reading = t.subscribe(&ordered, &topic).await.unwrap();
    assert_eq!(read(&mut reading, all.len(), |_| AckKind::Ack).await, all);
    reading.close().await.unwrap();

    // The group that needs no order gets every message too; one it
    // refuses goes to its standard dead-letter queue.
    let mut reading = t.subscribe(&counting, &topic).await.unwrap();
    let settle = |p: &Probe| {
        if p.key == "b" && p.seq == 3 {
            AckKind::Term
        } else {
            AckKind::Ack
        }
    };
    assert_eq!(read(&mut reading, all.len(), settle).await, all);
    reading.close().await.unwrap();
    let dead = t.dead_letter_queue(&topic, &counting);
    assert!(!dead.ends_with(".fifo"), "{dead}");
    assert_eq!(
        t.queue_depth(&dead).await.unwrap(),
        Some(1),
        "the refused message in {dead}"
    );

    for group in [&ordered, &counting] {
        let _ = t.delete_group(&topic, group).await;
    }
    let _ = t.delete_topic(&t.topic(&topic)).await;
}
