//! Reading configuration values into the ranges their setters keep them
//! in, so that a configuration read from a file means what the same
//! values given to the builder mean (`lanes = 0` is one lane, as
//! `lanes(0)` is).
//!
//! ```
//! #[derive(serde::Deserialize)]
//! struct Options {
//!     #[serde(deserialize_with = "tidings_core::clamp::at_least_one")]
//!     lanes: usize,
//! }
//! let o: Options = serde_json::from_str(r#"{"lanes": 0}"#).unwrap();
//! assert_eq!(o.lanes, 1);
//! ```

use std::time::Duration;

use serde::{Deserialize, Deserializer};

/// A count of at least 1.
pub fn at_least_one<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + PartialOrd + From<u8>,
{
    let n = T::deserialize(d)?;
    let one = T::from(1);
    Ok(if n < one { one } else { n })
}

/// An optional count of at least 1.
pub fn optional_at_least_one<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + PartialOrd + From<u8>,
{
    at_least_one(d).map(Some)
}

/// A duration ([`crate::duration`]) of at least 300 ms: partition leases.
pub fn lease_ttl<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    Ok(crate::duration::deserialize(d)?.max(Duration::from_millis(300)))
}

/// A duration ([`crate::duration`]) of at least 10 ms: polling intervals.
pub fn poll_interval<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    Ok(crate::duration::deserialize(d)?.max(Duration::from_millis(10)))
}

/// An optional duration ([`crate::duration`]).
pub fn optional_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    Ok(Some(crate::duration::deserialize(d)?).filter(|d| !d.is_zero()))
}
