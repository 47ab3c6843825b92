//! Amazon SNS's own client (the AWS SDK): a FIFO topic of the run's own
//! fanned out to one FIFO queue, `PublishBatch` requests of ten messages
//! (each with its message group and deduplication id), [`WINDOW`] messages
//! awaiting their confirmation.

use std::time::Instant;

use anyhow::Context as _;
use aws_config::BehaviorVersion;
use aws_sdk_sns::types::PublishBatchRequestEntry;
use aws_sdk_sqs::types::QueueAttributeName;
use futures::StreamExt;

use super::{Document, WINDOW, documents, host, query};
use crate::{Drain, drain, short_id};

/// SNS's largest batch.
const BATCH: usize = 10;

/// `sqs://[REGION][?endpoint=URL]`, the rest from the standard AWS
/// configuration, as the transport reads it.
pub(super) async fn publish(url: &str, n: usize) -> anyhow::Result<Drain> {
    let mut loader = aws_config::defaults(BehaviorVersion::latest());
    if let Some(region) = query(url, "region")?.or(host(url)?) {
        loader = loader.region(aws_config::Region::new(region));
    }
    if let Some(endpoint) = query(url, "endpoint")? {
        loader = loader.endpoint_url(endpoint);
    }
    let config = loader.load().await;
    let sns = aws_sdk_sns::Client::new(&config);
    let sqs = aws_sdk_sqs::Client::new(&config);

    let name = format!("bench-raw-{}.fifo", short_id());
    let topic = sns
        .create_topic()
        .name(&name)
        .attributes("FifoTopic", "true")
        .send()
        .await
        .with_context(|| format!("creating SNS topic {name} at {url}"))?
        .topic_arn
        .context("SNS made a topic without an ARN")?;
    let queue = sqs
        .create_queue()
        .queue_name(&name)
        .attributes(QueueAttributeName::FifoQueue, "true")
        .send()
        .await
        .with_context(|| format!("creating SQS queue {name}"))?
        .queue_url
        .context("SQS made a queue without a URL")?;
    let queue_arn = sqs
        .get_queue_attributes()
        .queue_url(&queue)
        .attribute_names(QueueAttributeName::QueueArn)
        .send()
        .await?
        .attributes
        .and_then(|mut a| a.remove(&QueueAttributeName::QueueArn))
        .context("an SQS queue without an ARN")?;
    sns.subscribe()
        .topic_arn(&topic)
        .protocol("sqs")
        .endpoint(&queue_arn)
        .attributes("RawMessageDelivery", "true")
        .send()
        .await
        .with_context(|| format!("subscribing {name} to its topic"))?;

    let documents = documents(n);
    let started = Instant::now();
    let batches = documents
        .chunks(BATCH)
        .map(|chunk| publish_batch(&sns, &topic, chunk));
    let mut confirmed = futures::stream::iter(batches).buffer_unordered(WINDOW / BATCH);
    while let Some(result) = confirmed.next().await {
        result?;
    }
    let measured = drain(1, n, started);

    sns.delete_topic().topic_arn(&topic).send().await?;
    sqs.delete_queue().queue_url(&queue).send().await?;
    Ok(measured)
}

/// One `PublishBatch` request; fails if SNS refused any of its messages.
async fn publish_batch(sns: &aws_sdk_sns::Client, topic: &str, chunk: &[Document]) -> anyhow::Result<()> {
    let mut entries = Vec::with_capacity(chunk.len());
    for (i, d) in chunk.iter().enumerate() {
        entries.push(
            PublishBatchRequestEntry::builder()
                .id(i.to_string())
                .message(String::from_utf8_lossy(&d.body))
                .message_group_id(&d.key)
                .message_deduplication_id(&d.id)
                .build()?,
        );
    }
    let out = sns
        .publish_batch()
        .topic_arn(topic)
        .set_publish_batch_request_entries(Some(entries))
        .send()
        .await
        .context("SNS PublishBatch")?;
    if let Some(failed) = out.failed().first() {
        anyhow::bail!(
            "SNS refused a message: {} {}",
            failed.code(),
            failed.message().unwrap_or("")
        );
    }
    Ok(())
}
