//! A key's and a message's story over a big outbox: what the console's
//! `/keys/KEY` and `/messages/ID` pages read (`Inspect::trace_key` and
//! `Inspect::trace_message`), timed beside the raw limit of the same pool,
//! a primary-key lookup of one outbox row, with the plans of the key's
//! statements so that an index lost shows as a scan.
//!
//! The rows are written set-based (`generate_series`, `INSERT ... SELECT`)
//! into a database of the bench's own, and kept there: a second run with
//! the same size measures again without filling again.

use std::fmt;
use std::time::Instant;

use anyhow::Context as _;
use serde::Serialize;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection as _, PgConnection, PgPool, Row as _};
use tidings_core::Inspect as _;
use tidings_core::inspect::MessageTrace;
use tidings_sql::{Dialect as _, SqlStore};
use tidings_store_postgres::Pg;
use uuid::Uuid;

use super::latency::percentile;

/// What the story scenario runs.
#[derive(Debug, Clone, clap::Args)]
pub struct StoryBench {
    /// The PostgreSQL server, as the URL of any database on it: the rows are
    /// kept in a database of their own on the same server (`--keep-in`).
    #[arg(long, env = "TIDINGS_DATABASE_URL")]
    pub(crate) database: String,
    /// The database the rows are kept in between runs: created when
    /// missing, dropped and filled again when it holds another size.
    #[arg(long, default_value = "tidings_bench_story")]
    pub(crate) keep_in: String,
    /// Outbox rows (sent, kept by the outbox retention), and as many
    /// processed markers.
    #[arg(long, default_value_t = 10_000_000)]
    pub(crate) rows: u64,
    /// Messages per key: the keys are `rows / per_key`.
    #[arg(long, default_value_t = 10)]
    pub(crate) per_key: u64,
    /// Consumers the processed markers are spread over.
    #[arg(long, default_value_t = 3)]
    pub(crate) consumers: u64,
    /// Lookups of each kind measured (after a quarter as many, at least
    /// 10, to warm up).
    #[arg(long, default_value_t = 200)]
    pub(crate) lookups: usize,
    /// The most messages a key's trace reads (the console's key page reads 200).
    #[arg(long, default_value_t = 200)]
    pub(crate) key_limit: u32,
    /// Drop the database at the end, to free its disk.
    #[arg(long)]
    pub(crate) drop: bool,
}

/// Bumped whenever the fill writes other rows, so that a kept database of
/// an older fill is filled again.
const FILL_VERSION: i32 = 1;

/// Rows written per statement of the fill.
const BATCH: u64 = 500_000;

/// Every this many messages, one is dead-lettered (and its key's next
/// message parked behind it); every [`EFFECT_EVERY`], one has an effect.
const LETTER_EVERY: u64 = 1000;
const EFFECT_EVERY: u64 = 10;

/// The time the messages are spread over: the last 30 days.
const SPREAD_MICROS: u64 = 30 * 24 * 3600 * 1_000_000;

impl StoryBench {
    /// Refuses what cannot run, with one line.
    pub(crate) fn check(&self) -> anyhow::Result<()> {
        super::ensure_postgres(&self.database, "story")?;
        anyhow::ensure!(
            self.rows > 0 && self.per_key > 0 && self.consumers > 0 && self.lookups > 0,
            "--rows, --per-key, --consumers and --lookups must be positive"
        );
        anyhow::ensure!(
            self.rows >= self.per_key,
            "--rows must be at least --per-key (one key at least)"
        );
        anyhow::ensure!(self.rows < 1 << 48, "--rows must be below 2^48");
        anyhow::ensure!(
            self.keep_in.starts_with("tidings_bench")
                && self
                    .keep_in
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'),
            "--keep-in must be a database of the bench's own: tidings_bench followed by lowercase letters, digits or _ \
             (it is dropped and made again when it holds another fill)"
        );
        Ok(())
    }
}

/// What the kept database holds: the fill is used again when this is the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq, sqlx::FromRow)]
struct Shape {
    rows: i64,
    keys: i64,
    consumers: i64,
    version: i32,
    /// The first message's time, microseconds since the epoch, less one step.
    base_us: i64,
    /// Microseconds between two messages.
    step_us: i64,
}

