//! Declaring topics and subscriptions (each made once, found if it is
//! there), and deleting them, for tests and tools.

use gcloud_gax::grpc::Code;
use gcloud_googleapis::pubsub::v1::{DeadLetterPolicy, ModifyAckDeadlineRequest, PullRequest};
use gcloud_pubsub::subscription::SubscriptionConfig;
use tidings_core::{Error, Partition, RawMessage, Result};

use crate::marshal::raw_message;

use crate::{PubSubTransport, TRANSPORT};

impl PubSubTransport {
    /// Makes topic `id` unless this transport made or found it already.
    pub(crate) async fn topic(&self, id: &str) -> Result<()> {
        if self.declared.topics.lock().unwrap().contains(id) {
            return Ok(());
        }
        match self.client.topic(id).create(None, None).await {
            Ok(()) => tracing::info!(topic = %self.options.topic_path(id), "Pub/Sub topic made"),
            Err(e) if e.code() == Code::AlreadyExists => {}
            Err(e) => return Err(self.error(&format!("making Pub/Sub topic {id}"), e)),
        }
        self.declared.topics.lock().unwrap().insert(id.to_owned());
        Ok(())
    }

    /// Makes subscription `id` to topic `topic_id` unless it is there already.
    async fn subscription(&self, id: &str, topic_id: &str, config: SubscriptionConfig) -> Result<()> {
        match self.client.create_subscription(id, topic_id, config, None).await {
            Ok(_) => {
                tracing::info!(subscription = %self.options.subscription_path(id), "Pub/Sub subscription made");
                Ok(())
            }
            Err(e) if e.code() == Code::AlreadyExists => Ok(()),
            Err(e) => Err(self.error(&format!("making Pub/Sub subscription {id}"), e)),
        }
    }

    /// Makes `group`'s subscriptions to every partition of `topic` (message
    /// ordering on, the ack deadline, the dead-letter policy), its
    /// dead-letter topic, and the subscription that keeps what reaches it.
    pub(crate) async fn declare_group(&self, topic: &str, group: &str) -> Result<()> {
        let key = (topic.to_owned(), group.to_owned());
        if self.declared.groups.lock().unwrap().contains(&key) {
            return Ok(());
        }
        self.check_topic_partitions(topic).await?;
        let dead = self.options.dead_id(topic, group);
        self.topic(&dead).await?;
        self.subscription(&dead, &dead, SubscriptionConfig::default())
            .await?;
        for partition in Partition::all(self.options.partitions_of(topic)) {
            let topic_id = self.options.topic_id(topic, partition);
            self.topic(&topic_id).await?;
            let config = SubscriptionConfig {
                enable_message_ordering: true,
                ack_deadline_seconds: self.options.ack_deadline.as_secs() as i32,
                dead_letter_policy: Some(DeadLetterPolicy {
                    dead_letter_topic: self.options.topic_path(&dead),
                    max_delivery_attempts: self.options.max_delivery_attempts as i32,
                }),
                ..SubscriptionConfig::default()
            };
            self.subscription(
                &self.options.subscription_id(topic, group, partition),
                &topic_id,
                config,
            )
            .await?;
            self.declared.subscribed.lock().unwrap().insert(topic_id);
        }
        self.declared.groups.lock().unwrap().insert(key);
        Ok(())
    }

    /// Fails, retryably, while nothing subscribes to topic `id`: Pub/Sub
    /// would take the message and keep it for no one.
    pub(crate) async fn check_subscribed(&self, topic: &str, id: &str) -> Result<()> {
        if self.declared.subscribed.lock().unwrap().contains(id) {
            return Ok(());
        }
        let listed = self.client.topic(id).subscriptions(None).await.map_err(|e| {
            if e.code() == Code::NotFound {
                self.declared.forget_topic(id);
            }
            self.error(&format!("listing the subscriptions of Pub/Sub topic {id}"), e)
        })?;
        if listed.is_empty() {
            return Err(Error::transport_reason(
                TRANSPORT,
                format!(
                    "publishing: no subscription takes Pub/Sub topic {} (topic {topic:?}): start or \
                     ensure the consumer groups (which makes their subscriptions) before publishing; the \
                     message stays in the outbox",
                    self.options.topic_path(id)
                ),
                true,
            ));
        }
        self.declared.subscribed.lock().unwrap().insert(id.to_owned());
        Ok(())
    }

