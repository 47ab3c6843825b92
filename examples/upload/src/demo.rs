//! `tidings demo upload`: a burst of uploads through the antivirus, the
//! thumbnailer and the search index, each stage a work queue with bounded
//! concurrency.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use rand::Rng;
use serde::Serialize;
use tidings::AnyStore;
use tidings::sql::StoreOptions;
use tidings_consumer::Handler;
use tidings_demo_kit::{Meter, RunOptions, Runner, SidePool, ThirdParty, Transport, counts};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::handlers::{Antivirus, Catalog, FragileSearch, Indexer, Thumbnailer};
use crate::messages::*;
use crate::system::{File, UploadStore};

/// The stages, in the order a file goes through them (the catalog beside them).
pub const STAGES: [&str; 4] = ["catalog", "antivirus", "thumbnailer", "indexer"];

/// Fraction of uploads carrying malware.
pub const INFECTED_RATE: f64 = 0.05;

/// Each stage's handler timeout but the indexer's.
pub const STAGE_TIMEOUT: Duration = Duration::from_secs(10);
/// The indexer's handler timeout: the search API's latency spikes exceed it.
pub const INDEX_TIMEOUT: Duration = Duration::from_secs(1);

/// How to run the demo.
#[derive(Debug, Clone)]
pub struct UploadOptions {
    /// Files to upload, all at once (a burst).
    pub uploads: usize,
    /// Fraction of clean uploads that are no image (the thumbnailer dead-letters them).
    pub poison_rate: f64,
    /// The database, the broker, the scale, progress.
    pub run: RunOptions,
}

impl Default for UploadOptions {
    fn default() -> Self {
        UploadOptions {
            uploads: 500,
            poison_rate: 0.0,
            run: RunOptions::default(),
        }
    }
}

/// What the run did, read back from the database, and the invariants.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// Which database (no credentials).
    pub database: String,
    /// Which transport (no credentials).
    pub transport: String,
    /// The prefix of this system's resources on the broker, if any.
    pub broker_namespace: Option<String>,
    /// Files uploaded by this run.
    pub uploads: i64,
    /// Of which infected.
    pub infected: i64,
    /// Of which clean but no image.
    pub corrupt: i64,
    /// Files scanned by this run.
    pub scanned: i64,
    /// Files quarantined by this run.
    pub quarantined: i64,
    /// Thumbnails made by this run.
    pub thumbnails: i64,
    /// Files indexed by this run (once each).
    pub indexed: i64,
    /// Calls to the search API (a call repeated with the same key indexes nothing more).
    pub search_calls: i64,
    /// The slowest handling each stage committed, in milliseconds (all runs), and its timeout.
    pub slowest_ms: BTreeMap<String, (i64, u64)>,
    /// The most messages each stage had waiting at once.
    pub max_backlog: BTreeMap<String, i64>,
    /// Messages handled per stage (all runs).
    pub handled: BTreeMap<String, i64>,
    /// Dead letters per stage (all runs).
    pub dead_lettered: BTreeMap<String, i64>,
    /// Messages parked behind a dead letter of their file (all runs).
    pub parked: BTreeMap<String, i64>,
    /// Handler attempts retried (the search API's failures and timeouts among them).
    pub retries: u64,
    /// Duplicate deliveries injected.
    pub duplicates_delivered: u64,
    /// Duplicate deliveries recognised and skipped.
    pub duplicates_suppressed: u64,
    /// Messages committed but neither handled, dead-lettered nor parked.
    pub lost: i64,
    /// Events the catalog saw after a later event of the same file.
    pub order_violations: i64,
    /// Files indexed twice (all runs).
    pub duplicated_effects: i64,
    /// Thumbnails of infected files (all runs).
    pub infected_thumbnails: i64,
    /// Broken invariants, each in a sentence; empty when all hold.
    pub broken: Vec<String>,
    /// Whether everything was handled before the timeout.
    pub drained: bool,
    /// Wall-clock time of this run.
    pub elapsed_ms: u64,
}

impl Summary {
    /// True when every invariant holds.
    pub fn ok(&self) -> bool {
        self.broken.is_empty()
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list = counts;
        writeln!(f, "upload demo on {} over {}", self.database, self.transport)?;
        writeln!(
            f,
            "  uploads              {} ({} infected, {} no image)",
            self.uploads, self.infected, self.corrupt
        )?;
        writeln!(
            f,
            "  scanned              {} ({} quarantined)",
            self.scanned, self.quarantined
        )?;
        writeln!(f, "  thumbnails           {}", self.thumbnails)?;
        writeln!(
            f,
            "  indexed              {} ({} calls to the search API: failures, timeouts and retries with the same key)",
            self.indexed, self.search_calls
        )?;
        writeln!(f, "  most waiting         {}", list(&self.max_backlog))?;
        let slowest: Vec<String> = self
            .slowest_ms
            .iter()
            .map(|(stage, (ms, limit))| format!("{stage} {ms} ms (timeout {limit} ms)"))
            .collect();
        writeln!(f, "  slowest handling     {}", slowest.join(" · "))?;
        writeln!(f, "  handled              {}", list(&self.handled))?;
        writeln!(
            f,
            "  duplicates           {} delivered, {} suppressed",
            self.duplicates_delivered, self.duplicates_suppressed
        )?;
        writeln!(f, "  retries              {}", self.retries)?;
        writeln!(f, "  dead-lettered        {}", list(&self.dead_lettered))?;
        writeln!(f, "  parked               {}", list(&self.parked))?;
        writeln!(f, "  lost                 {}", self.lost)?;
        writeln!(f, "  order violations     {}", self.order_violations)?;
        writeln!(
            f,
            "  duplicated effects   {} (files indexed twice), {} thumbnails of infected files",
            self.duplicated_effects, self.infected_thumbnails
        )?;
        tidings_demo_kit::outcome(f, self.drained, &self.broken, self.elapsed_ms)
    }
}

