//! The upload system's tables, its front door, and the figures read back.

use async_trait::async_trait;
use tidings_core::{Envelope, Outbox, OutgoingMessage};
use tidings_demo_kit::Work;
use tidings_sql::SqlStore;
use tidings_sql::db::Stmt;

use crate::messages::*;
use crate::sql::{UploadDialect, shared};

/// Figures read from the database in one snapshot.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tally {
    /// Files uploaded.
    pub uploads: i64,
    /// Of which infected.
    pub infected: i64,
    /// Of which clean but no image.
    pub corrupt: i64,
    /// Files scanned.
    pub scanned: i64,
    /// Scans that found malware.
    pub scanned_infected: i64,
    /// Thumbnails made.
    pub thumbnails: i64,
    /// Thumbnails of infected files (must be 0).
    pub infected_thumbnails: i64,
    /// Files the catalog shows as quarantined.
    pub quarantined: i64,
    /// Outbox records not yet sent.
    pub outbox_pending: i64,
    /// Events a consumer saw after a later event of the same file.
    pub violations: i64,
    /// The slowest handling each stage committed, in milliseconds.
    pub slowest_ms: Vec<(String, i64)>,
    /// What each consumer did.
    pub work: Work,
}

impl Tally {
    /// Messages on each stage's queue not yet handled, dead-lettered or
    /// parked: (catalog, antivirus, thumbnailer, indexer).
    pub fn backlog(&self) -> [i64; 4] {
        [
            self.work.missing("catalog", self.uploads + self.scanned_infected),
            self.work.missing("antivirus", self.uploads),
            self.work
                .missing("thumbnailer", self.scanned - self.scanned_infected),
            self.work.missing("indexer", self.thumbnails),
        ]
    }
}

/// A file as the upload service stores it.
#[derive(Debug, Clone)]
pub struct File {
    /// Its id.
    pub file_id: String,
    /// Its name.
    pub name: String,
    /// Its size.
    pub bytes: i64,
    /// Whether it carries malware (the simulated content).
    pub infected: bool,
    /// Whether it is no image (the thumbnailer cannot read it).
    pub corrupt: bool,
}

/// What the demo needs from a database.
#[async_trait]
pub trait UploadStore: tidings_core::Store {
    /// Runs Tidings' migrations and creates the upload tables.
    async fn setup(&self) -> anyhow::Result<()>;

    /// The upload service: stores the file and, in the same transaction,
    /// tells the world (`UploadFinished`) and queues its scan (`ScanFile`).
    async fn upload(&self, file: &File) -> tidings_core::Result<()>;

    /// Reads the figures.
    async fn tally(&self) -> anyhow::Result<Tally>;

    /// This database's system id, made once.
    async fn system_id(&self) -> anyhow::Result<String>;
}

fn outgoing<M: tidings_core::Message>(message: &M) -> tidings_core::Result<OutgoingMessage> {
    Ok(OutgoingMessage {
        topic: M::TOPIC.to_owned(),
        envelope: Envelope::new("upload-api", message)?,
    })
}

#[async_trait]
impl<D: UploadDialect> UploadStore for SqlStore<D> {
    async fn setup(&self) -> anyhow::Result<()> {
        Ok(tidings_demo_kit::setup_system(self, D::UPLOAD.schema, "creating the upload tables").await?)
    }

    async fn upload(&self, file: &File) -> tidings_core::Result<()> {
        let finished = outgoing(&UploadFinished {
            file_id: file.file_id.clone(),
            name: file.name.clone(),
            bytes: file.bytes,
            step: 1,
        })?;
        let scan = outgoing(&ScanFile {
            file_id: file.file_id.clone(),
        })?;
        let mut tx = self.begin_tx("storing an upload").await?;
        Stmt::<D>::new(shared::UPLOAD, "storing an upload")
            .bind(file.file_id.as_str())
            .bind(file.name.as_str())
            .bind(file.bytes)
            .bind(i64::from(file.infected))
            .bind(i64::from(file.corrupt))
            .execute(&mut tx)
            .await?;
        self.enqueue_outgoing(&mut tx, &finished).await?;
        self.enqueue_outgoing(&mut tx, &scan).await?;
        self.commit(tx).await
    }

    async fn system_id(&self) -> anyhow::Result<String> {
        let mut conn = self.conn("naming the system").await?;
        Ok(tidings_demo_kit::system_id::<D>(&mut conn, "upload").await?)
    }

    async fn tally(&self) -> anyhow::Result<Tally> {
        let mut tx = self.pool().begin().await?;
        Stmt::<D>::new(D::UPLOAD.snapshot, "starting the tally's snapshot")
            .execute(&mut tx)
            .await?;
        let row = Stmt::<D>::new(shared::TALLY, "reading the figures")
            .fetch_one(&mut tx)
            .await?;
        let figure = |i: usize| row.get::<i64>(i);
        Ok(Tally {
            uploads: figure(0)?,
            infected: figure(1)?,
            corrupt: figure(2)?,
            scanned: figure(3)?,
            scanned_infected: figure(4)?,
            thumbnails: figure(5)?,
            infected_thumbnails: figure(6)?,
            quarantined: figure(7)?,
            outbox_pending: figure(8)?,
            violations: figure(9)?,
            slowest_ms: Stmt::<D>::new(shared::SLOWEST, "reading the slowest handlings")
                .fetch_all(&mut tx)
                .await?
                .iter()
                .map(|r| Ok((r.get(0)?, r.get(1)?)))
                .collect::<tidings_core::Result<_>>()?,
            work: Work::read::<D>(&mut tx).await?.only(&crate::demo::STAGES),
        })
    }
}
