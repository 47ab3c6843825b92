//! Reading a group's partition subscription: pulls that wait a few
//! seconds for messages, the messages held kept leased (their ack
//! deadlines extended), and handed back when the subscription closes.

use std::time::{Duration, Instant};

use async_trait::async_trait;
use gcloud_gax::grpc::Code;
use gcloud_googleapis::pubsub::v1::{ModifyAckDeadlineRequest, PullRequest};
use tidings_core::{Backoff, Delivery, Partition, Result, Subscriber, Subscription};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;

use crate::PubSubTransport;
use crate::acker::{HAND_BACK_SECONDS, Held, PubSubAcker};
use crate::marshal::raw_message;
use crate::settlements::Settlements;

/// How long one pull waits for messages before it is asked again.
const PULL_WAIT: Duration = Duration::from_secs(5);
/// The pauses between pulls that brought nothing, on the emulator: from
/// the first to the longest, doubling.
const IDLE_FIRST: Duration = Duration::from_millis(50);
const IDLE_MAX: Duration = Duration::from_secs(1);
/// How long a pull waits for room in the stream before taking what there is.
const ROOM_GATHER: Duration = Duration::from_millis(50);
/// After a message held is settled, on the emulator: how long the next
/// pull waits for others settled at the same time.
const SETTLED_GATHER: Duration = Duration::from_millis(20);
/// The most ack ids one `modifyAckDeadline` request takes here.
const MODIFY_BATCH: usize = 1000;

#[async_trait]
impl Subscriber for PubSubTransport {
    fn partitions(&self, topic: &str) -> u32 {
        self.options.partitions_of(topic)
    }

    /// Refuses a topic that has Pub/Sub topics of another partition count.
    async fn check_partitions(&self, topic: &str) -> Result<()> {
        self.check_topic_partitions(topic).await
    }

    /// Pub/Sub counts a subscription's backlog only in Cloud Monitoring,
    /// not through its own API: unknown here.
    async fn pending(&self, _group: &str, _topic: &str) -> Result<Option<u64>> {
        Ok(None)
    }

    /// Makes the group's subscriptions, receiving nothing.
    async fn ensure_group(&self, group: &str, topic: &str) -> Result<()> {
        self.declare_group(topic, group).await
    }

    async fn subscribe_partition(
        &self,
        group: &str,
        topic: &str,
        partition: Partition,
    ) -> Result<Subscription> {
        self.declare_group(topic, group).await?;
        let reader = Reader {
            transport: self.clone(),
            topic: topic.to_owned(),
            group: group.to_owned(),
            subscription: self.options.subscription_id(topic, group, partition),
            dead_topic: self.options.dead_id(topic, group),
            held: Held::default(),
        };
        let (tx, rx) = mpsc::channel(usize::from(self.options.prefetch));
        let (stop, stopped) = watch::channel(false);
        let reading = tokio::spawn(reader.clone().read(tx, stopped.clone()));
        let keeping = tokio::spawn(reader.clone().keep_leased(stopped));
        Ok(
            Subscription::new(ReceiverStream::new(rx)).on_close(move || async move {
                let _ = stop.send(true);
                let _ = reading.await;
                let _ = keeping.await;
                // What is still held goes back, in a second.
                reader.modify_held(HAND_BACK_SECONDS).await;
                reader.held.ack_ids.lock().unwrap().clear();
                Ok(())
            }),
        )
    }
}

/// Room in `tx` for `wanted` deliveries, or for what there is once there
/// has been room for one for [`ROOM_GATHER`]; `None` once the stream is
/// dropped.
async fn room_for(tx: &mpsc::Sender<Result<Delivery>>, wanted: usize) -> Option<usize> {
    drop(tx.reserve().await.ok()?);
    if let Ok(permits) = tokio::time::timeout(ROOM_GATHER, tx.reserve_many(wanted)).await {
        drop(permits.ok()?);
    }
    Some(tx.capacity().max(1))
}

