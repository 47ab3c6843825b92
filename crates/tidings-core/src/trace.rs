//! Following one order through the system: W3C trace context on every
//! envelope, and the spans Tidings opens.
//!
//! Every envelope carries a `traceparent` header ([W3C Trace Context]) from
//! birth: [`Envelope::new`](crate::Envelope::new) takes the current trace if
//! a tracing backend says there is one ([`set_backend`]), else starts a new
//! trace; [`Envelope::caused_by`](crate::Envelope::caused_by) continues the
//! cause's trace. Every transport carries headers, so the trace id of a
//! `PlaceOrder` command is the trace id of every event it causes, in every
//! consumer, whatever the broker.
//!
//! Spans (with the `tracing` crate): `tidings.enqueue` (message id, type,
//! topic, correlation and trace ids), `tidings.relay.batch` and
//! `tidings.publish` (records), `tidings.handle` (consumer, message id and
//! type, correlation and causation ids, trace id, attempt). With the
//! OpenTelemetry backend installed (`tidings-otel`), a handling span's parent
//! is the message's `traceparent`, and exported traces join across processes.
//!
//! [W3C Trace Context]: https://www.w3.org/TR/trace-context/

use std::fmt;
use std::sync::OnceLock;

use rand::Rng;

/// The header carrying the trace context.
pub const TRACEPARENT: &str = "traceparent";

/// A W3C trace context: which trace, and which span in it is the parent.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceContext {
    /// The trace's id (never 0).
    pub trace_id: u128,
    /// The parent span's id (never 0).
    pub span_id: u64,
    /// Whether the trace is sampled.
    pub sampled: bool,
}

impl fmt::Debug for TraceContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_header())
    }
}

impl TraceContext {
    /// A new trace, sampled.
    pub fn new_root() -> Self {
        let mut rng = rand::rng();
        TraceContext {
            trace_id: rng.random_range(1..=u128::MAX),
            span_id: rng.random_range(1..=u64::MAX),
            sampled: true,
        }
    }

    /// The same trace, a new span in it.
    pub fn child(&self) -> Self {
        TraceContext {
            span_id: rand::rng().random_range(1..=u64::MAX),
            ..*self
        }
    }

    /// Reads a `traceparent` header (version 00); `None` if malformed.
    ///
    /// ```
    /// use tidings_core::trace::TraceContext;
    /// let t = TraceContext::parse("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01").unwrap();
    /// assert_eq!(t.trace_id_hex(), "0af7651916cd43dd8448eb211c80319c");
    /// assert!(t.sampled);
    /// assert_eq!(t.to_header(), "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01");
    /// assert!(TraceContext::parse("00-00000000000000000000000000000000-b7ad6b7169203331-01").is_none());
    /// ```
    pub fn parse(header: &str) -> Option<Self> {
        let mut parts = header.trim().split('-');
        let (version, trace, span, flags) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        let hex = |s: &str, len: usize| s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit());
        if !hex(version, 2) || version == "ff" || !hex(trace, 32) || !hex(span, 16) || !hex(flags, 2) {
            return None;
        }
        // Version 00 has exactly four fields; later versions may add some.
        if version == "00" && parts.next().is_some() {
            return None;
        }
        let trace_id = u128::from_str_radix(trace, 16).ok()?;
        let span_id = u64::from_str_radix(span, 16).ok()?;
        let flags = u8::from_str_radix(flags, 16).ok()?;
        (trace_id != 0 && span_id != 0).then_some(TraceContext {
            trace_id,
            span_id,
            sampled: flags & 1 == 1,
        })
    }

    /// The `traceparent` header's value.
    pub fn to_header(&self) -> String {
        format!(
            "00-{:032x}-{:016x}-{:02x}",
            self.trace_id,
            self.span_id,
            u8::from(self.sampled)
        )
    }

    /// The trace id as 32 hex digits (as tracing backends show it).
    pub fn trace_id_hex(&self) -> String {
        format!("{:032x}", self.trace_id)
    }
}

/// What a tracing backend (OpenTelemetry) provides: the current span's
/// context, and how to make a span a child of a remote one.
#[derive(Debug, Clone, Copy)]
pub struct Backend {
    /// The trace context of the current span, if it is part of a trace.
    pub current: fn() -> Option<TraceContext>,
    /// Makes `span` a child of the remote context (a message's `traceparent`).
    pub set_parent: fn(&tracing::Span, &TraceContext),
}

static BACKEND: OnceLock<Backend> = OnceLock::new();

/// Installs the tracing backend, once per process (later calls are ignored).
pub fn set_backend(backend: Backend) {
    let _ = BACKEND.set(backend);
}

/// Whether a backend is installed: spans that only make sense inside a
/// trace (one per message, say) are not worth making without one.
pub fn has_backend() -> bool {
    BACKEND.get().is_some()
}

/// The current span's trace context, if a backend is installed and the span is traced.
pub fn current() -> Option<TraceContext> {
    BACKEND.get().and_then(|b| (b.current)())
}

/// The trace a new envelope joins: the current span's (which becomes the
/// parent of the message's handling), or a new trace.
pub fn current_or_new() -> TraceContext {
    current().unwrap_or_else(TraceContext::new_root)
}

/// The trace of a message caused by one carrying `cause`: the current span's
/// if it is in the same trace (the cause's handling span, with a backend),
/// else a child of `cause`.
pub fn caused_by(cause: &TraceContext) -> TraceContext {
    current()
        .filter(|c| c.trace_id == cause.trace_id)
        .unwrap_or_else(|| cause.child())
}

/// Makes `span` a child of `parent` where the backend can (a no-op without one).
pub fn set_parent(span: &tracing::Span, parent: &TraceContext) {
    if let Some(b) = BACKEND.get() {
        (b.set_parent)(span, parent);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_and_malformed_ones_are_refused() {
        for _ in 0..100 {
            let t = TraceContext::new_root();
            assert_eq!(TraceContext::parse(&t.to_header()), Some(t));
            let c = t.child();
            assert_eq!((c.trace_id, c.sampled), (t.trace_id, t.sampled));
        }
        for bad in [
            "",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",
            "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
            "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",
            "00-xyz7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        ] {
            assert_eq!(TraceContext::parse(bad), None, "{bad}");
        }
        let unsampled =
            TraceContext::parse("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00").unwrap();
        assert!(!unsampled.sampled);
    }
}