fn guard() -> anyhow::Result<Arc<tidings_schema::SchemaGuard>> {
    Ok(Arc::new(tidings_schema::SchemaGuard::new(&crate::schemas())?))
}

/// Runs the whole demo, and sums it up.
pub async fn run(options: UploadOptions) -> anyhow::Result<Summary> {
    let store_options = StoreOptions::default().source("upload").guard(guard()?);
    let (store, label) = options.run.open_store(store_options).await?;
    // The search API is another system: connections (or a file) of its own.
    let side = SidePool::open(&options.run.database_url(), "provider").await?;
    let api = ThirdParty::new(side, "search");
    match store {
        AnyStore::Postgres(store) => run_on(store, api, options, label).await,
        AnyStore::MySql(store) => run_on(store, api, options, label).await,
        AnyStore::Sqlite(store) => run_on(store, api, options, label).await,
        other => anyhow::bail!(
            "the demo runs on PostgreSQL, MySQL or SQLite, not {}",
            other.database()
        ),
    }
}

async fn run_on<S>(
    store: S,
    api: ThirdParty,
    options: UploadOptions,
    label: String,
) -> anyhow::Result<Summary>
where
    S: UploadStore,
    Catalog: Handler<S::Database>,
    Antivirus: Handler<S::Database>,
    Thumbnailer: Handler<S::Database>,
    Indexer: Handler<S::Database>,
{
    let started = Instant::now();
    store.setup().await.context("setting up the upload schema")?;
    api.setup().await.context("setting up the search API")?;
    let baseline = store.tally().await?;
    let baseline_calls = api.calls().await?;

    let system = format!("demo-{}", store.system_id().await?);
    let transport = Transport::open(
        &store,
        options.run.broker.as_deref(),
        options.run.scale.partitions,
        &system,
    )
    .await?;
    let stages = [
        ("catalog", UPLOADS),
        ("antivirus", SCAN),
        ("thumbnailer", THUMBNAIL),
        ("indexer", INDEX),
    ];
    for (group, topic) in stages {
        transport.subscriber.ensure_group(group, topic).await?;
    }
    let mut running = Runner::new(
        store.clone(),
        &transport,
        options.run.scale,
        CancellationToken::new(),
    );
    running.relays();
    let base = tidings_demo_kit::consumer_config().handler_timeout(STAGE_TIMEOUT);
    running.consumer("catalog", UPLOADS, Catalog, &base);
    // Bounded concurrency per stage: the slow stages take few lanes.
    running.consumer("antivirus", SCAN, Antivirus, &base.clone().lanes(4));
    running.consumer("thumbnailer", THUMBNAIL, Thumbnailer, &base.clone().lanes(2));
    let search = FragileSearch {
        api: api.clone(),
        failure_rate: 0.1,
        spike_rate: 0.03,
        spike: Duration::from_millis(1500),
    };
    // The search API is fragile: more attempts, and a timeout its spikes exceed.
    let indexer = base
        .clone()
        .lanes(4)
        .max_attempts(8)
        .handler_timeout(Duration::from_secs(1));
    running.consumer("indexer", INDEX, Indexer { search }, &indexer);

    let uploaded = Arc::new(AtomicUsize::new(0));
    let burst = upload_burst(&store, &options, uploaded.clone());
    let mut meter = Meter::new(
        options.run.progress,
        (options.uploads * 5) as u64,
        "messages handled",
    );
    let baseline_work = baseline.work.done();
    let mut most = [0i64; 4];
    let (tally, drained) = running
        .drain(
            burst,
            options.run.drain_timeout,
            || store.tally(),
            |t, uploaded_all| {
                let backlog = t.backlog();
                for (most, now) in most.iter_mut().zip(backlog) {
                    *most = (*most).max(now);
                }
                meter.show(
                    t.work.done().saturating_sub(baseline_work),
                    &format!(
                        "{} / {} uploaded · waiting: scan {} · thumbnail {} · index {}",
                        uploaded.load(Ordering::Relaxed),
                        options.uploads,
                        backlog[1],
                        backlog[2],
                        backlog[3]
                    ),
                );
                uploaded_all && backlog.iter().all(|b| *b == 0) && t.outbox_pending == 0
            },
        )
        .await?;
    meter.finish();
    let duplicates = (
        running.duplicates_delivered(),
        running.duplicates_suppressed(),
        running.retries(),
    );
    running.stop().await?;
    let calls = api.calls().await?;

    let (t, b) = (&tally, &baseline);
    let timeout = |stage: &str| {
        if stage == "indexer" {
            INDEX_TIMEOUT
        } else {
            STAGE_TIMEOUT
        }
    };
    let slowest_ms: BTreeMap<String, (i64, u64)> = t
        .slowest_ms
        .iter()
        .filter(|(stage, _)| STAGES.contains(&stage.as_str()))
        .map(|(stage, ms)| (stage.clone(), (*ms, timeout(stage).as_millis() as u64)))
        .collect();
    let lost: i64 = t.backlog().iter().sum();
    let mut broken = Vec::new();
    if !drained {
        broken.push("the system did not drain before the timeout".to_owned());
    }
    if lost > 0 {
        broken.push(format!("{lost} messages lost"));
    }
    if t.violations > 0 {
        broken.push(format!("{} order violations", t.violations));
    }
    if calls.duplicated > 0 {
        broken.push(format!("{} files indexed twice", calls.duplicated));
    }
    for (stage, (ms, limit)) in &slowest_ms {
        if *ms as u64 > *limit {
            broken.push(format!(
                "a {stage} handling committed after {ms} ms, past its {limit} ms timeout"
            ));
        }
    }
    if t.infected_thumbnails > 0 {
        broken.push(format!(
            "{} infected files got a thumbnail",
            t.infected_thumbnails
        ));
    }
    let uploads = t.uploads - b.uploads;
    let infected = t.infected - b.infected;
    let corrupt = t.corrupt - b.corrupt;
    let quarantined = t.quarantined - b.quarantined;
    let indexed = calls.done - baseline_calls.done;
    if drained {
        if quarantined != infected {
            broken.push(format!("{quarantined} files quarantined of {infected} infected"));
        }
        if indexed != uploads - infected - corrupt {
            broken.push(format!(
                "{indexed} files indexed of {} clean images",
                uploads - infected - corrupt
            ));
        }
        if t.work.dead_by("thumbnailer") != t.corrupt
            || t.work.dead_letters.iter().any(|(c, _)| c != "thumbnailer")
        {
            broken.push(format!(
                "dead letters {:?}: only the thumbnailer's, one per file that is no image ({})",
                t.work.dead_letters, t.corrupt
            ));
        }
    }
    Ok(Summary {
        database: label,
        transport: transport.label.clone(),
        broker_namespace: transport.namespace.clone(),
        uploads,
        infected,
        corrupt,
        scanned: t.scanned - b.scanned,
        quarantined,
        thumbnails: t.thumbnails - b.thumbnails,
        indexed,
        search_calls: calls.calls - baseline_calls.calls,
        slowest_ms,
        max_backlog: STAGES
            .iter()
            .zip(most)
            .map(|(s, m)| ((*s).to_owned(), m))
            .collect(),
        handled: t.work.processed.iter().cloned().collect(),
        dead_lettered: t.work.dead_letters.iter().cloned().collect(),
        parked: t.work.parked.iter().cloned().collect(),
        retries: duplicates.2,
        duplicates_delivered: duplicates.0,
        duplicates_suppressed: duplicates.1,
        lost,
        order_violations: t.violations,
        duplicated_effects: calls.duplicated,
        infected_thumbnails: t.infected_thumbnails,
        broken,
        drained,
        elapsed_ms: started.elapsed().as_millis() as u64,
    })
}