impl Shape {
    fn new(bench: &StoryBench) -> Shape {
        let now_us = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64);
        let step_us = (SPREAD_MICROS / bench.rows).max(1);
        Shape {
            rows: bench.rows as i64,
            keys: (bench.rows / bench.per_key) as i64,
            consumers: bench.consumers as i64,
            version: FILL_VERSION,
            base_us: now_us.saturating_sub(step_us * bench.rows) as i64,
            step_us: step_us as i64,
        }
    }

    /// Whether a kept fill serves this run.
    fn serves(&self, bench: &StoryBench) -> bool {
        let wanted = Shape::new(bench);
        (self.rows, self.keys, self.consumers, self.version)
            == (wanted.rows, wanted.keys, wanted.consumers, wanted.version)
    }

    /// Message `i`'s id: a UUIDv7 of its time, as `Envelope::new` makes
    /// them, with `i` in its random bits (the fill's SQL writes the same).
    fn message_id(&self, i: u64) -> Uuid {
        let ms = (self.base_us as u64 + i * self.step_us as u64) / 1000;
        let high = (u128::from(ms) << 80) | (0x7 << 76) | (u128::from(i % 4096) << 64);
        Uuid::from_u128(high | (0x8 << 60) | u128::from(i))
    }

    fn key_index(&self, i: u64) -> u64 {
        i % self.keys as u64
    }

    /// The key of key index `k`.
    fn key(k: u64) -> String {
        format!("order-{k}")
    }

    fn consumer(&self, c: u64) -> String {
        format!("consumer-{}", c % self.consumers as u64)
    }

    /// The messages of key index `k` (message `i` has key `i % keys`).
    fn messages_of(&self, k: u64) -> u64 {
        let (rows, keys) = (self.rows as u64, self.keys as u64);
        if k == 0 {
            rows / keys
        } else {
            (rows - k) / keys + 1
        }
    }

    fn dead_lettered(i: u64) -> bool {
        i.is_multiple_of(LETTER_EVERY)
    }

    /// Parked behind the dead letter of its key's previous message.
    fn parked(&self, i: u64) -> bool {
        let keys = self.keys as u64;
        i > keys && Self::dead_lettered(i - keys)
    }

    /// Checks message `i`'s trace against what the fill wrote.
    fn check(&self, i: u64, t: &MessageTrace) -> anyhow::Result<()> {
        let wrong = |what: &str| anyhow::anyhow!("message {i}'s trace has {what}: {t:?}");
        if t.message_id != self.message_id(i) {
            return Err(wrong("another id"));
        }
        let outbox = t.outbox.as_ref().ok_or_else(|| wrong("no outbox record"))?;
        if outbox.seq != i as i64 || outbox.published_at.is_none() {
            return Err(wrong("another outbox record"));
        }
        if t.aggregate_key.as_deref() != Some(Self::key(self.key_index(i)).as_str()) {
            return Err(wrong("another key"));
        }
        if t.handled.len() != 1 || t.handled[0].consumer != self.consumer(i) {
            return Err(wrong("other processed markers"));
        }
        if t.effects.len() != usize::from(i.is_multiple_of(EFFECT_EVERY)) {
            return Err(wrong("other effects"));
        }
        let letters = usize::from(Self::dead_lettered(i));
        if t.dead_letters.len() != letters || t.dead_letters.iter().any(|d| d.last_error.is_none()) {
            return Err(wrong("other dead letters"));
        }
        let parked = t
            .parked
            .iter()
            .filter(|p| p.held_by_dead_letter.is_some())
            .count();
        if t.parked.len() != usize::from(self.parked(i)) || parked != t.parked.len() {
            return Err(wrong("other parked copies"));
        }
        Ok(())
    }
}

/// Milliseconds of a kind of lookup.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Timing {
    /// Median, milliseconds.
    pub(crate) p50_ms: f64,
    /// 99th percentile, milliseconds.
    pub(crate) p99_ms: f64,
    /// Slowest, milliseconds.
    pub(crate) max_ms: f64,
}

impl Timing {
    fn of(mut ms: Vec<f64>) -> Timing {
        ms.sort_by(f64::total_cmp);
        Timing {
            p50_ms: percentile(&ms, 0.50),
            p99_ms: percentile(&ms, 0.99),
            max_ms: ms.last().copied().unwrap_or(0.0),
        }
    }
}

