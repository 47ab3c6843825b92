//! The names brokers with a narrow alphabet (SNS, SQS, Pub/Sub) give
//! Tidings' topics and groups: parts joined by `-`, each part either the
//! name itself or, where the name holds a character the broker refuses (or
//! `-`, which separates), a cleaned copy and a hash of the name, so that no
//! two names share a resource; and a name longer than the broker takes cut,
//! ending with a hash of the whole so that two long names stay apart.
//!
//! The hashes are SHA-256's first bytes: names made by one version of
//! Tidings are made again, the same, by the next.

use sha2::{Digest, Sha256};

/// `name` as one part of a resource name that no other name shares: as it
/// is when it holds only ASCII letters, digits and `_`; else each other
/// character made `_`, then `_` and six hex digits of a hash of `name`.
pub fn part(name: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || c == '_';
    if !name.is_empty() && name.chars().all(plain) {
        return name.to_owned();
    }
    let cleaned: String = name.chars().map(|c| if plain(c) { c } else { '_' }).collect();
    format!("{cleaned}_{}", hex::encode(&Sha256::digest(name.as_bytes())[..3]))
}

/// A prefix as a broker with this alphabet takes it: ASCII letters,
/// digits, `-` and `_`, any other character `_`.
pub fn prefix(prefix: &str) -> String {
    prefix
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// `base` then `suffix`, in at most `max` characters: where longer, `base`
/// is cut and followed by `-` and eight hex digits of a hash of the whole
/// of it, then `suffix`.
pub fn fit(base: &str, suffix: &str, max: usize) -> String {
    if base.len() + suffix.len() <= max {
        return format!("{base}{suffix}");
    }
    let hash = hex::encode(&Sha256::digest(base.as_bytes())[..4]);
    let keep = max.saturating_sub(suffix.len() + hash.len() + 1);
    format!("{}-{hash}{suffix}", &base[..keep.min(base.len())])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_never_share_a_name() {
        assert_eq!(part("orders_v1"), "orders_v1");
        assert!(part("orders.v1").starts_with("orders_v1_"));
        assert_ne!(part("orders.v1"), part("orders_v1"));
        assert!(!part("a-b").contains('-'));
        assert_ne!(part(""), "");
    }

    #[test]
    fn long_names_are_cut_and_stay_apart() {
        assert_eq!(fit("short", ".fifo", 80), "short.fifo");
        let long = "g".repeat(100);
        let a = fit(&long, ".fifo", 80);
        let b = fit(&format!("{long}x"), ".fifo", 80);
        assert_eq!(a.len(), 80);
        assert!(a.ends_with(".fifo"));
        assert_ne!(a, b);
    }
}
