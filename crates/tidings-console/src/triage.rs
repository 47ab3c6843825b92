//! Sorting dead letters: why each was dead-lettered, with what varies from
//! one message to the next taken out, so that the dead letters of one bug
//! share one [`Cause`]; which letters a selection picks ([`Selection`]);
//! and the letters grouped by cause ([`CauseGroup`]). `tidings dlq` and the
//! console's dead-letter page and API sort them the same way.
//!
//! `warehouse rejected sku POISON-14 for order 0193c1a2-8f3e-7cc1-9a6b-2f1d3e4c5b6a`
//! has the shape `warehouse rejected sku POISON-<n> for order <id>`
//! ([`error_shape`]).

use std::collections::BTreeMap;
use std::fmt;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tidings_core::{DeadLetter, DeadLetterFilter, FailureStore};
use uuid::Uuid;

/// What dead letters of one bug have in common: the consumer, the message
/// type, and the class and shape ([`error_shape`]) of the last error.
#[derive(
    Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, schemars::JsonSchema,
)]
pub struct Cause {
    /// The consumer that gave up.
    pub consumer: String,
    /// The message's type, if it could be decoded.
    pub message_type: Option<String>,
    /// `transient` or `permanent`: the last error's class.
    pub class: String,
    /// The last error with its varying parts replaced.
    pub shape: String,
}

impl Cause {
    /// The cause of `letter`.
    pub fn of(letter: &DeadLetter) -> Cause {
        let last = letter.errors.last();
        Cause {
            consumer: letter.consumer.clone(),
            message_type: letter.message_type.clone(),
            class: last.map_or_else(String::new, |f| f.class.clone()),
            // Likely secrets masked first: the shape is shown, and its
            // fingerprint must not be a short hash of a password.
            shape: last.map_or_else(String::new, |f| {
                error_shape(&crate::letter::mask_words(&f.error).0)
            }),
        }
    }

    /// A short stable name for the cause (12 hex digits), the same from one
    /// run, process or machine to the next.
    pub fn fingerprint(&self) -> String {
        // FNV-1a over the parts, each ended by a 0 byte: stable by definition.
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        let parts = [
            self.consumer.as_str(),
            self.message_type.as_deref().unwrap_or(""),
            self.class.as_str(),
            self.shape.as_str(),
        ];
        for byte in parts.iter().flat_map(|p| p.bytes().chain([0])) {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
        format!("{:012x}", hash >> 16)
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.class, self.shape)
    }
}

/// `error` with what usually varies between messages replaced: UUIDs by
/// `<id>`, quoted text by `<s>` (quotes kept), runs of digits by `<n>`.
pub fn error_shape(error: &str) -> String {
    let chars: Vec<char> = error.chars().collect();
    let mut shape = String::with_capacity(error.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if is_uuid_at(&chars, i) {
            shape.push_str("<id>");
            i += 36;
        } else if c == '"' || c == '\'' {
            match chars[i + 1..].iter().position(|&q| q == c) {
                Some(len) => {
                    shape.push(c);
                    shape.push_str("<s>");
                    shape.push(c);
                    i += len + 2;
                }
                None => {
                    shape.push(c);
                    i += 1;
                }
            }
        } else if c.is_ascii_digit() {
            shape.push_str("<n>");
            while i < chars.len() && chars[i].is_ascii_digit() {
                i += 1;
            }
        } else {
            shape.push(c);
            i += 1;
        }
    }
    shape
}

/// A UUID (8-4-4-4-12 hex digits) starts at `i`, not inside a longer word.
fn is_uuid_at(chars: &[char], i: usize) -> bool {
    const DASHES: [usize; 4] = [8, 13, 18, 23];
    let Some(window) = chars.get(i..i + 36) else {
        return false;
    };
    let fits = window.iter().enumerate().all(|(k, c)| {
        if DASHES.contains(&k) {
            *c == '-'
        } else {
            c.is_ascii_hexdigit()
        }
    });
    let alone = |c: Option<&char>| c.is_none_or(|c| !c.is_ascii_alphanumeric());
    fits && alone(i.checked_sub(1).and_then(|p| chars.get(p))) && alone(chars.get(i + 36))
}

