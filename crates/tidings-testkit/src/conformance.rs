//! The transport conformance suite: one set of checks every transport must
//! pass, in the manner of Watermill's `TestPubSub`.
//!
//! A transport crate implements [`TransportUnderTest`] for a fixture that
//! points at a real broker (or database) and expands
//! [`transport_conformance!`](crate::transport_conformance) once, naming the
//! optional features it has (its declaration of features, as Watermill's
//! `Features` struct; a feature left out is a documented limitation, and
//! its check is not generated rather than passed vacuously):
//!
//! ```ignore
//! tidings_testkit::transport_conformance!(async { MyFixture::new().await },
//!     features: [cloudevents_attributes_travel_as_headers]);
//! ```
//!
//! The contract every transport keeps:
//!
//! - a consumer group receives every message published to the topic after
//!   it first subscribed, or was first ensured (and may receive older
//!   retained ones);
//! - messages of one key arrive in publish order;
//! - a topic's partitions split a group: each member reading some of them
//!   gets exactly the keys that fall in those;
//! - `publish` returning `Ok` means the transport has the message: a member
//!   connecting afterwards gets it;
//! - a delivery that is not settled is delivered again after the
//!   subscription closes (a crash) or after `Nak(delay)`;
//! - `Ack` and `Term` settle a delivery for the group for good.

mod foreign;
pub use foreign::python as foreign_python;
mod poison;

pub use foreign::{
    ForeignAddress, foreign_kafka_clicks, foreign_kafka_topic, foreign_names_are_read,
    foreign_plain_json_is_read_once, foreign_producers_are_read_once,
    foreign_readers_recognise_what_tidings_publishes, read_plain_json, run_client,
    the_rust_sdk_reads_what_tidings_publishes,
};
pub use poison::{a_corrupt_record_waits_alone_with_its_key, an_oversized_record_waits_alone_with_its_key};

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use tidings_core::{
    AckKind, Delivery, Envelope, Kind, Message, OutgoingMessage, Partition, Publisher, Subscriber,
    Subscription,
};
use uuid::Uuid;

/// A transport pointed at a real service, for the suite.
#[async_trait]
pub trait TransportUnderTest: Send + Sync + 'static {
    /// A publisher (a new connection where the transport has connections).
    async fn publisher(&self) -> Arc<dyn Publisher>;

    /// A subscriber standing for one group member (a new connection where
    /// the transport has connections), configured with at least two
    /// partitions per topic, so that the suite runs partitioned and checks
    /// that partitions split a group's work.
    async fn subscriber(&self) -> Arc<dyn Subscriber>;

    /// How long an unsettled delivery of a closed subscription takes to come back.
    fn redelivery_wait(&self) -> Duration {
        Duration::from_secs(10)
    }

    /// Releases what the fixture created (called after a passing check).
    async fn teardown(&self) {}

    /// How its binary mode names CloudEvents attribute headers: `ce-` as
    /// the HTTP binding does (NATS, RabbitMQ), `ce_` on Kafka.
    fn binding(&self) -> tidings_core::cloudevents::Binding {
        tidings_core::cloudevents::Binding::Standard
    }

    /// A publisher writing CloudEvents in `mode`; the default opens only
    /// binary mode ([`TransportUnderTest::publisher`]).
    async fn publisher_in(&self, mode: tidings_core::cloudevents::ContentMode) -> Arc<dyn Publisher> {
        assert_eq!(
            mode,
            tidings_core::cloudevents::ContentMode::Binary,
            "this fixture opens no structured-mode publisher"
        );
        self.publisher().await
    }

    /// Where other teams' clients read what it writes for `topic`, for the
    /// interoperability checks (`None`: no foreign client reads it).
    fn foreign_address(&self, topic: &str) -> Option<ForeignAddress> {
        let _ = topic;
        None
    }

    /// A subscriber reading `topic` from resources another team made under
    /// `name` with the foreign client's `own` command (a NATS stream
    /// holding `<name>.>`, a RabbitMQ topic exchange `<name>`), by their
    /// names (`None`: the transport reads no other naming).
    async fn foreign_subscriber(&self, topic: &str, name: &str) -> Option<Arc<dyn Subscriber>> {
        let _ = (topic, name);
        None
    }
}

/// The event the suite publishes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Probe {
    /// Its key.
    pub key: String,
    /// Its number within the key.
    pub seq: u32,
}

