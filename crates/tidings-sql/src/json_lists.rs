//! List parameters as JSON arrays, for databases without arrays (SQLite,
//! MySQL): the statements read them back as rows (`json_each`,
//! `JSON_TABLE`). Ids travel as 32 hex digits, which the statements turn
//! back into the 16 bytes the id columns hold (`unhex`, `UNHEX`).

use uuid::Uuid;

/// `[1,2,3]`.
pub fn ints(values: &[i64]) -> String {
    serde_json::to_string(values).expect("integers are JSON")
}

/// `["a","b"]`.
pub fn texts(values: &[String]) -> String {
    serde_json::to_string(values).expect("strings are JSON")
}

/// `["0191c0ffee...","..."]`: each id as 32 hex digits.
pub fn hex_ids(values: &[Uuid]) -> String {
    let hex: Vec<String> = values.iter().map(|id| id.simple().to_string()).collect();
    serde_json::to_string(&hex).expect("strings are JSON")
}

#[cfg(test)]
mod tests {
    use uuid::Uuid;

    #[test]
    fn lists_are_json_arrays() {
        assert_eq!(super::ints(&[3, -1]), "[3,-1]");
        assert_eq!(super::texts(&["a\"b".to_owned()]), r#"["a\"b"]"#);
        let id = Uuid::from_u128(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef);
        assert_eq!(super::hex_ids(&[id]), r#"["0123456789abcdef0123456789abcdef"]"#);
    }
}
