//! The outbox: `enqueue` in the caller's transaction, the relay's claims
//! (the dialect's own), and the cleanup of sent records.

use std::time::Duration;

use async_trait::async_trait;
use sqlx::Database;
use tidings_core::partition::key_hash;
use tidings_core::{
    Error, ErrorClass, Outbox, OutboxPartitions, OutgoingMessage, RelayStore, Result, cloudevents,
};
use tracing::Instrument;

use crate::db::Stmt;
use crate::store::millis;
use crate::{Dialect, SqlStore, Wakeups};

#[async_trait]
impl<D: Dialect> Outbox for SqlStore<D> {
    type Database = D::Db;

    fn error_class(&self, error: &sqlx::Error) -> ErrorClass {
        crate::classify::<D>(error)
    }

    async fn enqueue_outgoing(
        &self,
        conn: &mut <D::Db as Database>::Connection,
        message: &OutgoingMessage,
    ) -> Result<()> {
        tidings_core::guard::check(&self.inner.options.guard, message)?;
        let e = &message.envelope;
        let body = cloudevents::to_json(e);
        if let Some(limit) = self.inner.options.max_event_bytes
            && body.len() > limit
        {
            return Err(Error::Refused {
                message_type: e.message_type.clone(),
                version: e.version,
                reason: format!(
                    "the event is {} bytes, more than the {limit} its transports accept \
                     (StoreOptions::max_event_bytes): keep large payloads elsewhere and send a reference",
                    body.len()
                ),
            });
        }
        if let Some(transport) = self.inner.transport.get()
            && let Some(reason) = transport.refuses(message)
        {
            return Err(Error::Refused {
                message_type: e.message_type.clone(),
                version: e.version,
                reason: format!("the transport would refuse it: {reason}"),
            });
        }
        Stmt::<D>::new(D::SQL.enqueue, "inserting into the outbox")
            .bind(e.id)
            .bind(message.topic.as_str())
            .bind(e.aggregate_key.as_str())
            .bind(i64::from(key_hash(&e.aggregate_key)))
            .bind(e.message_type.as_str())
            .bind(body.as_slice())
            .execute(conn)
            .instrument(enqueue_span(message))
            .await?;
        Ok(())
    }

    fn source(&self) -> &str {
        &self.inner.options.source
    }

    fn wake(&self) {
        self.inner.wake.outbox_committed();
    }
}

#[async_trait]
impl<D: Dialect> RelayStore for SqlStore<D> {
    type Batch = D::Batch;

    async fn claim(&self, limit: usize, held: &OutboxPartitions) -> Result<D::Batch> {
        D::claim(self, limit, held).await
    }

    async fn wait_for_work(&self, timeout: Duration) {
        self.inner.wake.wait_outbox(timeout).await;
    }

    async fn cleanup(&self) -> Result<u64> {
        let Some(retention) = self.inner.options.retention else {
            return Ok(0);
        };
        let mut conn = self.conn("deleting sent outbox rows past retention").await?;
        let done = Stmt::<D>::new(D::SQL.outbox_cleanup, "deleting sent outbox rows past retention")
            .bind(millis(retention))
            .execute(&mut conn)
            .await?;
        Ok(D::rows_affected(&done))
    }
}

/// The span of writing `message` to the outbox (`tidings.enqueue`), with
/// the ids a trace search needs, in the message's own trace (a child of its
/// `traceparent`, which is usually the current span already).
fn enqueue_span(message: &OutgoingMessage) -> tracing::Span {
    let e = &message.envelope;
    let trace = e.trace();
    let span = tracing::info_span!(
        "tidings.enqueue",
        message_id = %e.id,
        message_type = %e.message_type,
        topic = %message.topic,
        correlation_id = %e.correlation_id,
        trace_id = %trace.map(|t| t.trace_id_hex()).unwrap_or_default(),
    );
    if let Some(parent) = trace
        && !span.is_disabled()
    {
        tidings_core::trace::set_parent(&span, &parent);
    }
    span
}