impl Message for Probe {
    const TYPE: &'static str = "Probe";
    const VERSION: u32 = 1;
    const KIND: Kind = Kind::Event;
    const AGGREGATE: &'static str = "probe";
    const TOPIC: &'static str = "conformance";
    fn key(&self) -> String {
        self.key.clone()
    }
}

/// A topic no other test uses.
pub fn fresh_topic() -> String {
    format!("conf.{}", Uuid::new_v4().simple())
}

/// A group name no other test uses.
pub fn fresh_group(role: &str) -> String {
    format!("{role}-{}", &Uuid::new_v4().simple().to_string()[..8])
}

/// A [`Probe`] for `topic`, the `seq`-th of `key`, with a trace context
/// and a header of the caller's own.
pub fn probe(topic: &str, key: &str, seq: u32) -> OutgoingMessage {
    let envelope = Envelope::new(
        "conformance",
        &Probe {
            key: key.to_owned(),
            seq,
        },
    )
    .expect("probe encodes")
    .header(
        "traceparent",
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    )
    .header("X-Tenant", "acme");
    OutgoingMessage {
        topic: topic.to_owned(),
        envelope,
    }
}

/// `per_key` probes for each of `keys`, interleaved across keys.
fn probes(topic: &str, keys: usize, per_key: u32) -> Vec<OutgoingMessage> {
    (1..=per_key)
        .flat_map(|seq| (0..keys).map(move |k| probe(topic, &format!("k{k}"), seq)))
        .collect()
}

const WAIT: Duration = Duration::from_secs(30);

async fn next(sub: &mut Subscription, what: &str) -> Delivery {
    match tokio::time::timeout(WAIT, sub.next()).await {
        Ok(Some(Ok(d))) => d,
        Ok(Some(Err(e))) => panic!("subscription error while waiting for {what}: {e}"),
        Ok(None) => panic!("subscription ended while waiting for {what}"),
        Err(_) => panic!("nothing delivered within {WAIT:?} while waiting for {what}"),
    }
}

/// Waits up to `within` for a delivery; `None` if none comes.
async fn maybe_next(sub: &mut Subscription, within: Duration) -> Option<Delivery> {
    match tokio::time::timeout(within, sub.next()).await {
        Ok(Some(Ok(d))) => Some(d),
        Ok(Some(Err(e))) => panic!("subscription error: {e}"),
        _ => None,
    }
}

fn decode(d: &Delivery) -> (Envelope, Probe) {
    let e = d
        .message
        .decode()
        .unwrap_or_else(|err| panic!("delivered message does not decode: {err}"));
    let p = e.decode::<Probe>().expect("probe payload");
    (e, p)
}

/// Receives `n` deliveries, acknowledging each; returns their envelopes in arrival order.
async fn receive_all(sub: &mut Subscription, n: usize, what: &str) -> Vec<Envelope> {
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let d = next(sub, what).await;
        out.push(decode(&d).0);
        d.ack(AckKind::Ack).await.expect("ack");
    }
    out
}

/// Subscribes a fresh group (named after `role`) to `topic`.
async fn subscribe<T: TransportUnderTest>(t: &T, role: &str, topic: &str) -> Subscription {
    t.subscriber()
        .await
        .subscribe(&fresh_group(role), topic)
        .await
        .unwrap()
}

/// Publishes one probe of key `k` to `topic`, returning it.
async fn publish_one<T: TransportUnderTest>(t: &T, topic: &str) -> OutgoingMessage {
    let sent = probe(topic, "k", 1);
    t.publisher()
        .await
        .publish(std::slice::from_ref(&sent))
        .await
        .unwrap();
    sent
}

/// A message published goes to a subscribed group, whole.
pub async fn publish_and_receive<T: TransportUnderTest>(t: &T) {
    let topic = fresh_topic();
    let mut sub = subscribe(t, "g", &topic).await;
    let sent = probes(&topic, 2, 2);
    t.publisher().await.publish(&sent).await.unwrap();
    let got = receive_all(&mut sub, sent.len(), "published messages").await;
    let by_id: BTreeMap<Uuid, &Envelope> = got.iter().map(|e| (e.id, e)).collect();
    for m in &sent {
        let e = by_id
            .get(&m.envelope.id)
            .unwrap_or_else(|| panic!("message {} not delivered", m.envelope.id));
        assert_eq!(**e, m.envelope, "the envelope changed in transit");
    }
    sub.close().await.unwrap();
}

