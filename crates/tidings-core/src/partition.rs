//! Partitions: how aggregate keys are spread so that several members of a
//! consumer group (or several relays) share the work while each key stays
//! with one of them, in order.
//!
//! A topic has a fixed number of partitions, set on the transport (1 unless
//! configured). A key always falls in the same partition: the 32-bit FNV-1a
//! hash of its UTF-8 bytes, modulo the count. The function is fixed and
//! documented so that every transport, every process and any other language
//! agrees on it.
//!
//! ```
//! use tidings_core::Partition;
//! let p = Partition::of("order-42", 4);
//! assert_eq!(p.count, 4);
//! assert!(p.contains("order-42"));
//! assert_eq!(p, Partition::of("order-42", 4), "a key never moves");
//! ```

use std::fmt;

/// One partition of a topic: `index` out of `count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Partition {
    /// Which partition, from 0 to `count - 1`.
    pub index: u32,
    /// How many partitions the topic has (at least 1).
    pub count: u32,
}

impl Partition {
    /// The only partition of an unpartitioned topic.
    pub const WHOLE: Partition = Partition { index: 0, count: 1 };

    /// Partition `index` of `count`.
    ///
    /// # Panics
    ///
    /// If `count` is 0 or `index` is not below it.
    pub fn new(index: u32, count: u32) -> Self {
        assert!(index < count, "partition {index} of {count} does not exist");
        Partition { index, count }
    }

    /// The partition `key` falls in when there are `count` partitions.
    pub fn of(key: &str, count: u32) -> Self {
        let count = count.max(1);
        Partition {
            index: key_hash(key) % count,
            count,
        }
    }

    /// Every partition of a topic with `count` partitions.
    pub fn all(count: u32) -> impl Iterator<Item = Partition> {
        let count = count.max(1);
        (0..count).map(move |index| Partition { index, count })
    }

    /// Whether `key` falls in this partition.
    pub fn contains(&self, key: &str) -> bool {
        key_hash(key) % self.count == self.index
    }

    /// Whether this is the whole topic (a topic of one partition).
    pub fn is_whole(&self) -> bool {
        self.count == 1
    }
}

impl fmt::Display for Partition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

/// The 32-bit FNV-1a hash of `key`'s bytes: the one hash of partitioning.
pub fn key_hash(key: &str) -> u32 {
    const OFFSET: u32 = 0x811c_9dc5;
    const PRIME: u32 = 0x0100_0193;
    key.bytes()
        .fold(OFFSET, |h, b| (h ^ u32::from(b)).wrapping_mul(PRIME))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_is_fnv1a() {
        // Reference values of 32-bit FNV-1a.
        assert_eq!(key_hash(""), 0x811c_9dc5);
        assert_eq!(key_hash("a"), 0xe40c_292c);
        assert_eq!(key_hash("foobar"), 0xbf9c_f968);
    }

    #[test]
    fn keys_spread_over_every_partition() {
        let mut seen = [0u32; 8];
        for i in 0..8000 {
            seen[Partition::of(&format!("order-{i}"), 8).index as usize] += 1;
        }
        for (p, n) in seen.iter().enumerate() {
            assert!((700..1300).contains(n), "partition {p} got {n} of 8000 keys");
        }
    }

    #[test]
    fn one_partition_is_the_whole_topic() {
        assert_eq!(Partition::of("anything", 1), Partition::WHOLE);
        assert_eq!(Partition::of("anything", 0), Partition::WHOLE);
        assert_eq!(Partition::all(3).count(), 3);
    }
}
