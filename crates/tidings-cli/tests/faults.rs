//! The fault suite: the checkout system spread over real processes (two
//! relay processes, two consumer processes running all five consumers, one
//! producer), on PostgreSQL and a private broker of the test's own, while
//! the test kills relays and consumers with SIGKILL at random moments and
//! starts them again, freezes them (SIGSTOP) past their leases, stops the
//! broker for a while, and the producer poisons 1% of orders (more in a small run) and consumers
//! see duplicated deliveries. Over NATS the database is a private
//! PostgreSQL server, which the test crashes (SIGKILL of the postmaster and
//! its backends) and starts again while the producer commits. Once, mid-run, the test spoils two records
//! in the outbox (a body that is not an envelope, and one larger than the
//! broker takes): the relay must set each aside as a dead letter naming why,
//! hold only their keys and send everything else; the bodies are then put
//! back and `tidings dlq redrive` releases them. Afterwards the database must show every
//! committed event's effect applied exactly once per consumer, each
//! order's events in order at every consumer, the poison in the failure
//! store with its history (and its orders' later events parked behind
//! it), nothing left in the outbox, and producers having committed while
//! the broker was down. The broker is NATS, RabbitMQ, the Kafka protocol
//! or Pub/Sub (its emulator).
//! One scenario runs the relays in CDC mode, reading the outbox from
//! PostgreSQL's logical replication through the crash, over RabbitMQ.
//!
//! Each scenario writes its figures to `target/tmp/fault-suite-*.txt`,
//! which `scripts/test` prints at the end.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tidings::sql::SqlStore;
use tidings::sql::db::Stmt;
use tidings_core::{DeadLetterFilter, FailureStore, LagSource, RELAY_LETTERS};
use tidings_example_checkout::demo::lost;
use tidings_example_checkout::sql::CheckoutDialect;
use tidings_example_checkout::system::{CheckoutStore, Tally};
use tidings_testkit::kafka::PrivateTansu;
use tidings_testkit::nats::PrivateNats;
use tidings_testkit::outage::PrivateBroker;
use tidings_testkit::postgres::PrivatePgTestDb;
use tidings_testkit::pubsub::PrivateEmulator;
use tidings_testkit::rabbitmq::PrivateRabbit;
use tidings_testkit::services::{MySqlTestDb, PgTestDb, TestDb};
use tidings_testkit::sqs::PrivateMoto;

mod common;

use common::{count, texts};

/// The error shapes `tidings dlq` groups dead letters by, to group those a failure reports.
use tidings_console::triage as cause;

/// Orders per scenario: three commands and three events each, every event
/// handled by four consumers; and at most how many a second the producer
/// places. Fewer over the emulators, whose work grows with what they hold:
/// the Pub/Sub emulator keeps a backlog with a thread of its own for each
/// ordering key of each subscription and scans them all on every pull;
/// moto, one Python process, scans a queue's messages (and asks each
/// whether it is visible) for every message SNS sends it, and for each it
/// receives, changes or deletes. With thousands of orders either takes the
/// machine's cores. They are placed at a steady rate there, so that the
/// producer still commits while the faults come.
fn orders(broker: &str) -> (usize, Option<u32>) {
    let (n, rate) = if broker.starts_with("pubsub:") {
        (800, Some(80))
    } else if broker.starts_with("sqs:") {
        (200, Some(30))
    } else {
        (1500, None)
    };
    let n = std::env::var("TIDINGS_FAULT_ORDERS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(n);
    (n, rate)
}

/// How long a scenario may take to drain after its last fault.
const DRAIN_LIMIT: Duration = Duration::from_secs(240);

/// One scenario at a time: two on two cores would starve each other's leases.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkout_processes_survive_a_database_crash_kills_freezes_and_a_nats_outage() {
    let _one = ONE_AT_A_TIME.lock().await;
    let nats = PrivateNats::start();
    let url = nats.url();
    run_scenario::<PrivatePgTestDb>("nats", Box::new(nats), url, &WITH_DATABASE_CRASH, Relays::Poll).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkout_processes_on_mysql_survive_kills_freezes_and_a_nats_outage() {
    let _one = ONE_AT_A_TIME.lock().await;
    let nats = PrivateNats::start();
    let url = nats.url();
    run_scenario::<MySqlTestDb>("mysql-nats", Box::new(nats), url, &FAULTS, Relays::Poll).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkout_processes_survive_kills_freezes_and_a_rabbitmq_outage() {
    let _one = ONE_AT_A_TIME.lock().await;
    let rabbit = rabbit_refusing_large_records();
    let url = rabbit.url();
    run_scenario::<PgTestDb>("rabbitmq", Box::new(rabbit), url, &FAULTS, Relays::Poll).await;
}

/// Over the Kafka protocol the broker's outage is a freeze: the private
/// Tansu keeps its storage in memory, so a restart would empty it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkout_processes_survive_kills_freezes_and_a_frozen_kafka_broker() {
    let _one = ONE_AT_A_TIME.lock().await;
    let kafka = PrivateTansu::start();
    let url = kafka.url();
    run_scenario::<PgTestDb>("kafka", Box::new(kafka), url, &FAULTS, Relays::Poll).await;
}

/// Over SNS + SQS the outage is a freeze too: moto keeps its state in
/// memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkout_processes_survive_kills_freezes_and_a_frozen_sns_sqs_server() {
    let _one = ONE_AT_A_TIME.lock().await;
    let moto = PrivateMoto::start();
    let url = moto.url();
    run_scenario::<PgTestDb>("sqs", Box::new(moto), url, &FAULTS, Relays::Poll).await;
}

