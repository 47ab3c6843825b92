//! The brokers' raw limits: their own clients publishing the bench's events
//! with confirmations, a window of publishes in flight, no Tidings code in
//! the path. A relay's rate is read against these.

mod nats;
mod pubsub;
mod rabbitmq;
mod sns;

use super::{Drain, event};

/// Publishes confirmed at once, at most.
pub(super) const WINDOW: usize = 500;

/// One bench event as a broker carries it.
struct Document {
    /// Its aggregate key: the message group or ordering key where the
    /// broker has one.
    key: String,
    /// Its envelope id: the deduplication id where the broker asks for one.
    id: String,
    /// The CloudEvents JSON document.
    body: Vec<u8>,
}

fn documents(n: usize) -> Vec<Document> {
    (0..n)
        .map(|seq| {
            let envelope = event(seq).envelope;
            Document {
                key: envelope.aggregate_key.clone(),
                id: envelope.id.to_string(),
                body: tidings_core::cloudevents::to_json(&envelope),
            }
        })
        .collect()
}

/// The bench's events as the broker carries them: the CloudEvents JSON document.
fn bodies(n: usize) -> Vec<Vec<u8>> {
    documents(n).into_iter().map(|d| d.body).collect()
}

/// `n` events published to the broker at `url` with its own client, with
/// up to [`WINDOW`] awaiting their confirmation; `None` for the database log.
pub(super) async fn publish(url: Option<&str>, n: usize) -> anyhow::Result<Option<Drain>> {
    let Some(url) = url else { return Ok(None) };
    let scheme = url.split_once("://").map_or("", |(s, _)| s);
    let drain = match scheme {
        "nats" => nats::publish(url, n).await?,
        "amqp" | "amqps" => rabbitmq::publish(url, n).await?,
        "sqs" => sns::publish(url, n).await?,
        "pubsub" => pubsub::publish(url, n).await?,
        _ => return Ok(None),
    };
    Ok(Some(drain))
}

/// The value of query parameter `name` in `url`.
fn query(url: &str, name: &str) -> anyhow::Result<Option<String>> {
    let parsed = url::Url::parse(url).map_err(|e| anyhow::anyhow!("{url:?} is not a URL: {e}"))?;
    Ok(parsed
        .query_pairs()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned()))
}

/// The host part of `url` (the region, the project), if any.
fn host(url: &str) -> anyhow::Result<Option<String>> {
    let parsed = url::Url::parse(url).map_err(|e| anyhow::anyhow!("{url:?} is not a URL: {e}"))?;
    Ok(parsed.host_str().filter(|h| !h.is_empty()).map(str::to_owned))
}
