//! The producer tax: what writing an event with the business row costs.

use std::fmt;
use std::time::{Duration, Instant};

use serde::Serialize;
use tidings_core::{Envelope, Message, Outbox, OutgoingMessage};
use tidings_sql::{SqlStore, StoreOptions};
use tokio::task::JoinSet;

use super::database::{BenchDialect, OnDatabase, arg, ensure_measured, on_scratch, run};
use super::{BenchEvent, create_orders};

/// What the producer-tax scenario runs.
#[derive(Debug, Clone, clap::Args)]
pub struct ProducerBench {
    /// PostgreSQL or MySQL (the bench works in a schema or database of its
    /// own, dropped at the end).
    #[arg(long, env = "TIDINGS_DATABASE_URL")]
    pub(crate) database: String,
    /// Connections writing at once.
    #[arg(long, default_value_t = 16)]
    pub(crate) connections: usize,
    /// Seconds per variant (run in four rotating rounds).
    #[arg(long, default_value_t = 15.0)]
    pub(crate) seconds: f64,
}

impl ProducerBench {
    /// Refuses what cannot run, with one line.
    pub(crate) fn check(&self) -> anyhow::Result<()> {
        ensure_measured(&self.database, "producer")?;
        anyhow::ensure!(
            self.connections > 0 && self.seconds > 0.0,
            "--connections and --seconds must be positive"
        );
        Ok(())
    }
}

/// Committed transactions per second of one way of writing.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Throughput {
    /// Which way.
    pub(crate) variant: &'static str,
    /// Transactions committed.
    pub(crate) transactions: u64,
    /// Per second.
    pub(crate) per_second: f64,
}

/// What writing an event with the business row costs a producer.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ProducerTax {
    /// The database measured.
    pub(crate) database: &'static str,
    /// Connections writing at once.
    pub(crate) connections: usize,
    /// The business insert alone (the raw limit).
    pub(crate) business_only: Throughput,
    /// The business insert and an outbox insert written by hand (the raw equivalent).
    pub(crate) raw_outbox: Throughput,
    /// The business insert and `Outbox::enqueue`, then the relay woken after commit.
    pub(crate) tidings: Throughput,
    /// The same with the payload validated against its schema and scanned
    /// for secrets at publish (`SchemaGuard`), what `trust` switches off.
    pub(crate) validated: Throughput,
    /// CPU time of one `SchemaGuard::check` of the bench event, in microseconds.
    pub(crate) guard_check_micros: f64,
    /// CPU time of encoding the same event (`Envelope::new`), the raw work
    /// every producer does, in microseconds.
    pub(crate) encode_micros: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Write {
    BusinessOnly,
    RawOutbox,
    Tidings,
    /// `Tidings` on a store whose outbox validates (pass a guarded store).
    Validated,
}

/// One producer transaction of the given kind.
async fn write_one<D: BenchDialect>(store: &SqlStore<D>, kind: Write, seq: u64) -> anyhow::Result<()> {
    let order = BenchEvent {
        key: format!("order-{seq}"),
        seq,
        note: "an order-sized payload, about as large as a small business event".into(),
    };
    let mut tx = store.pool().begin().await?;
    run::<D>(&mut tx, D::BUSINESS, |a| {
        arg::<D, _>(a, uuid::Uuid::now_v7())?;
        arg::<D, _>(a, order.key.as_str())?;
        arg::<D, _>(a, seq as i64)
    })
    .await?;
    match kind {
        Write::BusinessOnly => {}
        // What a hand-rolled outbox writes: the event as JSON, its key and type.
        Write::RawOutbox => {
            let body = serde_json::to_vec(&order)?;
            run::<D>(&mut tx, D::RAW_OUTBOX, |a| {
                arg::<D, _>(a, uuid::Uuid::now_v7())?;
                arg::<D, _>(a, BenchEvent::TOPIC)?;
                arg::<D, _>(a, order.key.as_str())?;
                arg::<D, _>(a, BenchEvent::TYPE)?;
                arg::<D, _>(a, body.as_slice())
            })
            .await?;
        }
        Write::Tidings | Write::Validated => {
            store.enqueue(&mut tx, &order).await?;
        }
    }
    tx.commit().await?;
    if kind != Write::BusinessOnly && kind != Write::RawOutbox {
        store.wake();
    }
    Ok(())
}

/// Runs `kind` on `connections` writers for `duration`; transactions committed.
pub(super) async fn write_for<D: BenchDialect>(
    store: &SqlStore<D>,
    kind: Write,
    connections: usize,
    duration: Duration,
) -> anyhow::Result<u64> {
    let deadline = Instant::now() + duration;
    let mut writers = JoinSet::new();
    for w in 0..connections {
        let store = store.clone();
        writers.spawn(async move {
            let mut done = 0u64;
            while Instant::now() < deadline {
                write_one(&store, kind, (w as u64) << 40 | done).await?;
                done += 1;
            }
            anyhow::Ok(done)
        });
    }
    let mut total = 0;
    while let Some(done) = writers.join_next().await {
        total += done??;
    }
    Ok(total)
}