/// Over Pub/Sub the outage is a freeze too: the emulator keeps its state
/// in memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkout_processes_survive_kills_freezes_and_a_frozen_pubsub_emulator() {
    let _one = ONE_AT_A_TIME.lock().await;
    let emulator = PrivateEmulator::start();
    let url = emulator.url();
    run_scenario::<PgTestDb>("pubsub", Box::new(emulator), url, &FAULTS, Relays::Poll).await;
}

/// The relays read the outbox from PostgreSQL's logical replication (CDC),
/// on a private server the test crashes: the stream ends with it and is
/// started again from the slot's confirmed position. Over RabbitMQ, so
/// that a database crash is met over NATS (polling) and RabbitMQ (CDC).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cdc_relays_survive_a_database_crash_kills_freezes_and_a_rabbitmq_outage() {
    let _one = ONE_AT_A_TIME.lock().await;
    let rabbit = rabbit_refusing_large_records();
    let url = rabbit.url();
    run_scenario::<PrivatePgTestDb>(
        "cdc-rabbitmq",
        Box::new(rabbit),
        url,
        &WITH_DATABASE_CRASH,
        Relays::Cdc,
    )
    .await;
}

/// A private RabbitMQ that refuses messages over 1 MiB. The transport is
/// not told: the broker's refusal names the record.
fn rabbit_refusing_large_records() -> PrivateRabbit {
    PrivateRabbit::start_with(&format!("max_message_size = {}\n", 1 << 20))
}

/// How the scenario's relays learn what was committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Relays {
    /// Claiming unsent outbox records.
    Poll,
    /// From logical replication (`--relay-mode cdc`).
    Cdc,
}

/// A process of the system.
struct Process {
    child: Child,
}

/// The processes of one scenario.
struct System {
    database: String,
    broker: String,
    /// Orders the producer places.
    orders: usize,
    /// At most this many a second.
    order_rate: Option<u32>,
    relay_mode: Relays,
    logs: std::path::PathBuf,
    relays: Vec<Process>,
    consumers: Vec<Process>,
    started: usize,
}

impl System {
    fn spawn(&mut self, role: &'static str) -> Process {
        self.started += 1;
        let log = std::fs::File::create(self.logs.join(format!("{role}-{}.log", self.started))).unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_tidings"))
            // TIDINGS_FAULT_LOG: the processes' RUST_LOG, to look closer at a failure.
            .env(
                "RUST_LOG",
                std::env::var("TIDINGS_FAULT_LOG").unwrap_or_else(|_| "warn,sqlx=error,lapin=error".into()),
            )
            // Moto takes any credentials; the AWS SDK wants some.
            .env("AWS_ACCESS_KEY_ID", "test")
            .env("AWS_SECRET_ACCESS_KEY", "test")
            .args(["demo", "checkout", "--role", role, "--partitions", "4"])
            .args(["--database", &self.database, "--broker", &self.broker])
            // 1%, or enough for ten poisoned orders on average in a
            // smaller run: none at all would leave nothing to check.
            .args(["--orders", &self.orders.to_string()])
            .args([
                "--poison-rate",
                &(10.0 / self.orders.max(1) as f64).clamp(0.01, 0.05).to_string(),
            ])
            .args(
                self.order_rate
                    .map(|r| vec!["--order-rate".to_owned(), r.to_string()])
                    .unwrap_or_default(),
            )
            .args(["--duplicate-rate", "0.05"])
            .args(match (role, self.relay_mode) {
                ("relay", Relays::Cdc) => &["--relay-mode", "cdc"][..],
                _ => &[][..],
            })
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("starting tidings");
        if role == "consumers" {
            // Consumers say when their groups exist: before that, a RabbitMQ
            // queue would miss what the relays publish.
            let stdout = child.stdout.take().unwrap();
            let (tx, rx) = mpsc::channel();
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                    let _ = tx.send(line);
                }
            });
            let ready = rx.recv_timeout(Duration::from_secs(120));
            assert_eq!(
                ready.as_deref(),
                Ok("ready"),
                "a consumer process did not get ready (logs in {})",
                self.logs.display()
            );
        }
        Process { child }
    }

    /// Which processes still run, by role.
    fn alive(&mut self) -> Vec<(&'static str, bool)> {
        let relays = self
            .relays
            .iter_mut()
            .map(|p| ("relay", p.child.try_wait().unwrap().is_none()));
        let consumers = self
            .consumers
            .iter_mut()
            .map(|p| ("consumers", p.child.try_wait().unwrap().is_none()));
        relays.chain(consumers).collect()
    }

    fn stop_all(&mut self) {
        for p in self.relays.iter_mut().chain(self.consumers.iter_mut()) {
            if let Ok(None) = p.child.try_wait() {
                signal(&p.child, "TERM");
            }
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        for p in self.relays.iter_mut().chain(self.consumers.iter_mut()) {
            while p.child.try_wait().unwrap().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = p.child.kill();
            let _ = p.child.wait();
        }
    }
}

