//! The upload pipeline's four services, as Tidings handlers. Each stage
//! is a competing consumer on its work queue, with its own bounded number
//! of lanes, so a burst of uploads waits in the queues instead of melting
//! the database.
//!
//! - [`Catalog`] keeps each file's status for the product (uploaded, quarantined).
//! - [`Antivirus`] scans each file (slowly): an infected one is
//!   quarantined and goes no further; a clean one goes to the thumbnailer.
//! - [`Thumbnailer`] makes the thumbnail (slower, CPU-bound, off the async
//!   threads), then asks for the file to be indexed. A file that is no image
//!   (`corrupt`) is dead-lettered.
//! - [`Indexer`] puts the file in a fragile third-party search API, in a
//!   job of its own as the seed advises: through the effects ledger
//!   (`ctx.once`), with the API's idempotency key, so that a call whose
//!   answer was lost (a timeout, a crash) is repeated with the same key and
//!   indexes nothing twice.

use std::time::{Duration, Instant};

use rand::Rng;
use tidings_consumer::{Context, Handler, HandlerError};
use tidings_demo_kit::{ThirdParty, check_step, for_each_database};
use tidings_sql::db::Stmt;

use crate::messages::*;

/// Keeps each file's status.
#[derive(Debug, Clone, Copy)]
pub struct Catalog;

/// Scans files for malware.
#[derive(Debug, Clone, Copy)]
pub struct Antivirus;

/// Makes thumbnails.
#[derive(Debug, Clone, Copy)]
pub struct Thumbnailer;

/// Indexes files in the search API.
#[derive(Debug, Clone)]
pub struct Indexer {
    /// The search API.
    pub search: FragileSearch,
}

/// A search API that fails now and then, and now and then answers late
/// after doing the work (the answer lost to the caller's timeout).
#[derive(Debug, Clone)]
pub struct FragileSearch {
    /// The API (the third party's service `search`).
    pub api: ThirdParty,
    /// Fraction of calls refused with a 503.
    pub failure_rate: f64,
    /// Fraction of calls answered after `spike` (the work done all the same).
    pub spike_rate: f64,
    /// How late a spike answers.
    pub spike: Duration,
}

impl FragileSearch {
    /// Indexes `file_id` under the idempotency `key`.
    async fn index(&self, key: &str, file_id: &str) -> Result<(), HandlerError> {
        let (fail, spike) = {
            let mut rng = rand::rng();
            (
                rng.random_bool(self.failure_rate.clamp(0.0, 1.0)),
                rng.random_bool(self.spike_rate.clamp(0.0, 1.0)),
            )
        };
        if fail {
            return Err(HandlerError::transient("search API: 503 Service Unavailable"));
        }
        self.api
            .call(key, file_id, "index")
            .await
            .map_err(HandlerError::transient)?;
        if spike {
            tokio::time::sleep(self.spike).await;
        }
        Ok(())
    }
}

/// The thumbnail of a file of `bytes`: CPU work proportional to its size.
pub fn thumbnail(file_id: &str, bytes: i64) -> String {
    use std::hash::{Hash, Hasher};
    let mut digest = 0u64;
    for round in 0..(bytes / 64).max(1) {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (file_id, round, digest).hash(&mut h);
        digest = h.finish();
    }
    format!("{digest:016x}")
}

