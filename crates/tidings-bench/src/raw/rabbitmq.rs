//! RabbitMQ's own client (lapin), publishing with publisher confirms.

use std::collections::VecDeque;
use std::time::Instant;

use anyhow::Context as _;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Confirmation, Connection, ConnectionProperties};

use super::{WINDOW, bodies};
use crate::{Drain, drain, short_id};

/// RabbitMQ: a durable queue of its own through the default exchange,
/// persistent and mandatory messages, publisher confirms.
pub(super) async fn publish(url: &str, n: usize) -> anyhow::Result<Drain> {
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