impl Drop for System {
    fn drop(&mut self) {
        for p in self.relays.iter_mut().chain(self.consumers.iter_mut()) {
            if let Ok(None) = p.child.try_wait() {
                signal(&p.child, "CONT");
                let _ = p.child.kill();
                let _ = p.child.wait();
            }
        }
    }
}

fn signal(child: &Child, name: &str) {
    let _ = Command::new("kill")
        .args(["-s", name, &child.id().to_string()])
        .status();
}

/// The faults, in turn, each at a random moment and on a random victim.
#[derive(Debug, Clone, Copy)]
enum Fault {
    KillRelay,
    KillConsumer,
    BrokerOutage,
    FreezeRelay,
    FreezeConsumer,
    /// A corrupt record and an oversized one in the outbox, once.
    PoisonOutbox,
    /// The database server killed (SIGKILL) and started again, once.
    DatabaseCrash,
}

/// The poison and the outage come first, while the producer surely runs
/// (it commits its orders in a few seconds; a RabbitMQ node takes longer
/// than that to come back).
const FAULTS: [Fault; 7] = [
    Fault::PoisonOutbox,
    Fault::BrokerOutage,
    Fault::KillRelay,
    Fault::KillConsumer,
    Fault::FreezeRelay,
    Fault::KillConsumer,
    Fault::FreezeConsumer,
];

/// The crash first, once the producer commits, while it surely runs.
const WITH_DATABASE_CRASH: [Fault; 8] = [
    Fault::DatabaseCrash,
    Fault::PoisonOutbox,
    Fault::BrokerOutage,
    Fault::KillRelay,
    Fault::KillConsumer,
    Fault::FreezeRelay,
    Fault::KillConsumer,
    Fault::FreezeConsumer,
];

/// How long the crashed database stays down before it starts again.
const DATABASE_DOWN: Duration = Duration::from_secs(2);

/// A scenario's database, which it may crash.
trait ScenarioDb: TestDb {
    /// Crashes the server and starts it again after `down`; false where the
    /// server is shared and never crashed.
    async fn crash_for(&self, down: Duration) -> bool {
        let _ = down;
        false
    }
}

impl ScenarioDb for PgTestDb {}
impl ScenarioDb for MySqlTestDb {}
impl ScenarioDb for PrivatePgTestDb {
    async fn crash_for(&self, down: Duration) -> bool {
        PrivatePgTestDb::crash_for(self, down).await;
        true
    }
}

/// What the database crash of a scenario showed.
#[derive(Debug, Clone, Copy)]
struct Crash {
    /// Commands committed before it.
    before: i64,
    /// Commands committed when the server accepted connections again.
    back: i64,
    /// From the kill until the server accepted connections again.
    down: Duration,
}

/// Longer than the demo's 3 s leases: the frozen process's partitions move on.
const FREEZE: Duration = Duration::from_secs(5);
const OUTAGE: Duration = Duration::from_secs(4);

/// Larger than NATS's and Kafka's default limits (1 MiB, 1 MB), and the
/// private RabbitMQ node's `max_message_size` (1 MiB).
const OVERSIZED: usize = 1_500_000;
/// Larger than Pub/Sub's 10 MB.
const OVERSIZED_PUBSUB: usize = 10_500_000;

/// The padding that makes a record larger than the broker at `url` takes.
fn oversized(url: &str) -> usize {
    if url.starts_with("pubsub:") {
        OVERSIZED_PUBSUB
    } else {
        OVERSIZED
    }
}

