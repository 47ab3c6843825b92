//! The audit trail: entries come back newest first, as many as asked, only
//! those of a target when one is named, each field as it was written.

use chrono::{DateTime, Duration, Utc};
use serde_json::json;
use tidings_core::{AuditEntry, AuditStore};

use crate::services::TestDb;

/// An entry done `seconds` after `start`.
fn entry(
    start: DateTime<Utc>,
    seconds: i64,
    actor: &str,
    action: &str,
    target: &str,
    detail: serde_json::Value,
) -> AuditEntry {
    AuditEntry {
        at: start + Duration::seconds(seconds),
        actor: actor.into(),
        action: action.into(),
        target: target.into(),
        detail,
    }
}

/// (action, target) of each of `entries`, for messages.
fn summary<'a>(entries: impl IntoIterator<Item = &'a AuditEntry>) -> Vec<(&'a str, &'a str)> {
    entries
        .into_iter()
        .map(|e| (e.action.as_str(), e.target.as_str()))
        .collect()
}

/// `got` is `want`, entry by entry: every field equal, times to the
/// millisecond (a store keeps at least that).
fn assert_trail(got: &[AuditEntry], want: &[&AuditEntry], what: &str) {
    assert_eq!(
        got.len(),
        want.len(),
        "{what}: read {:?}, wanted {:?}",
        summary(got),
        summary(want.iter().copied()),
    );
    for (i, (got, want)) in got.iter().zip(want).enumerate() {
        assert_eq!(
            got.at.timestamp_millis(),
            want.at.timestamp_millis(),
            "{what}, entry {i}: written at {}, read back at {}",
            want.at,
            got.at
        );
        assert_eq!(got.actor, want.actor, "{what}, entry {i}");
        assert_eq!(got.action, want.action, "{what}, entry {i}");
        assert_eq!(got.target, want.target, "{what}, entry {i}");
        assert_eq!(got.detail, want.detail, "{what}, entry {i}");
    }
}

/// Entries written out of time order come back newest first (the later
/// written first among entries of one time), at most as many as asked;
/// asked by target, only that target's, matched exactly; every field comes
/// back as written.
pub async fn audit_entries_are_kept_newest_first_and_found_by_target<T: TestDb>(db: &T) {
    let store = db.store();
    assert!(
        store.audit_trail(None, 10).await.unwrap().is_empty(),
        "a new store has no trail"
    );

    // Microseconds past a millisecond: stores keep at least the millisecond.
    let start = DateTime::from_timestamp_micros(1_750_000_000_123_456).unwrap();
    let first = entry(
        start,
        0,
        "zoë@example.com",
        "redrive",
        "dead-letter:0193a3c4",
        json!({ "consumer": "billing", "redrive": 1 }),
    );
    let second = entry(
        start,
        10,
        "token:console",
        "skip",
        "dead-letter:77f0e2aa",
        json!(null),
    );
    let third = entry(
        start,
        20,
        "zoë@example.com",
        "redrive",
        "dead-letter:0193a3c4",
        json!({
            "redrive": 2,
            "note": "after the fix: \"quoted\", ünïcode ✓",
            "nested": { "list": [1, 2.5, null, "x", true], "empty": {} },
        }),
    );
    // Two entries of the same time: the one written later is the newer.
    let fourth = entry(
        start,
        30,
        "tidings-cli",
        "purge",
        "consumer=billing,settled",
        json!({ "purged": 3, "ids": ["0193a3c4", "77f0e2aa"] }),
    );
    let fifth = entry(
        start,
        30,
        "ops",
        "edit",
        "dead-letter:77f0e2aa",
        json!({ "field": "body" }),
    );

    // Written out of time order: the trail is ordered by time, not by writing.
    for e in [&third, &first, &second, &fourth, &fifth] {
        store.audit(e).await.unwrap();
    }

    let all = store.audit_trail(None, 100).await.unwrap();
    assert_trail(
        &all,
        &[&fifth, &fourth, &third, &second, &first],
        "the whole trail",
    );
    let newest = store.audit_trail(None, 2).await.unwrap();
    assert_trail(&newest, &[&fifth, &fourth], "the two newest");
    assert!(
        store.audit_trail(None, 0).await.unwrap().is_empty(),
        "a limit of 0 reads nothing"
    );

    let letter = store
        .audit_trail(Some("dead-letter:0193a3c4"), 100)
        .await
        .unwrap();
    assert_trail(&letter, &[&third, &first], "one dead letter's trail");
    let latest = store.audit_trail(Some("dead-letter:0193a3c4"), 1).await.unwrap();
    assert_trail(&latest, &[&third], "one dead letter's latest entry");
    let other = store
        .audit_trail(Some("dead-letter:77f0e2aa"), 100)
        .await
        .unwrap();
    assert_trail(&other, &[&fifth, &second], "another dead letter's trail");
    let selection = store
        .audit_trail(Some("consumer=billing,settled"), 100)
        .await
        .unwrap();
    assert_trail(&selection, &[&fourth], "a selection's trail");

    // Targets are matched exactly: neither a prefix nor another case finds any.
    for target in ["dead-letter:", "dead-letter", "DEAD-LETTER:0193A3C4", "nothing"] {
        assert!(
            store.audit_trail(Some(target), 100).await.unwrap().is_empty(),
            "{target:?} is no entry's target"
        );
    }
}
