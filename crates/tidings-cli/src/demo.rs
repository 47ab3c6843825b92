//! `tidings demo <shape>`: the reference systems, each end to end in one
//! process, on the embedded default or on real services, with a summary
//! read back from the database and its invariants as the exit status.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use serde::Serialize;
use tidings::{CancellationToken, shutdown_on_signal};
use tidings_demo_kit::{Progress, RunOptions, Scale};
use tidings_example_checkout::demo as checkout;
use tidings_example_checkout::{DemoOptions, Role};
use tidings_example_clicks::ClicksOptions;
use tidings_example_payments::PaymentsOptions;
use tidings_example_upload::UploadOptions;

use crate::or_env;

#[derive(Debug, Subcommand)]
pub(crate) enum Demo {
    /// PlaceOrder -> OrderPlaced -> inventory, email, analytics, loyalty; then a summary.
    Checkout {
        /// Orders to place.
        #[arg(long, default_value_t = 1000)]
        orders: usize,
        /// Place at most this many orders a second (default: as fast as
        /// the database takes them), for a steady load.
        #[arg(long, value_name = "PER_SECOND")]
        order_rate: Option<std::num::NonZeroU32>,
        /// Fraction of orders the inventory service cannot handle (0 to 1).
        #[arg(long, default_value_t = 0.0, value_parser = fraction)]
        poison_rate: f64,
        /// The inventory service's fix has shipped: poisoned orders go through
        /// (redrive their dead letters with `tidings dlq redrive`, then run this).
        #[arg(long)]
        warehouse_fixed: bool,
        /// Run one part of the system in this process, to spread it over several:
        /// `relay` and `consumers` run until SIGTERM or Ctrl-C (`consumers`
        /// prints `ready` once its groups exist), `producer` places the orders and exits.
        #[arg(long, value_enum, default_value_t = RoleArg::All)]
        role: RoleArg,
        /// Serve Prometheus metrics at http://ADDR/metrics while running
        /// (this process's relays and consumers, and lag measured every second).
        #[arg(long, value_name = "ADDR")]
        metrics: Option<SocketAddr>,
        /// How the relays learn what was committed: `poll` the outbox, or
        /// `cdc`, PostgreSQL's logical replication (wal_level = logical),
        /// through the slot `tidings_demo`, dropped when a whole run ends.
        #[arg(long, value_enum, default_value_t = RelayModeArg::Poll)]
        relay_mode: RelayModeArg,
        #[command(flatten)]
        system: SystemArgs,
    },
    /// UploadFinished -> ScanFile -> MakeThumbnail -> IndexDocument, each a
    /// work queue with bounded concurrency; then a summary.
    Upload {
        /// Files uploaded at once (a burst).
        #[arg(long, default_value_t = 500)]
        uploads: usize,
        /// Fraction of clean uploads that are no image: the thumbnailer dead-letters them (0 to 1).
        #[arg(long, default_value_t = 0.0, value_parser = fraction)]
        poison_rate: f64,
        #[command(flatten)]
        system: SystemArgs,
    },
    /// Stripe webhooks -> inbox -> intake -> ledger and notifications; a replay
    /// of the run that must change nothing; then a summary.
    Payments {
        /// Payments the simulated provider makes and delivers as webhooks
        /// (0: none; with --webhook-listen, only what others post).
        #[arg(long, default_value_t = 500)]
        payments: usize,
        /// Fraction of payments in a currency the ledger has no accounts for (0 to 1).
        #[arg(long, default_value_t = 0.0, value_parser = fraction)]
        poison_rate: f64,
        /// Serve the webhook endpoint at http://ADDR/stripe, and sum up only
        /// on SIGTERM or Ctrl-C, so that a real client (curl, a provider's CLI) can post to it.
        #[arg(long, value_name = "ADDR")]
        webhook_listen: Option<SocketAddr>,
        /// The endpoint's signing secret (`whsec_...`), read from this file;
        /// else a fresh one for the simulated provider.
        #[arg(long, value_name = "FILE")]
        webhook_secret_file: Option<PathBuf>,
        #[command(flatten)]
        system: SystemArgs,
    },
    /// A click stream -> fraud scoring in batches -> a feature store; over
    /// Kafka written by a plain producer, or read from another team's topic;
    /// then a summary with the throughput.
    Clicks {
        /// Clicks the web tier writes (0: none, only what is in --external-topic).
        #[arg(long, default_value_t = 200_000)]
        clicks: usize,
        /// Fraction of clicks that are malformed (the scorer dead-letters them) (0 to 1).
        #[arg(long, default_value_t = 0.0, value_parser = fraction)]
        poison_rate: f64,
        /// Read the clicks from this Kafka topic as another producer fills it
        /// (spec-valid CloudEvents, any partition count); needs a kafka:// broker.
        #[arg(long, value_name = "NAME")]
        external_topic: Option<String>,
        #[command(flatten)]
        system: SystemArgs,
    },
}

