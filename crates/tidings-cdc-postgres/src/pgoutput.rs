//! The two pgoutput messages the relay reads itself: a table's description
//! (`R`) and an inserted row (`I`). Transactions' beginnings and ends and
//! logical messages are decoded by the replication client.
//!
//! Layouts, from PostgreSQL's "Logical Replication Message Formats" (the
//! same in protocol versions 1 and 2 outside streamed transactions, which
//! the relay does not ask for); integers are big-endian, strings end in a
//! NUL byte:
//!
//! - `R`: relation OID (u32), namespace, name, replica identity (u8),
//!   column count (i16), then per column: flags (u8), name, type OID
//!   (u32), type modifier (i32).
//! - `I`: relation OID (u32), `N`, then the new tuple: column count (i16),
//!   then per column a kind: `n` null, `u` unchanged toasted value, `t`
//!   text or `b` binary, the last two followed by a length (i32) and bytes.

use std::fmt;

/// A pgoutput message the relay cannot read, naming where it broke.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed(pub String);

impl fmt::Display for Malformed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "malformed pgoutput message: {}", self.0)
    }
}

impl std::error::Error for Malformed {}

/// A message of the change stream, as far as the relay cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change<'a> {
    /// A table's description: where its column `seq` is.
    Relation {
        /// The table's OID, which its inserts name.
        oid: u32,
        /// Its schema.
        namespace: &'a str,
        /// Its name.
        name: &'a str,
        /// The position of its column named `seq`, if it has one.
        seq_column: Option<usize>,
    },
    /// A row inserted into the table `oid`: the text of each column.
    Insert {
        /// The table's OID.
        oid: u32,
        /// Each column's text (`None`: null, unchanged, or sent in binary).
        columns: Vec<Option<&'a [u8]>>,
    },
    /// Anything else (updates, deletes, types, origins, truncations):
    /// nothing the relay reads.
    Other(u8),
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], Malformed> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&end| end <= self.bytes.len())
            .ok_or_else(|| {
                Malformed(format!(
                    "{what}: {n} bytes wanted at {} of {}",
                    self.at,
                    self.bytes.len()
                ))
            })?;
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    fn u8(&mut self, what: &str) -> Result<u8, Malformed> {
        Ok(self.take(1, what)?[0])
    }

    fn u32(&mut self, what: &str) -> Result<u32, Malformed> {
        let b = self.take(4, what)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn i16(&mut self, what: &str) -> Result<i16, Malformed> {
        let b = self.take(2, what)?;
        Ok(i16::from_be_bytes([b[0], b[1]]))
    }

    fn string(&mut self, what: &str) -> Result<&'a str, Malformed> {
        let rest = &self.bytes[self.at..];
        let nul = rest
            .iter()
            .position(|&b| b == 0)
            .ok_or_else(|| Malformed(format!("{what}: no end of string")))?;
        let s = std::str::from_utf8(&rest[..nul]).map_err(|_| Malformed(format!("{what}: not UTF-8")))?;
        self.at += nul + 1;
        Ok(s)
    }

    fn count(&mut self, what: &str) -> Result<usize, Malformed> {
        usize::try_from(self.i16(what)?).map_err(|_| Malformed(format!("{what}: negative")))
    }
}

/// Decodes one pgoutput message (the payload of an XLogData message).
pub fn decode(bytes: &[u8]) -> Result<Change<'_>, Malformed> {
    let mut r = Reader { bytes, at: 0 };
    match r.u8("message tag")? {
        b'R' => {
            let oid = r.u32("relation oid")?;
            let namespace = r.string("relation namespace")?;
            let name = r.string("relation name")?;
            r.u8("replica identity")?;
            let n = r.count("relation column count")?;
            let mut seq_column = None;
            for i in 0..n {
                r.u8("column flags")?;
                if r.string("column name")? == "seq" {
                    seq_column = Some(i);
                }
                r.take(8, "column type")?;
            }
            Ok(Change::Relation {
                oid,
                namespace,
                name,
                seq_column,
            })
        }
        b'I' => {
            let oid = r.u32("insert relation oid")?;
            let tag = r.u8("insert tuple tag")?;
            if tag != b'N' {
                return Err(Malformed(format!("insert: tuple tag {tag:#04x}, not 'N'")));
            }
            let n = r.count("tuple column count")?;
            let mut columns = Vec::with_capacity(n);
            for _ in 0..n {
                match r.u8("tuple column kind")? {
                    b'n' | b'u' => columns.push(None),
                    kind @ (b't' | b'b') => {
                        let len = r.u32("tuple column length")?;
                        let len = usize::try_from(len)
                            .ok()
                            .filter(|&l| l <= i32::MAX as usize)
                            .ok_or_else(|| Malformed("tuple column length: negative".into()))?;
                        let value = r.take(len, "tuple column value")?;
                        columns.push((kind == b't').then_some(value));
                    }
                    kind => return Err(Malformed(format!("tuple column kind {kind:#04x}"))),
                }
            }
            Ok(Change::Insert { oid, columns })
        }
        tag => Ok(Change::Other(tag)),
    }
}