async fn run_scenario<T>(
    name: &str,
    mut broker: Box<dyn PrivateBroker + Send>,
    broker_url: String,
    schedule: &[Fault],
    relay_mode: Relays,
) where
    T: ScenarioDb,
    T::Dialect: CheckoutDialect,
{
    let db = T::create().await;
    let logs = std::env::temp_dir().join(format!("tidings-faults-{name}-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&logs).unwrap();
    let store = db.store().clone();
    let started = Instant::now();
    let (orders, order_rate) = orders(&broker_url);
    let mut system = System {
        database: db.url(),
        orders,
        order_rate,
        broker: broker_url,
        relay_mode,
        logs: logs.clone(),
        relays: Vec::new(),
        consumers: Vec::new(),
        started: 0,
    };
    // Consumers first, so that their groups exist before anything is published.
    for _ in 0..2 {
        let p = system.spawn("consumers");
        system.consumers.push(p);
    }
    for _ in 0..2 {
        let p = system.spawn("relay");
        system.relays.push(p);
    }
    let mut producer = system.spawn("producer");

    // TIDINGS_FAULT_SEED: the seed a failure printed, to replay its faults in its order.
    let seed = std::env::var("TIDINGS_FAULT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::rng().random::<u64>());
    let mut rng = StdRng::seed_from_u64(seed);
    let mut faults = Vec::new();
    let mut committed_during_outage = None;
    let mut poisoned = Vec::new();
    let mut crash = None;
    let mut next = 0;
    // Faults while the producer runs, and at least one round of each.
    while producer.child.try_wait().unwrap().is_none() || next < schedule.len() {
        tokio::time::sleep(Duration::from_millis(rng.random_range(500..1500))).await;
        let fault = schedule[next % schedule.len()];
        next += 1;
        let victim = rng.random_range(0..2);
        match fault {
            Fault::KillRelay | Fault::KillConsumer => {
                let (group, role) = match fault {
                    Fault::KillRelay => (&mut system.relays, "relay"),
                    _ => (&mut system.consumers, "consumers"),
                };
                group[victim].child.kill().unwrap();
                group[victim].child.wait().unwrap();
                let p = system.spawn(role);
                let group = if role == "relay" {
                    &mut system.relays
                } else {
                    &mut system.consumers
                };
                group[victim] = p;
            }
            Fault::FreezeRelay | Fault::FreezeConsumer => {
                let group = match fault {
                    Fault::FreezeRelay => &system.relays,
                    _ => &system.consumers,
                };
                signal(&group[victim].child, "STOP");
                tokio::time::sleep(FREEZE).await;
                signal(&group[victim].child, "CONT");
            }
            Fault::BrokerOutage => {
                let before = tally(&store).await.commands;
                broker.stop();
                tokio::time::sleep(OUTAGE).await;
                let during = tally(&store).await.commands - before;
                broker.resume();
                // Over every outage: one that comes after the producer
                // finished commits nothing, and says nothing.
                committed_during_outage = Some(committed_during_outage.unwrap_or(0) + during);
            }
            Fault::DatabaseCrash if crash.is_some() => continue,
            Fault::DatabaseCrash => {
                let deadline = Instant::now() + Duration::from_secs(60);
                let before = loop {
                    let n = tally(&store).await.commands;
                    if n >= 300.min(system.orders as i64) {
                        break n;
                    }
                    assert!(
                        Instant::now() < deadline,
                        "{name}: the producer committed nothing"
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                };
                assert!(
                    producer.child.try_wait().unwrap().is_none(),
                    "{name}: the producer finished before the database crash"
                );
                let killed = Instant::now();
                assert!(
                    db.crash_for(DATABASE_DOWN).await,
                    "{name}: this database cannot crash"
                );
                let down = killed.elapsed();
                crash = Some(Crash {
                    before,
                    back: tally(&store).await.commands,
                    down,
                });
            }
            Fault::PoisonOutbox if !poisoned.is_empty() => continue,
            Fault::PoisonOutbox => {
                poisoned = poison_outbox(&store, &system).await;
            }
        }
        faults.push(format!("{fault:?}#{victim}"));
    }
    assert!(
        producer.child.wait().unwrap().success(),
        "the producer failed (logs in {})",
        logs.display()
    );
    let last_fault = Instant::now();

    let held = release_poison(&store, &system.database, &poisoned, &logs).await;
    let mut t = tally(&store).await;
    while !(lost(&t) == 0 && t.outbox_pending == 0) {
        if last_fault.elapsed() >= DRAIN_LIMIT {
            panic!(
                "{name}: not drained {DRAIN_LIMIT:?} after the last fault: {} lost, {} in the outbox; \
                 handled per consumer {:?}, processes alive {:?} (faults {faults:?}, seed {seed}, logs in {})\n{}",
                lost(&t),
                t.outbox_pending,
                t.processed,
                system.alive(),
                logs.display(),
                diagnose(&store, &system.broker, &logs).await
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
        t = tally(&store).await;
    }
    let drained_in = last_fault.elapsed();
    system.stop_all();
    // Counters reported by the consumer processes on their way out.
    let t = tally(&store).await;

    let mut report = Report::read(
        name,
        &store,
        &t,
        committed_during_outage,
        held,
        drained_in,
        started.elapsed(),
    )
    .await;
    report.crash = crash;
    report.orders = system.orders;
    if report.order_violations > 0 {
        report.evidence = order_evidence(&store, &logs).await;
    }
    let text = format!("{report}  faults {} (seed {seed})\n", faults.join(" "));
    println!("{text}");
    let out = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("fault-suite-{name}.txt"));
    std::fs::write(out, &text).unwrap();
    report.assert_sound(&store, &t).await;
    let _ = std::fs::remove_dir_all(&logs);
    drop(system);
    db.teardown().await;
}

/// A record of the outbox the test made unsendable, and its body before.
#[derive(Debug)]
struct Poisoned {
    seq: i64,
    id: uuid::Uuid,
    key: String,
    original: Vec<u8>,
    oversized: bool,
}

/// The order violations the consumers recorded, and every log line that
/// names their orders, for the failure message.
async fn order_evidence<D: CheckoutDialect>(store: &SqlStore<D>, logs: &std::path::Path) -> String {
    let violations = texts(
        store,
        "SELECT CONCAT(consumer, ' ', order_id, ' step ', step, ' after ', last_step) FROM order_violations",
    )
    .await;
    let mut out = String::from("order violations:\n");
    for v in &violations {
        out += &format!("  {v}\n");
    }
    let ids: Vec<&str> = violations.iter().filter_map(|v| v.split(' ').nth(1)).collect();
    let mut files: Vec<_> = std::fs::read_dir(logs)
        .map(|dir| dir.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    files.sort();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        let lines: Vec<String> = text
            .lines()
            .filter(|l| {
                ids.iter().any(|o| l.contains(o))
                    || [
                        "older state",
                        "another reader",
                        "did not come back",
                        "abandoning",
                        "lease lost",
                    ]
                    .iter()
                    .any(|w| l.contains(w))
            })
            .map(strip_colours)
            .collect();
        if lines.is_empty() {
            continue;
        }
        out += &format!("{}:\n", file.file_name().unwrap_or_default().to_string_lossy());
        for line in lines.iter().take(60) {
            out += &format!("  {}\n", line.chars().take(400).collect::<String>());
        }
    }
    out
}

/// What a scenario that did not drain leaves to look at, for its failure
/// message (the logs stay on the machine that ran it): who holds each
/// partition, what the broker still holds per consumer group, and each
/// process's last warnings.
async fn diagnose<D: CheckoutDialect>(store: &SqlStore<D>, broker: &str, logs: &std::path::Path) -> String {
    use tidings_example_checkout::demo::{COMMAND_CONSUMER, EVENT_CONSUMERS};
    use tidings_example_checkout::messages::{COMMANDS, ORDERS};
    let mut out = String::from("partition leases:\n");
    let leases = texts(
        store,
        "SELECT CONCAT(scope, ' #', partition_index, ' held by ', owner, ' fence ', fence, \
         CASE WHEN expires_at > CURRENT_TIMESTAMP THEN '' ELSE ' (expired)' END) \
         FROM tidings_leases ORDER BY scope, partition_index",
    )
    .await;
    for lease in leases {
        out += &format!("  {lease}\n");
    }
    let waiting = async {
        // Named as the demo names its resources.
        let system = format!("demo-{}", store.system_id().await?);
        let transport = tidings_demo_kit::Transport::open(store, Some(broker), 4, &system).await?;
        let mut waiting = Vec::new();
        let groups = [(COMMAND_CONSUMER, COMMANDS)]
            .into_iter()
            .chain(EVENT_CONSUMERS.map(|c| (c, ORDERS)));
        for (group, topic) in groups {
            waiting.push(format!(
                "{group}: {:?}",
                transport.subscriber.pending(group, topic).await?
            ));
        }
        anyhow::Ok(waiting)
    };
    match tokio::time::timeout(Duration::from_secs(30), waiting).await {
        Ok(Ok(waiting)) => out += &format!("waiting in the broker per group: {}\n", waiting.join(", ")),
        Ok(Err(e)) => out += &format!("the broker's counts could not be read: {e:#}\n"),
        Err(_) => out += "the broker's counts could not be read within 30 s\n",
    }
    let mut files: Vec<_> = std::fs::read_dir(logs)
        .map(|dir| dir.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    files.sort();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        let warnings: Vec<String> = text
            .lines()
            .map(strip_colours)
            .filter(|l| l.contains("WARN") || l.contains("ERROR"))
            .collect();
        out += &format!(
            "{}: {} warning(s), the last:\n",
            file.file_name().unwrap_or_default().to_string_lossy(),
            warnings.len()
        );
        for line in &warnings[warnings.len().saturating_sub(4)..] {
            out += &format!("  {}\n", line.chars().take(400).collect::<String>());
        }
    }
    out
}

/// `line` without its terminal colour codes.
fn strip_colours(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // An escape runs to its final letter.
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Freezes both relays, so that no record committed from then on has been
/// read by one, then spoils the first such record (its body no longer an
/// envelope) and the first of another key (an envelope larger than the
/// broker takes); the relays go on.
async fn poison_outbox<D: CheckoutDialect>(store: &SqlStore<D>, system: &System) -> Vec<Poisoned> {
    for relay in &system.relays {
        signal(&relay.child, "STOP");
    }
    // A statement a relay sent before it froze runs its course first: a
    // claim that locked a record picked below would hold the test up.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = count(store, "SELECT COALESCE(MAX(seq), 0) FROM tidings_outbox").await;
    let wanted = 2;
    let deadline = Instant::now() + Duration::from_secs(20);
    let picked = loop {
        let mut conn = store.conn("reading new records").await.unwrap();
        let rows = Stmt::<D>::new(
            "SELECT seq, id, aggregate_key, body FROM tidings_outbox WHERE seq > $1 AND published_at IS NULL ORDER BY seq",
            "reading new records",
        )
        .bind(after)
        .fetch_all(&mut conn)
        .await
        .unwrap();
        let mut picked: Vec<Poisoned> = Vec::new();
        for row in rows {
            let key: String = row.get(2).unwrap();
            if picked.len() < wanted && picked.iter().all(|p| p.key != key) {
                picked.push(Poisoned {
                    seq: row.get(0).unwrap(),
                    id: row.get(1).unwrap(),
                    key,
                    original: row.get(3).unwrap(),
                    oversized: !picked.is_empty(),
                });
            }
        }
        if picked.len() == wanted {
            break picked;
        }
        assert!(
            Instant::now() < deadline,
            "the producer committed no new records while the relays were frozen"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    for p in &picked {
        let body = if p.oversized {
            let mut doc: serde_json::Value =
                serde_json::from_slice(&p.original).expect("an outbox body is a CloudEvents JSON document");
            doc.get_mut("data")
                .and_then(serde_json::Value::as_object_mut)
                .expect("the demo's records carry JSON objects")
                .insert("padding".into(), "x".repeat(oversized(&system.broker)).into());
            serde_json::to_vec(&doc).unwrap()
        } else {
            b"\x00\x9f not an envelope".to_vec()
        };
        overwrite_body(store, p.seq, &body).await;
    }
    for relay in &system.relays {
        signal(&relay.child, "CONT");
    }
    picked
}

/// By its position: a frozen relay may hold locks on older records, and
/// looking a record up by id would wait for them.
async fn overwrite_body<D: CheckoutDialect>(store: &SqlStore<D>, seq: i64, body: &[u8]) {
    let mut conn = store.conn("overwriting a body").await.unwrap();
    Stmt::<D>::new(
        "UPDATE tidings_outbox SET body = $1 WHERE seq = $2",
        "overwriting a body",
    )
    .bind(body)
    .bind(seq)
    .execute(&mut conn)
    .await
    .unwrap();
}

/// What the relay did with the poisoned records.
#[derive(Debug)]
struct Held {
    /// Relay dead letters, one per poisoned record.
    letters: usize,
    /// Records waiting in the outbox behind them, all of their keys.
    records: usize,
    /// Each letter's reason.
    reasons: Vec<String>,
}

/// Waits until every record but the poisoned keys' has gone out and each
/// poisoned record is a relay dead letter naming why; then puts the bodies
/// back and redrives the letters with `tidings dlq redrive`, as an operator
/// would after fixing the cause.
async fn release_poison<D: CheckoutDialect>(
    store: &SqlStore<D>,
    database: &str,
    poisoned: &[Poisoned],
    logs: &std::path::Path,
) -> Held {
    assert!(!poisoned.is_empty(), "no record was poisoned");
    let deadline = Instant::now() + DRAIN_LIMIT;
    let (letters, records) = loop {
        let letters = store
            .dead_letters(&DeadLetterFilter::default().consumer(RELAY_LETTERS))
            .await
            .unwrap();
        let waiting = texts(
            store,
            "SELECT aggregate_key FROM tidings_outbox WHERE published_at IS NULL",
        )
        .await;
        if letters.len() == poisoned.len() && waiting.iter().all(|k| poisoned.iter().any(|p| &p.key == k)) {
            break (letters, waiting.len() - poisoned.len());
        }
        assert!(
            Instant::now() < deadline,
            "the relay did not set the poisoned records {poisoned_ids:?} aside and send the rest: \
             {} relay dead letters, {} records waiting, of keys {:?} (logs in {})",
            letters.len(),
            waiting.len(),
            waiting.iter().collect::<std::collections::BTreeSet<_>>(),
            logs.display(),
            poisoned_ids = poisoned.iter().map(|p| p.id).collect::<Vec<_>>(),
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let mut reasons = Vec::new();
    for p in poisoned {
        let letter = letters
            .iter()
            .find(|l| l.message_id == Some(p.id))
            .unwrap_or_else(|| panic!("no relay dead letter for {}: {letters:?}", p.id));
        let reason = letter.errors.last().map_or(String::new(), |e| e.error.clone());
        let named = if p.oversized {
            [
                "max_payload",
                "message.max.bytes",
                "max_message_size",
                "too large for",
            ]
            .iter()
            .any(|limit| reason.contains(limit))
        } else {
            reason.contains("not an envelope")
        };
        assert!(named, "the relay dead letter of {} names why: {reason}", p.id);
        assert_eq!(letter.aggregate_key.as_deref(), Some(p.key.as_str()));
        reasons.push(reason);
        overwrite_body(store, p.seq, &p.original).await;
    }
    let out = common::tidings()
        .env("RUST_LOG", "error")
        .args(["dlq", "redrive", "--consumer", RELAY_LETTERS, "--all"])
        .args(["--database", database])
        .output()
        .expect("running tidings dlq redrive");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains(&format!("{0} of {0} dead letter(s) redriven", poisoned.len())),
        "tidings dlq redrive: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Held {
        letters: letters.len(),
        records,
        reasons,
    }
}

async fn tally<D: CheckoutDialect>(store: &SqlStore<D>) -> Tally {
    store.tally().await.expect("reading the checkout figures")
}

/// What one scenario shows.
#[derive(Debug)]
struct Report {
    name: String,
    /// Orders the producer placed.
    orders: usize,
    database: &'static str,
    events: i64,
    commands: i64,
    applied: i64,
    duplicates_suppressed: i64,
    dead_lettered: i64,
    parked: i64,
    lost: i64,
    order_violations: i64,
    duplicated_effects: i64,
    committed_during_outage: Option<i64>,
    crash: Option<Crash>,
    relay_poison: Held,
    drained_in: Duration,
    elapsed: Duration,
    /// What the logs say about the order violations, when there are some.
    evidence: String,
}

impl Report {
    async fn read<D: CheckoutDialect>(
        name: &str,
        store: &SqlStore<D>,
        t: &Tally,
        committed_during_outage: Option<i64>,
        relay_poison: Held,
        drained_in: Duration,
        elapsed: Duration,
    ) -> Report {
        let sum = |counts: &[(String, i64)]| counts.iter().map(|(_, n)| n).sum::<i64>();
        Report {
            name: name.to_owned(),
            orders: 0,
            database: D::NAME,
            events: t.events,
            commands: t.commands,
            applied: sum(&t.processed),
            duplicates_suppressed: t.duplicates_reported,
            dead_lettered: sum(&t.dead_letters),
            parked: sum(&t.parked),
            lost: lost(t),
            order_violations: t.violations,
            duplicated_effects: count(
                store,
                "SELECT count(*) FROM (SELECT subject, kind FROM demo_third_party WHERE service = 'email'
                 GROUP BY 1, 2 HAVING count(*) > 1) d",
            )
            .await,
            committed_during_outage,
            crash: None,
            relay_poison,
            drained_in,
            elapsed,
            evidence: String::new(),
        }
    }

    async fn assert_sound<D: CheckoutDialect>(&self, store: &SqlStore<D>, t: &Tally) {
        assert_eq!(self.lost, 0, "{self}");
        assert_eq!(self.order_violations, 0, "{self}");
        assert_eq!(self.duplicated_effects, 0, "{self}");
        assert!(
            self.committed_during_outage.is_some_and(|n| n > 0),
            "producers must keep committing while the broker is down: {self}"
        );
        if let Some(crash) = self.crash {
            assert!(
                self.commands > crash.back,
                "the producer must go on committing after the database comes back: {self}"
            );
        }
        let lag = store.lag().await.unwrap();
        assert_eq!(lag.outbox_pending, 0, "{self}");
        assert_eq!(
            count(store, "SELECT count(*) FROM tidings_relay_holds").await,
            0,
            "no key held by the relay after the redrive: {self}"
        );
        // Each effect once per consumer: every order took its three commands
        // once, each reservation, email and credit exists once.
        assert_eq!(t.orders as usize, self.orders, "{self}");
        assert_eq!(
            count(store, "SELECT count(*) FROM checkout_orders WHERE events <> 3").await,
            0,
            "{self}"
        );
        assert_eq!(
            count(store, "SELECT count(*) FROM inventory_reservations").await,
            t.orders - t.poisoned_orders,
            "{self}"
        );
        assert_eq!(t.points_credited, t.points_expected, "{self}");
        assert_eq!(t.analytics_counted, t.processed_by("analytics"), "{self}");
        assert_eq!(
            count(
                store,
                "SELECT count(*) FROM demo_third_party WHERE service = 'email'"
            )
            .await,
            t.orders
                + count(
                    store,
                    "SELECT count(*) FROM checkout_orders WHERE status = 'shipped'"
                )
                .await,
            "one confirmation per order and one notice per shipped order: {self}"
        );
        // The poison: in the failure store with its history, the orders'
        // later events parked behind it, nothing else failed.
        assert!(t.poisoned_orders > 0, "{self}");
        let letters = store.dead_letters(&DeadLetterFilter::default()).await.unwrap();
        let causes: std::collections::BTreeMap<String, usize> =
            letters.iter().fold(Default::default(), |mut by, l| {
                let last = l.errors.last().map_or("", |e| e.error.as_str());
                let cause = format!("{} {:?}: {last}", l.consumer, l.message_type);
                *by.entry(cause::error_shape(&cause)).or_default() += 1;
                by
            });
        assert_eq!(
            letters.len() as i64,
            t.poisoned_orders,
            "{self}\ndead letters by cause: {causes:#?}"
        );
        for letter in &letters {
            assert_eq!(letter.consumer, "inventory");
            assert_eq!(letter.message_type.as_deref(), Some("OrderPlaced"));
            assert!(!letter.errors.is_empty(), "a dead letter keeps its history");
            assert!(
                letter
                    .errors
                    .iter()
                    .all(|e| e.error.contains("warehouse rejected"))
            );
        }
        assert_eq!(t.parked_by("inventory"), 2 * t.poisoned_orders, "{self}");
        assert_eq!(
            lag.parked.iter().map(|p| p.held_keys as i64).sum::<i64>(),
            t.poisoned_orders
        );
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "fault suite · {} ({} orders, {}{}, private broker, 2 relay + 2 consumer processes)",
            self.name,
            self.orders,
            self.database,
            if self.crash.is_some() {
                " on a private server"
            } else {
                ""
            }
        )?;
        writeln!(
            f,
            "  events committed        {} (and {} commands)",
            self.events, self.commands
        )?;
        writeln!(
            f,
            "  effects applied         {} (processed markers, all consumers)",
            self.applied
        )?;
        writeln!(
            f,
            "  duplicates suppressed   {} (at least: killed processes lose their last report)",
            self.duplicates_suppressed
        )?;
        writeln!(f, "  dead-lettered           {}", self.dead_lettered)?;
        writeln!(f, "  parked                  {}", self.parked)?;
        writeln!(f, "  lost                    {}", self.lost)?;
        writeln!(f, "  order violations        {}", self.order_violations)?;
        writeln!(f, "  duplicated effects      {}", self.duplicated_effects)?;
        writeln!(
            f,
            "  committed in outages    {}",
            self.committed_during_outage.map_or("-".into(), |n| n.to_string())
        )?;
        if let Some(crash) = self.crash {
            writeln!(
                f,
                "  database crashed        after {} commands (SIGKILL of the postmaster), accepting again {:.1} s later; {} commands committed after it was back",
                crash.before,
                crash.down.as_secs_f64(),
                self.commands - crash.back
            )?;
        }
        writeln!(
            f,
            "  set aside by the relay  {} (then redriven), {} records of their keys held behind them",
            self.relay_poison.letters, self.relay_poison.records
        )?;
        for reason in &self.relay_poison.reasons {
            let short: String = reason.chars().take(110).collect();
            writeln!(f, "    {short}")?;
        }
        writeln!(
            f,
            "  drained after last fault {:.1} s",
            self.drained_in.as_secs_f64()
        )?;
        writeln!(f, "  elapsed                 {:.1} s", self.elapsed.as_secs_f64())?;
        f.write_str(&self.evidence)
    }
}