/// What every reference system takes.
#[derive(Debug, Args)]
pub(crate) struct SystemArgs {
    /// `postgres://user@host/db`, `mysql://user@host/db`, or `sqlite://path`;
    /// else TIDINGS_DATABASE__URL, else `sqlite://tidings-demo.db`.
    #[arg(long, env = "TIDINGS_DATABASE_URL")]
    database: Option<String>,
    /// `nats://host:4222` (NATS JetStream), `amqp://user:pw@host:5672/%2f` (RabbitMQ),
    /// `kafka://host:9092` (Kafka), `sqs://` (SNS and SQS, configured the
    /// AWS way: AWS_REGION, AWS_ENDPOINT_URL, ...) or `pubsub://PROJECT`
    /// (Pub/Sub; PUBSUB_EMULATOR_HOST for the emulator); else TIDINGS_BROKER__URL;
    /// the database log when left out.
    #[arg(long, env = "TIDINGS_BROKER_URL")]
    broker: Option<String>,
    /// Fraction of deliveries to redeliver a second time (0 to 1).
    #[arg(long, default_value_t = 0.0, value_parser = fraction)]
    duplicate_rate: f64,
    /// Members of each consumer group, sharing its partitions (as if run in that many processes).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    members: u32,
    /// Relays, sharing the outbox's partitions (as if run in that many processes).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    relays: u32,
    /// Partitions of the outbox and of every topic; keep it from one run to the next.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=256))]
    partitions: u32,
    /// Connections of the store's pool in each process, shared by its
    /// producers, relays and consumer lanes (default 32); keep the
    /// processes' sum under the server's `max_connections`.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    max_connections: Option<u32>,
    /// Seconds to wait for every message to be handled, once the producers are done.
    #[arg(long, default_value_t = 300)]
    timeout: u64,
    /// Print the summary as one JSON object on stdout.
    #[arg(long)]
    json: bool,
}

impl SystemArgs {
    fn database(&self) -> Option<String> {
        or_env(self.database.as_deref(), "TIDINGS_DATABASE__URL")
    }

    fn broker(&self) -> Option<String> {
        or_env(self.broker.as_deref(), "TIDINGS_BROKER__URL")
    }

    fn scale(&self) -> Scale {
        Scale {
            members: self.members as usize,
            relays: self.relays as usize,
            partitions: self.partitions,
            duplicate_rate: self.duplicate_rate,
        }
    }

    fn run(&self) -> RunOptions {
        RunOptions {
            database: self.database(),
            broker: self.broker(),
            scale: self.scale(),
            progress: Progress::for_stderr(self.json),
            drain_timeout: Duration::from_secs(self.timeout),
            max_connections: self.max_connections,
        }
    }
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub(crate) enum RoleArg {
    All,
    Relay,
    Consumers,
    Producer,
}

impl From<RoleArg> for Role {
    fn from(r: RoleArg) -> Role {
        match r {
            RoleArg::All => Role::All,
            RoleArg::Relay => Role::Relay,
            RoleArg::Consumers => Role::Consumers,
            RoleArg::Producer => Role::Producer,
        }
    }
}

/// `--relay-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum RelayModeArg {
    /// Claim unsent outbox records, woken by producers.
    Poll,
    /// Read the outbox's inserts from PostgreSQL's logical replication.
    Cdc,
}

