//! The brokers' raw limits: their own clients publishing the bench's events
//! with confirmations, a window of publishes in flight, no Tidings code in
//! the path. A relay's rate is read against these.

use std::collections::VecDeque;
use std::time::Instant;

use anyhow::Context as _;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Confirmation, Connection, ConnectionProperties};

use super::{Drain, drain, event, short_id};

/// Publishes confirmed at once, at most.
pub(super) const WINDOW: usize = 500;

/// The bench's events as the broker carries them: the CloudEvents JSON document.
fn bodies(n: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|seq| tidings_core::cloudevents::to_json(&event(seq).envelope))
        .collect()
}

/// `n` events published to the broker at `url` with its own client, with
/// up to [`WINDOW`] awaiting their confirmation; `None` for the database log.
pub(super) async fn publish(url: Option<&str>, n: usize) -> anyhow::Result<Option<Drain>> {
    match url {
        Some(url) if url.starts_with("nats://") => nats(url, n).await.map(Some),
        Some(url) if url.starts_with("amqp://") || url.starts_with("amqps://") => {
            rabbitmq(url, n).await.map(Some)
        }
        _ => Ok(None),
    }
}

/// JetStream: a file-backed stream of its own, each message with a `Nats-Msg-Id`
/// (the duplicate detection the adapter asks for).
async fn nats(url: &str, n: usize) -> anyhow::Result<Drain> {
    let client = async_nats::connect(url)
        .await
        .with_context(|| format!("connecting to NATS at {}", tidings_core::secret::redact_url(url)))?;
    let js = async_nats::jetstream::new(client);
    let id = short_id();
    let name = format!("BENCH_RAW_{}", id.to_uppercase());
    let subject = format!("bench.raw.{id}");
    js.get_or_create_stream(async_nats::jetstream::stream::Config {
        name: name.clone(),
        subjects: vec![subject.clone()],
        storage: async_nats::jetstream::stream::StorageType::File,
        ..Default::default()
    })
    .await
    .map_err(|e| anyhow::anyhow!("creating stream {name}: {e}"))?;
    let bodies = bodies(n);
    let started = Instant::now();
    let mut in_flight = VecDeque::with_capacity(WINDOW);
    for (seq, body) in bodies.into_iter().enumerate() {
        if in_flight.len() == WINDOW
            && let Some(ack) = in_flight.pop_front()
        {
            let ack: async_nats::jetstream::context::PublishAckFuture = ack;
            ack.await.map_err(|e| anyhow::anyhow!("JetStream ack: {e}"))?;
        }
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Nats-Msg-Id", format!("{id}-{seq}").as_str());
        let ack = js
            .publish_with_headers(subject.clone(), headers, body.into())
            .await
            .map_err(|e| anyhow::anyhow!("publishing to JetStream: {e}"))?;
        in_flight.push_back(ack);
    }
    for ack in in_flight {
        ack.await.map_err(|e| anyhow::anyhow!("JetStream ack: {e}"))?;
    }
    let measured = drain(1, n, started);
    js.delete_stream(&name)
        .await
        .map_err(|e| anyhow::anyhow!("deleting stream {name}: {e}"))?;
    Ok(measured)
}

/// RabbitMQ: a durable queue of its own through the default exchange,
/// persistent and mandatory messages, publisher confirms.
async fn rabbitmq(url: &str, n: usize) -> anyhow::Result<Drain> {
    let connection = Connection::connect(url, ConnectionProperties::default())
        .await
        .with_context(|| {
            format!(
                "connecting to RabbitMQ at {}",
                tidings_core::secret::redact_url(url)
            )
        })?;
    let channel = connection.create_channel().await?;
    channel.confirm_select(ConfirmSelectOptions::default()).await?;
    let queue = format!("bench.raw.{}", short_id());
    channel
        .queue_declare(
            queue.as_str().into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await?;
    let bodies = bodies(n);
    let started = Instant::now();
    let mut in_flight = VecDeque::with_capacity(WINDOW);
    for body in &bodies {
        if in_flight.len() == WINDOW
            && let Some(confirm) = in_flight.pop_front()
        {
            confirmed(confirm).await?;
        }
        let confirm = channel
            .basic_publish(
                "".into(),
                queue.as_str().into(),
                BasicPublishOptions {
                    mandatory: true,
                    ..Default::default()
                },
                body,
                BasicProperties::default().with_delivery_mode(2),
            )
            .await?;
        in_flight.push_back(confirm);
    }
    for confirm in in_flight {
        confirmed(confirm).await?;
    }
    let measured = drain(1, n, started);
    channel
        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
        .await?;
    connection.close(200, "bench done".into()).await?;
    Ok(measured)
}

async fn confirmed(confirm: lapin::PublisherConfirm) -> anyhow::Result<()> {
    match confirm.await? {
        Confirmation::Ack(None) => Ok(()),
        other => anyhow::bail!("RabbitMQ did not confirm a publish: {other:?}"),
    }
}