    /// Up to `max` of the messages waiting in `group`'s dead-letter
    /// subscription on `topic`, read and handed straight back (they stay
    /// there). A look, not a count: Pub/Sub may answer one pull with fewer
    /// messages than it holds.
    pub async fn peek_dead_letters(&self, topic: &str, group: &str, max: i32) -> Result<Vec<RawMessage>> {
        let id = self.options.dead_id(topic, group);
        let path = self.options.subscription_path(&id);
        let client = self.client.subscription(&id).get_client();
        let request = PullRequest {
            subscription: path.clone(),
            max_messages: max,
            #[allow(deprecated)]
            return_immediately: true,
        };
        let received = client
            .pull(request, None)
            .await
            .map_err(|e| self.error(&format!("reading dead-letter subscription {id}"), e))?
            .into_inner()
            .received_messages;
        if !received.is_empty() {
            let back = ModifyAckDeadlineRequest {
                subscription: path,
                ack_ids: received.iter().map(|m| m.ack_id.clone()).collect(),
                ack_deadline_seconds: 0,
            };
            client
                .modify_ack_deadline(back, None)
                .await
                .map_err(|e| self.error(&format!("handing back dead letters of {id}"), e))?;
        }
        Ok(received
            .into_iter()
            .filter_map(|m| m.message)
            .map(|m| raw_message(topic, &m.attributes, &m.data))
            .collect())
    }

    /// Deletes `group`'s subscriptions on `topic` (every partition's and
    /// the dead-letter one) and its dead-letter topic.
    pub async fn delete_group(&self, topic: &str, group: &str) -> Result<()> {
        for partition in Partition::all(self.options.partitions_of(topic)) {
            self.delete_subscription(&self.options.subscription_id(topic, group, partition))
                .await?;
        }
        let dead = self.options.dead_id(topic, group);
        self.delete_subscription(&dead).await?;
        self.delete_topic(&dead).await?;
        self.declared
            .groups
            .lock()
            .unwrap()
            .remove(&(topic.to_owned(), group.to_owned()));
        Ok(())
    }

    /// Deletes the topics of every partition of `topic`.
    pub async fn delete_topic_of(&self, topic: &str) -> Result<()> {
        for partition in Partition::all(self.options.partitions_of(topic)) {
            self.delete_topic(&self.options.topic_id(topic, partition))
                .await?;
        }
        Ok(())
    }

    /// The topic ids this transport made or found.
    pub fn topics(&self) -> Vec<String> {
        self.declared.topics.lock().unwrap().iter().cloned().collect()
    }

    /// The subscription ids of the groups this transport declared, their
    /// dead-letter subscriptions included.
    pub fn subscriptions(&self) -> Vec<String> {
        let groups = self.declared.groups.lock().unwrap().clone();
        let mut ids = Vec::new();
        for (topic, group) in groups {
            ids.push(self.options.dead_id(&topic, &group));
            for partition in Partition::all(self.options.partitions_of(&topic)) {
                ids.push(self.options.subscription_id(&topic, &group, partition));
            }
        }
        ids
    }

    /// Deletes topic `id` (its subscriptions stay, detached).
    pub async fn delete_topic(&self, id: &str) -> Result<()> {
        self.declared.forget_topic(id);
        self.declared.publishers.lock().unwrap().remove(id);
        match self.client.topic(id).delete(None).await {
            Ok(()) => Ok(()),
            Err(e) if e.code() == Code::NotFound => Ok(()),
            Err(e) => Err(self.error(&format!("deleting Pub/Sub topic {id}"), e)),
        }
    }

    /// Deletes subscription `id`.
    pub async fn delete_subscription(&self, id: &str) -> Result<()> {
        match self.client.subscription(id).delete(None).await {
            Ok(()) => Ok(()),
            Err(e) if e.code() == Code::NotFound => Ok(()),
            Err(e) => Err(self.error(&format!("deleting Pub/Sub subscription {id}"), e)),
        }
    }
}
