//! The units the layers hand each other: a delivery at work, the
//! partitions a session reads and the lease of each, and how a delivery
//! ended.

use std::collections::HashMap;

use async_trait::async_trait;
use futures::StreamExt;
use tidings_core::{AckKind, Acker, DecodeError, Delivery, Envelope, Partition, Subscription};

use crate::membership::Claim;

#[cfg(doc)]
use super::{Consumer, OnDeadLetter};

/// How one delivery ended (see [`Consumer::deliver`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Settled {
    /// The handler ran and its transaction committed, with the processed marker.
    Handled,
    /// The message was already processed: nothing ran.
    Duplicate,
    /// The message was given up on and stored in the failure store.
    DeadLettered,
    /// The message's key is held behind a dead letter: it waits, unhandled,
    /// in the parking store ([`OnDeadLetter::HoldKey`]).
    Parked,
    /// The message was given back to the transport unhandled (shutdown,
    /// hand-over, lost lease), to be delivered again.
    GivenBack,
}

/// A delivery on its way through the stack, decoded or not.
pub(super) struct Work {
    pub(super) delivery: Delivery,
    pub(super) envelope: Result<Envelope, DecodeError>,
    /// The lease that allows handling it; none outside a group ([`Consumer::deliver`]).
    pub(super) claim: Option<Claim>,
}

/// A subscription to one partition, tagging each delivery with the lease that allows it.
pub(super) struct Leased {
    pub(super) claim: Claim,
    pub(super) subscription: Subscription,
}

impl futures::Stream for Leased {
    type Item = (Claim, tidings_core::Result<Delivery>);

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        let claim = self.claim.clone();
        self.subscription
            .poll_next_unpin(cx)
            .map(|next| next.map(|item| (claim, item)))
    }
}

/// The partitions a session reads, to find the claim covering a key.
#[derive(Default)]
pub(super) struct Partitions {
    counts: HashMap<String, u32>,
    claims: HashMap<(String, u32), Claim>,
}

impl Partitions {
    pub(super) fn add(&mut self, topic: &str, partition: Partition, claim: &Claim) {
        self.counts.insert(topic.to_owned(), partition.count);
        self.claims
            .insert((topic.to_owned(), partition.index), claim.clone());
    }

    /// The claim under which this session handles `key` of `topic`, if it reads it.
    pub(super) fn claim(&self, topic: &str, key: &str) -> Option<Claim> {
        let count = *self.counts.get(topic)?;
        let index = Partition::of(key, count).index;
        self.claims.get(&(topic.to_owned(), index)).cloned()
    }
}

/// The acknowledgement of a message no transport delivered ([`Consumer::deliver`]).
pub(super) struct Unsettled;

#[async_trait]
impl Acker for Unsettled {
    async fn ack(&self, _: AckKind) -> tidings_core::Result<()> {
        Ok(())
    }
}
