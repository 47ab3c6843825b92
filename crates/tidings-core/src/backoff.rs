//! Capped exponential backoff with full jitter.

use std::time::Duration;

use rand::Rng;

/// Capped exponential backoff with jitter.
///
/// The delay before retry `n` (1-based) is drawn uniformly from
/// `[base * 2^(n-1) / 2, base * 2^(n-1)]`, capped at `max`. Half of the
/// delay is kept fixed so that retries never collapse to zero, and half is
/// random so that many consumers failing together do not retry together.
///
/// ```
/// use std::time::Duration;
/// use tidings_core::Backoff;
///
/// let b = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
/// let d = b.delay(3);
/// assert!(d >= Duration::from_millis(200) && d <= Duration::from_millis(400));
/// assert!(b.delay(30) <= Duration::from_secs(5));
/// ```
///
/// Deserialized from `{ base = "100ms", max = "30s" }`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(from = "BackoffFile")]
pub struct Backoff {
    base: Duration,
    max: Duration,
}

/// A [`Backoff`] as a file writes it.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct BackoffFile {
    #[serde(with = "crate::duration")]
    base: Duration,
    #[serde(with = "crate::duration")]
    max: Duration,
}

impl From<BackoffFile> for Backoff {
    fn from(file: BackoffFile) -> Self {
        Backoff::new(file.base, file.max)
    }
}

impl Default for Backoff {
    /// 100 ms doubling up to 30 s.
    fn default() -> Self {
        Backoff::new(Duration::from_millis(100), Duration::from_secs(30))
    }
}

impl Backoff {
    /// A backoff starting at `base` and never exceeding `max`.
    pub fn new(base: Duration, max: Duration) -> Self {
        Backoff {
            base,
            max: max.max(base),
        }
    }

    /// The first delay.
    pub fn base(&self) -> Duration {
        self.base
    }

    /// The cap.
    pub fn max(&self) -> Duration {
        self.max
    }

    /// The upper bound of the delay before retry `attempt` (1-based), without jitter.
    pub fn ceiling(&self, attempt: u32) -> Duration {
        let exp = attempt.saturating_sub(1).min(31);
        self.base.saturating_mul(1u32 << exp).min(self.max)
    }

    /// The delay before retry `attempt` (1-based), with jitter.
    pub fn delay(&self, attempt: u32) -> Duration {
        let ceiling = self.ceiling(attempt);
        let half = ceiling / 2;
        let nanos = u64::try_from(half.as_nanos()).unwrap_or(u64::MAX);
        let jitter = if nanos == 0 {
            0
        } else {
            rand::rng().random_range(0..=nanos)
        };
        half + Duration::from_nanos(jitter)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_then_caps() {
        let b = Backoff::new(Duration::from_millis(10), Duration::from_millis(100));
        assert_eq!(b.ceiling(1), Duration::from_millis(10));
        assert_eq!(b.ceiling(2), Duration::from_millis(20));
        assert_eq!(b.ceiling(4), Duration::from_millis(80));
        assert_eq!(b.ceiling(5), Duration::from_millis(100));
        assert_eq!(b.ceiling(u32::MAX), Duration::from_millis(100));
        for attempt in 1..50 {
            let d = b.delay(attempt);
            assert!(
                d >= b.ceiling(attempt) / 2 && d <= b.ceiling(attempt),
                "{attempt}: {d:?}"
            );
        }
    }

    #[test]
    fn jitter_spreads_delays() {
        let b = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        let distinct: std::collections::HashSet<_> = (0..20).map(|_| b.delay(3)).collect();
        assert!(distinct.len() > 1);
    }
}
