//! `tidings bench all`: every scenario, over the database log and each broker given.

use std::fmt;

use serde::Serialize;
use tidings_core::secret::redact_url;

use super::{
    ConsumerBench, ConsumerCost, Latencies, LatencyBench, PeerBench, PeerComparison, ProducerBench,
    ProducerTax, RelayBench, RelayScaling, SteadyBench, SteadyState, consumer, latency, peer, producer,
    relays, steady,
};

/// What `tidings bench all` runs.
#[derive(Debug, Clone, clap::Args)]
pub struct AllBench {
    /// PostgreSQL (the bench works in schemas of its own, dropped at the end).
    #[arg(long, env = "TIDINGS_DATABASE_URL")]
    pub(crate) database: String,
    /// A broker to run the transport scenarios over, besides the database
    /// log: `nats://...`, `amqp://...`, `kafka://...`, `sqs://...` or `pubsub://PROJECT`; repeat for several.
    #[arg(long)]
    pub(crate) broker: Vec<String>,
    /// Every scenario at a tiny size, in seconds: checks that all of them
    /// run, measures nothing worth reading.
    #[arg(long)]
    pub(crate) quick: bool,
    /// Also write the latency distributions as an SVG plot to this file.
    #[arg(long)]
    pub(crate) plot: Option<std::path::PathBuf>,
}

impl AllBench {
    /// Refuses what cannot run, with one line.
    pub(crate) fn check(&self) -> anyhow::Result<()> {
        super::ensure_postgres(&self.database, "all")
    }
}

/// The figures of one transport.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct TransportFigures {
    /// Relay drain and scaling, with the raw limits and the relay's memory.
    pub(crate) relays: RelayScaling,
    /// Steady state.
    pub(crate) steady: SteadyState,
    /// Commit-to-handler latency.
    pub(crate) latency: Latencies,
    /// The consumer's cost of idempotency.
    pub(crate) consumer: ConsumerCost,
}

/// Every scenario's figures.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct AllFigures {
    /// The producer tax (the transport plays no part in it).
    pub(crate) producer: ProducerTax,
    /// The transport scenarios, the database log first.
    pub(crate) transports: Vec<TransportFigures>,
    /// `pg-transactional-outbox` side by side, over the first RabbitMQ
    /// given (not in a quick run).
    pub(crate) peer: Option<PeerComparison>,
}

/// Runs every scenario, reporting progress on stderr.
pub(crate) async fn all(bench: AllBench) -> anyhow::Result<AllFigures> {
    let quick = bench.quick;
    let database = bench.database.clone();
    eprintln!("bench: producer tax");
    let producer = producer(ProducerBench {
        database: database.clone(),
        connections: if quick { 2 } else { 16 },
        seconds: if quick { 0.6 } else { 15.0 },
    })
    .await?;
    let mut transports = Vec::new();
    for broker in std::iter::once(None).chain(bench.broker.iter().map(|b| Some(b.clone()))) {
        let over = broker
            .as_deref()
            .map_or("the database log".to_owned(), redact_url);
        eprintln!("bench: relay drain over {over}");
        let relays = relays(RelayBench::new(
            database.clone(),
            broker.clone(),
            if quick { 1500 } else { 200_000 },
            if quick { vec![1] } else { vec![1, 2, 4] },
        ))
        .await?;
        eprintln!("bench: steady state over {over}");
        let steady = steady(SteadyBench {
            database: database.clone(),
            broker: broker.clone(),
            connections: if quick { 2 } else { 16 },
            seconds: if quick { 1.0 } else { 20.0 },
            relays: 1,
            partitions: 8,
        })
        .await?;
        eprintln!("bench: latency over {over}");
        let latency = latency(LatencyBench {
            database: database.clone(),
            broker: broker.clone(),
            rates: if quick { vec![50] } else { vec![500, 2000] },
            seconds: if quick { 1.0 } else { 10.0 },
            poll_ms: 100,
            plot: None,
        })
        .await?;
        eprintln!("bench: consumer cost over {over}");
        let consumer = consumer(ConsumerBench {
            database: database.clone(),
            broker: broker.clone(),
            events: if quick { 600 } else { 50_000 },
            lanes: 16,
            batch: 64,
        })
        .await?;
        transports.push(TransportFigures {
            relays,
            steady,
            latency,
            consumer,
        });
    }
    let rabbitmq = bench.broker.iter().find(|b| b.starts_with("amqp"));
    let peer = match rabbitmq {
        Some(broker) if !quick => {
            eprintln!("bench: pg-transactional-outbox side by side");
            Some(
                peer(PeerBench {
                    database: database.clone(),
                    broker: broker.clone(),
                    events: 2000,
                    rate: 500,
                    seconds: 10.0,
                    peer_dir: super::peer::default_dir(),
                })
                .await?,
            )
        }
        _ => None,
    };
    let figures = AllFigures {
        producer,
        transports,
        peer,
    };
    if let Some(path) = &bench.plot {
        let runs: Vec<_> = figures.transports.iter().map(|t| &t.latency).collect();
        std::fs::write(path, super::plot::latency_svg(&runs))?;
        eprintln!("bench: latency plot written to {}", path.display());
    }
    Ok(figures)
}

impl fmt::Display for AllFigures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}", self.producer)?;
        for t in &self.transports {
            writeln!(f, "{}", t.relays)?;
            writeln!(f, "{}", t.steady)?;
            writeln!(f, "{}", t.latency)?;
            writeln!(f, "{}", t.consumer)?;
        }
        if let Some(peer) = &self.peer {
            writeln!(f, "{peer}")?;
        }
        Ok(())
    }
}