/// Which dead letters: every criterion given must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default)]
pub struct Selection {
    /// Only this consumer's.
    #[serde(deserialize_with = "blank_is_none")]
    pub consumer: Option<String>,
    /// Only this message type.
    #[serde(rename = "type", deserialize_with = "blank_is_none")]
    pub message_type: Option<String>,
    /// Only those whose last error contains this text.
    #[serde(deserialize_with = "blank_is_none")]
    pub error: Option<String>,
    /// Only those of this cause (its fingerprint).
    #[serde(deserialize_with = "blank_is_none")]
    pub cause: Option<String>,
    /// Only those dead-lettered at or after this time (RFC 3339).
    #[serde(deserialize_with = "blank_is_none")]
    pub since: Option<DateTime<Utc>>,
    /// Only those dead-lettered before this time (RFC 3339).
    #[serde(deserialize_with = "blank_is_none")]
    pub until: Option<DateTime<Utc>>,
    /// Also those already redriven or skipped.
    #[serde(deserialize_with = "flag")]
    pub include_settled: bool,
}

/// A value given as text (a query string, a form) or as itself (JSON).
#[derive(Deserialize)]
#[serde(untagged)]
enum Given {
    Flag(bool),
    Text(String),
}

/// An optional value where a blank one (a form's empty field) is none.
pub(crate) fn blank_is_none<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: std::str::FromStr,
    T::Err: fmt::Display,
{
    match Option::<String>::deserialize(d)?.as_deref().map(str::trim) {
        None | Some("") => Ok(None),
        Some(text) => text.parse().map(Some).map_err(serde::de::Error::custom),
    }
}

/// A yes or no, as JSON's `true`, or as a form's `on`, `true` or `1`.
pub(crate) fn flag<'de, D: serde::Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    Ok(match Option::<Given>::deserialize(d)? {
        None => false,
        Some(Given::Flag(b)) => b,
        Some(Given::Text(t)) => matches!(t.trim(), "on" | "true" | "1" | "yes"),
    })
}

impl Selection {
    /// Whether no criterion is given (`include_settled` aside): it selects everything.
    pub fn is_empty(&self) -> bool {
        self.consumer.is_none()
            && self.message_type.is_none()
            && self.error.is_none()
            && self.cause.is_none()
            && self.since.is_none()
            && self.until.is_none()
    }

    /// Whether `letter` is selected.
    pub fn matches(&self, letter: &DeadLetter) -> bool {
        let last_error = letter.errors.last().map_or("", |f| f.error.as_str());
        let settled = !letter.is_pending();
        (self.include_settled || !settled)
            && self.consumer.as_deref().is_none_or(|c| letter.consumer == c)
            && self
                .message_type
                .as_deref()
                .is_none_or(|t| letter.message_type.as_deref() == Some(t))
            && self.error.as_deref().is_none_or(|e| last_error.contains(e))
            && self
                .cause
                .as_deref()
                .is_none_or(|c| Cause::of(letter).fingerprint() == c)
            && self.since.is_none_or(|t| letter.created_at >= t)
            && self.until.is_none_or(|t| letter.created_at < t)
    }

    /// The dead letters of `store` it selects, newest first.
    pub async fn letters<S: FailureStore + ?Sized>(
        &self,
        store: &S,
    ) -> tidings_core::Result<Vec<DeadLetter>> {
        self.letters_within(store, None).await
    }

    /// The dead letters it selects among the newest `limit` of its
    /// consumer and type (all of them with `None`), newest first.
    pub async fn letters_within<S: FailureStore + ?Sized>(
        &self,
        store: &S,
        limit: Option<u32>,
    ) -> tidings_core::Result<Vec<DeadLetter>> {
        let filter = DeadLetterFilter {
            consumer: self.consumer.clone(),
            message_type: self.message_type.clone(),
            limit,
            include_redriven: self.include_settled,
        };
        let mut letters = store.dead_letters(&filter).await?;
        letters.retain(|l| self.matches(l));
        Ok(letters)
    }
}

