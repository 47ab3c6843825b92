//! One dead letter as the API and the page show it: its body as JSON when
//! it is, as text when it is text, in hex otherwise, with its edits; and,
//! for the console, with what looks like a secret masked.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tidings_core::{DeadLetter, DeadLetterEdit, Failure, RawMessage, cloudevents};
use uuid::Uuid;

use crate::triage::{Cause, state};

/// A dead letter in full, as JSON.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct LetterView {
    /// The dead letter's id.
    pub id: Uuid,
    /// `pending`, `redriven` or `skipped`.
    pub state: String,
    /// Its cause's fingerprint.
    pub fingerprint: String,
    /// Its cause.
    pub cause: Cause,
    /// The consumer that gave up.
    pub consumer: String,
    /// The topic it was read from.
    pub topic: String,
    /// The message id, when the message could be decoded.
    pub message_id: Option<Uuid>,
    /// The message type, when known.
    pub message_type: Option<String>,
    /// The aggregate key, when known.
    pub aggregate_key: Option<String>,
    /// When it was first dead-lettered.
    pub created_at: DateTime<Utc>,
    /// Attempts made.
    pub attempts: u32,
    /// Every failure, oldest first.
    pub errors: Vec<Failure>,
    /// How many times it was redriven.
    pub redrives: u32,
    /// When it was last redriven.
    pub redriven_at: Option<DateTime<Utc>>,
    /// When it was skipped.
    pub skipped_at: Option<DateTime<Utc>>,
    /// Transport headers, in order.
    pub headers: Vec<(String, String)>,
    /// The body as JSON when it is, as text when it is text, else null.
    pub body: Value,
    /// The body in hex, when it is not text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body_hex: Option<String>,
    /// What was masked, by path (`data.card_number: a field named like a
    /// cardnumber`); empty when nothing was, or nothing is masked.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub masked: Vec<String>,
    /// Its edited redrives, oldest first ([`LetterView::with_edits`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub edits: Vec<EditView>,
}

/// One edited redrive of a dead letter: who, when, and the message's
/// payload before and after, each with its likely secrets masked.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct EditView {
    /// The edit's id (the `tidingsedit` header of the message sent).
    pub id: Uuid,
    /// Who edited it.
    pub by: String,
    /// When.
    pub at: DateTime<Utc>,
    /// The payload as the dead letter held it (its whole body where that
    /// is not an envelope).
    pub original: Value,
    /// The payload sent in its place.
    pub edited: Value,
    /// What was masked in either (`original: data.card_number: ...`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub masked: Vec<String>,
}

impl EditView {
    /// `edit` of `letter`, its payloads masked like a letter's body.
    pub fn masked(letter: &DeadLetter, edit: &DeadLetterEdit) -> EditView {
        // The original as received: in binary mode, its attributes are the letter's headers.
        let original = RawMessage {
            topic: letter.topic.clone(),
            key: letter.aggregate_key.clone(),
            headers: letter.headers.clone(),
            body: edit.original.clone(),
            refused: None,
        }
        .decode()
        .map_or_else(|_| edit.original.clone(), |e| e.payload);
        let edited = cloudevents::from_json(&edit.edited).map_or_else(|_| edit.edited.clone(), |e| e.payload);
        let mut masked = Vec::new();
        let original = masked_bytes(&original, "original", &mut masked);
        let edited = masked_bytes(&edited, "edited", &mut masked);
        EditView {
            id: edit.id,
            by: edit.by.clone(),
            at: edit.at,
            original,
            edited,
            masked,
        }
    }
}

