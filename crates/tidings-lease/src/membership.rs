//! One member of one or more scopes: the heartbeat, the leases of its
//! share, their renewal while it works, and the hand-over when shares move.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tidings_core::Result;
use tidings_core::lease::{Lease, LeaseStore};
use tokio_util::sync::CancellationToken;

use crate::assignment::assignment;

/// A member id unique to this process and run: `<kind>-pid<pid>-<random>`.
pub fn unique_member(kind: &str) -> String {
    let random = uuid::Uuid::new_v4().simple().to_string();
    format!("{kind}-pid{}-{}", std::process::id(), &random[..8])
}

/// A scope a member belongs to, and how many partitions it has.
#[derive(Debug, Clone)]
pub struct Scope {
    /// The scope's name ([`scope`](tidings_core::lease::scope) for a consumer group on a topic).
    pub name: Arc<str>,
    /// Its partition count.
    pub partitions: u32,
}

/// The leases held, per scope (same order as the scopes).
pub type Held = Vec<Vec<Lease>>;

/// One member of one or more scopes: it heartbeats, takes its share of
/// each scope's partitions, renews its leases while it works, and notices
/// when the shares move (the steps in the crate documentation).
#[derive(Debug)]
pub struct Membership<S> {
    store: S,
    member: String,
    ttl: Duration,
    scopes: Vec<Scope>,
}

fn partitions_of(leases: &[Lease]) -> Vec<u32> {
    leases.iter().map(|l| l.partition).collect()
}

impl<S: LeaseStore> Membership<S> {
    /// `member` of `scopes`, with leases lasting `ttl`.
    pub fn new(store: S, member: String, ttl: Duration, scopes: Vec<Scope>) -> Self {
        Membership {
            store,
            member,
            ttl,
            scopes,
        }
    }

    /// This member's id.
    pub fn member(&self) -> &str {
        &self.member
    }

    /// The scopes, in the order of [`Held`].
    pub fn scopes(&self) -> &[Scope] {
        &self.scopes
    }

    /// How often leases are renewed: three times per lease.
    pub fn tick(&self) -> Duration {
        self.ttl / 3
    }

    /// This member's share of `scope`, from a fresh heartbeat.
    async fn share(&self, scope: &Scope) -> Result<Vec<u32>> {
        let members = self.store.heartbeat(&scope.name, &self.member, self.ttl).await?;
        Ok(assignment(&members, &self.member, scope.partitions))
    }

    /// Between sessions: gives back what is no longer this member's share
    /// (nothing reads it now) and takes what of its share is free.
    pub async fn sync(&self, held: &Held) -> Result<Held> {
        let mut now = Vec::with_capacity(self.scopes.len());
        for (i, scope) in self.scopes.iter().enumerate() {
            let share = self.share(scope).await?;
            let before = held.get(i).map(Vec::as_slice).unwrap_or_default();
            let give_up: Vec<u32> = partitions_of(before)
                .into_iter()
                .filter(|p| !share.contains(p))
                .collect();
            if !give_up.is_empty() {
                self.store.release(&scope.name, &self.member, &give_up).await?;
                tracing::info!(member = %self.member, scope = %scope.name, partitions = ?give_up, "partitions handed over");
            }
            let leases = self
                .store
                .acquire(&scope.name, &self.member, &share, self.ttl)
                .await?;
            let gained: Vec<u32> = partitions_of(&leases)
                .into_iter()
                .filter(|p| !partitions_of(before).contains(p))
                .collect();
            if !gained.is_empty() {
                tracing::info!(member = %self.member, scope = %scope.name, partitions = ?gained, "partitions taken");
            }
            now.push(leases);
        }
        Ok(now)
    }

    /// During a session: renews `held` every tick, and cancels `stop` as
    /// soon as the session must end: a lease was lost, part of it is no
    /// longer this member's share, more of its share became free, or
    /// renewing failed for so long that the leases may lapse.
    pub async fn watch(&self, held: &Held, stop: CancellationToken) {
        let mut renewed = Instant::now();
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(self.tick()) => {}
            }
            match self.renew(held).await {
                Ok(None) => renewed = Instant::now(),
                Ok(Some(why)) => {
                    tracing::info!(member = %self.member, reason = why, "rebalancing partitions");
                    stop.cancel();
                    return;
                }
                Err(e) => {
                    tracing::warn!(member = %self.member, error = %e.report(), "renewing partition leases failed");
                    // Stop reading before the leases can lapse and pass to another member.
                    if renewed.elapsed() >= self.ttl.mul_f32(0.66) {
                        tracing::warn!(member = %self.member, "leases may lapse: stopping until they are renewed");
                        stop.cancel();
                        return;
                    }
                }
            }
        }
    }

    /// One renewal; `Some(reason)` when the session must end.
    async fn renew(&self, held: &Held) -> Result<Option<&'static str>> {
        for (i, scope) in self.scopes.iter().enumerate() {
            let share = self.share(scope).await?;
            let mine = &held[i];
            if mine.iter().any(|l| !share.contains(&l.partition)) {
                return Ok(Some("a partition is another member's share now"));
            }
            let leases = self
                .store
                .acquire(&scope.name, &self.member, &share, self.ttl)
                .await?;
            if mine.iter().any(|l| !leases.contains(l)) {
                return Ok(Some("a lease was lost"));
            }
            if leases.len() > mine.len() {
                return Ok(Some("more partitions are free to take"));
            }
        }
        Ok(None)
    }

    /// Leaves every scope (on shutdown), so others take over at once.
    pub async fn leave(&self) {
        for scope in &self.scopes {
            if let Err(e) = self.store.leave(&scope.name, &self.member).await {
                tracing::warn!(member = %self.member, scope = %scope.name, error = %e.report(), "leaving the group failed; its leases will lapse");
            }
        }
    }
}
