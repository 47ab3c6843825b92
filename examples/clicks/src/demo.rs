//! `tidings demo clicks`: a click stream scored for fraud, in batches,
//! with the features of each session upserted into a feature store.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde::Serialize;
use tidings::AnyStore;
use tidings::sql::StoreOptions;
use tidings_consumer::Handler;
use tidings_demo_kit::{Meter, RunOptions, Runner, Transport};
use tokio_util::sync::CancellationToken;

use crate::handlers::{Fraud, invalid};
use crate::messages::{CLICKS, Click};
use crate::score::Session;
use crate::stream::{self, TopicContents};
use crate::system::{ClicksStore, Features, Tally};

/// The scorer's consumer group.
pub const SCORER: &str = "fraud";
/// Clicks a scorer's lane takes into one transaction, at most.
pub const BATCH: usize = 100;

/// How to run the demo.
#[derive(Debug, Clone)]
pub struct ClicksOptions {
    /// Clicks the web tier writes (0: none, only what another producer put in `external_topic`).
    pub clicks: usize,
    /// Fraction of clicks that are malformed (dead-lettered by the scorer).
    pub poison_rate: f64,
    /// Read the clicks from this Kafka topic, as another team's producer
    /// fills it (the web tier, if it writes, writes there too).
    pub external_topic: Option<String>,
    /// The database, the broker, the scale, progress.
    pub run: RunOptions,
}