/// What the measured traces found, every one checked against the fill.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct Found {
    /// Messages the key traces returned, over all keys looked up.
    pub(crate) key_messages: u64,
    /// Messages the fill gave those keys (at most the key limit each).
    pub(crate) key_messages_expected: u64,
    /// Messages found by id (every one looked up must be).
    pub(crate) messages: u64,
    /// Processed markers, effects, dead letters and parked copies in those
    /// messages' traces.
    pub(crate) handled: u64,
    pub(crate) effects: u64,
    pub(crate) dead_letters: u64,
    pub(crate) parked: u64,
}

/// The plan of one statement a key's trace runs.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Plan {
    /// The statement (its name in the dialect's statements).
    pub(crate) statement: &'static str,
    /// The indexes its plan reads, in plan order.
    pub(crate) indexes: Vec<String>,
    /// The tables it reads whole (a sequential scan): only tables that
    /// are empty or nearly are expected.
    pub(crate) seq_scans: Vec<Scan>,
}

/// A table a plan reads whole.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Scan {
    /// The table.
    pub(crate) table: String,
    /// Its rows, counted up to [`SCAN_COUNT_CAP`].
    pub(crate) rows: u64,
}

/// How far the rows of a scanned table are counted.
const SCAN_COUNT_CAP: u64 = 1_000_000;

/// A key's and a message's story over a big outbox, beside a primary-key lookup.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct StoryFigures {
    /// The database.
    pub(crate) database: &'static str,
    /// The database the rows are kept in.
    pub(crate) kept_in: String,
    /// Outbox rows, all sent and kept; as many processed markers.
    pub(crate) rows: u64,
    /// Keys the rows are spread over.
    pub(crate) keys: u64,
    /// Consumers the markers are spread over.
    pub(crate) consumers: u64,
    /// Effects, dead letters and parked copies in the fill.
    pub(crate) effects: u64,
    pub(crate) dead_letters: u64,
    pub(crate) parked: u64,
    /// Whether this run filled the database (`false`: a kept fill was used).
    pub(crate) filled: bool,
    /// How long the fill took, when it was made.
    pub(crate) fill_seconds: f64,
    /// The kept database's size, MiB.
    pub(crate) database_mib: f64,
    /// The server's `shared_buffers`.
    pub(crate) shared_buffers: String,
    /// Lookups of each kind measured.
    pub(crate) lookups: usize,
    /// Lookups of each kind run before, to warm up.
    pub(crate) warm_up: usize,
    /// The most messages a key's trace reads.
    pub(crate) key_limit: u32,
    /// The raw limit: one outbox row by its primary key, on the same pool.
    pub(crate) primary_key: Timing,
    /// `trace_key` of a random key (what `/keys/KEY` reads).
    pub(crate) trace_key: Timing,
    /// `trace_message` of a random message (what `/messages/ID` reads).
    pub(crate) trace_message: Timing,
    /// What the measured traces found.
    pub(crate) found: Found,
    /// The plans of a key's statements, for the key looked up last.
    pub(crate) plans: Vec<Plan>,
}

/// Runs the story scenario.
pub(crate) async fn story(bench: StoryBench) -> anyhow::Result<StoryFigures> {
    let server: PgConnectOptions = bench.database.parse()?;
    let admin = PgPoolOptions::new()
        .max_connections(1)
        .connect_with(server.clone())
        .await
        .with_context(|| {
            format!(
                "connecting to PostgreSQL at {}",
                tidings_core::secret::redact_url(&bench.database)
            )
        })?;
    let kept = server.clone().database(&bench.keep_in);
    let exists: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
        .bind(&bench.keep_in)
        .fetch_one(&admin)
        .await?;
    if !exists {
        create_database(&admin, &bench.keep_in).await?;
    }
    let mut pool = open(&kept).await?;
    let shape = match kept_shape(&pool).await? {
        Some(shape) if shape.serves(&bench) => {
            eprintln!(
                "bench: story: using the {} rows kept in {}",
                shape.rows, bench.keep_in
            );
            Some(shape)
        }
        kept_shape => {
            if exists && (kept_shape.is_some() || has_tables(&pool).await?) {
                eprintln!(
                    "bench: story: {} holds another fill, making it again",
                    bench.keep_in
                );
                pool.close().await;
                drop_database(&admin, &bench.keep_in).await?;
                create_database(&admin, &bench.keep_in).await?;
                pool = open(&kept).await?;
            }
            None
        }
    };
    let store = SqlStore::<Pg>::new(pool.clone());
    store.migrate().await?;
    let (shape, filled) = match shape {
        Some(shape) => (shape, false),
        None => (fill(&kept, Shape::new(&bench)).await?, true),
    };
    let result = measure(&store, &bench, shape, filled).await;
    pool.close().await;
    if bench.drop {
        eprintln!("bench: story: dropping {}", bench.keep_in);
        drop_database(&admin, &bench.keep_in).await?;
    }
    admin.close().await;
    result
}