/// The dead letter `id` of `store`, pending or settled, however old.
pub async fn find<S: FailureStore + ?Sized>(store: &S, id: Uuid) -> tidings_core::Result<Option<DeadLetter>> {
    store.letter(id).await
}

/// Where a dead letter stands: waiting for a decision, or settled.
pub fn state(letter: &DeadLetter) -> &'static str {
    letter.state()
}

/// The dead letters of one cause.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct CauseGroup {
    /// The cause's fingerprint ([`Cause::fingerprint`]).
    pub fingerprint: String,
    /// The cause.
    pub cause: Cause,
    /// How many dead letters it has.
    pub count: usize,
    /// When the first of them was dead-lettered.
    pub first_at: DateTime<Utc>,
    /// When the last of them was.
    pub last_at: DateTime<Utc>,
    /// The newest dead letter's last error, as it was.
    pub example: String,
    /// Their ids, newest first.
    pub ids: Vec<Uuid>,
}

/// `letters` grouped by cause, the largest group first (then the most recent).
pub fn by_cause(letters: &[DeadLetter]) -> Vec<CauseGroup> {
    let mut causes: BTreeMap<Cause, Vec<&DeadLetter>> = BTreeMap::new();
    for letter in letters {
        causes.entry(Cause::of(letter)).or_default().push(letter);
    }
    let mut groups: Vec<CauseGroup> = causes
        .into_iter()
        .map(|(cause, mut letters)| {
            letters.sort_by_key(|l| std::cmp::Reverse(l.created_at));
            CauseGroup {
                fingerprint: cause.fingerprint(),
                count: letters.len(),
                first_at: letters.last().map(|l| l.created_at).unwrap_or_default(),
                last_at: letters.first().map(|l| l.created_at).unwrap_or_default(),
                example: letters
                    .first()
                    .and_then(|l| l.errors.last())
                    .map_or_else(String::new, |f| f.error.clone()),
                ids: letters.iter().map(|l| l.id).collect(),
                cause,
            }
        })
        .collect();
    groups.sort_by(|a, b| b.count.cmp(&a.count).then(b.last_at.cmp(&a.last_at)));
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shapes_of_the_module_documentation() {
        assert_eq!(
            error_shape("warehouse rejected sku POISON-14 for order 0193c1a2-8f3e-7cc1-9a6b-2f1d3e4c5b6a"),
            "warehouse rejected sku POISON-<n> for order <id>"
        );
        assert_eq!(
            error_shape(r#"no such customer "ada""#),
            r#"no such customer "<s>""#
        );
    }

    #[test]
    fn shapes_keep_the_words_and_drop_the_values() {
        assert_eq!(error_shape("timeout after 30s"), "timeout after <n>s");
        assert_eq!(error_shape("a 'b' \"c\" d"), "a '<s>' \"<s>\" d");
        assert_eq!(error_shape("unclosed \"quote"), "unclosed \"quote");
        assert_eq!(
            error_shape("id 0193C1A2-8F3E-7CC1-9A6B-2F1D3E4C5B6A, then 7"),
            "id <id>, then <n>"
        );
        assert_eq!(error_shape("héllo 42 wörld"), "héllo <n> wörld");
    }

    #[test]
    fn one_bug_is_one_fingerprint() {
        let cause = |error: &str| Cause {
            consumer: "inventory".into(),
            message_type: Some("OrderPlaced".into()),
            class: "transient".into(),
            shape: error_shape(error),
        };
        let a = cause("warehouse rejected sku POISON-14");
        let b = cause("warehouse rejected sku POISON-75");
        let c = cause("warehouse unreachable");
        assert_eq!(a.fingerprint(), b.fingerprint());
        assert_ne!(a.fingerprint(), c.fingerprint());
        assert_eq!(a.fingerprint().len(), 12);
    }
}
