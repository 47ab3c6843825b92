//! The consumer's cost of idempotency: handled events/s through the
//! consumer runtime (processed marker, fence, key lanes) beside the same
//! handler in a hand-written loop without any of it, one transaction per
//! event and in batches.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde::Serialize;
use tidings_consumer::{Consumer, ConsumerConfig, Context, Handler, HandlerError};
use tidings_core::{AckKind, Delivery, OutgoingMessage, Partition, Subscriber};
use tidings_sql::SqlStore;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::database::{BenchDialect, OnDatabase, arg, ensure_measured, on_scratch, run, scalar};
use super::{BenchEvent, CpuSample, CpuUse, event, open_transport, short_id};

/// What the consumer-cost scenario runs.
#[derive(Debug, Clone, clap::Args)]
pub struct ConsumerBench {
    /// PostgreSQL or MySQL (the bench works in a schema or database of its
    /// own, dropped at the end).
    #[arg(long, env = "TIDINGS_DATABASE_URL")]
    pub(crate) database: String,
    /// `nats://...`, `amqp://...`, `kafka://...`, `sqs://...` or `pubsub://PROJECT`; the database log when left out.
    #[arg(long, env = "TIDINGS_BROKER_URL")]
    pub(crate) broker: Option<String>,
    /// Events published once, then read by each variant in a group of its own.
    #[arg(long, default_value_t = 50_000)]
    pub(crate) events: usize,
    /// Key lanes (events handled at once), the same for every variant.
    #[arg(long, default_value_t = 16)]
    pub(crate) lanes: usize,
    /// Most events per transaction in the batched variants.
    #[arg(long, default_value_t = 64)]
    pub(crate) batch: usize,
}

impl ConsumerBench {
    /// Refuses what cannot run, with one line.
    pub(crate) fn check(&self) -> anyhow::Result<()> {
        ensure_measured(&self.database, "consumer")?;
        anyhow::ensure!(
            self.events > 0 && self.lanes > 0 && self.batch > 0,
            "--events, --lanes and --batch must be positive"
        );
        Ok(())
    }
}

/// One variant's run.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ConsumerRun {
    /// `Tidings` (the consumer runtime) or `by hand` (the same handler, no marker).
    pub(crate) variant: &'static str,
    /// Most events per transaction.
    pub(crate) batch: usize,
    /// Transactions committed.
    pub(crate) transactions: u64,
    /// Wall-clock time until every event was handled.
    pub(crate) seconds: f64,
    /// Events handled per second.
    pub(crate) per_second: f64,
    /// CPU seconds by process during the run (backends that ended during it are not counted).
    pub(crate) cpu: CpuUse,
}

/// Handled events/s with and without idempotency, per transaction and batched.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ConsumerCost {
    /// The database the handler writes to.
    pub(crate) database: &'static str,
    /// The transport (no credentials).
    pub(crate) transport: String,
    /// Events per run.
    pub(crate) events: usize,
    /// Key lanes.
    pub(crate) lanes: usize,
    /// By hand then Tidings, one event per transaction, then batched.
    pub(crate) runs: Vec<ConsumerRun>,
}

/// What every variant does with an event: insert a row for it, in the
/// database's own SQL.
async fn apply<D: BenchDialect>(
    conn: &mut <D::Db as sqlx::Database>::Connection,
    e: &BenchEvent,
) -> anyhow::Result<()> {
    run::<D>(conn, D::APPLY, |a| {
        arg::<D, _>(a, e.key.as_str())?;
        arg::<D, _>(a, e.seq as i64)
    })
    .await
}

/// The handler, run by the consumer runtime.
struct Apply<D>(PhantomData<D>);

#[async_trait::async_trait]
impl<D: BenchDialect> Handler<D::Db> for Apply<D> {
    async fn handle(&self, ctx: &mut Context<'_, D::Db>) -> Result<(), HandlerError> {
        let e: BenchEvent = ctx.decode()?;
        apply::<D>(ctx.tx(), &e).await.map_err(HandlerError::transient)?;
        Ok(())
    }
}

/// Runs the consumer-cost scenario.
pub(crate) async fn consumer(bench: ConsumerBench) -> anyhow::Result<ConsumerCost> {
    on_scratch(&bench.database, &bench).await
}

impl OnDatabase for ConsumerBench {
    type Figures = ConsumerCost;

    async fn run_on<D: BenchDialect>(
        &self,
        store: &SqlStore<D>,
        _scratch: &str,
    ) -> anyhow::Result<ConsumerCost> {
        consumer_in(store, self).await
    }
}

