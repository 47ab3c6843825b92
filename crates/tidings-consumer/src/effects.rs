//! Stable idempotency keys for outbound side effects.

use std::fmt;

use uuid::Uuid;

/// The namespace of Tidings' idempotency keys (a fixed, random UUID).
const NAMESPACE: Uuid = Uuid::from_u128(0x6f2b_8e4a_51c3_4d7e_9a10_2c5b_7f3e_8d41);

/// The key a provider receives with a side effect: the same for every
/// attempt, every redelivery and every replay of the same (consumer,
/// message, effect), different for anything else.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    /// Derives the key: a UUIDv5 of (consumer, message id, effect).
    ///
    /// ```
    /// use tidings_consumer::IdempotencyKey;
    /// let id = uuid::Uuid::now_v7();
    /// assert_eq!(IdempotencyKey::derive("email", id, "confirmation"), IdempotencyKey::derive("email", id, "confirmation"));
    /// assert_ne!(IdempotencyKey::derive("email", id, "confirmation"), IdempotencyKey::derive("email", id, "receipt"));
    /// ```
    pub fn derive(consumer: &str, message_id: Uuid, effect: &str) -> Self {
        // Length-prefixed parts, so ("a:b", "c") and ("a", "b:c") differ.
        let mut name = Vec::with_capacity(consumer.len() + effect.len() + 40);
        for part in [consumer.as_bytes(), message_id.as_bytes(), effect.as_bytes()] {
            name.extend_from_slice(&(part.len() as u32).to_be_bytes());
            name.extend_from_slice(part);
        }
        IdempotencyKey(Uuid::new_v5(&NAMESPACE, &name).to_string())
    }

    /// The key as a string, for the provider's `Idempotency-Key` header.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
