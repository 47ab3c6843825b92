//! Poison isolation: a batch with records that cannot go out.
//!
//! A record whose body does not decode, or that the transport refuses
//! whatever its state ([`Publisher::refuses`]), is set aside at once, and
//! the later records of its key in the batch stay unsent behind it. When
//! the transport fails the batch as a whole with a permanent error, the
//! batch is split in halves, in order, until each failing record stands
//! alone; such a record is only taken as at fault once another record of
//! the batch went out, or when it is the only record refused (the rest of
//! the batch waited behind it, in its key), so that a transport that
//! refuses everything (a missing stream, a revoked permission) is retried,
//! never turned into a dead letter per record. A transient error ends the search: what went
//! out is marked sent, the rest goes back unsent.

use std::collections::HashSet;
use std::time::Duration;

use tidings_core::store::{DeadLetter, Failure};
use tidings_core::{
    ClaimedBatch, Error, Headers, OutgoingMessage, Publisher, RELAY_LETTERS, SetAside, Settlement,
    Undecodable, cloudevents,
};
use tracing::Instrument;

/// What the search found: the settlement, and the error that ended the
/// round, if one did.
#[derive(Debug)]
pub(crate) struct Isolated {
    pub(crate) settlement: Settlement,
    pub(crate) error: Option<Error>,
}

/// A claimed batch's records ([`ClaimedBatch`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Records<'a> {
    pub(crate) messages: &'a [OutgoingMessage],
    pub(crate) seqs: &'a [i64],
    pub(crate) undecodable: &'a [Undecodable],
}

impl<'a> Records<'a> {
    pub(crate) fn of<B: ClaimedBatch>(batch: &'a B) -> Self {
        Records {
            messages: batch.messages(),
            seqs: batch.seqs(),
            undecodable: batch.undecodable(),
        }
    }
}

/// A record of the batch, in outbox order.
enum Entry {
    Message(usize),
    Undecodable(usize),
}

/// The keys held in this batch, by topic; records with no key hold nothing.
#[derive(Default)]
struct Held(HashSet<(String, String)>);

impl Held {
    fn hold(&mut self, topic: &str, key: &str) {
        if !key.is_empty() {
            self.0.insert((topic.to_owned(), key.to_owned()));
        }
    }

    fn holds_key(&self, topic: &str, key: &str) -> bool {
        !self.0.is_empty() && self.0.contains(&(topic.to_owned(), key.to_owned()))
    }

    fn holds(&self, m: &OutgoingMessage) -> bool {
        self.holds_key(&m.topic, &m.envelope.aggregate_key)
    }
}