/// Until the subscription closes (the watch's guard dropped before
/// anything else is awaited).
async fn stopping(stopped: &mut watch::Receiver<bool>) {
    let _ = stopped.wait_for(|s| *s).await;
}

#[derive(Clone)]
struct Reader {
    transport: PubSubTransport,
    topic: String,
    group: String,
    subscription: String,
    dead_topic: String,
    held: Held,
}

impl Reader {
    async fn read(self, tx: mpsc::Sender<Result<Delivery>>, mut stopped: watch::Receiver<bool>) {
        let client = self
            .transport
            .client
            .subscription(&self.subscription)
            .get_client();
        let subscription_path = self.transport.options.subscription_path(&self.subscription);
        let settlements = Settlements::start(client.clone(), subscription_path.clone());
        let emulated = self.transport.options.emulated();
        let mut failures = 0u32;
        let mut idle = Duration::ZERO;
        let gather = (usize::from(self.transport.options.prefetch) / 4).max(1);
        loop {
            // Room first: what is pulled is leased to this member. Room
            // for a quarter of the prefetch, or what there is after a
            // moment: a pull per message settled would keep Pub/Sub (the
            // emulator above all) busy answering pulls.
            let room = tokio::select! {
                _ = stopping(&mut stopped) => return,
                room = room_for(&tx, gather) => match room {
                    Some(room) => room,
                    None => return,
                },
            };
            // The emulator mishandles a pull cancelled while it waits (it
            // takes the next messages for it, and never lets go): there a
            // pull returns at once, and an empty one is followed by a pause
            // growing while nothing comes.
            let request = PullRequest {
                subscription: subscription_path.clone(),
                max_messages: room as i32,
                #[allow(deprecated)]
                return_immediately: emulated,
            };
            let pull = async {
                if emulated {
                    Ok(client.pull(request, None).await)
                } else {
                    tokio::time::timeout(PULL_WAIT, client.pull(request, None)).await
                }
            };
            let pulled = tokio::select! {
                _ = stopping(&mut stopped) => return,
                pulled = pull => pulled,
            };
            let messages = match pulled {
                // Nothing came while the pull waited.
                Err(_) => continue,
                Ok(Ok(response)) => {
                    failures = 0;
                    response.into_inner().received_messages
                }
                Ok(Err(e)) => {
                    failures += 1;
                    if e.code() == Code::NotFound {
                        self.declare_again().await;
                    }
                    let delay = Backoff::default().delay(failures);
                    tracing::warn!(subscription = %self.subscription, code = ?e.code(), error = e.message(), retry_in_ms = delay.as_millis() as u64, "Pub/Sub pull failed; pulling again");
                    tokio::select! {
                        _ = stopping(&mut stopped) => return,
                        _ = tokio::time::sleep(delay) => continue,
                    }
                }
            };
            if emulated {
                // While this member holds messages, the next pull comes as
                // soon as one is settled (its key may be free), or after
                // the pause, whichever is first.
                idle = if messages.is_empty() {
                    (idle * 2).clamp(IDLE_FIRST, IDLE_MAX)
                } else {
                    Duration::ZERO
                };
                if !idle.is_zero() {
                    let woken = tokio::select! {
                        _ = stopping(&mut stopped) => return,
                        _ = self.held.settled.notified() => true,
                        _ = tokio::time::sleep(idle) => false,
                    };
                    // Others are settled around the same time: one pull
                    // for all of them.
                    if woken {
                        tokio::select! {
                            _ = stopping(&mut stopped) => return,
                            _ = tokio::time::sleep(SETTLED_GATHER) => {}
                        }
                    }
                }
            }
            // Every message pulled is held before any is handed on: one the
            // stream no longer takes is handed back on close.
            {
                let mut held = self.held.ack_ids.lock().unwrap();
                let now = Instant::now();
                for m in &messages {
                    held.insert(m.ack_id.clone(), now);
                }
            }
            for received in messages {
                let Some(message) = received.message else {
                    continue;
                };
                let count = received.delivery_attempt.max(0) as u32;
                let raw = raw_message(&self.topic, &message.attributes, &message.data);
                tracing::debug!(subscription = %self.subscription, message_id = %message.message_id, key = raw.key.as_deref().unwrap_or(""), count, "received");
                let acker = PubSubAcker {
                    transport: self.transport.clone(),
                    settlements: settlements.clone(),
                    ack_id: received.ack_id,
                    message,
                    held: self.held.clone(),
                    dead_topic: self.dead_topic.clone(),
                };
                if tx.send(Ok(Delivery::new(raw, count, acker))).await.is_err() {
                    return;
                }
            }
        }
    }