async fn open(options: &PgConnectOptions) -> anyhow::Result<PgPool> {
    Ok(PgPoolOptions::new()
        .max_connections(4)
        .connect_with(options.clone())
        .await?)
}

/// `name` was checked: the bench's prefix, then letters, digits and `_`.
async fn create_database(admin: &PgPool, name: &str) -> anyhow::Result<()> {
    let sql = format!("CREATE DATABASE {name}");
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql)).execute(admin).await?;
    Ok(())
}

async fn drop_database(admin: &PgPool, name: &str) -> anyhow::Result<()> {
    let sql = format!("DROP DATABASE IF EXISTS {name}");
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
        .execute(admin)
        .await
        .with_context(|| format!("dropping {name} (is a session still connected to it?)"))?;
    Ok(())
}

/// The complete fill the database holds, if any (the marker is written last).
async fn kept_shape(pool: &PgPool) -> anyhow::Result<Option<Shape>> {
    let marked: bool = sqlx::query_scalar("SELECT to_regclass('bench_story_fill') IS NOT NULL")
        .fetch_one(pool)
        .await?;
    if !marked {
        return Ok(None);
    }
    Ok(
        sqlx::query_as("SELECT rows, keys, consumers, version, base_us, step_us FROM bench_story_fill")
            .fetch_optional(pool)
            .await?,
    )
}

/// Whether the database has any table of its own (a fill cut short, say).
async fn has_tables(pool: &PgPool) -> anyhow::Result<bool> {
    Ok(sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_tables WHERE schemaname NOT IN ('pg_catalog', 'information_schema'))",
    )
    .fetch_one(pool)
    .await?)
}