/// Sorts `batch` into records sent, records set aside and records left.
/// `failed` is the permanent error the whole batch just failed with, if it
/// was published whole already.
pub(crate) async fn isolate<P: Publisher>(
    publisher: &P,
    timeout: Duration,
    batch: Records<'_>,
    failed: Option<Error>,
) -> Isolated {
    let Records {
        messages,
        seqs,
        undecodable,
    } = batch;
    let mut entries: Vec<(i64, Entry)> = seqs
        .iter()
        .enumerate()
        .map(|(i, &seq)| (seq, Entry::Message(i)))
        .chain(
            undecodable
                .iter()
                .enumerate()
                .map(|(j, u)| (u.record.seq, Entry::Undecodable(j))),
        )
        .collect();
    entries.sort_unstable_by_key(|(seq, _)| *seq);

    let mut held = Held::default();
    let mut settlement = Settlement::default();
    let mut candidates = Vec::with_capacity(messages.len());
    for (_, entry) in &entries {
        match *entry {
            Entry::Undecodable(j) => {
                let u = &undecodable[j];
                let r = &u.record;
                if held.holds_key(&r.topic, &r.aggregate_key) {
                    continue;
                }
                held.hold(&r.topic, &r.aggregate_key);
                settlement.set_aside.push(undecodable_letter(u));
            }
            Entry::Message(i) => {
                let m = &messages[i];
                if held.holds(m) {
                    continue;
                }
                match publisher.refuses(m) {
                    Some(reason) => {
                        held.hold(&m.topic, &m.envelope.aggregate_key);
                        settlement.set_aside.push(refused_letter(seqs[i], m, &reason));
                    }
                    None => candidates.push(i),
                }
            }
        }
    }

    // Split in order: the left half goes first, and before each publish
    // the records of keys held meanwhile are dropped from it.
    let whole = candidates.len() == messages.len();
    let mut failed = failed.filter(|_| whole);
    let mut stack = vec![candidates];
    let mut suspects: Vec<(usize, Error)> = Vec::new();
    let mut error = None;
    while let Some(chunk) = stack.pop() {
        let chunk: Vec<usize> = chunk.into_iter().filter(|&i| !held.holds(&messages[i])).collect();
        if chunk.is_empty() {
            continue;
        }
        let result = match failed.take() {
            Some(e) => Err(e),
            None => {
                let records: Vec<OutgoingMessage> = chunk.iter().map(|&i| messages[i].clone()).collect();
                publish(publisher, timeout, &records).await
            }
        };
        match result {
            Ok(()) => settlement.sent.extend(chunk.iter().map(|&i| seqs[i])),
            Err(e) if e.class().is_retryable() => {
                error = Some(e);
                break;
            }
            Err(e) if chunk.len() == 1 => {
                let m = &messages[chunk[0]];
                held.hold(&m.topic, &m.envelope.aggregate_key);
                suspects.push((chunk[0], e));
            }
            Err(_) => {
                let (left, right) = chunk.split_at(chunk.len() / 2);
                stack.push(right.to_vec());
                stack.push(left.to_vec());
            }
        }
    }
    if error.is_none() && !suspects.is_empty() {
        // A record is at fault when another went out, or when it is the
        // only one refused: every other record of the batch waited behind
        // it, in its key (a run of one key filling the batch would
        // otherwise be tried and refused forever). Several refused and
        // none taken points at the transport.
        if settlement.sent.is_empty() && suspects.len() > 1 {
            // Nothing went out: the transport, not these records, may be at fault.
            error = suspects.into_iter().next().map(|(_, e)| e);
        } else {
            for (i, e) in suspects {
                let reason = format!("the transport refused it: {}", e.report());
                settlement
                    .set_aside
                    .push(refused_letter(seqs[i], &messages[i], &reason));
            }
        }
    }
    Isolated { settlement, error }
}

/// Publishes `records`, waiting at most `timeout` for the confirmation (a
/// transient error past it), in a `tidings.publish` span.
pub(crate) async fn publish<P: Publisher>(
    publisher: &P,
    timeout: Duration,
    records: &[OutgoingMessage],
) -> tidings_core::Result<()> {
    let publish = publisher
        .publish(records)
        .instrument(tracing::info_span!("tidings.publish", records = records.len()));
    match tokio::time::timeout(timeout, publish).await {
        Ok(result) => result,
        Err(_) => Err(Error::transport_reason(
            "relay",
            format!("no confirmation within {timeout:?}"),
            true,
        )),
    }
}

fn undecodable_letter(u: &Undecodable) -> SetAside {
    let r = &u.record;
    SetAside {
        seq: r.seq,
        letter: letter(
            r.seq,
            r.id,
            &r.topic,
            &r.message_type,
            &r.aggregate_key,
            r.body.clone(),
            &format!("its body is not an envelope: {}", u.reason),
        ),
    }
}

fn refused_letter(seq: i64, m: &OutgoingMessage, reason: &str) -> SetAside {
    let e = &m.envelope;
    SetAside {
        seq,
        letter: letter(
            seq,
            e.id,
            &m.topic,
            &e.message_type,
            &e.aggregate_key,
            cloudevents::to_json(e),
            reason,
        ),
    }
}

/// The dead letter of a record set aside.
fn letter(
    seq: i64,
    id: uuid::Uuid,
    topic: &str,
    message_type: &str,
    key: &str,
    body: Vec<u8>,
    reason: &str,
) -> DeadLetter {
    let now = chrono::Utc::now();
    let mut headers = Headers::new();
    headers.insert(
        tidings_core::set_aside::OUTBOX_SEQ_HEADER.to_owned(),
        seq.to_string(),
    );
    DeadLetter {
        id: uuid::Uuid::new_v4(),
        consumer: RELAY_LETTERS.to_owned(),
        topic: topic.to_owned(),
        message_id: Some(id),
        message_type: Some(message_type.to_owned()),
        aggregate_key: Some(key.to_owned()).filter(|k| !k.is_empty()),
        headers,
        body,
        attempts: 1,
        errors: vec![Failure {
            attempt: 1,
            at: now,
            class: "permanent".to_owned(),
            error: reason.to_owned(),
        }],
        created_at: now,
        redrives: 0,
        redriven_at: None,
        skipped_at: None,
    }
}
