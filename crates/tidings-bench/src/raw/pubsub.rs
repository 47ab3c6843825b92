//! Google Pub/Sub's own client (gcloud-pubsub): a topic of the run's own
//! with one ordered subscription, `Publish` requests of up to 1000
//! messages (the most Pub/Sub takes in one), each with its ordering key,
//! [`WINDOW`] messages or more awaiting their confirmation.

use std::time::Instant;

use anyhow::Context as _;
use futures::StreamExt;
use gcloud_gax::conn::Environment;
use gcloud_googleapis::pubsub::v1::PubsubMessage;
use gcloud_pubsub::client::{Client, ClientConfig};
use gcloud_pubsub::publisher::{Publisher, PublisherConfig};
use gcloud_pubsub::subscription::SubscriptionConfig;

use super::{WINDOW, documents, host, query};
use crate::{Drain, drain, short_id};

/// Pub/Sub's largest `Publish` request, in messages.
const REQUEST: usize = 1000;

/// `pubsub://PROJECT[?endpoint=URL]`; the emulator at `PUBSUB_EMULATOR_HOST`
/// or a plain `http://` endpoint, else Application Default Credentials.
pub(super) async fn publish(url: &str, n: usize) -> anyhow::Result<Drain> {
    let project = host(url)?.with_context(|| format!("{url:?} names no project (pubsub://PROJECT)"))?;
    let emulator = query(url, "endpoint")?
        .filter(|e| e.starts_with("http://"))
        .or_else(|| std::env::var("PUBSUB_EMULATOR_HOST").ok());
    let mut config = ClientConfig {
        project_id: Some(project.clone()),
        ..ClientConfig::default()
    };
    match emulator {
        Some(host) => {
            config.environment = Environment::Emulator(host.trim_start_matches("http://").to_owned())
        }
        None => config = config.with_auth().await.context("finding Google credentials")?,
    }
    let client = Client::new(config)
        .await
        .with_context(|| format!("connecting to Pub/Sub for project {project}"))?;

    let id = format!("bench-raw-{}", short_id());
    let topic = client.topic(&id);
    topic
        .create(None, None)
        .await
        .with_context(|| format!("creating Pub/Sub topic {id}"))?;
    let ordered = SubscriptionConfig {
        enable_message_ordering: true,
        ..SubscriptionConfig::default()
    };
    let subscription = client
        .create_subscription(&id, &id, ordered, None)
        .await
        .with_context(|| format!("creating Pub/Sub subscription {id}"))?;
    let publisher = topic.new_publisher(Some(PublisherConfig {
        workers: 0,
        ..PublisherConfig::default()
    }));

    let requests: Vec<Vec<PubsubMessage>> = documents(n)
        .chunks(REQUEST)
        .map(|chunk| {
            chunk
                .iter()
                .map(|d| PubsubMessage {
                    data: d.body.clone(),
                    ordering_key: d.key.clone(),
                    ..PubsubMessage::default()
                })
                .collect()
        })
        .collect();
    let started = Instant::now();
    let sent = requests.into_iter().map(|request| send(&publisher, request));
    let mut confirmed = futures::stream::iter(sent).buffer_unordered(WINDOW.div_ceil(REQUEST).max(2));
    while let Some(result) = confirmed.next().await {
        result?;
    }
    let measured = drain(1, n, started);

    subscription.delete(None).await?;
    topic.delete(None).await?;
    Ok(measured)
}

/// One `Publish` request, answered; fails unless every message got an id.
async fn send(publisher: &Publisher, request: Vec<PubsubMessage>) -> anyhow::Result<()> {
    let count = request.len();
    let ids = publisher
        .publish_immediately(request, None)
        .await
        .map_err(|e| anyhow::anyhow!("Pub/Sub Publish: {:?}: {}", e.code(), e.message()))?;
    anyhow::ensure!(
        ids.len() == count,
        "Pub/Sub confirmed {} of {count} messages",
        ids.len()
    );
    Ok(())
}
