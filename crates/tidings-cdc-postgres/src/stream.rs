//! One session streaming the slot: the outbox records each transaction
//! committed, in commit order, and the position to confirm once they are
//! sent.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use futures::FutureExt;
use pgwire_replication::{
    Lsn, PgWireError, ReplicationClient, ReplicationConfig, ReplicationEvent, TlsConfig,
};
use tidings_core::{Error, Result};

use crate::pgoutput::{self, Change};

/// Transactions received and not yet sent that the relay holds at most.
const MAX_READY: usize = 20_000;

/// The label of the stream's errors.
pub(crate) const SOURCE: &str = "pg-cdc";

/// What one committed transaction put in the outbox (nothing: a position
/// the server reported, past which nothing of the outbox waits).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Committed {
    /// The records' seqs, in the order they were inserted.
    pub(crate) seqs: Vec<i64>,
    /// The transaction's id (32 bits, as the stream gives it; 0 for a
    /// position with nothing to send).
    pub(crate) xid: u32,
    /// Where the server resumes a stream started past this transaction.
    pub(crate) end: Lsn,
}

/// A stream of the slot.
pub(crate) struct Stream {
    client: ReplicationClient,
    /// The outbox table's OID, with the position of its `seq` column, and
    /// the OIDs of other tables, whose inserts are passed over.
    seq_columns: HashMap<u32, Option<usize>>,
    /// The schema of the outbox this relay sends.
    schema: String,
    /// The transaction being received: its id and seqs.
    open: Option<(u32, Vec<i64>)>,
    /// Transactions received and not yet taken, oldest first.
    pub(crate) ready: VecDeque<Committed>,
    confirmed: Lsn,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream")
            .field("ready", &self.ready.len())
            .field("confirmed", &self.confirmed)
            .finish_non_exhaustive()
    }
}

/// The replication session's settings from the store's URL
/// (`postgres://user:password@host:port/database?sslmode=...`).
pub(crate) fn config(url: &str, slot: &str, status_interval: Duration) -> Result<ReplicationConfig> {
    let refuse = |reason: String| Error::Config {
        key: "database".into(),
        reason,
    };
    let parsed = url::Url::parse(url).map_err(|e| refuse(format!("not a PostgreSQL URL ({e})")))?;
    let decode = |s: &str| {
        url::form_urlencoded::parse(format!("x={s}").as_bytes())
            .next()
            .map(|(_, v)| v.into_owned())
            .unwrap_or_default()
    };
    let user = match parsed.username() {
        "" => "postgres".to_owned(),
        u => decode(u),
    };
    let password = parsed.password().map(decode).unwrap_or_default();
    let database = parsed.path().trim_start_matches('/');
    let database = if database.is_empty() {
        user.clone()
    } else {
        decode(database)
    };
    let host = match parsed.host_str() {
        Some(h) if !h.is_empty() => h.trim_matches(['[', ']']).to_owned(),
        _ => "localhost".to_owned(),
    };
    let mut tls = TlsConfig::disabled();
    for (key, value) in parsed.query_pairs() {
        if key == "sslmode" {
            tls = match value.as_ref() {
                "disable" | "allow" | "prefer" => TlsConfig::disabled(),
                "require" => TlsConfig::require(),
                "verify-ca" => TlsConfig::verify_ca(None),
                "verify-full" => TlsConfig::verify_full(None),
                other => return Err(refuse(format!("sslmode={other} is not one PostgreSQL knows"))),
            };
        }
    }
    Ok(ReplicationConfig::new(host, user, password, database, slot, slot)
        .with_port(parsed.port().unwrap_or(5432))
        .with_tls(tls)
        .with_status_interval(status_interval)
        .with_wakeup_interval(status_interval)
        .with_application_name(format!("tidings relay ({slot})")))
}

fn stream_error(what: &str, e: PgWireError) -> Error {
    let retryable = !matches!(e, PgWireError::Auth(_) | PgWireError::Tls(_));
    Error::transport(SOURCE, what.to_owned(), e, retryable)
}

impl Stream {
    /// Starts streaming the slot from the position it confirmed last.
    pub(crate) async fn start(config: ReplicationConfig, schema: String) -> Result<Stream> {
        let mut client = ReplicationClient::connect(config)
            .await
            .map_err(|e| stream_error("starting the change stream", e))?;
        // Whether the server took the slot, or why not (the slot in use by
        // another session, missing, a login refused).
        client
            .wait_started()
            .await
            .map_err(|e| stream_error("starting the change stream", e))?;
        let stream = Stream {
            client,
            seq_columns: HashMap::new(),
            schema,
            open: None,
            ready: VecDeque::new(),
            confirmed: Lsn(0),
        };
        Ok(stream)
    }

