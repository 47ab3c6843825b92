//! The shipped alert rules load in Prometheus' own checker, their unit tests
//! pass, and every metric they name is one Tidings records.

use std::path::PathBuf;
use std::process::Command;

use tidings_prometheus::{ALERT_RULES, alert_names, metrics_named_in};

fn rules_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy/prometheus")
}

fn promtool(args: &[&str]) -> String {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(rules_dir())
        .output()
        .unwrap_or_else(|e| {
            panic!("promtool is needed to check the alert rules ({e}): install Debian's prometheus package (scripts/test does)")
        });
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?} failed:\n{text}");
    text
}

#[test]
fn the_rules_load_and_each_alert_is_tested() {
    let checked = promtool(&["check", "rules", "tidings-alerts.yml"]);
    let alerts = alert_names(ALERT_RULES);
    assert!(
        checked.contains(&format!("SUCCESS: {} rules found", alerts.len())),
        "{checked}"
    );
    let tested = promtool(&["test", "rules", "tidings-alerts.test.yml"]);
    assert!(tested.contains("SUCCESS"), "{tested}");
    // Every alert has a case where it fires.
    let tests = std::fs::read_to_string(rules_dir().join("tidings-alerts.test.yml")).unwrap();
    for alert in &alerts {
        let fires = tests
            .split("alertname: ")
            .skip(1)
            .any(|case| case.starts_with(&format!("{alert}\n")) && case.contains("exp_labels"));
        assert!(fires, "{alert} has no test where it fires");
    }
}

#[test]
fn every_metric_the_rules_name_is_recorded() {
    let named = metrics_named_in(ALERT_RULES);
    assert!(named.len() >= 8, "{named:?}");
    for name in &named {
        assert!(
            tidings_core::metrics::info(name).is_some(),
            "the rules name {name}, which Tidings does not record"
        );
    }
    // What promise 5 lists is alerted on.
    for needed in [
        "tidings_outbox_pending",
        "tidings_outbox_oldest_unsent_age_seconds",
        "tidings_relay_published_total",
        "tidings_consumer_lag_messages",
        "tidings_dead_letters",
        "tidings_dead_letter_oldest_age_seconds",
    ] {
        assert!(named.contains(needed), "no alert on {needed}");
    }
}

#[test]
fn the_operations_guide_lists_every_metric_and_alert() {
    let guide = include_str!("../../../docs/OPERATIONS.md");
    for m in tidings_core::metrics::CATALOG {
        assert!(
            guide.contains(&format!("| `{}` |", m.name)),
            "docs/OPERATIONS.md does not list {}",
            m.name
        );
    }
    for alert in alert_names(ALERT_RULES) {
        assert!(
            guide.contains(&format!("| `{alert}` |")),
            "docs/OPERATIONS.md does not explain {alert}"
        );
    }
}
