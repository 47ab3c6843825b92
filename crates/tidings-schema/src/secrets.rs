//! Likely secrets in event payloads, by field name and by value.
//!
//! Events are copied to every consumer, kept in logs and dead-letter
//! stores, and replayed for weeks: a password or a card number in one is a
//! leak with a long tail. The lint refuses:
//!
//! - field names that say secret: `password`, `passwd`, `passphrase`,
//!   `secret`, `token`, `api_key`, `access_key`, `private_key`,
//!   `card_number`, `credit_card`, `cvv`, `cvc` (compared without case,
//!   `_` or `-`, anywhere in the name: `stripeApiKey` counts);
//! - values shaped like secrets: JSON Web Tokens, PEM private keys, and
//!   card numbers (13 to 19 digits passing the Luhn check).
//!
//! A field that is deliberately there (a payment provider's opaque
//! reference called `card_token`) is exempted in its schema, with the
//! reason, by the [`NOT_A_SECRET`](crate::NOT_A_SECRET) extension:
//! `#[schemars(extend("x-tidings-not-a-secret" = "opaque provider reference"))]`.

use std::fmt;

use base64::Engine;
use serde_json::Value;

use crate::NOT_A_SECRET;

const SECRET_WORDS: &[&str] = &[
    "password",
    "passwd",
    "passphrase",
    "secret",
    "token",
    "apikey",
    "accesskey",
    "privatekey",
    "cardnumber",
    "creditcard",
    "cvv",
    "cvc",
];

/// A likely secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// Where: the field path (`payment.card_number`).
    pub path: String,
    /// What it looks like (`a field named like a password`, `a JSON Web Token`).
    pub what: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "field `{}` looks like a secret ({}); keep secrets out of events, or mark the field `{NOT_A_SECRET}` with the reason",
            self.path, self.what
        )
    }
}

/// The secret word a field name contains, if any.
pub fn secret_name(field: &str) -> Option<&'static str> {
    let folded: String = field
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_lowercase())
        .collect();
    SECRET_WORDS.iter().copied().find(|w| folded.contains(w))
}

/// What a string value looks like, if it looks like a secret.
pub fn secret_value(value: &str) -> Option<&'static str> {
    let value = value.trim();
    if value.contains("-----BEGIN") && value.contains("PRIVATE KEY-----") {
        return Some("a PEM private key");
    }
    if is_jwt(value) {
        return Some("a JSON Web Token");
    }
    if is_card_number(value) {
        return Some("a card number passing the Luhn check");
    }
    None
}

