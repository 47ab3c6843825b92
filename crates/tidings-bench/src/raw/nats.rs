//! JetStream's own client, publishing with acknowledgements.

use std::collections::VecDeque;
use std::time::Instant;

use anyhow::Context as _;

use super::{WINDOW, bodies};
use crate::{Drain, drain, short_id};

/// JetStream: a file-backed stream of its own, each message with a `Nats-Msg-Id`
/// (the duplicate detection the adapter asks for).
pub(super) async fn publish(url: &str, n: usize) -> anyhow::Result<Drain> {
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
