//! What operators and tests ask of the topology: names, and deleting what
//! this transport made.

use tidings_core::Result;

use crate::SqsTransport;

impl SqsTransport {
    /// The SNS topic `topic` is published to.
    pub fn topic(&self, topic: &str) -> String {
        self.options.topic_name(topic)
    }

    /// The queue of `group` on `topic`'s `partition`.
    pub fn partition_queue(&self, topic: &str, group: &str, partition: tidings_core::Partition) -> String {
        self.options.queue_name(topic, group, partition)
    }

    /// The dead-letter queue of `group` on `topic`.
    pub fn dead_letter_queue(&self, topic: &str, group: &str) -> String {
        self.options.dead_queue_name(topic, group)
    }

    /// The SNS topics this transport made or found.
    pub fn topics(&self) -> Vec<String> {
        self.declared.topics.lock().unwrap().keys().cloned().collect()
    }

    /// The SQS queues this transport made or found.
    pub fn queues(&self) -> Vec<String> {
        self.declared.queues.lock().unwrap().keys().cloned().collect()
    }

    /// Messages waiting in queue `name` (approximately), `None` if it does not exist.
    pub async fn queue_depth(&self, name: &str) -> Result<Option<u64>> {
        let Some(url) = self.existing_queue(name).await? else {
            return Ok(None);
        };
        let out = self
            .sqs
            .get_queue_attributes()
            .queue_url(&url)
            .attribute_names(aws_sdk_sqs::types::QueueAttributeName::ApproximateNumberOfMessages)
            .send()
            .await
            .map_err(|e| self.error(&format!("counting the messages of SQS queue {name}"), e))?;
        Ok(out
            .attributes
            .unwrap_or_default()
            .values()
            .filter_map(|v| v.parse::<u64>().ok())
            .next())
    }

    /// Deletes SQS queue `name` and what it holds; a missing one is not an error.
    pub async fn delete_queue(&self, name: &str) -> Result<()> {
        let Some(url) = self.existing_queue(name).await? else {
            return Ok(());
        };
        self.sqs
            .delete_queue()
            .queue_url(&url)
            .send()
            .await
            .map_err(|e| self.error(&format!("deleting SQS queue {name}"), e))?;
        self.declared.queues.lock().unwrap().remove(name);
        self.declared.groups.lock().unwrap().clear();
        Ok(())
    }

    /// Deletes the queues of `group` on `topic`, every partition's and the
    /// dead-letter queue, with what they hold, and their subscriptions to
    /// the topic (SNS keeps a deleted queue's, and takes at most 100 on a
    /// FIFO topic).
    pub async fn delete_group(&self, topic: &str, group: &str) -> Result<()> {
        let queues: Vec<String> = tidings_core::Partition::all(self.options.partitions_of(topic))
            .map(|partition| self.options.queue_name(topic, group, partition))
            .collect();
        self.unsubscribe(topic, &queues).await?;
        for name in &queues {
            self.delete_queue(name).await?;
        }
        self.delete_queue(&self.options.dead_queue_name(topic, group))
            .await
    }

    /// Removes the subscriptions of queues `names` to `topic`'s SNS topic.
    async fn unsubscribe(&self, topic: &str, names: &[String]) -> Result<()> {
        let arn = self.create_topic(&self.options.topic_name(topic)).await?;
        let mut pages = self
            .sns
            .list_subscriptions_by_topic()
            .topic_arn(&arn)
            .into_paginator()
            .send();
        let mut ours = Vec::new();
        while let Some(page) = pages.next().await {
            let page =
                page.map_err(|e| self.error(&format!("listing the subscriptions of SNS topic {arn}"), e))?;
            for subscription in page.subscriptions() {
                // A queue's ARN ends with its name.
                let queue = subscription.endpoint().and_then(|e| e.rsplit(':').next());
                if queue.is_some_and(|q| names.iter().any(|n| n == q))
                    && let Some(id) = subscription.subscription_arn()
                {
                    ours.push(id.to_owned());
                }
            }
        }
        for id in ours {
            self.sns
                .unsubscribe()
                .subscription_arn(&id)
                .send()
                .await
                .map_err(|e| self.error(&format!("removing subscription {id} of SNS topic {arn}"), e))?;
        }
        self.declared.subscribed.lock().unwrap().remove(&arn);
        Ok(())
    }

    /// Deletes the SNS topic of `topic` and its subscriptions.
    pub async fn delete_topic_of(&self, topic: &str) -> Result<()> {
        let name = self.options.topic_name(topic);
        let arn = self.create_topic(&name).await?;
        self.delete_sns_topic(&name, &arn).await
    }

    /// Deletes SNS topic `name` (made by this transport) and its subscriptions.
    pub async fn delete_topic(&self, name: &str) -> Result<()> {
        let arn = self.declared.topics.lock().unwrap().get(name).cloned();
        match arn {
            Some(arn) => self.delete_sns_topic(name, &arn).await,
            None => Ok(()),
        }
    }

    /// Deletes SNS topic `name` at `arn`, and forgets it and what was
    /// declared on it.
    async fn delete_sns_topic(&self, name: &str, arn: &str) -> Result<()> {
        self.sns
            .delete_topic()
            .topic_arn(arn)
            .send()
            .await
            .map_err(|e| self.error(&format!("deleting SNS topic {name} ({arn})"), e))?;
        self.declared.forget_topic(name);
        self.declared.subscribed.lock().unwrap().remove(arn);
        self.declared.groups.lock().unwrap().clear();
        Ok(())
    }
}