/// Fills a freshly migrated database, reporting progress on stderr; the
/// marker of a complete fill goes last.
async fn fill(options: &PgConnectOptions, shape: Shape) -> anyhow::Result<Shape> {
    let started = Instant::now();
    let mut conn = PgConnection::connect_with(options).await?;
    // Room to sort a batch in memory: the rows go in in their seq order.
    sqlx::raw_sql("SET work_mem = '256MB'").execute(&mut conn).await?;
    let (rows, keys) = (shape.rows, shape.keys);

    // The keys, with the hash that places them in a partition: FNV-1a, from Rust.
    sqlx::raw_sql(
        "CREATE UNLOGGED TABLE bench_story_keys (k BIGINT PRIMARY KEY, name TEXT NOT NULL, hash BIGINT NOT NULL)",
    )
    .execute(&mut conn)
    .await?;
    for lo in (0..keys).step_by(100_000) {
        let ks: Vec<i64> = (lo..(lo + 100_000).min(keys)).collect();
        let names: Vec<String> = ks.iter().map(|&k| Shape::key(k as u64)).collect();
        let hashes: Vec<i64> = names
            .iter()
            .map(|n| i64::from(tidings_core::partition::key_hash(n)))
            .collect();
        sqlx::query(
            "INSERT INTO bench_story_keys SELECT * FROM UNNEST($1::bigint[], $2::text[], $3::bigint[])",
        )
        .bind(&ks)
        .bind(&names)
        .bind(&hashes)
        .execute(&mut conn)
        .await?;
    }

    // The same body in every row, as large as the bench's own events' envelopes.
    let body = tidings_core::cloudevents::to_json(&super::event(0).envelope);
    let mut lo = 1;
    while lo <= rows {
        let hi = (lo + BATCH as i64 - 1).min(rows);
        // Sent records kept by the outbox retention; ids as in
        // `Shape::message_id`, times 4 ms apart from enqueue to sent.
        sqlx::query(
            "INSERT INTO tidings_outbox (seq, id, topic, aggregate_key, message_type, body, created_at, published_at, key_hash)
             SELECT i,
                    (lpad(to_hex(($1 + i * $2) / 1000), 12, '0') || '7' || lpad(to_hex(i % 4096), 3, '0')
                     || '8' || lpad(to_hex(i), 15, '0'))::uuid,
                    'bench.events', k.name, 'BenchEvent', $6,
                    TIMESTAMPTZ 'epoch' + ($1 + i * $2) * INTERVAL '1 microsecond',
                    TIMESTAMPTZ 'epoch' + ($1 + i * $2 + 4000) * INTERVAL '1 microsecond',
                    k.hash
             FROM generate_series($3::bigint, $4::bigint) AS i JOIN bench_story_keys k ON k.k = i % $5
             ORDER BY i",
        )
        .bind(shape.base_us)
        .bind(shape.step_us)
        .bind(lo)
        .bind(hi)
        .bind(keys)
        .bind(&body)
        .execute(&mut conn)
        .await?;
        // A processed marker for each message, by one of the consumers.
        sqlx::query(
            "INSERT INTO tidings_processed (consumer, message_id, processed_at)
             SELECT 'consumer-' || (seq % $3), id, published_at + INTERVAL '20 milliseconds'
             FROM tidings_outbox WHERE seq BETWEEN $1 AND $2 ORDER BY seq",
        )
        .bind(lo)
        .bind(hi)
        .bind(shape.consumers)
        .execute(&mut conn)
        .await?;
        sqlx::query(
            "INSERT INTO tidings_effects (consumer, message_id, effect, idempotency_key, recorded_at)
             SELECT 'consumer-' || (seq % $3), id, 'receipt', 'receipt-' || id, published_at + INTERVAL '15 milliseconds'
             FROM tidings_outbox WHERE seq BETWEEN $1 AND $2 AND seq % $4 = 0 ORDER BY seq",
        )
        .bind(lo)
        .bind(hi)
        .bind(shape.consumers)
        .bind(EFFECT_EVERY as i64)
        .execute(&mut conn)
        .await?;
        eprintln!(
            "bench: story: {hi} of {rows} outbox rows, processed markers and effects ({:.0} s)",
            started.elapsed().as_secs_f64()
        );
        lo = hi + 1;
    }
    sqlx::query("SELECT setval('tidings_outbox_seq_seq', $1)")
        .bind(rows)
        .execute(&mut conn)
        .await?;

    // Every LETTER_EVERY-th message dead-lettered by the next consumer, which
    // holds its key; that key's next message parked behind it.
    sqlx::query(
        "INSERT INTO tidings_dead_letters (id, consumer, topic, message_id, message_type, aggregate_key,
                                           headers, body, attempts, errors, created_at, updated_at)
         SELECT gen_random_uuid(), 'consumer-' || ((o.seq + 1) % $2), o.topic, o.id, o.message_type, o.aggregate_key,
                '{}'::jsonb, o.body, 5,
                jsonb_build_array(jsonb_build_object(
                    'attempt', 5, 'at', to_char(o.published_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'),
                    'class', 'permanent', 'error', 'the payment service refused the order')),
                o.published_at + INTERVAL '1 second', o.published_at + INTERVAL '1 second'
         FROM generate_series($3::bigint, $1::bigint, $3::bigint) AS s JOIN tidings_outbox o ON o.seq = s ORDER BY s",
    )
    .bind(rows)
    .bind(shape.consumers)
    .bind(LETTER_EVERY as i64)
    .execute(&mut conn)
    .await?;
    sqlx::query(
        "INSERT INTO tidings_held_keys (consumer, topic, aggregate_key, message_id, released, held_at)
         SELECT consumer, topic, aggregate_key, message_id, false, created_at FROM tidings_dead_letters
         ORDER BY created_at ON CONFLICT DO NOTHING",
    )
    .execute(&mut conn)
    .await?;
    sqlx::query(
        "INSERT INTO tidings_parked (consumer, topic, aggregate_key, message_id, headers, body, parked_at)
         SELECT 'consumer-' || ((s + 1) % $2), o.topic, o.aggregate_key, o.id, '{}', o.body,
                o.published_at + INTERVAL '20 milliseconds'
         FROM generate_series($3::bigint, $1::bigint, $3::bigint) AS s JOIN tidings_outbox o ON o.seq = s + $4 ORDER BY s",
    )
    .bind(rows)
    .bind(shape.consumers)
    .bind(LETTER_EVERY as i64)
    .bind(keys)
    .execute(&mut conn)
    .await?;
    sqlx::raw_sql("DROP TABLE bench_story_keys")
        .execute(&mut conn)
        .await?;

    // As a long-lived table would be: statistics current, hint bits and
    // the visibility map set (the lookups must not pay for the fill's writes).
    eprintln!(
        "bench: story: vacuuming and analyzing ({:.0} s)",
        started.elapsed().as_secs_f64()
    );
    sqlx::raw_sql(
        "VACUUM (ANALYZE) tidings_outbox, tidings_processed, tidings_effects, tidings_dead_letters,
                          tidings_held_keys, tidings_parked",
    )
    .execute(&mut conn)
    .await?;

    let seconds = started.elapsed().as_secs_f64();
    sqlx::raw_sql(
        "CREATE TABLE bench_story_fill (rows BIGINT NOT NULL, keys BIGINT NOT NULL, consumers BIGINT NOT NULL,
             version INTEGER NOT NULL, base_us BIGINT NOT NULL, step_us BIGINT NOT NULL,
             fill_seconds DOUBLE PRECISION NOT NULL, filled_at TIMESTAMPTZ NOT NULL DEFAULT now())",
    )
    .execute(&mut conn)
    .await?;
    sqlx::query("INSERT INTO bench_story_fill VALUES ($1, $2, $3, $4, $5, $6, $7)")
        .bind(shape.rows)
        .bind(shape.keys)
        .bind(shape.consumers)
        .bind(shape.version)
        .bind(shape.base_us)
        .bind(shape.step_us)
        .bind(seconds)
        .execute(&mut conn)
        .await?;
    conn.close().await?;
    eprintln!("bench: story: filled in {seconds:.0} s");
    Ok(shape)
}