/// The upload service under a burst: 16 clients uploading at once.
async fn upload_burst<S: UploadStore>(
    store: &S,
    options: &UploadOptions,
    uploaded: Arc<AtomicUsize>,
) -> anyhow::Result<()> {
    let next = Arc::new(AtomicUsize::new(0));
    let mut clients = JoinSet::new();
    for _ in 0..16 {
        let (store, next, uploaded) = (store.clone(), next.clone(), uploaded.clone());
        let (total, poison_rate) = (options.uploads, options.poison_rate);
        clients.spawn(async move {
            loop {
                if next.fetch_add(1, Ordering::Relaxed) >= total {
                    return anyhow::Ok(());
                }
                let file = {
                    let mut rng = rand::rng();
                    let infected = rng.random_bool(INFECTED_RATE);
                    File {
                        file_id: format!("file-{}", uuid::Uuid::now_v7().simple()),
                        name: format!("IMG_{:04}.jpg", rng.random_range(0..10_000)),
                        bytes: rng.random_range(20_000..400_000),
                        infected,
                        corrupt: !infected && rng.random_bool(poison_rate.clamp(0.0, 1.0)),
                    }
                };
                tidings_core::retry::transaction(&tidings_core::retry::Retry::default(), || {
                    store.upload(&file)
                })
                .await?;
                uploaded.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    while let Some(done) = clients.join_next().await {
        done??;
    }
    Ok(())
}
