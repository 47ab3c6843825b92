//! The counters of a running consumer: [`ConsumerStats`].

use tidings_core::metrics::{self as m, Count};

#[cfg(doc)]
use super::ConsumerConfig;

/// Counters of a running consumer, also recorded as metrics labelled with
/// the consumer's name ([`tidings_core::metrics`]: `tidings_consumer_*`).
#[derive(Debug)]
pub struct ConsumerStats {
    pub(super) received: Count,
    pub(super) handled: Count,
    pub(super) failed: Count,
    pub(super) duplicates: Count,
    pub(super) retries: Count,
    pub(super) dead_lettered: Count,
    pub(super) parked: Count,
    pub(super) transactions: Count,
    pub(super) store_errors: Count,
    pub(super) handler_duration: metrics::Histogram,
}

impl ConsumerStats {
    /// The counters of the consumer named `consumer`, taking their metric
    /// handles from the recorder installed now.
    pub fn new(consumer: &str) -> Self {
        let count =
            |name: &'static str| Count::new(metrics::counter!(name, "consumer" => consumer.to_owned()));
        ConsumerStats {
            received: count(m::CONSUMER_RECEIVED),
            handled: count(m::CONSUMER_HANDLED),
            failed: count(m::CONSUMER_FAILED),
            duplicates: count(m::CONSUMER_DUPLICATES),
            retries: count(m::CONSUMER_RETRIED),
            dead_lettered: count(m::CONSUMER_DEAD_LETTERED),
            parked: count(m::CONSUMER_PARKED),
            transactions: Count::local(),
            store_errors: count(m::CONSUMER_STORE_ERRORS),
            handler_duration: metrics::histogram!(m::CONSUMER_HANDLER_DURATION, "consumer" => consumer.to_owned()),
        }
    }
}

macro_rules! counters {
    ($($name:ident: $doc:literal),* $(,)?) => {
        impl ConsumerStats {
            $(
                #[doc = $doc]
                pub fn $name(&self) -> u64 {
                    self.$name.get()
                }
            )*
        }
    };
}

counters! {
    received: "Deliveries received (duplicates included).",
    handled: "Messages handled and committed.",
    failed: "Handler attempts that failed (then retried or dead-lettered).",
    duplicates: "Deliveries recognised as already processed and skipped.",
    retries: "Attempts that failed and were retried.",
    dead_lettered: "Messages given up on and stored as dead letters.",
    parked: "Messages parked behind their key's dead letter.",
    transactions: "Handler transactions committed: one per handled message, fewer when batching ([`ConsumerConfig::batch`]).",
    store_errors: "Failures of Tidings' own database calls (retried without counting as attempts).",
}

pub(super) fn bump(c: &Count) {
    c.bump();
}
