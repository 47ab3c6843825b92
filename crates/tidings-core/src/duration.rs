//! Durations as people write them in configuration files: `500ms`, `30s`,
//! `5m`, `2h`, `7d`, or `0` for none.
//!
//! The configuration structs of the Tidings crates read their durations
//! this way when deserialized (`#[serde(with = "tidings_core::duration")]`).
//!
//! ```
//! use std::time::Duration;
//! use tidings_core::duration::{Humane, parse};
//!
//! assert_eq!(parse("30s"), Ok(Duration::from_secs(30)));
//! assert_eq!(Humane(Duration::from_millis(1500)).to_string(), "1500ms");
//! assert!(parse("5 minutes").unwrap_err().contains("write 500ms, 30s, 5m, 2h or 7d"));
//! ```

use std::fmt;
use std::time::Duration;

use serde::de::{self, Deserialize, Deserializer};
use serde::ser::Serializer;

const UNITS: [(&str, u64); 5] = [
    ("d", 86_400_000),
    ("h", 3_600_000),
    ("m", 60_000),
    ("s", 1000),
    ("ms", 1),
];

/// Parses `500ms`, `30s`, `5m`, `2h`, `7d` or `0`.
pub fn parse(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    if t == "0" {
        return Ok(Duration::ZERO);
    }
    let refused = || format!("{text:?} is not a duration (write 500ms, 30s, 5m, 2h or 7d)");
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let n: u64 = digits.parse().map_err(|_| refused())?;
    let (_, ms) = UNITS.iter().find(|(u, _)| *u == unit).ok_or_else(refused)?;
    Ok(Duration::from_millis(n.saturating_mul(*ms)))
}

/// A duration printed the way [`parse`] reads it, in its largest whole
/// unit (`90s` prints `90s`, `120s` prints `2m`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Humane(pub Duration);

impl fmt::Display for Humane {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.0.as_millis();
        let (unit, per) = UNITS
            .iter()
            .find(|(_, per)| ms >= u128::from(*per) && ms.is_multiple_of(u128::from(*per)))
            .map_or(("ms", 1), |(u, per)| (*u, u128::from(*per)));
        write!(f, "{}{unit}", ms / per)
    }
}

/// Reads a duration written as [`parse`] reads it.
pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let text = String::deserialize(d)?;
    parse(&text).map_err(de::Error::custom)
}

/// Writes a duration as [`Humane`] prints it.
pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(&Humane(*d))
}