/// `bytes` as JSON when they are, as text when they are text, with their
/// likely secrets masked and said in `masked` under `label`; bytes that
/// are not text are not shown.
fn masked_bytes(bytes: &[u8], label: &str, masked: &mut Vec<String>) -> Value {
    let mut found = Vec::new();
    let value = match Body::of(bytes) {
        Body::Json(mut v) => {
            mask(&mut v, &mut String::new(), &mut found);
            v
        }
        Body::Text(t) => {
            let (text, words) = mask_words(t);
            found.extend(words);
            Value::String(text)
        }
        Body::Binary => Value::String(format!(
            "({} bytes that are not text, not shown here)",
            bytes.len()
        )),
    };
    masked.extend(found.into_iter().map(|what| format!("{label}: {what}")));
    value
}

impl LetterView {
    /// `letter` as it is stored, nothing masked (an operator's own terminal).
    pub fn of(letter: &DeadLetter) -> LetterView {
        let cause = Cause::of(letter);
        let (body, body_hex) = match Body::of(&letter.body) {
            Body::Json(v) => (v, None),
            Body::Text(t) => (Value::String(t.to_owned()), None),
            Body::Binary => (Value::Null, Some(hex(&letter.body))),
        };
        LetterView {
            id: letter.id,
            state: state(letter).to_owned(),
            fingerprint: cause.fingerprint(),
            cause,
            consumer: letter.consumer.clone(),
            topic: letter.topic.clone(),
            message_id: letter.message_id,
            message_type: letter.message_type.clone(),
            aggregate_key: letter.aggregate_key.clone(),
            created_at: letter.created_at,
            attempts: letter.attempts,
            errors: letter.errors.clone(),
            redrives: letter.redrives,
            redriven_at: letter.redriven_at,
            skipped_at: letter.skipped_at,
            headers: letter
                .headers
                .iter()
                .map(|(n, v)| (n.clone(), v.clone()))
                .collect(),
            body,
            body_hex,
            masked: Vec::new(),
            edits: Vec::new(),
        }
    }

    /// The same, with `edits`, the letter's, masked ([`EditView::masked`]).
    pub fn with_edits(mut self, letter: &DeadLetter, edits: &[DeadLetterEdit]) -> LetterView {
        self.edits = edits.iter().map(|e| EditView::masked(letter, e)).collect();
        self
    }

    /// `letter` with every likely secret of its body and headers masked
    /// (what the secrets lint calls one: a field named like a password, a
    /// token, a card number; a value shaped like a JSON Web Token, a PEM
    /// private key, a card number), for a page or an API others read.
    pub fn masked(letter: &DeadLetter) -> LetterView {
        let mut view = LetterView::of(letter);
        let mut masked = Vec::new();
        mask(&mut view.body, &mut String::new(), &mut masked);
        if let Value::String(text) = &view.body {
            let (text, found) = mask_words(text);
            masked.extend(found.into_iter().map(|what| format!("body: {what}")));
            view.body = Value::String(text);
        }
        if view.body_hex.take().is_some() {
            view.body = Value::String(format!(
                "({} bytes that are not text, not shown here: `tidings dlq show` prints them in hex)",
                letter.body.len()
            ));
            masked.push("body: bytes that are not text".to_owned());
        }
        for failure in &mut view.errors {
            let (error, found) = mask_words(&failure.error);
            if !found.is_empty() {
                masked.extend(
                    found
                        .into_iter()
                        .map(|what| format!("error #{}: {what}", failure.attempt)),
                );
                failure.error = error;
            }
        }
        for (name, value) in &mut view.headers {
            let lower = name.to_ascii_lowercase();
            let what = if matches!(
                lower.as_str(),
                "authorization" | "cookie" | "set-cookie" | "proxy-authorization"
            ) {
                Some("a credentials header")
            } else {
                tidings_schema::secrets::secret_name(name)
                    .map(|_| "a header named like a secret")
                    .or_else(|| tidings_schema::secrets::secret_value(value))
            };
            if let Some(what) = what {
                *value = format!("(masked: {what})");
                masked.push(format!("header {name}: {what}"));
            }
        }
        view.masked = masked;
        view
    }
}

