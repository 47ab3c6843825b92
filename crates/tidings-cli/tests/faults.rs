//! The fault suite: the checkout system spread over real processes (two
//! relay processes, two consumer processes running all five consumers, one
//! producer), on PostgreSQL and a private broker of the test's own, while
//! the test kills relays and consumers with SIGKILL at random moments and
//! starts them again, freezes them (SIGSTOP) past their leases, stops the
//! broker for a while, and the producer poisons 1% of orders and consumers
//! see duplicated deliveries. Afterwards the database must show every
//! committed event's effect applied exactly once per consumer, each
//! order's events in order at every consumer, the poison in the failure
//! store with its history (and its orders' later events parked behind
//! it), nothing left in the outbox, and producers having committed while
//! the broker was down.
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
use tidings_core::{DeadLetterFilter, FailureStore, LagSource};
use tidings_example_checkout::demo::lost;
use tidings_example_checkout::sql::CheckoutDialect;
use tidings_example_checkout::system::{CheckoutStore, Tally};
use tidings_testkit::nats::PrivateNats;
use tidings_testkit::outage::PrivateBroker;
use tidings_testkit::rabbitmq::PrivateRabbit;
use tidings_testkit::services::{MySqlTestDb, PgTestDb, TestDb};

mod common;

use common::count;

/// The `tidings` binary's error shapes, to group the dead letters a failure reports.
#[path = "../src/cause.rs"]
#[allow(dead_code)]
mod cause;

/// Orders per scenario: three commands and three events each, every event
/// handled by four consumers.
fn orders() -> usize {
    std::env::var("TIDINGS_FAULT_ORDERS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(3400)
}

/// How long a scenario may take to drain after its last fault.
const DRAIN_LIMIT: Duration = Duration::from_secs(240);

/// One scenario at a time: two on two cores would starve each other's leases.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkout_processes_survive_kills_freezes_and_a_nats_outage() {
    let _one = ONE_AT_A_TIME.lock().await;
    let nats = PrivateNats::start();
    let url = nats.url();
    run_scenario::<PgTestDb>("nats", Box::new(nats), url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkout_processes_on_mysql_survive_kills_freezes_and_a_nats_outage() {
    let _one = ONE_AT_A_TIME.lock().await;
    let nats = PrivateNats::start();
    let url = nats.url();
    run_scenario::<MySqlTestDb>("mysql-nats", Box::new(nats), url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkout_processes_survive_kills_freezes_and_a_rabbitmq_outage() {
    let _one = ONE_AT_A_TIME.lock().await;
    let rabbit = PrivateRabbit::start();
    let url = rabbit.url();
    run_scenario::<PgTestDb>("rabbitmq", Box::new(rabbit), url).await;
}

/// A process of the system.
struct Process {
    child: Child,
}

/// The processes of one scenario.
struct System {
    database: String,
    broker: String,
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
            .env("RUST_LOG", "warn,sqlx=error,lapin=error")
            .args(["demo", "checkout", "--role", role, "--partitions", "4"])
            .args(["--database", &self.database, "--broker", &self.broker])
            .args(["--orders", &orders().to_string(), "--poison-rate", "0.01"])
            .args(["--duplicate-rate", "0.05"])
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
}

/// The outage comes first, while the producer surely runs.
const FAULTS: [Fault; 6] = [
    Fault::BrokerOutage,
    Fault::KillRelay,
    Fault::KillConsumer,
    Fault::FreezeRelay,
    Fault::KillConsumer,
    Fault::FreezeConsumer,
];

/// Longer than the demo's 3 s leases: the frozen process's partitions move on.
const FREEZE: Duration = Duration::from_secs(5);
const OUTAGE: Duration = Duration::from_secs(4);

async fn run_scenario<T>(name: &str, mut broker: Box<dyn PrivateBroker + Send>, broker_url: String)
where
    T: TestDb,
    T::Dialect: CheckoutDialect,
{
    let db = T::create().await;
    let logs = std::env::temp_dir().join(format!("tidings-faults-{name}-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&logs).unwrap();
    let store = db.store().clone();
    let started = Instant::now();
    let mut system = System {
        database: db.url(),
        broker: broker_url,
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

    let seed = rand::rng().random::<u64>();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut faults = Vec::new();
    let mut committed_during_outage = None;
    let mut next = 0;
    // Faults while the producer runs, and at least one round of each.
    while producer.child.try_wait().unwrap().is_none() || next < FAULTS.len() {
        tokio::time::sleep(Duration::from_millis(rng.random_range(500..1500))).await;
        let fault = FAULTS[next % FAULTS.len()];
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
                committed_during_outage = Some(during);
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

    let mut t = tally(&store).await;
    while !(lost(&t) == 0 && t.outbox_pending == 0) {
        assert!(
            last_fault.elapsed() < DRAIN_LIMIT,
            "{name}: not drained {DRAIN_LIMIT:?} after the last fault: {} lost, {} in the outbox (faults {faults:?}, seed {seed}, logs in {})",
            lost(&t),
            t.outbox_pending,
            logs.display()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
        t = tally(&store).await;
    }
    let drained_in = last_fault.elapsed();
    system.stop_all();
    // Counters reported by the consumer processes on their way out.
    let t = tally(&store).await;

    let report = Report::read(
        name,
        &store,
        &t,
        committed_during_outage,
        drained_in,
        started.elapsed(),
    )
    .await;
    let text = format!("{report}  faults {}\n", faults.join(" "));
    println!("{text}");
    let out = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("fault-suite-{name}.txt"));
    std::fs::write(out, &text).unwrap();
    report.assert_sound(&store, &t).await;
    let _ = std::fs::remove_dir_all(&logs);
    drop(system);
    db.teardown().await;
}

async fn tally<D: CheckoutDialect>(store: &SqlStore<D>) -> Tally {
    store.tally().await.expect("reading the checkout figures")
}

/// What one scenario shows.
#[derive(Debug)]
struct Report {
    name: String,
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
    drained_in: Duration,
    elapsed: Duration,
}

impl Report {
    async fn read<D: CheckoutDialect>(
        name: &str,
        store: &SqlStore<D>,
        t: &Tally,
        committed_during_outage: Option<i64>,
        drained_in: Duration,
        elapsed: Duration,
    ) -> Report {
        let sum = |counts: &[(String, i64)]| counts.iter().map(|(_, n)| n).sum::<i64>();
        Report {
            name: name.to_owned(),
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
                "SELECT count(*) FROM (SELECT order_id, kind FROM email_provider GROUP BY 1, 2 HAVING count(*) > 1) d",
            )
            .await,
            committed_during_outage,
            drained_in,
            elapsed,
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
        let lag = store.lag().await.unwrap();
        assert_eq!(lag.outbox_pending, 0, "{self}");
        // Each effect once per consumer: every order took its three commands
        // once, each reservation, email and credit exists once.
        assert_eq!(t.orders as usize, orders(), "{self}");
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
            count(store, "SELECT count(*) FROM email_provider").await,
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
            "fault suite · {} ({}, private broker, 2 relay + 2 consumer processes)",
            self.name, self.database
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
            "  committed during outage {}",
            self.committed_during_outage.map_or("-".into(), |n| n.to_string())
        )?;
        writeln!(
            f,
            "  drained after last fault {:.1} s",
            self.drained_in.as_secs_f64()
        )?;
        writeln!(f, "  elapsed                 {:.1} s", self.elapsed.as_secs_f64())
    }
}
