//! Declaring the topology: a FIFO SNS topic per topic, and per consumer
//! group an SQS queue per partition subscribed to it (raw delivery,
//! filtered on the partition), with a dead-letter queue: FIFO queues, or
//! standard ones for a group that needs no order.

use aws_sdk_sns::error::ProvideErrorMetadata;
use aws_sdk_sqs::types::QueueAttributeName;
use tidings_core::{Error, Partition, Result};

use crate::marshal::PARTITION_ATTRIBUTE;
use crate::names::is_fifo;
use crate::{SqsTransport, TRANSPORT};

/// Fourteen days, SQS's longest retention: what the relay confirmed stays
/// until a member settles it.
const RETENTION_SECONDS: &str = "1209600";
/// The SNS topic's tag holding the partitions its messages are spread over.
const PARTITIONS_TAG: &str = "tidings-partitions";

/// Whether SNS refused `e` for want of a permission.
fn denied<E: ProvideErrorMetadata, R>(e: &aws_sdk_sns::error::SdkError<E, R>) -> bool {
    e.as_service_error()
        .and_then(ProvideErrorMetadata::code)
        .is_some_and(|c| matches!(c, "AuthorizationError" | "AccessDenied" | "AccessDeniedException"))
}

impl SqsTransport {
    /// The ARN of `topic`'s SNS topic, created if need be. A topic whose
    /// messages are spread over another partition count than this
    /// transport's is refused, retryably: a publisher keeps its messages in
    /// the outbox until the counts agree ([`SqsTransport::partition_mismatch`]).
    pub(crate) async fn topic_arn(&self, topic: &str) -> Result<String> {
        let name = self.options.topic_name(topic);
        if let Some(arn) = self.declared.topics.lock().unwrap().get(&name) {
            return Ok(arn.clone());
        }
        let arn = self.create_topic(&name).await?;
        if let Some(reason) = self.partition_mismatch(topic, &arn).await? {
            return Err(Error::transport_reason(TRANSPORT, reason, true));
        }
        self.declared.topics.lock().unwrap().insert(name, arn.clone());
        Ok(arn)
    }

    /// Refuses to read `topic` where its SNS topic spreads messages over
    /// another partition count than this transport's: a configuration to
    /// fix, not to wait out.
    pub(crate) async fn check_topic_partitions(&self, topic: &str) -> Result<()> {
        let name = self.options.topic_name(topic);
        let arn = self.create_topic(&name).await?;
        match self.partition_mismatch(topic, &arn).await? {
            Some(reason) => Err(Error::Config {
                key: format!("SNS topic {name}"),
                reason,
            }),
            None => {
                self.declared.topics.lock().unwrap().insert(name, arn);
                Ok(())
            }
        }
    }

    /// Why `topic`'s SNS topic `arn` cannot be used with this transport's
    /// partition count, if it cannot. The count travels as the topic's tag
    /// `tidings-partitions`, set by the first publisher or group to find
    /// it missing: every message carries its partition in an attribute,
    /// and each group's queue takes one partition's by a filter, so a
    /// publisher and a group counting differently would send a key's
    /// messages to a queue no member reads, or to none. Without the
    /// permission to read or set tags, this says so and checks nothing.
    pub(crate) async fn partition_mismatch(&self, topic: &str, arn: &str) -> Result<Option<String>> {
        let configured = self.options.partitions_of(topic);
        let listed = match self.sns.list_tags_for_resource().resource_arn(arn).send().await {
            Ok(listed) => listed,
            Err(e) if denied(&e) => {
                tracing::warn!(topic = %arn, "cannot read the tags of the SNS topic (grant sns:ListTagsForResource and sns:TagResource): its partition count is not checked against this process's");
                return Ok(None);
            }
            Err(e) => return Err(self.error(&format!("reading the tags of SNS topic {arn}"), e)),
        };
        let found = listed
            .tags()
            .iter()
            .find(|t| t.key() == PARTITIONS_TAG)
            .map(|t| t.value().to_owned());
        match found {
            Some(found) if found == configured.to_string() => Ok(None),
            Some(found) => Ok(Some(format!(
                "SNS topic {arn} carries {PARTITIONS_TAG}={found} and this transport is configured for \
                 {configured} partitions: a publisher and a consumer group counting differently send a \
                 key's messages to a queue no member reads, or to none. Every publisher and group of a \
                 topic uses one count: configure {found} (SqsOptions::partitions, [broker] partitions in \
                 tidings.toml, or --partitions)"
            ))),
            None => {
                let tag = aws_sdk_sns::types::Tag::builder()
                    .key(PARTITIONS_TAG)
                    .value(configured.to_string())
                    .build()
                    .map_err(|e| Error::transport(TRANSPORT, "building an SNS tag", e, false))?;
                match self.sns.tag_resource().resource_arn(arn).tags(tag).send().await {
                    Ok(_) => Ok(None),
                    Err(e) if denied(&e) => {
                        tracing::warn!(topic = %arn, "cannot tag the SNS topic with its partition count (grant sns:TagResource): it is not checked against other processes'");
                        Ok(None)
                    }
                    Err(e) => Err(self.error(&format!("tagging SNS topic {arn}"), e)),
                }
            }
        }
    }