/// Masks, in place, the likely secrets of `value` at `path`, and says which.
fn mask(value: &mut Value, path: &mut String, masked: &mut Vec<String>) {
    let len = path.len();
    match value {
        Value::Object(fields) => {
            for (name, field) in fields.iter_mut() {
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(name);
                // Everything under a field named like a secret goes, whole.
                let named = tidings_schema::secrets::secret_name(name).filter(|_| !field.is_null());
                match named {
                    Some(word) => {
                        masked.push(format!("{path}: a field named like a {word}"));
                        *field = Value::String(format!("(masked: named like a {word})"));
                    }
                    None => mask(field, path, masked),
                }
                path.truncate(len);
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter_mut().enumerate() {
                path.push_str(&format!("[{i}]"));
                mask(item, path, masked);
                path.truncate(len);
            }
        }
        Value::String(s) => {
            if let Some(what) = tidings_schema::secrets::secret_value(s) {
                masked.push(format!("{path}: {what}"));
                *value = Value::String(format!("(masked: {what})"));
            } else {
                let (text, found) = mask_words(s);
                if !found.is_empty() {
                    masked.extend(found.into_iter().map(|what| format!("{path}: {what}")));
                    *value = Value::String(text);
                }
            }
        }
        Value::Number(n) => {
            if let Some(what) = tidings_schema::secrets::secret_value(&n.to_string()) {
                masked.push(format!("{path}: {what}"));
                *value = Value::String(format!("(masked: {what})"));
            }
        }
        Value::Null | Value::Bool(_) => {}
    }
}

/// `text` with each word that looks like a secret masked, and what each
/// was: a value shaped like one (a JSON Web Token, a card number), or the
/// value of a `name=value` or `name: value` pair whose name says secret
/// (`password=hunter2`, `api_key: sk_live_x`). Words end at spaces, `&`,
/// `,`, `;` and quotes, so query strings and error messages are read too.
pub fn mask_words(text: &str) -> (String, Vec<String>) {
    let is_break = |c: char| c.is_whitespace() || matches!(c, '&' | ',' | ';' | '"' | '\'');
    let mut out = String::with_capacity(text.len());
    let mut found = Vec::new();
    // A word named like a secret, whose value may come after a `:` or `=`.
    let mut named: Option<&'static str> = None;
    let mut awaiting_value = false;
    let mut rest = text;
    while !rest.is_empty() {
        let end = rest.find(is_break).unwrap_or(rest.len());
        let (word, tail) = rest.split_at(end);
        let separator_len = tail.chars().next().map_or(0, char::len_utf8);
        let (separator, after) = tail.split_at(separator_len);
        rest = after;
        if word.is_empty() {
            out.push_str(separator);
            continue;
        }
        let (name, value) = match word.split_once(['=', ':']) {
            Some((name, value)) => (Some(name), value),
            None => (None, word),
        };
        if let Some(name) = name.filter(|n| !n.is_empty()) {
            named = tidings_schema::secrets::secret_name(name);
            awaiting_value = true;
        } else if name.is_some() {
            // A lone `:` or `=` after a word: its value comes next.
            awaiting_value = named.is_some();
        }
        if value.is_empty() {
            if name.is_none() {
                named = None;
            }
            out.push_str(word);
            out.push_str(separator);
            continue;
        }
        let what = match (named, awaiting_value) {
            (Some(secret), true) => Some(format!("a value named like a {secret}")),
            _ => tidings_schema::secrets::secret_value(value).map(str::to_owned),
        };
        if name.is_none() {
            named = if awaiting_value {
                None
            } else {
                tidings_schema::secrets::secret_name(word)
            };
        } else {
            named = None;
        }
        awaiting_value = false;
        match what {
            Some(what) => {
                out.push_str(&word[..word.len() - value.len()]);
                out.push_str("(masked)");
                found.push(what);
            }
            None => out.push_str(word),
        }
        out.push_str(separator);
    }
    (out, found)
}

/// What a dead letter's body holds, for showing it.
#[derive(Debug)]
pub enum Body<'a> {
    /// A JSON document (an envelope, usually).
    Json(Value),
    /// Text that is not JSON.
    Text(&'a str),
    /// Bytes that are not text, or text with control characters a
    /// terminal would act on: shown in hex, never raw.
    Binary,
}

impl<'a> Body<'a> {
    /// What `bytes` hold.
    pub fn of(bytes: &'a [u8]) -> Body<'a> {
        if let Ok(v) = serde_json::from_slice(bytes) {
            return Body::Json(v);
        }
        match std::str::from_utf8(bytes) {
            Ok(t)
                if !t
                    .chars()
                    .any(|c| c.is_control() && !matches!(c, '\n' | '\t' | '\r')) =>
            {
                Body::Text(t)
            }
            _ => Body::Binary,
        }
    }
}

/// `bytes` in lowercase hex.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut out, b| {
            let _ = write!(out, "{b:02x}");
            out
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tidings_core::{Failure, Headers};

    fn letter(body: &[u8], headers: &[(&str, &str)]) -> DeadLetter {
        let mut h = Headers::new();
        for (n, v) in headers {
            h.insert((*n).to_owned(), (*v).to_owned());
        }
        DeadLetter {
            id: Uuid::nil(),
            consumer: "billing".into(),
            topic: "orders".into(),
            message_id: None,
            message_type: Some("OrderPlaced".into()),
            aggregate_key: Some("order-1".into()),
            headers: h,
            body: body.to_vec(),
            attempts: 3,
            errors: Vec::new(),
            created_at: Utc::now(),
            redrives: 0,
            redriven_at: None,
            skipped_at: None,
        }
    }

    #[test]
    fn secrets_are_masked_by_name_and_by_shape_and_the_rest_kept() {
        let body = serde_json::json!({
            "data": {
                "order": "o-1",
                "payment": {"card_number": "4111111111111111", "cvv": 123},
                "notes": ["4111 1111 1111 1111 is not here", "4012888888881881"],
                "apiToken": null,
                "amount": 4200
            }
        });
        let l = letter(
            body.to_string().as_bytes(),
            &[("Authorization", "Bearer abc"), ("x-tenant", "acme")],
        );
        let view = LetterView::masked(&l);
        let data = &view.body["data"];
        assert_eq!(data["order"], "o-1");
        assert_eq!(data["amount"], 4200);
        assert_eq!(data["apiToken"], Value::Null);
        for masked in [
            &data["payment"]["card_number"],
            &data["payment"]["cvv"],
            &data["notes"][1],
        ] {
            assert!(
                masked.as_str().is_some_and(|s| s.starts_with("(masked")),
                "{masked}"
            );
        }
        assert_eq!(data["notes"][0], "4111 1111 1111 1111 is not here");
        assert_eq!(view.headers[0].1, "(masked: a credentials header)");
        assert_eq!(view.headers[1].1, "acme");
        assert_eq!(
            view.masked,
            [
                "data.notes[1]: a card number passing the Luhn check",
                "data.payment.card_number: a field named like a cardnumber",
                "data.payment.cvv: a field named like a cvv",
                "header Authorization: a credentials header",
            ]
        );
        let unmasked = LetterView::of(&l);
        assert_eq!(unmasked.body, body);
        assert!(unmasked.masked.is_empty());
    }

    #[test]
    fn secrets_in_text_errors_and_nested_fields_are_masked() {
        let (text, found) =
            mask_words("login failed for ada password=hunter2&next=/home, card 4111111111111111");
        assert_eq!(
            text,
            "login failed for ada password=(masked)&next=/home, card (masked)"
        );
        assert_eq!(found.len(), 2, "{found:?}");
        let (text, _) = mask_words("api_key: sk_live_abc then 'secret': 'x1'");
        assert_eq!(text, "api_key: (masked) then 'secret': '(masked)'");
        assert_eq!(mask_words("nothing to see here").1, Vec::<String>::new());

        let body =
            serde_json::json!({"password": {"v": "x"}, "api_keys": ["sk_live_1"], "note": "token=abc123"});
        let mut l = letter(body.to_string().as_bytes(), &[("Set-Cookie", "sid=1")]);
        l.errors.push(Failure {
            attempt: 1,
            at: Utc::now(),
            class: "permanent".into(),
            error: "provider refused password=hunter2".into(),
        });
        let view = LetterView::masked(&l);
        assert!(
            view.body["password"].is_string() && view.body["api_keys"].is_string(),
            "{}",
            view.body
        );
        assert_eq!(view.body["note"], "token=(masked)");
        assert_eq!(view.errors[0].error, "provider refused password=(masked)");
        assert!(view.headers[0].1.starts_with("(masked"));
        let shown = serde_json::to_string(&view).unwrap();
        assert!(
            !shown.contains("hunter2") && !shown.contains("sk_live_1") && !shown.contains("abc123"),
            "{shown}"
        );

        let binary = LetterView::masked(&letter(b"\x00secret bytes\xff", &[]));
        assert!(binary.body_hex.is_none() && binary.body.as_str().unwrap().contains("not shown"));
    }

    #[test]
    fn an_edit_shows_both_payloads_with_their_secrets_masked() {
        #[derive(Serialize, Deserialize)]
        struct Placed;
        impl tidings_core::Message for Placed {
            const TYPE: &'static str = "OrderPlaced";
            const VERSION: u32 = 1;
            const KIND: tidings_core::Kind = tidings_core::Kind::Event;
            const AGGREGATE: &'static str = "order";
            const TOPIC: &'static str = "orders";
            fn key(&self) -> String {
                "order-1".into()
            }
        }
        const CARD: &str = "4111111111111111";
        let envelope = |data: Value| {
            let mut e = tidings_core::Envelope::new("tests", &Placed).unwrap();
            e.payload = serde_json::to_vec(&data).unwrap();
            e
        };
        let original = envelope(serde_json::json!({ "sku": "POISON-1", "card_number": CARD }));
        let edited = envelope(serde_json::json!({ "sku": "SKU-1", "note": format!("card {CARD}") }));
        let l = letter(&cloudevents::to_json(&original), &[]);
        let edit = DeadLetterEdit {
            id: Uuid::now_v7(),
            dead_letter_id: l.id,
            by: "alice".into(),
            at: Utc::now(),
            original: l.body.clone(),
            edited: cloudevents::to_json(&edited),
        };
        let view = LetterView::masked(&l).with_edits(&l, std::slice::from_ref(&edit));
        let e = &view.edits[0];
        assert_eq!((e.id, e.by.as_str()), (edit.id, "alice"));
        assert_eq!(e.original["sku"], "POISON-1", "the payload, not the envelope");
        assert_eq!(e.edited["sku"], "SKU-1");
        let shown = serde_json::to_string(&view).unwrap();
        assert!(!shown.contains(CARD), "{shown}");
        assert_eq!(
            e.masked,
            [
                "original: card_number: a field named like a cardnumber",
                "edited: note: a card number passing the Luhn check",
            ]
        );
        // A body that is not an envelope is shown whole.
        let garbled = DeadLetterEdit {
            original: b"not an envelope".to_vec(),
            ..edit
        };
        assert_eq!(
            EditView::masked(&l, &garbled).original,
            Value::String("not an envelope".into())
        );
    }

    #[test]
    fn bodies_that_are_not_json_are_text_or_hex() {
        assert_eq!(LetterView::of(&letter(b"plain words", &[])).body, "plain words");
        let binary = LetterView::of(&letter(b"\x00\x1b[2Jx", &[]));
        assert_eq!(binary.body, Value::Null);
        assert_eq!(binary.body_hex.as_deref(), Some("001b5b324a78"));
    }
}