/// Runs the producer-tax scenario: the variants rotate through rounds, so
/// that drift of a shared machine falls on all of them alike.
pub(crate) async fn producer(bench: ProducerBench) -> anyhow::Result<ProducerTax> {
    on_scratch(&bench.database, &bench).await
}

impl OnDatabase for ProducerBench {
    type Figures = ProducerTax;

    async fn run_on<D: BenchDialect>(
        &self,
        store: &SqlStore<D>,
        _scratch: &str,
    ) -> anyhow::Result<ProducerTax> {
        producer_in(store, self).await
    }
}

async fn producer_in<D: BenchDialect>(
    store: &SqlStore<D>,
    bench: &ProducerBench,
) -> anyhow::Result<ProducerTax> {
    create_orders(store).await?;
    // As many rounds as variants, each round starting at the next variant:
    // each variant runs once in each position, so that a drifting machine
    // (and the growing outbox table) weighs on all alike.
    const ROUNDS: u32 = 4;
    let round = Duration::from_secs_f64(bench.seconds / f64::from(ROUNDS));
    let kinds = [
        Write::BusinessOnly,
        Write::RawOutbox,
        Write::Tidings,
        Write::Validated,
    ];
    let guarded = guarded(store)?;
    write_for(
        store,
        Write::Tidings,
        bench.connections,
        Duration::from_millis(500),
    )
    .await?;
    let mut totals = [0u64; 4];
    for round_number in 0..ROUNDS as usize {
        for step in 0..kinds.len() {
            let i = (round_number + step) % kinds.len();
            let kind = &kinds[i];
            let on = if *kind == Write::Validated {
                &guarded
            } else {
                store
            };
            totals[i] += write_for(on, *kind, bench.connections, round).await?;
        }
    }
    let (guard_check_micros, encode_micros) = guard_cost()?;
    let seconds = round.as_secs_f64() * f64::from(ROUNDS);
    let figure = |variant, transactions: u64| Throughput {
        variant,
        transactions,
        per_second: transactions as f64 / seconds,
    };
    Ok(ProducerTax {
        database: D::NAME,
        connections: bench.connections,
        business_only: figure("business insert only", totals[0]),
        raw_outbox: figure("business + outbox insert by hand", totals[1]),
        tidings: figure("business + Outbox::enqueue", totals[2]),
        validated: figure("business + enqueue, schema-validated", totals[3]),
        guard_check_micros,
        encode_micros,
    })
}

/// The bench store with `SchemaGuard` over the bench event's schema.
fn guarded<D: BenchDialect>(store: &SqlStore<D>) -> anyhow::Result<SqlStore<D>> {
    let registry = tidings_schema::Registry::new().register::<BenchEvent>();
    let guard = std::sync::Arc::new(tidings_schema::SchemaGuard::new(&registry)?);
    Ok(SqlStore::with_options(
        store.pool().clone(),
        StoreOptions::default().guard(guard),
    ))
}

/// Microseconds per `SchemaGuard::check` and per `Envelope::new` of the
/// bench event, each timed over the same number of runs.
fn guard_cost() -> anyhow::Result<(f64, f64)> {
    use tidings_core::PublishGuard;
    const RUNS: u32 = 20_000;
    let order = BenchEvent {
        key: "order-1".into(),
        seq: 1,
        note: "an order-sized payload, about as large as a small business event".into(),
    };
    let registry = tidings_schema::Registry::new().register::<BenchEvent>();
    let guard = tidings_schema::SchemaGuard::new(&registry)?;
    let message = OutgoingMessage::new("bench", &order)?;
    let started = Instant::now();
    for _ in 0..RUNS {
        guard.check(std::hint::black_box(&message))?;
    }
    let check = started.elapsed();
    let started = Instant::now();
    for _ in 0..RUNS {
        std::hint::black_box(Envelope::new("bench", std::hint::black_box(&order))?);
    }
    let encode = started.elapsed();
    let micros = |d: Duration| d.as_secs_f64() * 1e6 / f64::from(RUNS);
    Ok((micros(check), micros(encode)))
}

impl fmt::Display for ProducerTax {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "producer tax · {} · {} connections · committed transactions/s",
            self.database, self.connections
        )?;
        let base = self.business_only.per_second.max(1e-9);
        for t in [
            &self.business_only,
            &self.raw_outbox,
            &self.tidings,
            &self.validated,
        ] {
            writeln!(
                f,
                "  {:<36} {:>8.0}/s  ({:.2} of business only)",
                t.variant,
                t.per_second,
                t.per_second / base
            )?;
        }
        writeln!(
            f,
            "  Tidings / raw outbox                 {:>8.2}   (target: at least 0.95)",
            self.tidings.per_second / self.raw_outbox.per_second.max(1e-9)
        )?;
        writeln!(
            f,
            "  schema validation at publish          {:>7.1} µs/message (encoding the event: {:.1} µs)",
            self.guard_check_micros, self.encode_micros
        )
    }
}
