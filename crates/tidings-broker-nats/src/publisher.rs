//! Publishing with PubAcks and `Nats-Msg-Id` dedupe.

use async_nats::HeaderMap;
use async_nats::jetstream::context::PublishAckFuture;
use async_nats::jetstream::context::{PublishError, PublishErrorKind};
use async_trait::async_trait;
use tidings_core::waves::key_waves;
use tidings_core::{Error, OutgoingMessage, Partition, Publisher, Result, cloudevents};

use crate::topology::subject_token;
use crate::{NatsTransport, TRANSPORT};

/// Whether JetStream refused the message for its size, as the stream is set up.
fn too_large_for_the_stream(e: &PublishError) -> bool {
    use async_nats::jetstream::ErrorCode;
    std::error::Error::source(e)
        .and_then(|s| s.downcast_ref::<async_nats::jetstream::Error>())
        .is_some_and(|j| {
            matches!(
                j.error_code(),
                ErrorCode::STREAM_MESSAGE_EXCEEDS_MAXIMUM | ErrorCode::STREAM_HEADER_EXCEEDS_MAXIMUM
            )
        })
}

/// Whether `name` is a header JetStream acts on (`Nats-` in any case).
fn is_jetstream_header(name: &str) -> bool {
    name.get(..5).is_some_and(|p| p.eq_ignore_ascii_case("nats-"))
}

impl NatsTransport {
    /// Hands one message to the client, returning its PubAck to await.
    async fn send(&self, m: &OutgoingMessage) -> Result<PublishAckFuture> {
        self.ensure_stream(&m.topic).await?;
        let (attributes, payload) = cloudevents::encode(
            &m.envelope,
            cloudevents::Binding::Standard,
            self.options.content_mode,
        );
        let mut headers = HeaderMap::new();
        // `Nats-*` headers are JetStream's instructions (`Nats-Rollup`,
        // `Nats-Expected-*`): one kept from a message read elsewhere must
        // not steer this publish. Only the id below is Tidings' own.
        for (k, v) in attributes.iter().filter(|(k, _)| !is_jetstream_header(k)) {
            headers.insert(k.as_str(), v.as_str());
        }
        // A redrive must not be dropped as a duplicate of the first publish.
        let msg_id = match m.envelope.headers.get(tidings_core::REDRIVE_HEADER) {
            Some(n) => format!("{}/redrive/{n}", m.envelope.id),
            None => m.envelope.id.to_string(),
        };
        headers.insert("Nats-Msg-Id", msg_id.as_str());
        let partition = Partition::of(&m.envelope.aggregate_key, self.options.partitions_of(&m.topic));
        let subject = self.options.message_subject(
            &m.topic,
            &partition.index.to_string(),
            &subject_token(&m.envelope.message_type),
        );
        self.js
            .publish_with_headers(subject, headers, payload.into())
            .await
            .map_err(|e| {
                // Checked by the client before sending: this record will never fit.
                let transient = e.kind() != PublishErrorKind::MaxPayloadExceeded;
                Error::transport(TRANSPORT, "publishing", e, transient)
            })
    }
}

#[async_trait]
impl Publisher for NatsTransport {
    async fn publish(&self, batch: &[OutgoingMessage]) -> Result<()> {
        // The client pipelines and reconnects on its own: what it had
        // written to a broken connection is lost while what was still
        // queued goes out on the next one. So the batch goes in key waves
        // (no two messages of a key in flight together), each wave sent
        // whole and then its PubAcks awaited: one round trip per wave.
        for wave in key_waves(batch) {
            let mut acks = Vec::with_capacity(wave.len());
            for m in wave {
                acks.push(self.send(m).await?);
            }
            for ack in acks {
                ack.await.map_err(|e| {
                    if too_large_for_the_stream(&e) {
                        // The stream's max_msg_size (or header limit): it
                        // will never take this record, so the relay finds
                        // it and sets it aside.
                        Error::transport(
                            TRANSPORT,
                            "publishing: the stream refuses a message this large (its max_msg_size); raise it, or make the event smaller",
                            e,
                            false,
                        )
                    } else {
                        Error::transport(TRANSPORT, "waiting for a PubAck", e, true)
                    }
                })?;
            }
        }
        Ok(())
    }

    /// A record whose payload and own headers alone exceed the server's
    /// `max_payload`; one that exceeds it only with the CloudEvents
    /// attributes fails its publish permanently, and the relay finds it.
    fn refuses(&self, m: &OutgoingMessage) -> Option<String> {
        let max = self.max_payload();
        let size = m.envelope.own_bytes();
        (size > max).then(|| {
            format!(
                "its {size} bytes are more than the NATS server's max_payload of {max} bytes: raise max_payload on the server, or make the event smaller"
            )
        })
    }
}
