//! Message traces: a message's whole story, read from every table that
//! records part of it, a few statements per call whatever the number of
//! messages (each reads the records of a list of ids).

use std::collections::HashMap;

use tidings_core::inspect::{DeadLetterRef, EffectRecord, Handled, MessageTrace, OutboxEntry, ParkedRef};
use tidings_core::{Failure, Result};
use uuid::Uuid;

use crate::db::Stmt;
use crate::store::from_micros;
use crate::{Dialect, SqlStore};

/// A trace before anything is known of the message.
fn blank(message_id: Uuid) -> MessageTrace {
    MessageTrace {
        message_id,
        message_type: None,
        topic: None,
        aggregate_key: None,
        outbox: None,
        handled: Vec::new(),
        effects: Vec::new(),
        dead_letters: Vec::new(),
        parked: Vec::new(),
        held_by_relay: false,
    }
}

/// Whether the database knows anything of the message.
fn known(t: &MessageTrace) -> bool {
    t.outbox.is_some()
        || !t.handled.is_empty()
        || !t.effects.is_empty()
        || !t.dead_letters.is_empty()
        || !t.parked.is_empty()
}

/// A dead letter's state: the later of its two decisions, if any.
fn letter_state(redriven: Option<i64>, skipped: Option<i64>) -> &'static str {
    tidings_core::dead_letter_state(redriven, skipped)
}

/// Fills the blanks of `slot` from `value`.
fn fill(slot: &mut Option<String>, value: Option<String>) {
    if slot.is_none() {
        *slot = value;
    }
}

impl<D: Dialect> SqlStore<D> {
    /// The messages of `key` the database knows of, oldest first, at most `limit`.
    pub(crate) async fn key_messages(&self, key: &str, limit: u32) -> Result<Vec<Uuid>> {
        let mut conn = self.conn("finding a key's messages").await?;
        let rows = Stmt::<D>::new(D::SQL.trace_key_messages, "finding a key's messages")
            .bind(key)
            .bind(i64::from(limit))
            .fetch_all(&mut conn)
            .await?;
        rows.iter().map(|r| r.get(0)).collect()
    }

    /// The traces of the messages `ids` the database knows of, in the order of `ids`.
    pub(crate) async fn traces(&self, ids: &[Uuid]) -> Result<Vec<MessageTrace>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let what = "tracing messages";
        let mut conn = self.conn(what).await?;
        let mut traces: HashMap<Uuid, MessageTrace> = ids.iter().map(|&id| (id, blank(id))).collect();
        let list = D::uuid_list(ids);

        // By seq: the latest record of a message enqueued again wins.
        let rows = Stmt::<D>::new(D::SQL.trace_outbox, what)
            .bind(list.clone())
            .fetch_all(&mut conn)
            .await?;
        for r in &rows {
            let Some(t) = traces.get_mut(&r.get::<Uuid>(0)?) else {
                continue;
            };
            t.outbox = Some(OutboxEntry {
                seq: r.get(1)?,
                key_hash: r
                    .get::<Option<i64>>(2)?
                    .and_then(|h| u32::try_from(h).ok())
                    .unwrap_or(0),
                created_at: from_micros(r.get(6)?),
                published_at: r.get::<Option<i64>>(7)?.map(from_micros),
            });
            t.topic = Some(r.get(3)?);
            t.aggregate_key = Some(r.get(4)?);
            t.message_type = Some(r.get(5)?);
            t.held_by_relay = r.get(8)?;
        }

        let rows = Stmt::<D>::new(D::SQL.trace_processed, what)
            .bind(list.clone())
            .fetch_all(&mut conn)
            .await?;
        for r in &rows {
            if let Some(t) = traces.get_mut(&r.get::<Uuid>(0)?) {
                t.handled.push(Handled {
                    consumer: r.get(1)?,
                    at: from_micros(r.get(2)?),
                });
            }
        }

        let rows = Stmt::<D>::new(D::SQL.trace_effects, what)
            .bind(list.clone())
            .fetch_all(&mut conn)
            .await?;
        for r in &rows {
            if let Some(t) = traces.get_mut(&r.get::<Uuid>(0)?) {
                t.effects.push(EffectRecord {
                    consumer: r.get(1)?,
                    effect: r.get(2)?,
                    idempotency_key: r.get(3)?,
                    at: from_micros(r.get(4)?),
                });
            }
        }

        let rows = Stmt::<D>::new(D::SQL.trace_dead_letters, what)
            .bind(list.clone())
            .fetch_all(&mut conn)
            .await?;
        for r in &rows {
            let Some(t) = traces.get_mut(&r.get::<Uuid>(0)?) else {
                continue;
            };
            let errors: String = r.get(7)?;
            let last_error = serde_json::from_str::<Vec<Failure>>(&errors)
                .ok()
                .and_then(|e| e.into_iter().last())
                .map(|f| f.error);
            t.dead_letters.push(DeadLetterRef {
                id: r.get(1)?,
                consumer: r.get(2)?,
                state: letter_state(r.get(9)?, r.get(10)?).to_owned(),
                attempts: u32::try_from(r.get::<i32>(6)?).unwrap_or(0),
                last_error,
                created_at: from_micros(r.get(8)?),
            });
            fill(&mut t.topic, Some(r.get(3)?));
            fill(&mut t.message_type, r.get(4)?);
            fill(&mut t.aggregate_key, r.get(5)?);
        }

        let rows = Stmt::<D>::new(D::SQL.trace_parked, what)
            .bind(list)
            .fetch_all(&mut conn)
            .await?;
        for r in &rows {
            let Some(t) = traces.get_mut(&r.get::<Uuid>(0)?) else {
                continue;
            };
            let (topic, key): (String, String) = (r.get(2)?, r.get(3)?);
            fill(&mut t.topic, Some(topic.clone()));
            fill(&mut t.aggregate_key, Some(key.clone()));
            t.parked.push(ParkedRef {
                consumer: r.get(1)?,
                topic,
                key,
                since: from_micros(r.get(4)?),
                held_by_message: r.get(5)?,
                held_by_dead_letter: r.get(6)?,
                released: r.get(7)?,
            });
        }

        Ok(ids
            .iter()
            .filter_map(|id| traces.remove(id))
            .filter(known)
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::letter_state;

    #[test]
    fn a_dead_letter_is_in_the_state_of_its_latest_decision() {
        assert_eq!(letter_state(None, None), "pending");
        assert_eq!(letter_state(Some(5), None), "redriven");
        assert_eq!(letter_state(None, Some(5)), "skipped");
        assert_eq!(letter_state(Some(5), Some(7)), "skipped");
        assert_eq!(letter_state(Some(7), Some(5)), "redriven");
    }
}