/// Three base64url segments whose header decodes to a JSON object with `alg`.
fn is_jwt(value: &str) -> bool {
    let parts: Vec<&str> = value.split('.').collect();
    if parts.len() != 3 || parts[..2].iter().any(|p| p.is_empty()) {
        return false;
    }
    let base64url = |p: &str| {
        p.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    if !parts.iter().all(|p| base64url(p)) {
        return false;
    }
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(parts[0].trim_end_matches('='))
        .ok()
        .and_then(|header| serde_json::from_slice::<Value>(&header).ok())
        .is_some_and(|header| header.get("alg").is_some())
}

/// 13 to 19 digits (spaces and dashes allowed between), of a card network's
/// range (starting 2 to 6), passing the Luhn check.
fn is_card_number(value: &str) -> bool {
    if !value
        .bytes()
        .all(|b| b.is_ascii_digit() || b == b' ' || b == b'-')
    {
        return false;
    }
    let digits: Vec<u32> = value.chars().filter_map(|c| c.to_digit(10)).collect();
    if !(13..=19).contains(&digits.len()) || !(2..=6).contains(&digits[0]) {
        return false;
    }
    let sum: u32 = digits
        .iter()
        .rev()
        .enumerate()
        .map(|(i, &d)| {
            if i % 2 == 1 {
                let d = d * 2;
                if d > 9 { d - 9 } else { d }
            } else {
                d
            }
        })
        .sum();
    sum.is_multiple_of(10)
}

/// Fields of `schema` named like secrets and not exempted.
pub fn lint_schema(schema: &Value) -> Vec<Finding> {
    let mut found = Vec::new();
    walk_schema("", schema, &mut found);
    found
}

fn walk_schema(path: &str, schema: &Value, found: &mut Vec<Finding>) {
    let Some(map) = schema.as_object() else {
        return;
    };
    if let Some(Value::Object(props)) = map.get("properties") {
        for (name, sub) in props {
            let here = join(path, name);
            if exempt(sub) {
                continue;
            }
            if let Some(word) = secret_name(name) {
                found.push(Finding {
                    path: here.clone(),
                    what: format!("a field named like a {word}"),
                });
            }
            walk_schema(&here, sub, found);
        }
    }
    if let Some(items) = map.get("items") {
        walk_schema(&format!("{path}[]"), items, found);
    }
    for key in ["anyOf", "oneOf", "allOf"] {
        if let Some(Value::Array(alts)) = map.get(key) {
            for alt in alts {
                walk_schema(path, alt, found);
            }
        }
    }
}

/// Fields of `payload` named like secrets, and string values shaped like
/// one, except where `schema` (the payload's registered schema) exempts
/// the field.
pub fn scan_payload(schema: Option<&Value>, payload: &Value) -> Vec<Finding> {
    let mut found = Vec::new();
    walk_value("", schema, payload, &mut found);
    found
}

fn walk_value(path: &str, schema: Option<&Value>, value: &Value, found: &mut Vec<Finding>) {
    if schema.is_some_and(exempt) {
        return;
    }
    match value {
        Value::Object(map) => {
            for (name, v) in map {
                let here = join(path, name);
                let sub = schema.and_then(|s| property(s, name));
                if sub.is_some_and(exempt) {
                    continue;
                }
                if let Some(word) = secret_name(name) {
                    found.push(Finding {
                        path: here.clone(),
                        what: format!("a field named like a {word}"),
                    });
                    continue;
                }
                walk_value(&here, sub, v, found);
            }
        }
        Value::Array(items) => {
            let sub = schema.and_then(|s| nonnull(s).get("items"));
            for item in items {
                walk_value(&format!("{path}[]"), sub, item, found);
            }
        }
        Value::String(s) => {
            if let Some(what) = secret_value(s) {
                found.push(Finding {
                    path: path.to_owned(),
                    what: what.to_owned(),
                });
            }
        }
        _ => {}
    }
}

/// The schema without its `null` alternative (`anyOf: [T, null]` -> `T`).
fn nonnull(schema: &Value) -> &Value {
    for key in ["anyOf", "oneOf"] {
        if let Some(Value::Array(alts)) = schema.get(key) {
            let others: Vec<&Value> = alts
                .iter()
                .filter(|a| a.get("type").and_then(Value::as_str) != Some("null"))
                .collect();
            if others.len() == 1 {
                return others[0];
            }
        }
    }
    schema
}

fn property<'a>(schema: &'a Value, name: &str) -> Option<&'a Value> {
    nonnull(schema).get("properties").and_then(|p| p.get(name))
}

fn exempt(schema: &Value) -> bool {
    schema.get(NOT_A_SECRET).is_some()
}

fn join(path: &str, name: &str) -> String {
    if path.is_empty() {
        name.to_owned()
    } else {
        format!("{path}.{name}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn names_are_compared_without_case_or_separators() {
        assert_eq!(secret_name("password"), Some("password"));
        assert_eq!(secret_name("stripeApiKey"), Some("apikey"));
        assert_eq!(secret_name("card-number"), Some("cardnumber"));
        assert_eq!(secret_name("CVV"), Some("cvv"));
        assert_eq!(secret_name("customer_id"), None);
        assert_eq!(secret_name("total_cents"), None);
    }

    #[test]
    fn values_shaped_like_secrets_are_found() {
        let header =
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(br#"{"alg":"HS256","typ":"JWT"}"#);
        let body = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(br#"{"sub":"42"}"#);
        let jwt = format!("{header}.{body}.c2lnbmF0dXJl");
        assert_eq!(secret_value(&jwt), Some("a JSON Web Token"));
        assert_eq!(
            secret_value("4111 1111 1111 1111"),
            Some("a card number passing the Luhn check")
        );
        assert_eq!(secret_value("4111-1111-1111-1112"), None, "fails Luhn");
        assert_eq!(
            secret_value("-----BEGIN RSA PRIVATE KEY-----\nMIIB...\n-----END RSA PRIVATE KEY-----"),
            Some("a PEM private key")
        );
        assert_eq!(secret_value("order-1234"), None);
        assert_eq!(secret_value("a.b.c"), None, "dots alone are not a token");
        assert_eq!(
            secret_value("0191e4f2-7f3a-7c1e-9a4b-3f1d2c3b4a59"),
            None,
            "a UUID"
        );
    }

    #[test]
    fn exempted_fields_pass() {
        let schema = json!({"type": "object", "properties": {
            "card_token": {"type": "string", NOT_A_SECRET: "the provider's opaque reference"},
            "password": {"type": "string"},
        }});
        let found = lint_schema(&schema);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].path, "password");
        let payload = json!({"card_token": "tok_123", "password": "hunter2"});
        let found = scan_payload(Some(&schema), &payload);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].path, "password");
    }
}
