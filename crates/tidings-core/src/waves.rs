//! A batch in key waves, for transports whose client may lose a message
//! and still deliver the next one.
//!
//! A client that pipelines a batch and reconnects on its own (async-nats
//! does) can lose what it had written to the broken connection and then
//! send the messages still queued on the new one: the broker stores a
//! key's later message and never its earlier one, and when the publisher
//! retries the batch the earlier one lands after it. Sending the batch in
//! waves closes that gap. Wave `n` holds the `n`-th message of each key
//! (per topic), and a wave goes out only once the broker confirmed every
//! message of the one before: no two messages of one key are ever in
//! flight together, so a lost message can only be followed by other keys.
//! A batch of distinct keys is one wave, as pipelined as before; a batch of
//! one key goes one message per round trip, as its order demands.
//! Messages without a key promise no order and all go in the first wave.

use std::collections::HashMap;

use crate::transport::OutgoingMessage;

/// `batch` in waves: the `n`-th message of each (topic, aggregate key) in
/// wave `n`, each wave in batch order.
pub fn key_waves(batch: &[OutgoingMessage]) -> Vec<Vec<&OutgoingMessage>> {
    let mut sent: HashMap<(&str, &str), usize> = HashMap::new();
    let mut waves: Vec<Vec<&OutgoingMessage>> = Vec::new();
    for m in batch {
        if m.envelope.aggregate_key.is_empty() {
            // No key, no order to keep: the first wave.
            if waves.is_empty() {
                waves.push(Vec::new());
            }
            waves[0].push(m);
            continue;
        }
        let n = sent
            .entry((m.topic.as_str(), m.envelope.aggregate_key.as_str()))
            .or_default();
        if *n == waves.len() {
            waves.push(Vec::new());
        }
        waves[*n].push(m);
        *n += 1;
    }
    waves
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Kind, Message};

    #[derive(serde::Serialize, serde::Deserialize)]
    struct Step {
        key: String,
        seq: u32,
    }

    impl Message for Step {
        const TYPE: &'static str = "Step";
        const VERSION: u32 = 1;
        const KIND: Kind = Kind::Event;
        const AGGREGATE: &'static str = "thing";
        const TOPIC: &'static str = "steps";
        fn key(&self) -> String {
            self.key.clone()
        }
    }

    fn message(topic: &str, key: &str, seq: u32) -> OutgoingMessage {
        let step = Step {
            key: key.to_owned(),
            seq,
        };
        let mut m = OutgoingMessage::new("test", &step).unwrap();
        m.topic = topic.to_owned();
        m
    }

    fn shape(waves: &[Vec<&OutgoingMessage>]) -> Vec<Vec<String>> {
        waves
            .iter()
            .map(|w| {
                w.iter()
                    .map(|m| {
                        let seq =
                            serde_json::from_slice::<serde_json::Value>(&m.envelope.payload).unwrap()["seq"]
                                .clone();
                        format!("{}/{}/{seq}", m.topic, m.envelope.aggregate_key)
                    })
                    .collect()
            })
            .collect()
    }

    #[test]
    fn each_wave_holds_one_message_of_a_key_in_order() {
        let batch = [
            message("orders", "a", 1),
            message("orders", "b", 1),
            message("orders", "a", 2),
            message("orders", "a", 3),
            message("orders", "c", 1),
            message("orders", "b", 2),
        ];
        assert_eq!(
            shape(&key_waves(&batch)),
            [
                vec!["orders/a/1", "orders/b/1", "orders/c/1"],
                vec!["orders/a/2", "orders/b/2"],
                vec!["orders/a/3"],
            ]
        );
    }

    #[test]
    fn distinct_keys_go_in_one_wave_and_one_key_goes_alone() {
        let distinct: Vec<_> = (0..5).map(|i| message("orders", &format!("k{i}"), 1)).collect();
        assert_eq!(key_waves(&distinct).len(), 1);
        let one: Vec<_> = (0..5).map(|i| message("orders", "k", i)).collect();
        let waves = key_waves(&one);
        assert_eq!(waves.len(), 5);
        assert!(waves.iter().all(|w| w.len() == 1));
        assert!(key_waves(&[]).is_empty());
    }

    #[test]
    fn messages_without_a_key_go_in_the_first_wave() {
        let batch: Vec<_> = (0..4).map(|i| message("orders", "", i)).collect();
        assert_eq!(key_waves(&batch).len(), 1);
        let mixed = [
            message("orders", "a", 1),
            message("orders", "a", 2),
            message("orders", "", 1),
        ];
        assert_eq!(
            shape(&key_waves(&mixed)),
            [vec!["orders/a/1", "orders//1"], vec!["orders/a/2"]]
        );
    }

    #[test]
    fn one_key_on_two_topics_is_two_keys() {
        let batch = [message("orders", "a", 1), message("payments", "a", 1)];
        assert_eq!(key_waves(&batch).len(), 1);
    }
}