pub(crate) fn fraction(s: &str) -> Result<f64, String> {
    let f: f64 = s.parse().map_err(|_| format!("{s:?} is not a number"))?;
    if (0.0..=1.0).contains(&f) {
        Ok(f)
    } else {
        Err(format!("{f} is not between 0 and 1"))
    }
}

/// Prints `summary` (as JSON with `json`); the exit status says whether its invariants hold.
fn report(summary: &(impl Serialize + std::fmt::Display), json: bool, ok: bool) -> anyhow::Result<ExitCode> {
    if json {
        say!("{}", serde_json::to_string(summary)?);
    } else {
        say!("{summary}");
    }
    Ok(if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

pub(crate) async fn run(demo: Demo) -> anyhow::Result<ExitCode> {
    match demo {
        Demo::Checkout {
            orders,
            order_rate,
            poison_rate,
            warehouse_fixed,
            role,
            metrics,
            relay_mode,
            system,
        } => {
            if let Some(addr) = metrics {
                crate::serve_metrics(addr).await?;
            }
            let scale = system.scale();
            let options = DemoOptions {
                orders,
                order_rate,
                database: system.database(),
                broker: system.broker(),
                duplicate_rate: scale.duplicate_rate,
                poison_rate,
                warehouse_fixed,
                progress: Progress::for_stderr(system.json),
                drain_timeout: Duration::from_secs(system.timeout),
                members: scale.members,
                relays: scale.relays,
                partitions: scale.partitions,
                sample_lag: metrics.map(|_| Duration::from_secs(1)),
                max_connections: system.max_connections,
                cdc_group: (relay_mode == RelayModeArg::Cdc).then(|| "demo".to_owned()),
                ..DemoOptions::default()
            };
            if !matches!(role, RoleArg::All) {
                checkout::run_role(options, role.into(), shutdown_on_signal()?).await?;
                return Ok(ExitCode::SUCCESS);
            }
            let summary = checkout::run(options).await?;
            report(&summary, system.json, summary.ok())
        }
        Demo::Upload {
            uploads,
            poison_rate,
            system,
        } => {
            let options = UploadOptions {
                uploads,
                poison_rate,
                run: system.run(),
            };
            let summary = tidings_example_upload::demo::run(options)
                .await
                .context("running the upload demo")?;
            report(&summary, system.json, summary.ok())
        }
        Demo::Clicks {
            clicks,
            poison_rate,
            external_topic,
            system,
        } => {
            anyhow::ensure!(
                clicks > 0 || external_topic.is_some(),
                "--clicks 0 writes no click: give --external-topic to read clicks another producer writes"
            );
            let options = ClicksOptions {
                clicks,
                poison_rate,
                external_topic,
                run: system.run(),
            };
            let summary = tidings_example_clicks::demo::run(options)
                .await
                .context("running the clicks demo")?;
            report(&summary, system.json, summary.ok())
        }
        Demo::Payments {
            payments,
            poison_rate,
            webhook_listen,
            webhook_secret_file,
            system,
        } => {
            anyhow::ensure!(
                payments > 0 || webhook_listen.is_some(),
                "--payments 0 makes no payment: give --webhook-listen to take deliveries from elsewhere"
            );
            let options = PaymentsOptions {
                payments,
                poison_rate,
                listen: webhook_listen,
                secret_file: webhook_secret_file,
                // Only a demo that listens for others sums up on a signal.
                stop: match webhook_listen {
                    Some(_) => shutdown_on_signal()?,
                    None => CancellationToken::new(),
                },
                run: system.run(),
            };
            let summary = tidings_example_payments::demo::run(options)
                .await
                .context("running the payments demo")?;
            report(&summary, system.json, summary.ok())
        }
    }
}