    /// Takes what has arrived, without waiting, up to [`MAX_READY`]
    /// transactions held: past that the server waits (the client stops
    /// reading its socket) until the relay has taken some.
    pub(crate) fn pull(&mut self) -> Result<()> {
        while self.ready.len() < MAX_READY {
            let Some(next) = self.client.recv().now_or_never() else {
                break;
            };
            self.received(next)?;
        }
        Ok(())
    }

    /// Waits up to `timeout` for something to arrive, then takes what has.
    pub(crate) async fn wait(&mut self, timeout: Duration) -> Result<()> {
        if self.ready.len() >= MAX_READY {
            return Ok(());
        }
        if let Ok(next) = tokio::time::timeout(timeout, self.client.recv()).await {
            self.received(next)?;
        }
        self.pull()
    }

    fn received(&mut self, next: std::result::Result<Option<ReplicationEvent>, PgWireError>) -> Result<()> {
        match next {
            Ok(Some(event)) => self.handle(event),
            Ok(None) => Err(Error::transport_reason(
                SOURCE,
                "the server ended the change stream",
                true,
            )),
            Err(e) => Err(stream_error("reading the change stream", e)),
        }
    }

    fn handle(&mut self, event: ReplicationEvent) -> Result<()> {
        match event {
            ReplicationEvent::Begin { xid, .. } => self.open = Some((xid, Vec::new())),
            ReplicationEvent::XLogData { data, .. } => self.change(&data)?,
            ReplicationEvent::Commit { end_lsn, .. } => {
                let (xid, seqs) = self.open.take().unwrap_or_default();
                self.push(Committed {
                    seqs,
                    xid,
                    end: end_lsn,
                });
            }
            // Heartbeats outside a transaction, and the server's position
            // when it has nothing to send: nothing of the outbox before it.
            ReplicationEvent::Message {
                transactional: false,
                lsn,
                ..
            } if self.open.is_none() => self.push(Committed {
                seqs: Vec::new(),
                xid: 0,
                end: lsn,
            }),
            ReplicationEvent::KeepAlive { wal_end, .. } if self.open.is_none() => self.push(Committed {
                seqs: Vec::new(),
                xid: 0,
                end: wal_end,
            }),
            _ => {}
        }
        Ok(())
    }

    /// Queues a transaction; positions with nothing to send merge into one.
    fn push(&mut self, committed: Committed) {
        if committed.seqs.is_empty()
            && let Some(last) = self.ready.back_mut()
            && last.seqs.is_empty()
        {
            last.end = last.end.max(committed.end);
            return;
        }
        self.ready.push_back(committed);
    }

    fn change(&mut self, data: &[u8]) -> Result<()> {
        let malformed =
            |e: pgoutput::Malformed| Error::transport(SOURCE, "decoding the change stream", e, true);
        match pgoutput::decode(data).map_err(malformed)? {
            Change::Relation {
                oid,
                name,
                seq_column,
                namespace,
            } => {
                // Only this outbox: a publication once set to another
                // schema's may still describe it in older log.
                if name != "tidings_outbox" || namespace != self.schema {
                    self.seq_columns.insert(oid, None);
                    return Ok(());
                }
                let Some(at) = seq_column else {
                    return Err(Error::transport_reason(
                        SOURCE,
                        format!("{namespace}.{name} has no column seq: not a Tidings outbox"),
                        false,
                    ));
                };
                self.seq_columns.insert(oid, Some(at));
            }
            Change::Insert { oid, columns } => {
                let at = *self.seq_columns.get(&oid).ok_or_else(|| {
                    Error::transport_reason(
                        SOURCE,
                        format!("an insert into relation {oid}, never described"),
                        true,
                    )
                })?;
                let Some(at) = at else {
                    return Ok(());
                };
                let seq = pgoutput::seq_of(&columns, at).map_err(malformed)?;
                self.open.get_or_insert_with(Default::default).1.push(seq);
            }
            Change::Other(_) => {}
        }
        Ok(())
    }

    /// Tells the server everything up to `lsn` is sent: it may free the
    /// log before it.
    pub(crate) fn confirm(&mut self, lsn: Lsn) {
        if lsn > self.confirmed {
            self.confirmed = lsn;
            self.client.update_applied_lsn(lsn);
        }
    }

    /// Ends the session, waiting for the server to let the slot go.
    pub(crate) async fn close(mut self) {
        if let Err(e) = self.client.shutdown().await {
            tracing::debug!(error = %e, "ending the change stream");
        }
    }

    /// The position confirmed last by this session.
    pub(crate) fn confirmed(&self) -> Lsn {
        self.confirmed
    }
}