impl Default for ClicksOptions {
    fn default() -> Self {
        ClicksOptions {
            clicks: 200_000,
            poison_rate: 0.0,
            external_topic: None,
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
    /// How the clicks travel: through the outbox, or straight to a Kafka topic (its name).
    pub path: String,
    /// Clicks the web tier wrote in this run.
    pub produced: usize,
    /// Of which malformed.
    pub malformed: usize,
    /// Clicks written per second.
    pub produced_per_s: f64,
    /// Clicks scored in this run.
    pub scored: i64,
    /// Clicks scored per second, from the first click written to the last scored.
    pub scored_per_s: f64,
    /// Sessions in the feature store (all runs).
    pub sessions: i64,
    /// Of which flagged as fraud.
    pub flagged: i64,
    /// Over Kafka: the records in the topic, read back from its start.
    pub records_in_topic: Option<u64>,
    /// The most clicks waiting to be scored at once.
    pub max_waiting: i64,
    /// Clicks waiting to be scored, once a second.
    pub waiting_over_time: Vec<i64>,
    /// Dead letters (all runs).
    pub dead_lettered: i64,
    /// Clicks parked behind a dead letter of their session (all runs).
    pub parked: i64,
    /// Handler attempts retried.
    pub retries: u64,
    /// Duplicate deliveries injected.
    pub duplicates_delivered: u64,
    /// Duplicate deliveries recognised and skipped.
    pub duplicates_suppressed: u64,
    /// Clicks written but neither scored, dead-lettered nor parked.
    pub lost: i64,
    /// Clicks the scorer saw after a later click of their session, in this run.
    pub order_violations: i64,
    /// Clicks the scorer's state counted twice (all runs).
    pub duplicated_effects: i64,
    /// Sessions whose features differ from a recomputation from the stored clicks.
    pub feature_mismatches: i64,
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

/// `samples` as a line of bars, at most `width` wide (each bar the most of its samples).
pub fn sparkline(samples: &[i64], width: usize) -> String {
    const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    if samples.is_empty() {
        return String::new();
    }
    let per = samples.len().div_ceil(width.max(1));
    let buckets: Vec<i64> = samples
        .chunks(per)
        .map(|c| c.iter().copied().max().unwrap_or(0))
        .collect();
    let max = buckets.iter().copied().max().unwrap_or(0).max(1);
    buckets
        .iter()
        .map(|v| BARS[((v.max(&0) * 7) / max) as usize])
        .collect()
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "clicks demo on {} over {}", self.database, self.transport)?;
        writeln!(f, "  path                 {}", self.path)?;
        writeln!(
            f,
            "  produced             {} ({} malformed), {:.0} clicks/s",
            self.produced, self.malformed, self.produced_per_s
        )?;
        if let Some(records) = self.records_in_topic {
            writeln!(f, "  records in topic     {records}")?;
        }
        writeln!(
            f,
            "  scored               {}, {:.0} clicks/s (batches of up to {BATCH} in a transaction)",
            self.scored, self.scored_per_s
        )?;
        writeln!(
            f,
            "  feature store        {} sessions, {} flagged as fraud",
            self.sessions, self.flagged
        )?;
        writeln!(
            f,
            "  waiting over time    {} (most {}, one bar per {})",
            sparkline(&self.waiting_over_time, 60),
            self.max_waiting,
            match self.waiting_over_time.len().div_ceil(60) {
                1 => "second".to_owned(),
                n => format!("{n} seconds"),
            }
        )?;
        writeln!(
            f,
            "  duplicates           {} delivered, {} suppressed",
            self.duplicates_delivered, self.duplicates_suppressed
        )?;
        writeln!(f, "  retries              {}", self.retries)?;
        writeln!(
            f,
            "  dead-lettered        {} (parked behind them {})",
            self.dead_lettered, self.parked
        )?;
        writeln!(f, "  lost                 {}", self.lost)?;
        writeln!(f, "  order violations     {}", self.order_violations)?;
        writeln!(f, "  duplicated effects   {}", self.duplicated_effects)?;
        writeln!(
            f,
            "  features recomputed  {} sessions differ",
            self.feature_mismatches
        )?;
        tidings_demo_kit::outcome(f, self.drained, &self.broken, self.elapsed_ms)
    }
}

fn guard() -> anyhow::Result<Arc<tidings_schema::SchemaGuard>> {
    Ok(Arc::new(tidings_schema::SchemaGuard::new(&crate::schemas())?))
}

/// Runs the whole demo, and sums it up.
pub async fn run(options: ClicksOptions) -> anyhow::Result<Summary> {
    let store_options = StoreOptions::default().source("web").guard(guard()?);
    let (store, label) = options.run.open_store(store_options).await?;
    match store {
        AnyStore::Postgres(store) => run_on(store, options, label).await,
        AnyStore::MySql(store) => run_on(store, options, label).await,
        AnyStore::Sqlite(store) => run_on(store, options, label).await,
        other => anyhow::bail!(
            "the demo runs on PostgreSQL, MySQL or SQLite, not {}",
            other.database()
        ),
    }
}

async fn run_on<S>(store: S, options: ClicksOptions, label: String) -> anyhow::Result<Summary>
where
    S: ClicksStore,
    Fraud: Handler<S::Database>,
{
    let started = Instant::now();
    let external = options.external_topic.is_some();
    store.setup().await.context("setting up the clicks schema")?;
    let baseline = store.tally().await?;

    let system = format!("demo-{}", store.system_id().await?);
    let foreign: Vec<(&str, &str)> = options
        .external_topic
        .as_deref()
        .map(|t| (CLICKS, t))
        .into_iter()
        .collect();
    let transport = Transport::open_reading(
        &store,
        options.run.broker.as_deref(),
        options.run.scale.partitions,
        &system,
        &foreign,
    )
    .await?;
    transport
        .subscriber
        .ensure_group(SCORER, CLICKS)
        .await
        .with_context(|| match &options.external_topic {
            Some(t) => format!("reading the Kafka topic {t}: does it exist?"),
            None => "creating the scorer's group".to_owned(),
        })?;
    let kafka = transport.kafka().cloned();
    let kafka_topic = kafka.as_ref().map(|k| k.kafka_topic(CLICKS));
    // What earlier runs set aside: dead-lettered, or parked behind a dead letter.
    let aside_before = baseline.work.dead_by(SCORER) + baseline.work.parked_by(SCORER);
    // Another team's topic is taken as found: what it holds now (and what
    // this run writes) is what must be scored.
    let found = match (&kafka, &kafka_topic, external) {
        (Some(kafka), Some(topic), true) => {
            let found = stream::read_topic(kafka, topic, CLICKS, options.run.drain_timeout)
                .await
                .with_context(|| format!("reading {topic}"))?;
            let stored: HashSet<String> = store.stored().await?.into_iter().map(|c| c.click_id).collect();
            // To be settled by this run: the clicks not stored yet, but those
            // an earlier run set aside (dead-lettered, parked), and the
            // records that are no click (each a dead letter).
            let unstored = found.ids.iter().filter(|id| !stored.contains(*id)).count() as i64;
            let new = (unstored - aside_before).max(0) as usize + found.unreadable_count as usize;
            Some((found, new))
        }
        _ => None,
    };
    let found_new = found.as_ref().map_or(0, |(_, new)| *new);

    let mut running = Runner::new(
        store.clone(),
        &transport,
        options.run.scale,
        CancellationToken::new(),
    );
    if kafka.is_none() {
        running.relays();
    }
    // Bounded lanes, each taking what is queued into one transaction.
    let scorer = tidings_demo_kit::consumer_config().lanes(4).batch(BATCH);
    running.consumer(SCORER, CLICKS, Fraud, &scorer);

    let clicks = Arc::new(stream::generate(options.clicks, options.poison_rate));
    let malformed = clicks.iter().filter(|c| invalid(c).is_some()).count();
    // A session's first malformed click is dead-lettered; the rest of the
    // session (later malformed clicks too) is parked behind it.
    let poisoned_sessions = clicks
        .iter()
        .filter(|c| invalid(c).is_some())
        .map(|c| c.session_id.as_str())
        .collect::<HashSet<_>>()
        .len();
    let written = Arc::new(AtomicUsize::new(0));
    let produce_started = Instant::now();
    // The web tier runs on its own, not paused while the figures are read.
    let producer = {
        let (clicks, written) = (clicks.clone(), written.clone());
        let (store, kafka, topic) = (store.clone(), kafka.clone(), kafka_topic.clone());
        // On a topic of Tidings' own, sessions go where Tidings places keys.
        let own_partitions = (!external).then_some(options.run.scale.partitions);
        tokio::spawn(async move {
            match (&kafka, &topic) {
                (Some(kafka), Some(topic)) => {
                    stream::produce_to_kafka(kafka, topic, own_partitions, clicks, written).await?
                }
                _ => stream::write_through_outbox(&store, clicks, written).await?,
            }
            anyhow::Ok(())
        })
    };
    let produce = async move { producer.await.context("the web tier panicked")? };
    let mut produced_in = None;

    let expected = options.clicks + found_new;
    let mut meter = Meter::new(options.run.progress, expected as u64, "clicks scored");
    let baseline_done = baseline.work.done() as i64;
    let mut waiting_over_time: Vec<i64> = Vec::new();
    let mut last_sample = Instant::now();
    let (tally, drained) = running
        .drain(
            produce,
            options.run.drain_timeout,
            || store.tally(),
            |t, producers_done| {
                if producers_done && produced_in.is_none() {
                    produced_in = Some(produce_started.elapsed());
                }
                let settled = t.work.done() as i64 - baseline_done;
                let waiting = (found_new as i64 + written.load(Ordering::Relaxed) as i64 - settled).max(0);
                if last_sample.elapsed() >= Duration::from_secs(1) || waiting_over_time.is_empty() {
                    last_sample = Instant::now();
                    waiting_over_time.push(waiting);
                }
                meter.show(
                    (t.stored - baseline.stored).max(0) as u64,
                    &format!(
                        "{} / {} written · waiting {waiting}",
                        written.load(Ordering::Relaxed),
                        options.clicks
                    ),
                );
                producers_done
                    // Over Kafka nothing goes through the outbox (nor do relays run).
                    && (kafka.is_some() || t.outbox_pending == 0)
                    && settled >= expected as i64
            },
        )
        .await?;
    let scored_in = produce_started.elapsed();
    meter.finish();
    let injected = (
        running.duplicates_delivered(),
        running.duplicates_suppressed(),
        running.retries(),
    );
    running.stop().await?;

    let contents = match (&kafka, &kafka_topic) {
        (Some(kafka), Some(topic)) => Some(
            stream::read_topic(kafka, topic, CLICKS, options.run.drain_timeout)
                .await
                .with_context(|| format!("reading {topic} back"))?,
        ),
        _ => None,
    };
    let stored = store.stored().await?;
    let features = store.features().await?;
    let mismatches = recompute(&stored, &features);
    let produced = written.load(Ordering::Relaxed);
    let t: &Tally = &tally;
    let missing_in_topic = match &contents {
        Some(contents) if !external => clicks
            .iter()
            .filter(|c| !contents.ids.contains(&c.click_id))
            .count(),
        _ => 0,
    };
    let (dead, parked) = (t.work.dead_by(SCORER), t.work.parked_by(SCORER));
    // Every click written (and, over Kafka, every click in the topic;
    // of another team's topic, every click found there) is scored, or
    // dead-lettered, or parked behind a dead letter of its session.
    let scored_ids: HashSet<&str> = stored.iter().map(|c| c.click_id.as_str()).collect();
    let mut must: HashSet<&str> = clicks.iter().map(|c| c.click_id.as_str()).collect();
    if let Some((found, _)) = &found {
        must.extend(found.ids.iter().map(String::as_str));
    }
    let unscored = must.iter().filter(|id| !scored_ids.contains(**id)).count() as i64;
    // This run's clicks are set aside by this run; another team's topic may
    // hold clicks an earlier run set aside.
    let aside = dead + parked;
    let lost = if external {
        (unscored - aside).max(0)
    } else {
        (unscored - (aside - aside_before).max(0)).max(0)
    };
    let violations = t.violations - baseline.violations;
    let scored = t.stored - baseline.stored;
    // The feature store counts each click once: more is a click scored twice.
    let duplicated = features.values().map(|f| f.clicks).sum::<i64>() - stored.len() as i64;
    let dead_now = dead - baseline.work.dead_by(SCORER);

    let mut broken = Vec::new();
    if !drained {
        broken.push("the system did not drain before the timeout".to_owned());
    }
    if lost > 0 {
        broken.push(format!("{lost} clicks lost"));
    }
    if missing_in_topic > 0 {
        broken.push(format!(
            "{missing_in_topic} clicks confirmed by Kafka are not in the topic"
        ));
    }
    if violations > 0 {
        broken.push(format!("{violations} order violations"));
    }
    if duplicated != 0 {
        broken.push(format!("{duplicated} clicks counted twice"));
    }
    if mismatches > 0 {
        broken.push(format!(
            "{mismatches} sessions' features differ from a recomputation from their clicks"
        ));
    }
    if let Some(contents) = &contents
        && contents.unreadable_count > 0
        && !external
    {
        broken.push(format!(
            "{} records of the topic are no click: {}",
            contents.unreadable_count,
            contents.unreadable.join("; ")
        ));
    }
    if drained && !external && dead_now != poisoned_sessions as i64 {
        broken.push(format!(
            "{dead_now} dead letters for {poisoned_sessions} sessions with a malformed click"
        ));
    }
    let secs = |d: Duration| d.as_secs_f64().max(1e-3);
    Ok(Summary {
        database: label,
        transport: transport.label.clone(),
        broker_namespace: transport.namespace.clone(),
        path: match (&kafka_topic, external) {
            (Some(topic), true) => format!("another team's Kafka topic {topic}, read as found"),
            (Some(topic), false) => {
                format!("straight to the Kafka topic {topic} (a plain producer, no outbox)")
            }
            _ => "through the outbox".to_owned(),
        },
        produced,
        malformed,
        produced_per_s: produced as f64 / secs(produced_in.unwrap_or(scored_in)),
        scored,
        scored_per_s: scored as f64 / secs(scored_in),
        sessions: t.sessions,
        flagged: t.flagged,
        records_in_topic: contents.as_ref().map(|c: &TopicContents| c.records),
        max_waiting: waiting_over_time.iter().copied().max().unwrap_or(0),
        waiting_over_time,
        dead_lettered: dead,
        parked,
        retries: injected.2,
        duplicates_delivered: injected.0,
        duplicates_suppressed: injected.1,
        lost,
        order_violations: violations,
        duplicated_effects: duplicated,
        feature_mismatches: mismatches,
        broken,
        drained,
        elapsed_ms: started.elapsed().as_millis() as u64,
    })
}

/// Sessions whose features in the store differ from the model applied
/// again to their stored clicks, in order (or that have features and no
/// clicks).
pub fn recompute(stored: &[Click], features: &HashMap<String, Features>) -> i64 {
    let mut sessions: BTreeMap<&str, Session> = BTreeMap::new();
    for click in stored {
        let s = sessions.entry(click.session_id.as_str()).or_default();
        *s = s.apply(click);
    }
    let differ = sessions
        .iter()
        .filter(|(id, s)| features.get(**id) != Some(&Features::from(**s)))
        .count();
    let orphans = features
        .keys()
        .filter(|id| !sessions.contains_key(id.as_str()))
        .count();
    (differ + orphans) as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn click(session: &str, seq: i64, at_ms: i64) -> Click {
        Click {
            click_id: format!("{session}-{seq}"),
            session_id: session.to_owned(),
            seq,
            page: "/".into(),
            at_ms,
        }
    }

    #[test]
    fn features_that_counted_a_click_twice_or_have_no_clicks_differ_from_the_recomputation() {
        let stored = vec![click("a", 1, 0), click("a", 2, 100), click("b", 1, 0)];
        let once =
            |clicks: &[Click]| Features::from(clicks.iter().fold(Session::default(), |s, c| s.apply(c)));
        let mut features = HashMap::from([
            ("a".to_owned(), once(&stored[..2])),
            ("b".to_owned(), once(&stored[2..])),
        ]);
        assert_eq!(recompute(&stored, &features), 0);
        // Session a's second click scored twice.
        features.insert(
            "a".to_owned(),
            once(&[stored[0].clone(), stored[1].clone(), stored[1].clone()]),
        );
        assert_eq!(recompute(&stored, &features), 1);
        features.insert("c".to_owned(), once(&stored[2..]));
        assert_eq!(recompute(&stored, &features), 2);
    }

    #[test]
    fn a_sparkline_keeps_the_most_of_each_bucket() {
        assert_eq!(sparkline(&[0, 7, 14], 10), "▁▄█");
        assert_eq!(sparkline(&[0, 14, 0, 0], 2), "█▁");
        assert_eq!(sparkline(&[], 10), "");
    }
}
