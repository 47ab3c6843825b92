//! pgoutput messages as the CDC relay reads them from the change stream:
//! any bytes decode or are refused naming where they broke, never a panic;
//! a decoded insert's columns read as a seq or are refused the same way.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tidings_cdc_postgres::pgoutput::{Change, decode, seq_of};

fuzz_target!(|bytes: &[u8]| {
    match decode(bytes) {
        Ok(Change::Insert { columns, .. }) => {
            for at in 0..=columns.len() {
                if let Err(e) = seq_of(&columns, at) {
                    assert!(!e.0.is_empty());
                }
            }
        }
        Ok(_) => {}
        Err(e) => assert!(e.to_string().starts_with("malformed pgoutput message: ")),
    }
});