/// The outbox sequence number an insert carries in its column `at`.
pub fn seq_of(columns: &[Option<&[u8]>], at: usize) -> Result<i64, Malformed> {
    let text = columns
        .get(at)
        .copied()
        .flatten()
        .ok_or_else(|| Malformed(format!("insert: no text in column {at} (seq)")))?;
    std::str::from_utf8(text)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| {
            Malformed(format!(
                "insert: seq {:?} is not a number",
                String::from_utf8_lossy(text)
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn relation() -> Vec<u8> {
        let mut m = vec![b'R'];
        m.extend(16_385u32.to_be_bytes());
        m.extend(b"tidings_test_1\0tidings_outbox\0d");
        m.extend(2i16.to_be_bytes());
        for (name, oid) in [("id", 2950u32), ("seq", 20)] {
            m.push(0);
            m.extend(name.as_bytes());
            m.push(0);
            m.extend(oid.to_be_bytes());
            m.extend((-1i32).to_be_bytes());
        }
        m
    }

    fn insert(seq: &str) -> Vec<u8> {
        let mut m = vec![b'I'];
        m.extend(16_385u32.to_be_bytes());
        m.push(b'N');
        m.extend(3i16.to_be_bytes());
        m.push(b'n');
        m.push(b't');
        m.extend((seq.len() as u32).to_be_bytes());
        m.extend(seq.as_bytes());
        m.push(b'u');
        m
    }

    #[test]
    fn a_relation_names_its_seq_column_and_an_insert_carries_it() {
        assert_eq!(
            decode(&relation()).unwrap(),
            Change::Relation {
                oid: 16_385,
                namespace: "tidings_test_1",
                name: "tidings_outbox",
                seq_column: Some(1),
            }
        );
        let bytes = insert("9007199254740993");
        let Change::Insert { oid, columns } = decode(&bytes).unwrap() else {
            panic!("an insert");
        };
        assert_eq!(oid, 16_385);
        assert_eq!(columns.len(), 3);
        assert_eq!(seq_of(&columns, 1).unwrap(), 9_007_199_254_740_993);
        assert!(seq_of(&columns, 0).unwrap_err().0.contains("no text in column 0"));
    }

    #[test]
    fn every_truncation_of_a_message_is_an_error_naming_the_field() {
        for message in [relation(), insert("42")] {
            for end in 0..message.len() {
                let e = decode(&message[..end]).unwrap_err();
                assert!(e.to_string().starts_with("malformed pgoutput message: "), "{e}");
            }
        }
        let mut bad = insert("4x2");
        let Change::Insert { columns, .. } = decode(&bad).unwrap() else {
            panic!("an insert");
        };
        assert!(
            seq_of(&columns, 1)
                .unwrap_err()
                .0
                .contains("\"4x2\" is not a number")
        );
        let last = bad.len() - 1;
        bad[last] = b'z';
        assert_eq!(decode(&bad).unwrap_err().0, "tuple column kind 0x7a");
    }

    #[test]
    fn updates_deletes_and_the_rest_are_passed_over() {
        for tag in [b'U', b'D', b'T', b'Y', b'O'] {
            assert_eq!(decode(&[tag, 1, 2, 3]).unwrap(), Change::Other(tag));
        }
    }
}