for_each_database! {
    use crate::sql::shared;

    /// Records, in the handling's transaction, how long it took since
    /// `started`: a handling that ran past its timeout and committed all
    /// the same would show here.
    async fn timed(ctx: &mut Context<'_, Db>, started: Instant) -> Result<(), HandlerError> {
        let (consumer, id) = (ctx.consumer().to_owned(), ctx.envelope().id.to_string());
        Stmt::<D>::new(shared::TIMING, "recording the handling's time")
            .bind(consumer.as_str())
            .bind(id.as_str())
            .bind(started.elapsed().as_millis() as i64)
            .execute(ctx.tx())
            .await?;
        Ok(())
    }

    /// (bytes, infected, corrupt) of the stored file.
    async fn file(ctx: &mut Context<'_, Db>, file_id: &str) -> Result<(i64, bool, bool), HandlerError> {
        let row = Stmt::<D>::new(shared::FILE, "reading the file")
            .bind(file_id)
            .fetch_optional(ctx.tx())
            .await?
            .ok_or_else(|| HandlerError::permanent(format!("no file {file_id}")))?;
        Ok((row.get(0)?, row.get::<i64>(1)? == 1, row.get::<i64>(2)? == 1))
    }

    #[async_trait::async_trait]
    impl Handler<Db> for Catalog {
        async fn handle(&self, ctx: &mut Context<'_, Db>) -> Result<(), HandlerError> {
            let started = Instant::now();
            let message_type = ctx.envelope().message_type.clone();
            let (file_id, step) = match message_type.as_str() {
                "UploadFinished" => {
                    let e: UploadFinished = ctx.decode()?;
                    Stmt::<D>::new(shared::STATUS, "recording the file")
                        .bind(e.file_id.as_str())
                        .bind("uploaded")
                        .execute(ctx.tx())
                        .await?;
                    (e.file_id, e.step)
                }
                "FileQuarantined" => {
                    let e: FileQuarantined = ctx.decode()?;
                    Stmt::<D>::new(shared::RESTATUS, "quarantining the file")
                        .bind(e.file_id.as_str())
                        .bind("quarantined")
                        .execute(ctx.tx())
                        .await?;
                    (e.file_id, e.step)
                }
                other => return Err(HandlerError::permanent(format!("the catalog takes no {other}"))),
            };
            let consumer = ctx.consumer().to_owned();
            check_step::<D>(ctx.tx(), &consumer, &file_id, step).await?;
            timed(ctx, started).await
        }
    }

    #[async_trait::async_trait]
    impl Handler<Db> for Antivirus {
        async fn handle(&self, ctx: &mut Context<'_, Db>) -> Result<(), HandlerError> {
            let started = Instant::now();
            let c: ScanFile = ctx.decode()?;
            let (_, infected, _) = file(ctx, &c.file_id).await?;
            // Scanning takes a while.
            let ms = rand::rng().random_range(2..10);
            tokio::time::sleep(Duration::from_millis(ms)).await;
            let verdict = if infected { "infected" } else { "clean" };
            Stmt::<D>::new(shared::SCANNED, "recording the scan")
                .bind(c.file_id.as_str())
                .bind(verdict)
                .execute(ctx.tx())
                .await?;
            if infected {
                ctx.emit(&FileQuarantined {
                    file_id: c.file_id,
                    signature: "EICAR-Test-File".into(),
                    step: 2,
                })
                .await?;
            } else {
                ctx.emit(&MakeThumbnail { file_id: c.file_id }).await?;
            }
            timed(ctx, started).await
        }
    }

    #[async_trait::async_trait]
    impl Handler<Db> for Thumbnailer {
        async fn handle(&self, ctx: &mut Context<'_, Db>) -> Result<(), HandlerError> {
            let started = Instant::now();
            let c: MakeThumbnail = ctx.decode()?;
            let (bytes, infected, corrupt) = file(ctx, &c.file_id).await?;
            if infected {
                return Err(HandlerError::permanent(format!("{} is quarantined: no thumbnail", c.file_id)));
            }
            if corrupt {
                return Err(HandlerError::permanent(format!("{} is not an image: no thumbnail", c.file_id)));
            }
            // CPU-bound: off the async threads.
            let id = c.file_id.clone();
            let digest = tokio::task::spawn_blocking(move || thumbnail(&id, bytes))
                .await
                .map_err(HandlerError::transient)?;
            Stmt::<D>::new(shared::THUMBNAIL, "storing the thumbnail")
                .bind(c.file_id.as_str())
                .bind(digest.as_str())
                .execute(ctx.tx())
                .await?;
            ctx.emit(&IndexDocument { file_id: c.file_id, thumbnail: digest }).await?;
            timed(ctx, started).await
        }
    }

    #[async_trait::async_trait]
    impl Handler<Db> for Indexer {
        async fn handle(&self, ctx: &mut Context<'_, Db>) -> Result<(), HandlerError> {
            let started = Instant::now();
            let c: IndexDocument = ctx.decode()?;
            let search = &self.search;
            let file_id = c.file_id.clone();
            ctx.once("index", |key| async move { search.index(key.as_str(), &file_id).await })
                .await?;
            timed(ctx, started).await
        }
    }
}
