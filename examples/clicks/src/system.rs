//! The clicks system's tables, the web tier's outbox door, and the
//! figures read back.

use std::collections::HashMap;

use async_trait::async_trait;
use tidings_core::{Envelope, Outbox, OutgoingMessage};
use tidings_demo_kit::Work;
use tidings_sql::SqlStore;
use tidings_sql::db::Stmt;

use crate::messages::*;
use crate::score::Session;
use crate::sql::{ClicksDialect, shared};

/// Who writes the clicks.
pub const SOURCE: &str = "web";

/// Figures read from the database in one snapshot.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tally {
    /// Clicks stored (scored), all runs.
    pub stored: i64,
    /// Sessions in the feature store.
    pub sessions: i64,
    /// Of which flagged as fraud.
    pub flagged: i64,
    /// Outbox records not yet sent.
    pub outbox_pending: i64,
    /// Clicks the scorer saw after a later click of the same session.
    pub violations: i64,
    /// What the scorer did.
    pub work: Work,
}

/// A session's row in the feature store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Features {
    /// Clicks.
    pub clicks: i64,
    /// Fast clicks.
    pub fast: i64,
    /// The longest run of fast clicks.
    pub max_streak: i64,
    /// The fraud score (0 to 1000).
    pub score: i64,
    /// Flagged as fraud.
    pub flagged: bool,
}

impl From<Session> for Features {
    fn from(s: Session) -> Features {
        Features {
            clicks: s.clicks,
            fast: s.fast,
            max_streak: s.max_streak,
            score: s.score(),
            flagged: s.flagged(),
        }
    }
}

/// `clicks` as the outbox takes them, each with its event id made once: a
/// transaction tried again writes the same events, never new copies.
pub fn outgoing(clicks: &[Click]) -> tidings_core::Result<Vec<OutgoingMessage>> {
    clicks
        .iter()
        .map(|click| {
            Ok(OutgoingMessage {
                topic: CLICKS.to_owned(),
                envelope: Envelope::new(SOURCE, click)?,
            })
        })
        .collect()
}

/// What the demo needs from a database.
#[async_trait]
pub trait ClicksStore: tidings_core::Store {
    /// Runs Tidings' migrations and creates the clicks tables.
    async fn setup(&self) -> anyhow::Result<()>;

    /// The web tier, through the outbox: the [`outgoing`] clicks in one transaction.
    async fn write_clicks(&self, clicks: &[OutgoingMessage]) -> tidings_core::Result<()>;

    /// Reads the figures.
    async fn tally(&self) -> anyhow::Result<Tally>;

    /// Every stored click, each session's in order.
    async fn stored(&self) -> anyhow::Result<Vec<Click>>;

    /// The feature store, by session.
    async fn features(&self) -> anyhow::Result<HashMap<String, Features>>;

    /// This database's system id, made once.
    async fn system_id(&self) -> anyhow::Result<String>;
}

#[async_trait]
impl<D: ClicksDialect> ClicksStore for SqlStore<D> {
    async fn setup(&self) -> anyhow::Result<()> {
        Ok(tidings_demo_kit::setup_system(self, D::CLICKS.schema, "creating the clicks tables").await?)
    }

    async fn write_clicks(&self, clicks: &[OutgoingMessage]) -> tidings_core::Result<()> {
        let mut tx = self.begin_tx("writing clicks").await?;
        for message in clicks {
            self.enqueue_outgoing(&mut tx, message).await?;
        }
        self.commit(tx).await
    }

    async fn system_id(&self) -> anyhow::Result<String> {
        let mut conn = self.conn("naming the system").await?;
        Ok(tidings_demo_kit::system_id::<D>(&mut conn, "clicks").await?)
    }

    async fn tally(&self) -> anyhow::Result<Tally> {
        let mut tx = self.pool().begin().await?;
        Stmt::<D>::new(D::CLICKS.snapshot, "starting the tally's snapshot")
            .execute(&mut tx)
            .await?;
        let row = Stmt::<D>::new(shared::TALLY, "reading the figures")
            .fetch_one(&mut tx)
            .await?;
        let figure = |i: usize| row.get::<i64>(i);
        Ok(Tally {
            stored: figure(0)?,
            sessions: figure(1)?,
            flagged: figure(2)?,
            outbox_pending: figure(3)?,
            violations: figure(4)?,
            work: Work::read::<D>(&mut tx).await?.only(&["fraud"]),
        })
    }

    async fn stored(&self) -> anyhow::Result<Vec<Click>> {
        let mut conn = self.conn("reading the stored clicks").await?;
        Stmt::<D>::new(shared::STORED, "reading the stored clicks")
            .fetch_all(&mut conn)
            .await?
            .iter()
            .map(|r| {
                Ok(Click {
                    click_id: r.get(0)?,
                    session_id: r.get(1)?,
                    seq: r.get(2)?,
                    page: r.get(3)?,
                    at_ms: r.get(4)?,
                })
            })
            .collect()
    }

    async fn features(&self) -> anyhow::Result<HashMap<String, Features>> {
        let mut conn = self.conn("reading the feature store").await?;
        Stmt::<D>::new(shared::FEATURES, "reading the feature store")
            .fetch_all(&mut conn)
            .await?
            .iter()
            .map(|r| {
                Ok((
                    r.get(0)?,
                    Features {
                        clicks: r.get(1)?,
                        fast: r.get(2)?,
                        max_streak: r.get(3)?,
                        score: r.get(4)?,
                        flagged: r.get::<i64>(5)? == 1,
                    },
                ))
            })
            .collect()
    }
}
