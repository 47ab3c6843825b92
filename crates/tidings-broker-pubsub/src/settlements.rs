//! One subscription's acknowledgements and deadline changes, sent
//! together: while one request is on its way, what the other lanes settle
//! meanwhile waits for it and leaves in the next, so a busy subscription
//! sends one `Acknowledge` for many messages instead of one each.

use std::collections::BTreeMap;

use gcloud_gax::grpc::{Code, Status};
use gcloud_googleapis::pubsub::v1::{AcknowledgeRequest, ModifyAckDeadlineRequest};
use gcloud_pubsub::apiv1::subscriber_client::SubscriberClient;
use tokio::sync::{mpsc, oneshot};

/// The most ack ids one request carries (Pub/Sub takes requests up to
/// 512 KB; an ack id is a few hundred bytes at most).
const MOST_PER_REQUEST: usize = 1000;

/// What becomes of a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Settle {
    /// Acknowledged: done with.
    Ack,
    /// Its ack deadline set to this many seconds from now.
    Deadline(i32),
}

struct Pending {
    ack_id: String,
    settle: Settle,
    done: oneshot::Sender<Result<(), Status>>,
}

/// The sending side, shared by the subscription's deliveries. The task
/// sending the requests ends when the last of them is dropped.
#[derive(Clone)]
pub(crate) struct Settlements {
    tx: mpsc::UnboundedSender<Pending>,
}

impl Settlements {
    /// Starts sending settlements for `subscription` (its full path).
    pub(crate) fn start(client: SubscriberClient, subscription: String) -> Settlements {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(send_all(client, subscription, rx));
        Settlements { tx }
    }

    /// Settles one message, once Pub/Sub answered the request carrying it.
    pub(crate) async fn settle(&self, ack_id: String, settle: Settle) -> Result<(), Status> {
        let (done, answer) = oneshot::channel();
        let gone = || Status::new(Code::Cancelled, "the subscription's settlements stopped");
        self.tx
            .send(Pending { ack_id, settle, done })
            .map_err(|_| gone())?;
        answer.await.unwrap_or_else(|_| Err(gone()))
    }
}

async fn send_all(client: SubscriberClient, subscription: String, mut rx: mpsc::UnboundedReceiver<Pending>) {
    let mut taken = Vec::new();
    while rx.recv_many(&mut taken, MOST_PER_REQUEST).await > 0 {
        let mut by_kind: BTreeMap<Settle, Vec<Pending>> = BTreeMap::new();
        for p in taken.drain(..) {
            by_kind.entry(p.settle).or_default().push(p);
        }
        for (settle, pending) in by_kind {
            let ack_ids: Vec<String> = pending.iter().map(|p| p.ack_id.clone()).collect();
            let sent = match settle {
                Settle::Ack => client
                    .acknowledge(
                        AcknowledgeRequest {
                            subscription: subscription.clone(),
                            ack_ids,
                        },
                        None,
                    )
                    .await
                    .map(drop),
                Settle::Deadline(seconds) => client
                    .modify_ack_deadline(
                        ModifyAckDeadlineRequest {
                            subscription: subscription.clone(),
                            ack_ids,
                            ack_deadline_seconds: seconds,
                        },
                        None,
                    )
                    .await
                    .map(drop),
            };
            for p in pending {
                let answer = match &sent {
                    Ok(()) => Ok(()),
                    Err(e) => Err(Status::new(e.code(), e.message())),
                };
                let _ = p.done.send(answer);
            }
        }
    }
}
