//! Why a message was dead-lettered, with what varies from one message to the
//! next taken out, so that the dead letters of one bug share one [`Cause`]:
//! `tidings dlq` groups and selects dead letters by it.
//!
//! `warehouse rejected sku POISON-14 for order 0193c1a2-8f3e-7cc1-9a6b-2f1d3e4c5b6a`
//! has the shape `warehouse rejected sku POISON-<n> for order <id>`
//! ([`error_shape`]).

use std::fmt;

use serde::Serialize;

use tidings_core::DeadLetter;

/// What dead letters of one bug have in common: the consumer, the message
/// type, and the class and shape ([`error_shape`]) of the last error.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub(crate) struct Cause {
    /// The consumer that gave up.
    pub(crate) consumer: String,
    /// The message's type, if it could be decoded.
    pub(crate) message_type: Option<String>,
    /// `transient` or `permanent`: the last error's class.
    pub(crate) class: String,
    /// The last error with its varying parts replaced.
    pub(crate) shape: String,
}

impl Cause {
    /// The cause of `letter`.
    pub(crate) fn of(letter: &DeadLetter) -> Cause {
        let last = letter.errors.last();
        Cause {
            consumer: letter.consumer.clone(),
            message_type: letter.message_type.clone(),
            class: last.map_or_else(String::new, |f| f.class.clone()),
            shape: last.map_or_else(String::new, |f| error_shape(&f.error)),
        }
    }

    /// A short stable name for the cause (12 hex digits), the same from one
    /// run, process or machine to the next.
    pub(crate) fn fingerprint(&self) -> String {
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
pub(crate) fn error_shape(error: &str) -> String {
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