/// A random number in `0..n`.
fn random_below(n: u64) -> u64 {
    (Uuid::new_v4().as_u128() % u128::from(n.max(1))) as u64
}

/// The lookups, in rotating rounds (each kind once per round, so that the
/// machine's drift falls on all alike), then the plans.
async fn measure(
    store: &SqlStore<Pg>,
    bench: &StoryBench,
    shape: Shape,
    filled: bool,
) -> anyhow::Result<StoryFigures> {
    let pool = store.pool();
    let rows = shape.rows as u64;
    let keys = shape.keys as u64;
    let warm_up = (bench.lookups / 4).max(10);
    eprintln!(
        "bench: story: {} lookups of each kind after {warm_up} to warm up",
        bench.lookups
    );
    let (mut primary, mut by_key, mut by_id) = (Vec::new(), Vec::new(), Vec::new());
    let mut found = Found::default();
    let mut last_key = 0;
    for round in 0..warm_up + bench.lookups {
        let measured = round >= warm_up;

        let i = random_below(rows) + 1;
        let started = Instant::now();
        let row = sqlx::query(
            "SELECT id, aggregate_key, topic, message_type, created_at, published_at, key_hash
             FROM tidings_outbox WHERE seq = $1",
        )
        .bind(i as i64)
        .fetch_one(pool)
        .await?;
        let row: (Uuid, String) = (row.try_get(0)?, row.try_get(1)?);
        let ms = started.elapsed().as_secs_f64() * 1000.0;
        anyhow::ensure!(
            row == (shape.message_id(i), Shape::key(shape.key_index(i))),
            "outbox row {i} is not the one the fill wrote: {row:?}"
        );
        if measured {
            primary.push(ms);
        }

        let k = random_below(keys);
        let key = Shape::key(k);
        let started = Instant::now();
        let traces = store.trace_key(&key, bench.key_limit).await?;
        let ms = started.elapsed().as_secs_f64() * 1000.0;
        let expected = shape.messages_of(k).min(u64::from(bench.key_limit));
        anyhow::ensure!(
            traces.len() as u64 == expected,
            "key {key}: {} messages traced, the fill gave it {expected}",
            traces.len()
        );
        let mut previous = 0;
        for t in &traces {
            let seq = t.outbox.as_ref().map_or(0, |o| o.seq) as u64;
            anyhow::ensure!(
                seq > previous && seq % keys == k,
                "key {key}: its traces are not its messages, oldest first"
            );
            shape.check(seq, t)?;
            previous = seq;
        }
        if measured {
            by_key.push(ms);
            found.key_messages += traces.len() as u64;
            found.key_messages_expected += expected;
            last_key = k;
        }

        let i = random_below(rows) + 1;
        let started = Instant::now();
        let trace = store.trace_message(shape.message_id(i)).await?;
        let ms = started.elapsed().as_secs_f64() * 1000.0;
        let trace = trace.with_context(|| format!("message {i} not found by its id"))?;
        shape.check(i, &trace)?;
        if measured {
            by_id.push(ms);
            found.messages += 1;
            found.handled += trace.handled.len() as u64;
            found.effects += trace.effects.len() as u64;
            found.dead_letters += trace.dead_letters.len() as u64;
            found.parked += trace.parked.len() as u64;
        }
    }

    let plans = plans(store, &Shape::key(last_key), bench.key_limit).await?;
    let counts: (i64, i64, i64, f64, String, f64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM tidings_effects), (SELECT count(*) FROM tidings_dead_letters),
                (SELECT count(*) FROM tidings_parked),
                pg_database_size(current_database())::float8 / 1048576,
                current_setting('shared_buffers'),
                (SELECT fill_seconds FROM bench_story_fill)",
    )
    .fetch_one(pool)
    .await?;
    Ok(StoryFigures {
        database: Pg::NAME,
        kept_in: bench.keep_in.clone(),
        rows,
        keys,
        consumers: shape.consumers as u64,
        effects: counts.0 as u64,
        dead_letters: counts.1 as u64,
        parked: counts.2 as u64,
        filled,
        fill_seconds: counts.5,
        database_mib: counts.3,
        shared_buffers: counts.4,
        lookups: bench.lookups,
        warm_up,
        key_limit: bench.key_limit,
        primary_key: Timing::of(primary),
        trace_key: Timing::of(by_key),
        trace_message: Timing::of(by_id),
        found,
        plans,
    })
}