    /// Creates SNS topic `name`, or finds it: its ARN.
    pub(crate) async fn create_topic(&self, name: &str) -> Result<String> {
        let created = self
            .sns
            .create_topic()
            .name(name)
            .attributes("FifoTopic", "true")
            .attributes("ContentBasedDeduplication", "false")
            .send()
            .await
            .map_err(|e| self.error(&format!("creating SNS topic {name}"), e))?;
        created.topic_arn.ok_or_else(|| {
            Error::transport_reason(
                TRANSPORT,
                format!("SNS created topic {name} without an ARN"),
                true,
            )
        })
    }

    /// The URL of queue `name`, created with `attributes` if missing (an
    /// existing queue is taken as it is).
    pub(crate) async fn queue(
        &self,
        name: &str,
        attributes: &[(QueueAttributeName, String)],
    ) -> Result<String> {
        if let Some(url) = self.declared.queues.lock().unwrap().get(name) {
            return Ok(url.clone());
        }
        let mut create = self
            .sqs
            .create_queue()
            .queue_name(name)
            .attributes(QueueAttributeName::MessageRetentionPeriod, RETENTION_SECONDS);
        if is_fifo(name) {
            create = create.attributes(QueueAttributeName::FifoQueue, "true");
        }
        for (k, v) in attributes {
            create = create.attributes(k.clone(), v);
        }
        let url = match create.send().await {
            Ok(out) => out.queue_url,
            // Made earlier with other attributes (another visibility
            // timeout): taken as it is.
            Err(e) if e.as_service_error().is_some_and(|s| s.is_queue_name_exists()) => {
                self.sqs
                    .get_queue_url()
                    .queue_name(name)
                    .send()
                    .await
                    .map_err(|e| self.error(&format!("finding SQS queue {name}"), e))?
                    .queue_url
            }
            Err(e) => return Err(self.error(&format!("creating SQS queue {name}"), e)),
        };
        let url = url.ok_or_else(|| {
            Error::transport_reason(TRANSPORT, format!("SQS created queue {name} without a URL"), true)
        })?;
        self.declared
            .queues
            .lock()
            .unwrap()
            .insert(name.to_owned(), url.clone());
        Ok(url)
    }

    /// The URL of queue `name` if it exists, without creating it.
    pub(crate) async fn existing_queue(&self, name: &str) -> Result<Option<String>> {
        if let Some(url) = self.declared.queues.lock().unwrap().get(name) {
            return Ok(Some(url.clone()));
        }
        match self.sqs.get_queue_url().queue_name(name).send().await {
            Ok(out) => Ok(out.queue_url),
            Err(e) if e.as_service_error().is_some_and(|s| s.is_queue_does_not_exist()) => Ok(None),
            Err(e) => Err(self.error(&format!("finding SQS queue {name}"), e)),
        }
    }