async fn consumer_in<D: BenchDialect>(
    store: &SqlStore<D>,
    bench: &ConsumerBench,
) -> anyhow::Result<ConsumerCost> {
    {
        let mut conn = store.conn("creating the bench's table").await?;
        run::<D>(&mut conn, D::APPLIED_TABLE, |_| Ok(())).await?;
    }
    let topic = format!("bench.consume.{}", short_id());
    let transport = open_transport(store, bench.broker.as_deref(), 1).await?;
    let variants = [
        ("by hand", 1),
        ("Tidings", 1),
        ("by hand", bench.batch),
        ("Tidings", bench.batch),
    ];
    let groups: Vec<String> = (0..variants.len()).map(|i| format!("consume-{i}")).collect();
    for group in &groups {
        transport.subscriber.ensure_group(group, &topic).await?;
    }
    let batches: Vec<Vec<OutgoingMessage>> = (0..bench.events)
        .map(|seq| OutgoingMessage {
            topic: topic.clone(),
            ..event(seq)
        })
        .collect::<Vec<_>>()
        .chunks(500)
        .map(<[OutgoingMessage]>::to_vec)
        .collect();
    for batch in &batches {
        transport.publisher.publish(batch).await?;
    }

    let mut runs = Vec::new();
    for ((variant, batch), group) in variants.into_iter().zip(&groups) {
        let cpu = CpuSample::take();
        let started = Instant::now();
        let transactions = match variant {
            "Tidings" => by_tidings(store, &*transport.subscriber, group, &topic, bench, batch).await?,
            _ => by_hand(store, &*transport.subscriber, group, &topic, bench, batch).await?,
        };
        let seconds = started.elapsed().as_secs_f64();
        runs.push(ConsumerRun {
            variant,
            batch,
            transactions,
            seconds,
            cpu: CpuSample::take().since(&cpu),
            per_second: bench.events as f64 / seconds.max(1e-9),
        });
    }
    let applied = scalar(store, "SELECT count(*) FROM bench_applied").await?;
    anyhow::ensure!(
        applied as usize == bench.events * runs.len(),
        "{applied} rows applied for {} events in {} runs",
        bench.events,
        runs.len()
    );
    let group_refs: Vec<&str> = groups.iter().map(String::as_str).collect();
    transport.remove(&topic, &group_refs).await?;
    Ok(ConsumerCost {
        database: D::NAME,
        transport: transport.label.clone(),
        events: bench.events,
        lanes: bench.lanes,
        runs,
    })
}

/// The consumer runtime until every event is handled; its transactions.
async fn by_tidings<D: BenchDialect>(
    store: &SqlStore<D>,
    subscriber: &dyn Subscriber,
    group: &str,
    topic: &str,
    bench: &ConsumerBench,
    batch: usize,
) -> anyhow::Result<u64> {
    let consumer = Consumer::new(group, store.clone(), Apply::<D>(PhantomData))
        .topic(topic)
        .config(ConsumerConfig::default().lanes(bench.lanes).batch(batch));
    let stats = consumer.stats();
    let stop = CancellationToken::new();
    let watch = async {
        while (stats.handled() as usize) < bench.events {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        stop.cancel();
    };
    let (run, ()) = tokio::join!(consumer.run(subscriber, stop.clone()), watch);
    run?;
    Ok(stats.transactions())
}

/// The same handler by hand: the subscription spread over as many lanes by
/// key, each lane committing what is queued for it (up to `batch`) in one
/// transaction, then acknowledging it. No marker, no fence.
async fn by_hand<D: BenchDialect>(
    store: &SqlStore<D>,
    subscriber: &dyn Subscriber,
    group: &str,
    topic: &str,
    bench: &ConsumerBench,
    batch: usize,
) -> anyhow::Result<u64> {
    let handled = Arc::new(AtomicU64::new(0));
    let transactions = Arc::new(AtomicU64::new(0));
    let mut lanes = Vec::new();
    let mut tasks = JoinSet::new();
    for _ in 0..bench.lanes {
        let (tx, mut rx) = mpsc::channel::<Delivery>(32);
        lanes.push(tx);
        let (pool, handled, transactions) = (store.pool().clone(), handled.clone(), transactions.clone());
        tasks.spawn(async move {
            let mut queued = Vec::with_capacity(batch);
            while let Some(d) = rx.recv().await {
                queued.push(d);
                while queued.len() < batch {
                    match rx.try_recv() {
                        Ok(d) => queued.push(d),
                        Err(_) => break,
                    }
                }
                let mut tx = pool.begin().await?;
                for d in &queued {
                    let e: BenchEvent = d.message.decode()?.decode()?;
                    apply::<D>(&mut tx, &e).await?;
                }
                tx.commit().await?;
                transactions.fetch_add(1, Ordering::Relaxed);
                for d in queued.drain(..) {
                    d.ack(AckKind::Ack).await?;
                    handled.fetch_add(1, Ordering::Relaxed);
                }
            }
            anyhow::Ok(())
        });
    }
    let mut subscription = subscriber.subscribe(group, topic).await?;
    while (handled.load(Ordering::Relaxed) as usize) < bench.events {
        let next = tokio::select! {
            next = subscription.next() => next,
            done = tasks.join_next() => {
                if let Some(done) = done {
                    done??;
                }
                anyhow::bail!("a lane stopped before every event was handled");
            }
            _ = tokio::time::sleep(Duration::from_millis(5)) => continue,
        };
        let Some(d) = next else {
            anyhow::bail!("the subscription ended before every event was handled");
        };
        let d = d?;
        let key = d.message.key.clone().unwrap_or_default();
        let lane = &lanes[Partition::of(&key, lanes.len() as u32).index as usize];
        lane.send(d).await?;
    }
    drop(lanes);
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    subscription.close().await?;
    Ok(transactions.load(Ordering::Relaxed))
}

impl fmt::Display for ConsumerCost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "consumer cost of idempotency · {} -> {} · {} events · {} lanes",
            self.transport, self.database, self.events, self.lanes
        )?;
        for run in &self.runs {
            let raw = self
                .runs
                .iter()
                .find(|r| r.variant == "by hand" && r.batch == run.batch)
                .map_or(0.0, |r| r.per_second);
            let ratio = if run.variant == "by hand" {
                "(raw limit: no marker, no fence)".to_owned()
            } else {
                format!("({:.2} of by hand)", run.per_second / raw.max(1e-9))
            };
            writeln!(
                f,
                "  {:<8} up to {:>3} per transaction  {:>9.0} events/s  {:>7} transactions  {ratio}",
                run.variant, run.batch, run.per_second, run.transactions
            )?;
            writeln!(
                f,
                "           CPU µs per event: {}",
                run.cpu.per_event(self.events)
            )?;
        }
        writeln!(
            f,
            "  targets: Tidings at least 0.75 of by hand; batched at least 20 000 events/s"
        )
    }
}