/// The plans of the statements a trace of `key` runs, with the values
/// they run with (the key, then the ids of its messages).
async fn plans(store: &SqlStore<Pg>, key: &str, limit: u32) -> anyhow::Result<Vec<Plan>> {
    let ids: Vec<Uuid> = store
        .trace_key(key, limit)
        .await?
        .iter()
        .map(|t| t.message_id)
        .collect();
    let sql = &Pg::SQL;
    let mut conn = store.pool().acquire().await?;
    let mut plans = Vec::new();
    let explain = |statement: &str| sqlx::AssertSqlSafe(format!("EXPLAIN (FORMAT JSON) {statement}"));
    let plan: sqlx::types::Json<serde_json::Value> = sqlx::query_scalar(explain(sql.trace_key_messages))
        .bind(key)
        .bind(i64::from(limit))
        .fetch_one(&mut *conn)
        .await?;
    plans.push(summary("trace_key_messages", &plan.0));
    for (name, statement) in [
        ("trace_outbox", sql.trace_outbox),
        ("trace_processed", sql.trace_processed),
        ("trace_effects", sql.trace_effects),
        ("trace_dead_letters", sql.trace_dead_letters),
        ("trace_parked", sql.trace_parked),
    ] {
        let plan: sqlx::types::Json<serde_json::Value> = sqlx::query_scalar(explain(statement))
            .bind(&ids)
            .fetch_one(&mut *conn)
            .await?;
        plans.push(summary(name, &plan.0));
    }
    for scan in plans.iter_mut().flat_map(|p| p.seq_scans.iter_mut()) {
        // A name from the plan: the tables of the migrations, checked anyway.
        anyhow::ensure!(
            scan.table.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
            "an unexpected table name in a plan: {}",
            scan.table
        );
        let count = format!(
            "SELECT count(*) FROM (SELECT 1 FROM {} LIMIT {SCAN_COUNT_CAP}) AS t",
            scan.table
        );
        let rows: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(count))
            .fetch_one(&mut *conn)
            .await?;
        scan.rows = rows as u64;
    }
    Ok(plans)
}

