//! Records the relay cannot send over this transport: a body that is not
//! an envelope, and (where the transport has a limit) a record larger than
//! it takes. Each is set aside, only its key waits, and a skip lets the key
//! go on, in order.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use tidings_core::{DeadLetterFilter, FailureStore, RELAY_LETTERS, Skip};
use tidings_relay::{Relay, Round};

use super::{TransportUnderTest, decode, fresh_topic, maybe_next, next, probe, subscribe};
use crate::store_conformance::fixtures::StoreExt;
use crate::store_conformance::poison::overwrite_body;

/// A corrupt record among others: every other record reaches the group in
/// order, the corrupt one is set aside, and its key's later records follow
/// once it is skipped.
pub async fn a_corrupt_record_waits_alone_with_its_key<T: TransportUnderTest>(t: &T) {
    cannot_send(t, false).await;
}

/// The same with a record larger than the transport takes (its limit is
/// about 1 MiB: NATS's `max_payload`, Kafka's `message.max.bytes`, or
/// RabbitMQ's `max_message_size` as the transport under test is told).
pub async fn an_oversized_record_waits_alone_with_its_key<T: TransportUnderTest>(t: &T) {
    cannot_send(t, true).await;
}

async fn cannot_send<T: TransportUnderTest>(t: &T, oversized: bool) {
    let db = crate::services::SqliteTestDb::new().await;
    let topic = fresh_topic();
    let mut sub = subscribe(t, "relayed", &topic).await;
    let keys = ["k0", "k1", "k2", "bad"];
    let mut records = Vec::new();
    for seq in 1..=5 {
        for key in keys {
            let mut m = probe(&topic, key, seq);
            if key == "bad" && seq == 2 && oversized {
                let pad = "x".repeat(1_300_000);
                m.envelope.payload = format!(r#"{{"key":"bad","seq":2,"pad":"{pad}"}}"#).into_bytes();
            }
            records.push(m);
        }
    }
    // Seq 2 of the key "bad": the second round of keys, the fourth key.
    let bad_id = records[4 + 3].envelope.id;
    db.store.enqueue_all(&records).await;
    if !oversized {
        overwrite_body(&db.store, bad_id, b"{\"specversion\": 1").await;
    }
    let relay = Relay::new(db.store.clone(), t.publisher().await);
    // A round the transport failed for a passing cause (a channel still
    // closing after the refused record) is made again; any other error fails.
    let drain = || async {
        loop {
            match relay.round().await {
                Ok(Round::Idle) => break,
                Ok(_) => {}
                Err(e) if e.class().is_retryable() => {
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await
                }
                Err(e) => panic!("a relay round failed: {e}"),
            }
        }
    };
    drain().await;

    let letters = db
        .store
        .dead_letters(&DeadLetterFilter::default().consumer(RELAY_LETTERS))
        .await
        .unwrap();
    assert_eq!(letters.len(), 1, "one record set aside: {letters:?}");
    assert_eq!(letters[0].message_id, Some(bad_id));
    let reason = &letters[0].errors[0].error;
    if oversized {
        assert!(
            [
                "max_payload",
                "message.max.bytes",
                "max_message_size",
                "too large"
            ]
            .iter()
            .any(|limit| reason.to_lowercase().contains(limit)),
            "the reason names the limit: {reason}"
        );
    } else {
        assert!(reason.contains("not an envelope"), "{reason}");
    }

    // The relay may publish a record again while it looks for the one at
    // fault (Kafka keeps both copies): consumers deduplicate on the id, and
    // so does this count.
    let mut seen = HashSet::new();
    let got = distinct(&mut sub, 3 * 5 + 1, &mut seen, "the records of the keys not held").await;
    for key in ["k0", "k1", "k2"] {
        assert_eq!(got[key], vec![1, 2, 3, 4, 5], "key {key} whole and in order");
    }
    assert_eq!(got["bad"], vec![1], "the bad key stops before its bad record");
    assert_eq!(
        db.store.skip(letters[0].id).await.unwrap(),
        Skip::Skipped { released_key: true }
    );
    drain().await;
    let rest = distinct(&mut sub, 3, &mut seen, "the held key's later records").await;
    assert_eq!(
        rest.get("bad"),
        Some(&vec![3, 4, 5]),
        "the key goes on in order without the record skipped: {rest:?}"
    );
    while let Some(d) = maybe_next(&mut sub, Duration::from_millis(500)).await {
        let (e, p) = decode(&d);
        assert!(seen.contains(&e.id), "nothing new arrives, but {p:?} did");
        d.ack(tidings_core::AckKind::Ack).await.unwrap();
    }
}

/// The next `n` records not seen yet, by key in arrival order; every delivery acknowledged.
async fn distinct(
    sub: &mut tidings_core::Subscription,
    n: usize,
    seen: &mut HashSet<uuid::Uuid>,
    what: &str,
) -> BTreeMap<String, Vec<u32>> {
    let mut got: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    let mut fresh = 0;
    while fresh < n {
        let d = next(sub, what).await;
        let (e, p) = decode(&d);
        if seen.insert(e.id) {
            fresh += 1;
            got.entry(p.key).or_default().push(p.seq);
        }
        d.ack(tidings_core::AckKind::Ack).await.unwrap();
    }
    got
}