/// A group ensured before the first publish (`Subscriber::ensure_group`),
/// without reading, gets everything published afterwards when its first
/// member subscribes: what a member process starting after the relay needs.
pub async fn an_ensured_group_keeps_what_is_published_next<T: TransportUnderTest>(t: &T) {
    let topic = fresh_topic();
    let group = fresh_group("ensured");
    let subscriber = t.subscriber().await;
    subscriber.ensure_group(&group, &topic).await.unwrap();
    // Ensuring twice is harmless.
    subscriber.ensure_group(&group, &topic).await.unwrap();
    let sent = probes(&topic, 3, 3);
    t.publisher().await.publish(&sent).await.unwrap();
    let mut sub = t.subscriber().await.subscribe(&group, &topic).await.unwrap();
    let got: HashSet<Uuid> = receive_all(
        &mut sub,
        sent.len(),
        "messages published after the group was ensured",
    )
    .await
    .iter()
    .map(|e| e.id)
    .collect();
    assert_eq!(got, sent.iter().map(|m| m.envelope.id).collect::<HashSet<_>>());
    sub.close().await.unwrap();
}

/// The broker counts what a group has not settled (`Subscriber::pending`):
/// nothing for a group it does not have, everything published for an
/// ensured group nobody reads, nothing once a member has acknowledged it all.
/// Optional (`broker_counts_pending`): the database log's lag is read from the store.
pub async fn broker_counts_pending<T: TransportUnderTest>(t: &T) {
    let topic = fresh_topic();
    let group = fresh_group("counted");
    let subscriber = t.subscriber().await;
    assert_eq!(
        subscriber.pending(&group, &topic).await.unwrap(),
        None,
        "an unknown group"
    );
    subscriber.ensure_group(&group, &topic).await.unwrap();
    let sent = probes(&topic, 3, 2);
    t.publisher().await.publish(&sent).await.unwrap();
    let deadline = std::time::Instant::now() + WAIT;
    while subscriber.pending(&group, &topic).await.unwrap() != Some(sent.len() as u64) {
        assert!(
            std::time::Instant::now() < deadline,
            "pending is {:?}, not the {} published",
            subscriber.pending(&group, &topic).await.unwrap(),
            sent.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut sub = subscriber.subscribe(&group, &topic).await.unwrap();
    receive_all(&mut sub, sent.len(), "the counted messages").await;
    while subscriber.pending(&group, &topic).await.unwrap() != Some(0) {
        assert!(
            std::time::Instant::now() < deadline,
            "pending is {:?} after every message was acknowledged",
            subscriber.pending(&group, &topic).await.unwrap()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    sub.close().await.unwrap();
}

/// Every group gets every message.
pub async fn fan_out_to_every_group<T: TransportUnderTest>(t: &T) {
    let topic = fresh_topic();
    let mut a = t
        .subscriber()
        .await
        .subscribe(&fresh_group("a"), &topic)
        .await
        .unwrap();
    let mut b = t
        .subscriber()
        .await
        .subscribe(&fresh_group("b"), &topic)
        .await
        .unwrap();
    let sent = probes(&topic, 3, 4);
    t.publisher().await.publish(&sent).await.unwrap();
    let ids: HashSet<Uuid> = sent.iter().map(|m| m.envelope.id).collect();
    for (name, sub) in [("a", &mut a), ("b", &mut b)] {
        let got: HashSet<Uuid> = receive_all(sub, sent.len(), name)
            .await
            .iter()
            .map(|e| e.id)
            .collect();
        assert_eq!(got, ids, "group {name} missed messages");
    }
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// Two members of one group, each reading half of the partitions, split
/// the messages: the group gets each message once, every key reaches one
/// member only (the one reading its partition), in order.
pub async fn partitions_split_a_group<T: TransportUnderTest>(t: &T) {
    let topic = fresh_topic();
    let group = fresh_group("shared");
    let count = t.subscriber().await.partitions(&topic);
    assert!(
        count >= 2,
        "the fixture must give topics at least 2 partitions for this check (it gives {count})"
    );
    let mut members = Vec::new();
    for parity in 0..2 {
        let subscriber = t.subscriber().await;
        let mut parts = Vec::new();
        for partition in Partition::all(count).filter(|p| p.index % 2 == parity) {
            parts.push(
                subscriber
                    .subscribe_partition(&group, &topic, partition)
                    .await
                    .unwrap(),
            );
        }
        members.push(Subscription::merge(parts));
    }
    let sent = probes(&topic, 16, 20);
    t.publisher().await.publish(&sent).await.unwrap();
    // Both members working at once, each acknowledging at once.
    type Seen = BTreeMap<Uuid, Vec<(u32, Probe)>>;
    let seen: Arc<std::sync::Mutex<Seen>> = Arc::default();
    let total = sent.len();
    let tasks: Vec<_> = members
        .into_iter()
        .zip(0u32..)
        .map(|(mut sub, member)| {
            let seen = seen.clone();
            tokio::spawn(async move {
                let deadline = Instant::now() + WAIT;
                while seen.lock().expect("lock").len() < total && Instant::now() < deadline {
                    if let Some(d) = maybe_next(&mut sub, Duration::from_millis(100)).await {
                        d.ack(AckKind::Ack).await.expect("ack");
                        let (e, probe) = decode(&d);
                        seen.lock()
                            .expect("lock")
                            .entry(e.id)
                            .or_default()
                            .push((member, probe));
                    }
                }
                sub
            })
        })
        .collect();
    let mut subs = Vec::new();
    for task in tasks {
        subs.push(task.await.expect("member"));
    }
    let seen = seen.lock().expect("lock").clone();
    assert_eq!(seen.len(), total, "the group missed messages");
    assert!(
        seen.values().all(|d| d.len() == 1),
        "a message reached the group twice"
    );
    let mut by_key: BTreeMap<String, Vec<(u32, u32)>> = BTreeMap::new();
    for (member, probe) in seen.values().flatten() {
        by_key
            .entry(probe.key.clone())
            .or_default()
            .push((*member, probe.seq));
    }
    let mut per_member = [0usize; 2];
    for (key, got) in &by_key {
        let member = Partition::of(key, count).index % 2;
        assert!(
            got.iter().all(|(m, _)| *m == member),
            "key {key} reached a member not reading its partition"
        );
        per_member[member as usize] += got.len();
    }
    assert!(
        per_member.iter().all(|&n| n > 0),
        "one member got everything: {per_member:?}"
    );
    for sub in subs {
        sub.close().await.unwrap();
    }
}

/// A key's messages arrive in publish order.
pub async fn order_is_kept_per_key<T: TransportUnderTest>(t: &T) {
    let topic = fresh_topic();
    let mut sub = subscribe(t, "o", &topic).await;
    let publisher = t.publisher().await;
    let sent = probes(&topic, 5, 20);
    // Several batches, as the relay sends them.
    for chunk in sent.chunks(17) {
        publisher.publish(chunk).await.unwrap();
    }
    let got = receive_all(&mut sub, sent.len(), "ordered messages").await;
    let mut per_key: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for e in got {
        per_key
            .entry(e.aggregate_key.clone())
            .or_default()
            .push(e.decode::<Probe>().unwrap().seq);
    }
    for (key, seqs) in per_key {
        assert_eq!(seqs, (1..=20).collect::<Vec<_>>(), "key {key} out of order");
    }
    sub.close().await.unwrap();
}

/// A delivery never settled (the member crashed) comes back to the group.
pub async fn unsettled_delivery_is_redelivered_after_a_crash<T: TransportUnderTest>(t: &T) {
    let topic = fresh_topic();
    let group = fresh_group("crash");
    let mut sub = t.subscriber().await.subscribe(&group, &topic).await.unwrap();
    let sent = publish_one(t, &topic).await;
    let d = next(&mut sub, "the first delivery").await;
    assert_eq!(decode(&d).0.id, sent.envelope.id);
    // Crash: no ack, the member goes away.
    drop(d);
    sub.close().await.unwrap();
    let mut again = t.subscriber().await.subscribe(&group, &topic).await.unwrap();
    let d = tokio::time::timeout(t.redelivery_wait() + WAIT, again.next())
        .await
        .expect("the unsettled message was not redelivered")
        .expect("stream open")
        .expect("delivery");
    assert_eq!(decode(&d).0.id, sent.envelope.id);
    d.ack(AckKind::Ack).await.unwrap();
    again.close().await.unwrap();
}

/// `Nak(delay)` brings the message back, not before the delay.
pub async fn nak_with_delay_redelivers_later<T: TransportUnderTest>(t: &T) {
    let topic = fresh_topic();
    let mut sub = subscribe(t, "nak", &topic).await;
    let sent = publish_one(t, &topic).await;
    let d = next(&mut sub, "the first delivery").await;
    let delay = Duration::from_millis(500);
    let naked = Instant::now();
    d.ack(AckKind::Nak(Some(delay))).await.unwrap();
    let d = next(&mut sub, "the redelivery").await;
    let waited = naked.elapsed();
    assert_eq!(decode(&d).0.id, sent.envelope.id);
    assert!(
        waited >= delay.mul_f32(0.8),
        "redelivered after {waited:?}, before the {delay:?} asked for"
    );
    assert!(
        d.delivery_count >= 2 || d.delivery_count == 0,
        "delivery count {}",
        d.delivery_count
    );
    d.ack(AckKind::Ack).await.unwrap();
    sub.close().await.unwrap();
}

/// Acknowledged and terminated deliveries stay settled across a restart;
/// the rest come back.
pub async fn settled_messages_stay_settled_across_restart<T: TransportUnderTest>(t: &T) {
    let topic = fresh_topic();
    let group = fresh_group("restart");
    let mut sub = t.subscriber().await.subscribe(&group, &topic).await.unwrap();
    let sent = probes(&topic, 1, 10);
    t.publisher().await.publish(&sent).await.unwrap();
    let mut settled = HashSet::new();
    for i in 0..5 {
        let d = next(&mut sub, "the first half").await;
        settled.insert(decode(&d).0.id);
        d.ack(if i == 4 { AckKind::Term } else { AckKind::Ack })
            .await
            .unwrap();
    }
    sub.close().await.unwrap();
    let mut again = t.subscriber().await.subscribe(&group, &topic).await.unwrap();
    let mut rest = HashSet::new();
    while rest.len() < 5 {
        let d = tokio::time::timeout(t.redelivery_wait() + WAIT, again.next())
            .await
            .expect("the unsettled half did not come back")
            .expect("stream open")
            .expect("delivery");
        let id = decode(&d).0.id;
        assert!(
            !settled.contains(&id),
            "a settled message was delivered again after restart"
        );
        rest.insert(id);
        d.ack(AckKind::Ack).await.unwrap();
    }
    let expected: HashSet<Uuid> = sent[5..].iter().map(|m| m.envelope.id).collect();
    assert_eq!(rest, expected);
    again.close().await.unwrap();
}

/// `publish` returning means the transport has it: a member connecting
/// afterwards, over a new connection, receives it.
pub async fn confirmed_publish_survives_the_publisher<T: TransportUnderTest>(t: &T) {
    let topic = fresh_topic();
    let group = fresh_group("durable");
    // Create the group, then go away.
    t.subscriber()
        .await
        .subscribe(&group, &topic)
        .await
        .unwrap()
        .close()
        .await
        .unwrap();
    let sent = probes(&topic, 2, 3);
    {
        let publisher = t.publisher().await;
        publisher.publish(&sent).await.unwrap();
    }
    let mut sub = t.subscriber().await.subscribe(&group, &topic).await.unwrap();
    let got: HashSet<Uuid> = receive_all(&mut sub, sent.len(), "confirmed messages")
        .await
        .iter()
        .map(|e| e.id)
        .collect();
    assert_eq!(got, sent.iter().map(|m| m.envelope.id).collect());
    sub.close().await.unwrap();
}

/// A message published before any group exists is never silently dropped:
/// the transport either keeps it for groups that subscribe later, or
/// refuses the publish (so the relay keeps it in the outbox).
pub async fn publish_before_any_group_is_kept_or_refused<T: TransportUnderTest>(t: &T) {
    let topic = fresh_topic();
    let sent = probe(&topic, "early", 1);
    match t.publisher().await.publish(std::slice::from_ref(&sent)).await {
        Err(e) => assert!(
            e.class().is_retryable(),
            "a refusal should be retryable once groups exist: {e}"
        ),
        Ok(()) => {
            let mut sub = subscribe(t, "late", &topic).await;
            let d = next(&mut sub, "the message published before the group existed").await;
            assert_eq!(decode(&d).0.id, sent.envelope.id);
            d.ack(AckKind::Ack).await.unwrap();
            sub.close().await.unwrap();
        }
    }
}

/// Optional feature: in binary mode, CloudEvents attributes are transport headers.
pub async fn cloudevents_attributes_travel_as_headers<T: TransportUnderTest>(t: &T) {
    let topic = fresh_topic();
    let mut sub = subscribe(t, "h", &topic).await;
    let sent = publish_one(t, &topic).await;
    let d = next(&mut sub, "a message").await;
    let h = &d.message.headers;
    let e = &sent.envelope;
    let p = match t.binding() {
        tidings_core::cloudevents::Binding::Standard => "ce-",
        tidings_core::cloudevents::Binding::Kafka => "ce_",
    };
    let get = |name: &str| h.get(&format!("{p}{name}")).map(String::as_str);
    assert_eq!(get("specversion"), Some("1.0"), "{h:?}");
    assert_eq!(get("id"), Some(e.id.to_string().as_str()));
    assert_eq!(get("type"), Some(e.message_type.as_str()));
    assert_eq!(get("source"), Some(e.source.as_str()));
    assert_eq!(get("subject"), Some(e.aggregate_key.as_str()));
    assert_eq!(get("partitionkey"), Some(e.aggregate_key.as_str()));
    assert_eq!(
        get("traceparent"),
        e.headers.get("traceparent").map(String::as_str)
    );
    assert_eq!(h.get("content-type"), Some(&e.content_type));
    assert_eq!(d.message.body, e.payload, "binary mode carries the bare payload");
    assert_eq!(decode(&d).0, *e);
    d.ack(AckKind::Ack).await.unwrap();
    sub.close().await.unwrap();
}

/// A handler for the runtime checks: records what it handled, fails forever on one key.
#[derive(Debug, Clone, Default)]
struct ProbeHandler {
    poison_key: Option<String>,
    /// Once set, the poison key is handled like any other (the bug was fixed).
    healed: Arc<std::sync::atomic::AtomicBool>,
    seen: Arc<std::sync::Mutex<Vec<(String, u32)>>>,
}

#[async_trait]
impl<DB: sqlx::Database> tidings_consumer::Handler<DB> for ProbeHandler {
    async fn handle(
        &self,
        ctx: &mut tidings_consumer::Context<'_, DB>,
    ) -> Result<(), tidings_consumer::HandlerError> {
        let p: Probe = ctx.decode()?;
        if self.poison_key.as_deref() == Some(p.key.as_str())
            && !self.healed.load(std::sync::atomic::Ordering::SeqCst)
        {
            return Err(tidings_consumer::HandlerError::transient("poisoned"));
        }
        // Uneven handling times, so that lanes finish out of step.
        let pause = rand::random::<u64>() % 4;
        tokio::time::sleep(Duration::from_millis(pause)).await;
        self.seen.lock().expect("lock").push((p.key, p.seq));
        Ok(())
    }
}

async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The consumer runtime over this transport handles keys in parallel and each key in order.
pub async fn parallel_handling_keeps_order_per_key<T: TransportUnderTest>(t: &T) {
    let db = crate::services::SqliteTestDb::new().await;
    let topic = fresh_topic();
    let handler = ProbeHandler::default();
    let consumer = tidings_consumer::Consumer::new(fresh_group("lanes"), db.store.clone(), handler.clone())
        .topic(topic.clone())
        .config(tidings_consumer::ConsumerConfig::default().lanes(8));
    let stop = tokio_util::sync::CancellationToken::new();
    let (stats, task) = start(t, consumer, stop.clone()).await;
    let sent = probes(&topic, 8, 15);
    t.publisher().await.publish(&sent).await.unwrap();
    eventually("every message handled", || stats.handled() == sent.len() as u64).await;
    stop.cancel();
    task.await.unwrap().unwrap();
    let mut per_key: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for (key, seq) in handler.seen.lock().unwrap().iter() {
        per_key.entry(key.clone()).or_default().push(*seq);
    }
    assert_eq!(per_key.len(), 8);
    for (key, seqs) in per_key {
        assert_eq!(
            seqs,
            (1..=15).collect::<Vec<_>>(),
            "key {key} handled out of order"
        );
    }
}

/// Waits for its partner at a barrier: both arrive only when two events
/// are handled at once.
#[derive(Debug, Clone)]
struct Meeting {
    barrier: Arc<tokio::sync::Barrier>,
    met: Arc<std::sync::atomic::AtomicUsize>,
}

#[async_trait]
impl<DB: sqlx::Database> tidings_consumer::Handler<DB> for Meeting {
    async fn handle(
        &self,
        _ctx: &mut tidings_consumer::Context<'_, DB>,
    ) -> Result<(), tidings_consumer::HandlerError> {
        if tokio::time::timeout(Duration::from_secs(5), self.barrier.wait())
            .await
            .is_ok()
        {
            self.met.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        Ok(())
    }
}

/// Events without a key (a foreign producer's, naming no `partitionkey`,
/// `subject` or record key) have no order to keep: they are handled in
/// parallel, not one after another behind one empty key.
pub async fn events_without_a_key_are_handled_in_parallel<T: TransportUnderTest>(t: &T) {
    // PostgreSQL: two handler transactions can be open at once (SQLite
    // takes one writer at a time, whatever the lanes do).
    let db = crate::services::PgTestDb::new().await;
    let topic = fresh_topic();
    let handler = Meeting {
        barrier: Arc::new(tokio::sync::Barrier::new(2)),
        met: Arc::default(),
    };
    let consumer = tidings_consumer::Consumer::new(fresh_group("keyless"), db.store.clone(), handler.clone())
        .topic(topic.clone())
        .config(tidings_consumer::ConsumerConfig::default().lanes(4));
    let stop = tokio_util::sync::CancellationToken::new();
    let (stats, task) = start(t, consumer, stop.clone()).await;
    // Both on one partition (one key, ""): only the lanes can run them side by side.
    let sent = vec![probe(&topic, "", 1), probe(&topic, "", 2)];
    t.publisher().await.publish(&sent).await.unwrap();
    eventually("both events handled", || stats.handled() == 2).await;
    stop.cancel();
    task.await.unwrap().unwrap();
    assert_eq!(
        handler.met.load(std::sync::atomic::Ordering::SeqCst),
        2,
        "the two events without a key were handled one after the other"
    );
}

type Running = (
    Arc<tidings_consumer::ConsumerStats>,
    tokio::task::JoinHandle<tidings_core::Result<()>>,
);

async fn start<T: TransportUnderTest, S: tidings_core::Store>(
    t: &T,
    consumer: tidings_consumer::Consumer<S>,
    stop: tokio_util::sync::CancellationToken,
) -> Running {
    let subscriber = t.subscriber().await;
    // The group exists before anything is published: on some brokers a
    // queue only receives what is published after it exists.
    for topic in consumer.topics() {
        subscriber.ensure_group(consumer.name(), topic).await.unwrap();
    }
    start_on(subscriber, consumer, stop)
}

/// Runs `consumer` on `subscriber` until `stop`.
fn start_on<S: tidings_core::Store>(
    subscriber: Arc<dyn Subscriber>,
    consumer: tidings_consumer::Consumer<S>,
    stop: tokio_util::sync::CancellationToken,
) -> Running {
    let stats = consumer.stats();
    let task = tokio::spawn(async move { consumer.run(&*subscriber, stop).await });
    (stats, task)
}

/// A message failing every attempt is dead-lettered after the last one and
/// settled for good, while the others flow.
pub async fn poison_is_dead_lettered_and_never_redelivered<T: TransportUnderTest>(t: &T) {
    use tidings_core::FailureStore;
    let db = crate::services::SqliteTestDb::new().await;
    let topic = fresh_topic();
    let group = fresh_group("dlq");
    let handler = ProbeHandler {
        poison_key: Some("poison".into()),
        ..ProbeHandler::default()
    };
    let config = tidings_consumer::ConsumerConfig::default()
        .max_attempts(3)
        .backoff(tidings_core::Backoff::new(
            Duration::from_millis(1),
            Duration::from_millis(5),
        ));
    let run = |stop: tokio_util::sync::CancellationToken| {
        let consumer = tidings_consumer::Consumer::new(group.clone(), db.store.clone(), handler.clone())
            .topic(topic.clone())
            .config(config.clone());
        start(t, consumer, stop)
    };
    let stop = tokio_util::sync::CancellationToken::new();
    let (stats, task) = run(stop.clone()).await;
    let mut sent = vec![probe(&topic, "poison", 1)];
    sent.extend(probes(&topic, 3, 4));
    t.publisher().await.publish(&sent).await.unwrap();
    eventually("the poison dead-lettered and the rest handled", || {
        stats.dead_lettered() == 1 && stats.handled() == 12
    })
    .await;
    stop.cancel();
    task.await.unwrap().unwrap();
    let letters = db.store.dead_letters(&Default::default()).await.unwrap();
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].attempts, 3);
    assert_eq!(letters[0].message_id, Some(sent[0].envelope.id));

    // A restarted member does not see the dead-lettered message again.
    let stop = tokio_util::sync::CancellationToken::new();
    let (stats, task) = run(stop.clone()).await;
    tokio::time::sleep(t.redelivery_wait() + Duration::from_secs(1)).await;
    stop.cancel();
    task.await.unwrap().unwrap();
    assert_eq!(stats.dead_lettered(), 0, "the settled poison came back");
}

/// A dead letter is redriven through the outbox, whatever the transport:
/// the consumer that failed handles it once, a consumer that had handled it
/// skips it, and the dead letter is recorded as redriven.
pub async fn dead_letters_redrive_through_the_outbox<T: TransportUnderTest>(t: &T) {
    use std::sync::atomic::Ordering;
    use tidings_core::{DeadLetterFilter, FailureStore, Redrive};
    let db = crate::services::SqliteTestDb::new().await;
    let topic = fresh_topic();
    let handler = ProbeHandler {
        poison_key: Some("poison".into()),
        ..ProbeHandler::default()
    };
    let quick = tidings_consumer::ConsumerConfig::default()
        .max_attempts(2)
        .backoff(tidings_core::Backoff::new(
            Duration::from_millis(1),
            Duration::from_millis(5),
        ));
    let stop = tokio_util::sync::CancellationToken::new();
    let failing = tidings_consumer::Consumer::new(fresh_group("failing"), db.store.clone(), handler.clone())
        .topic(topic.clone())
        .config(quick.clone());
    let bystander = tidings_consumer::Consumer::new(
        fresh_group("bystander"),
        db.store.clone(),
        ProbeHandler::default(),
    )
    .topic(topic.clone())
    .config(quick);
    let (failing, failing_task) = start(t, failing, stop.clone()).await;
    let (bystander, bystander_task) = start(t, bystander, stop.clone()).await;
    let mut sent = vec![probe(&topic, "poison", 1)];
    sent.extend(probes(&topic, 3, 1));
    t.publisher().await.publish(&sent).await.unwrap();
    eventually("the poison dead-lettered", || {
        failing.dead_lettered() == 1 && failing.handled() == 3
    })
    .await;
    eventually("the bystander done", || bystander.handled() == 4).await;

    let pending = db.store.dead_letters(&DeadLetterFilter::default()).await.unwrap();
    assert_eq!(pending.len(), 1);
    handler.healed.store(true, Ordering::SeqCst);
    let outcome = db.store.redrive(pending[0].id).await.unwrap();
    assert_eq!(
        outcome,
        Redrive::Enqueued {
            message_id: sent[0].envelope.id,
            redrive: 1
        }
    );
    assert_eq!(db.store.redrive(Uuid::now_v7()).await.unwrap(), Redrive::NotFound);
    let relay = tidings_relay::Relay::new(db.store.clone(), t.publisher().await);
    assert_eq!(relay.round().await.unwrap(), tidings_relay::Round::Published(1));

    eventually("the redriven message handled", || failing.handled() == 4).await;
    eventually("the bystander skipping it", || bystander.duplicates() == 1).await;
    stop.cancel();
    failing_task.await.unwrap().unwrap();
    bystander_task.await.unwrap().unwrap();
    assert_eq!(bystander.handled(), 4, "the bystander handled the redrive again");
    assert!(
        db.store
            .dead_letters(&DeadLetterFilter::default())
            .await
            .unwrap()
            .is_empty()
    );
    let all = db
        .store
        .dead_letters(&DeadLetterFilter::default().include_redriven())
        .await
        .unwrap();
    assert_eq!((all.len(), all[0].redrives), (1, 1));
    assert!(all[0].redriven_at.is_some());
}

/// Expands the suite into one `#[tokio::test]` per check, each on a fresh
/// fixture built by `$fixture` (an async expression).
///
/// Optional checks, generated only when listed in `features: [...]`:
/// `cloudevents_attributes_travel_as_headers`, `broker_counts_pending`,
/// `a_corrupt_record_waits_alone_with_its_key`,
/// `an_oversized_record_waits_alone_with_its_key` (a transport with a limit
/// of about 1 MiB).
#[macro_export]
macro_rules! transport_conformance {
    ($fixture:expr) => {
        $crate::transport_conformance!($fixture, features: []);
    };
    ($fixture:expr, features: [$($feature:ident),* $(,)?]) => {
        $crate::transport_conformance!(@cases $fixture;
            publish_and_receive,
            publish_before_any_group_is_kept_or_refused,
            an_ensured_group_keeps_what_is_published_next,
            fan_out_to_every_group,
            order_is_kept_per_key,
            unsettled_delivery_is_redelivered_after_a_crash,
            nak_with_delay_redelivers_later,
            settled_messages_stay_settled_across_restart,
            confirmed_publish_survives_the_publisher,
            parallel_handling_keeps_order_per_key,
            events_without_a_key_are_handled_in_parallel,
            poison_is_dead_lettered_and_never_redelivered,
            dead_letters_redrive_through_the_outbox,
            partitions_split_a_group,
            $($feature,)*
        );
    };
    (@cases $fixture:expr; $($case:ident),* $(,)?) => {
        mod conformance {
            #[allow(unused_imports)]
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let fixture = $fixture.await;
                    $crate::conformance::$case(&fixture).await;
                    $crate::conformance::TransportUnderTest::teardown(&fixture).await;
                }
            )*
        }
    };
}