/// The indexes and sequential scans of an `EXPLAIN (FORMAT JSON)` plan.
fn summary(statement: &'static str, plan: &serde_json::Value) -> Plan {
    fn walk(node: &serde_json::Value, plan: &mut Plan) {
        let text = |field: &str| node.get(field).and_then(serde_json::Value::as_str);
        if let Some(index) = text("Index Name")
            && !plan.indexes.iter().any(|i| i == index)
        {
            plan.indexes.push(index.to_owned());
        }
        if text("Node Type") == Some("Seq Scan")
            && let Some(table) = text("Relation Name")
        {
            plan.seq_scans.push(Scan {
                table: table.to_owned(),
                rows: 0,
            });
        }
        for child in node
            .get("Plans")
            .and_then(serde_json::Value::as_array)
            .into_iter()
            .flatten()
        {
            walk(child, plan);
        }
    }
    let mut summary = Plan {
        statement,
        indexes: Vec::new(),
        seq_scans: Vec::new(),
    };
    if let Some(root) = plan.get(0).and_then(|p| p.get("Plan")) {
        walk(root, &mut summary);
    }
    summary
}

impl fmt::Display for StoryFigures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "a key's and a message's story · {} · {} outbox rows (sent, kept) and as many processed markers over {} keys and {} consumers; {} effects, {} dead letters, {} parked",
            self.database, self.rows, self.keys, self.consumers, self.effects, self.dead_letters, self.parked
        )?;
        writeln!(
            f,
            "  kept in {} · {:.0} MiB (shared_buffers {}) · {} in {:.0} s",
            self.kept_in,
            self.database_mib,
            self.shared_buffers,
            if self.filled {
                "filled by this run"
            } else {
                "filled by an earlier run"
            },
            self.fill_seconds
        )?;
        writeln!(
            f,
            "  {:<48}{:>9} {:>9} {:>9}",
            format!(
                "{} lookups of each kind, after {} to warm up",
                self.lookups, self.warm_up
            ),
            "p50 ms",
            "p99 ms",
            "max ms"
        )?;
        let line = |f: &mut fmt::Formatter<'_>, label: &str, t: &Timing, ratio: bool| {
            let share = if ratio {
                format!(
                    "  ({:.1}x the primary key at p50)",
                    t.p50_ms / self.primary_key.p50_ms.max(1e-9)
                )
            } else {
                String::new()
            };
            writeln!(
                f,
                "  {label:<48}{:>9.2} {:>9.2} {:>9.2}{share}",
                t.p50_ms, t.p99_ms, t.max_ms
            )
        };
        line(
            f,
            "raw limit: one outbox row by its primary key",
            &self.primary_key,
            false,
        )?;
        line(
            f,
            &format!("trace_key (/keys/KEY, at most {})", self.key_limit),
            &self.trace_key,
            true,
        )?;
        line(f, "trace_message (/messages/ID)", &self.trace_message, true)?;
        let found = &self.found;
        writeln!(
            f,
            "  found, as filled: {} messages over the keys ({} expected); {} messages by id, with {} markers, {} effects, {} dead letters, {} parked",
            found.key_messages,
            found.key_messages_expected,
            found.messages,
            found.handled,
            found.effects,
            found.dead_letters,
            found.parked
        )?;
        writeln!(f, "  plans of a key's statements (indexes read):")?;
        for p in &self.plans {
            let indexes = if p.indexes.is_empty() {
                "no index".to_owned()
            } else {
                p.indexes.join(", ")
            };
            let scans = p
                .seq_scans
                .iter()
                .map(|s| {
                    let rows = if s.rows >= SCAN_COUNT_CAP {
                        format!("at least {SCAN_COUNT_CAP}")
                    } else {
                        s.rows.to_string()
                    };
                    format!("  SEQUENTIAL SCAN of {} ({rows} rows)", s.table)
                })
                .collect::<String>();
            writeln!(f, "    {:<20}{indexes}{scans}", p.statement)?;
        }
        writeln!(f, "  target: a key's page within 1 s")
    }
}