    /// Every third of the ack deadline, extends the deadline of the
    /// messages held: a live member keeps what it holds, a dead one's come
    /// back one deadline after it died.
    async fn keep_leased(self, mut stopped: watch::Receiver<bool>) {
        let deadline = self.transport.options.ack_deadline;
        let every = deadline / 3;
        loop {
            tokio::select! {
                _ = stopping(&mut stopped) => return,
                _ = tokio::time::sleep(every) => {}
            }
            self.modify_held(deadline.as_secs() as i32).await;
        }
    }

    /// Sets the ack deadline of every message held to `seconds` from now
    /// ([`HAND_BACK_SECONDS`] hands them back). A message held longer than
    /// the longest lease is let go instead: Pub/Sub hands it out again when
    /// its deadline runs out.
    async fn modify_held(&self, seconds: i32) {
        let max_lease = self.transport.options.max_lease;
        let held: Vec<String> = {
            let mut held = self.held.ack_ids.lock().unwrap();
            if seconds > HAND_BACK_SECONDS {
                held.retain(|ack_id, since| {
                    let keep = since.elapsed() < max_lease;
                    if !keep {
                        tracing::warn!(subscription = %self.subscription, ack_id = %ack_id, ?max_lease, "a message held longer than the longest lease is let go: Pub/Sub delivers it again");
                    }
                    keep
                });
            }
            held.keys().cloned().collect()
        };
        let client = self
            .transport
            .client
            .subscription(&self.subscription)
            .get_client();
        for chunk in held.chunks(MODIFY_BATCH) {
            let request = ModifyAckDeadlineRequest {
                subscription: self.transport.options.subscription_path(&self.subscription),
                ack_ids: chunk.to_vec(),
                ack_deadline_seconds: seconds,
            };
            if let Err(e) = client.modify_ack_deadline(request, None).await {
                tracing::warn!(subscription = %self.subscription, code = ?e.code(), error = e.message(), seconds, "changing the ack deadline of held Pub/Sub messages failed; they may be delivered again");
            }
        }
    }

    /// The group's subscription was deleted while this member read it:
    /// makes the group's subscriptions again. What the topic took
    /// meanwhile did not reach the group, and is said so.
    async fn declare_again(&self) {
        let transport = &self.transport;
        transport
            .declared
            .groups
            .lock()
            .unwrap()
            .remove(&(self.topic.clone(), self.group.clone()));
        for partition in Partition::all(transport.options.partitions_of(&self.topic)) {
            transport
                .declared
                .forget_topic(&transport.options.topic_id(&self.topic, partition));
        }
        tracing::error!(
            topic = %self.topic,
            group = %self.group,
            subscription = %self.subscription,
            "Pub/Sub subscription deleted while the group read it; making it again: what was published to the topic while it was gone did not reach this group (`tidings replay --consumer GROUP --since ...` re-delivers it from the outbox records kept for database.outbox_retention)"
        );
        if let Err(e) = transport.declare_group(&self.topic, &self.group).await {
            tracing::warn!(topic = %self.topic, group = %self.group, error = %e, "making the group's Pub/Sub subscriptions again failed; trying again");
        }
    }
}
