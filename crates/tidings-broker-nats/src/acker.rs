//! Settling a delivery: JetStream's acknowledgements, one to one.

use async_nats::jetstream;
use async_trait::async_trait;
use tidings_core::{AckKind, Acker, Error, Result};

use crate::TRANSPORT;

pub(crate) struct NatsAcker(pub(crate) jetstream::message::Acker);

#[async_trait]
impl Acker for NatsAcker {
    async fn ack(&self, kind: AckKind) -> Result<()> {
        let kind = match kind {
            AckKind::Ack => jetstream::AckKind::Ack,
            AckKind::Nak(delay) => jetstream::AckKind::Nak(delay),
            AckKind::Progress => jetstream::AckKind::Progress,
            AckKind::Term => jetstream::AckKind::Term,
        };
        self.0
            .ack_with(kind)
            .await
            .map_err(|e| Error::transport(TRANSPORT, "acknowledging", e, true))
    }
}
