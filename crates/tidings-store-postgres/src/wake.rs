//! Wake-ups: in this process through memory, across processes through
//! `LISTEN`/`NOTIFY`.
//!
//! `NOTIFY` is never sent from inside the producer's transaction: PostgreSQL
//! takes a cluster-wide lock from a transaction's `NOTIFY` until its commit,
//! which serializes every producer's commit (measured at 0.30x of the
//! commit rate). Instead, `wake()` after commit raises a flag and a
//! background task sends one `NOTIFY` per burst of wake-ups.

use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use sqlx::PgPool;
use sqlx::postgres::PgListener;
use tidings_sql::{LocalWakeups, Wakeups};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::{CancellationToken, DropGuard};

const CHANNEL: &str = "tidings_wake";

/// The least time between two `NOTIFY`s. Each commits a transaction that
/// takes PostgreSQL's notification lock; sent after every burst of commits
/// they cost producers about 7% of their commit rate at 16 connections
/// (`tidings bench producer`). Spaced out, at most 500 a second, they cost
/// about 2%, and a relay in another process learns of new rows at most
/// this much later.
const NOTIFY_SPACING: Duration = Duration::from_millis(2);

#[derive(Debug, Default)]
struct Flags {
    outbox: AtomicBool,
    log: AtomicBool,
}

/// PostgreSQL's wake-ups: local signals and the cross-process bridge.
pub struct PgWakeups {
    pool: PgPool,
    cross_process: bool,
    /// This process's relays and log readers.
    local: LocalWakeups,
    flags: Arc<Flags>,
    sender: OnceLock<mpsc::Sender<()>>,
    listener: OnceLock<()>,
    /// Stops the background tasks when the store is dropped.
    stop: CancellationToken,
    _guard: DropGuard,
}

impl std::fmt::Debug for PgWakeups {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgWakeups")
            .field("cross_process", &self.cross_process)
            .finish_non_exhaustive()
    }
}

impl PgWakeups {
    pub(crate) fn new(pool: PgPool, cross_process: bool) -> Self {
        let stop = CancellationToken::new();
        PgWakeups {
            pool,
            cross_process,
            local: LocalWakeups::default(),
            flags: Arc::default(),
            sender: OnceLock::new(),
            listener: OnceLock::new(),
            _guard: stop.clone().drop_guard(),
            stop,
        }
    }

    fn kick(&self) {
        let sender = self.sender.get_or_init(|| {
            // Capacity 1: while a NOTIFY is pending, more wake-ups coalesce into it.
            let (tx, mut rx) = mpsc::channel::<()>(1);
            let pool = self.pool.clone();
            let flags = self.flags.clone();
            let stop = self.stop.clone();
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        _ = stop.cancelled() => break,
                        msg = rx.recv() => if msg.is_none() { break },
                    }
                    for (flag, payload) in [(&flags.outbox, "outbox"), (&flags.log, "log")] {
                        if flag.swap(false, Ordering::AcqRel) {
                            let sent = sqlx::query("SELECT pg_notify($1, $2)")
                                .bind(CHANNEL)
                                .bind(payload)
                                .execute(&pool)
                                .await;
                            if let Err(e) = sent {
                                // Readers poll: a lost wake-up only adds latency.
                                tracing::debug!(error = %e, "sending a wake-up failed");
                            }
                        }
                    }
                    // Wake-ups in the meantime coalesce into the next NOTIFY.
                    tokio::time::sleep(NOTIFY_SPACING).await;
                }
            });
            tx
        });
        let _ = sender.try_send(());
    }

    fn listen(&self) {
        if !self.cross_process {
            return;
        }
        self.listener.get_or_init(|| {
            let pool = self.pool.clone();
            let local = self.local.clone();
            let stop = self.stop.clone();
            tokio::spawn(async move {
                let mut backoff = 0u32;
                'connect: loop {
                    let listener = async {
                        let mut l = PgListener::connect_with(&pool).await?;
                        l.listen(CHANNEL).await?;
                        Ok::<_, sqlx::Error>(l)
                    };
                    let mut listener = tokio::select! {
                        _ = stop.cancelled() => return,
                        l = listener => match l {
                            Ok(l) => l,
                            Err(e) => {
                                backoff += 1;
                                tracing::debug!(error = %e, "LISTEN failed; polling until it works");
                                tokio::time::sleep(tidings_core::Backoff::default().delay(backoff)).await;
                                continue 'connect;
                            }
                        }
                    };
                    backoff = 0;
                    // Anything sent while we were not listening: assume there is work.
                    local.outbox_committed();
                    local.log_appended();
                    loop {
                        let received = tokio::select! {
                            _ = stop.cancelled() => return,
                            r = listener.try_recv() => r,
                        };
                        match received {
                            Ok(Some(n)) => match n.payload() {
                                "outbox" => local.outbox_committed(),
                                _ => local.log_appended(),
                            },
                            // The connection dropped; reconnect and assume work was missed.
                            Ok(None) | Err(_) => continue 'connect,
                        }
                    }
                }
            });
        });
    }
}

#[async_trait]
impl Wakeups for PgWakeups {
    fn outbox_committed(&self) {
        self.local.outbox_committed();
        if self.cross_process {
            self.flags.outbox.store(true, Ordering::Release);
            self.kick();
        }
    }

    fn log_appended(&self) {
        self.local.log_appended();
        if self.cross_process {
            self.flags.log.store(true, Ordering::Release);
            self.kick();
        }
    }

    async fn wait_outbox(&self, timeout: Duration) {
        self.listen();
        self.local.wait_outbox(timeout).await;
    }

    fn log_signal(&self) -> watch::Receiver<u64> {
        self.listen();
        self.local.log_signal()
    }
}