    pub(crate) async fn queue_arn(&self, url: &str) -> Result<String> {
        let attributes = self
            .sqs
            .get_queue_attributes()
            .queue_url(url)
            .attribute_names(QueueAttributeName::QueueArn)
            .send()
            .await
            .map_err(|e| self.error(&format!("reading the ARN of SQS queue {url}"), e))?;
        attributes
            .attributes
            .and_then(|mut a| a.remove(&QueueAttributeName::QueueArn))
            .ok_or_else(|| Error::transport_reason(TRANSPORT, format!("SQS queue {url} has no ARN"), true))
    }

    /// The queues of `group` on every partition of `topic`, their
    /// dead-letter queue, and their subscriptions to the topic, made if
    /// missing.
    pub(crate) async fn declare_group(&self, topic: &str, group: &str) -> Result<()> {
        let id = (topic.to_owned(), group.to_owned());
        if self.declared.groups.lock().unwrap().contains(&id) {
            return Ok(());
        }
        let topic_arn = self.topic_arn(topic).await?;
        let dead = self
            .queue(&self.options.dead_queue_name(topic, group), &[])
            .await?;
        let dead_arn = self.queue_arn(&dead).await?;
        let redrive = serde_json::json!({
            "deadLetterTargetArn": dead_arn,
            "maxReceiveCount": self.options.max_receive_count,
        })
        .to_string();
        // The partitions' queues at once: each takes four requests, which
        // a service busy after an outage answers slowly.
        let count = self.options.partitions_of(topic);
        futures::future::try_join_all(
            Partition::all(count).map(|p| self.declare_partition(topic, group, p, &topic_arn, &redrive)),
        )
        .await?;
        self.declared.subscribed.lock().unwrap().insert(topic_arn);
        self.declared.groups.lock().unwrap().insert(id);
        Ok(())
    }

    /// Partition `partition`'s queue of `group` on `topic`, and its
    /// subscription to the topic, made if missing.
    async fn declare_partition(
        &self,
        topic: &str,
        group: &str,
        partition: Partition,
        topic_arn: &str,
        redrive: &str,
    ) -> Result<()> {
        let count = self.options.partitions_of(topic);
        let name = self.options.queue_name(topic, group, partition);
        let url = self
            .queue(
                &name,
                &[
                    (
                        QueueAttributeName::VisibilityTimeout,
                        self.options.visibility_timeout.as_secs().to_string(),
                    ),
                    (QueueAttributeName::RedrivePolicy, redrive.to_owned()),
                ],
            )
            .await?;
        let queue_arn = self.queue_arn(&url).await?;
        // SNS may deliver to the queue: its policy lets this topic send.
        let policy = serde_json::json!({
            "Version": "2012-10-17",
            "Statement": [{
                "Effect": "Allow",
                "Principal": {"Service": "sns.amazonaws.com"},
                "Action": "sqs:SendMessage",
                "Resource": queue_arn,
                "Condition": {"ArnEquals": {"aws:SourceArn": topic_arn}},
            }],
        })
        .to_string();
        self.sqs
            .set_queue_attributes()
            .queue_url(&url)
            .attributes(QueueAttributeName::Policy, policy)
            .send()
            .await
            .map_err(|e| self.error(&format!("letting SNS topic {topic_arn} send to {name}"), e))?;
        let mut subscribe = self
            .sns
            .subscribe()
            .topic_arn(topic_arn)
            .protocol("sqs")
            .endpoint(&queue_arn)
            .attributes("RawMessageDelivery", "true")
            .return_subscription_arn(true);
        if count > 1 {
            let filter = serde_json::json!({ PARTITION_ATTRIBUTE: [partition.index.to_string()] });
            subscribe = subscribe.attributes("FilterPolicy", filter.to_string());
        }
        subscribe.send().await.map_err(|e| {
            let clash = e
                .as_service_error()
                .filter(|s| s.is_invalid_parameter_exception())
                .and_then(ProvideErrorMetadata::message)
                .map(str::to_owned);
            match clash {
                Some(reason) => Error::transport_reason(
                    TRANSPORT,
                    format!(
                        "subscribing SQS queue {name} to SNS topic {topic_arn}: {reason} (a \
                         subscription with other settings exists: were the topic's partitions changed?)"
                    ),
                    false,
                ),
                None => self.error(&format!("subscribing SQS queue {name} to {topic_arn}"), e),
            }
        })?;
        Ok(())
    }
}
