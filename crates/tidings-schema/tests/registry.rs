//! The registry workflow over a matrix of changes: generate from one shape
//! of `OrderPlaced` v1, change the Rust type, and check against the files.

#![allow(unreachable_pub)]

use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tidings_schema::{Registry, Report, SchemaError};

/// `OrderPlaced` in one of its shapes, at `$version`.
macro_rules! order_placed {
    ($module:ident, $version:literal, { $($body:tt)* } $(, $extra:item)*) => {
        mod $module {
            use super::*;

            /// An order was placed.
            #[derive(Debug, Serialize, Deserialize, JsonSchema)]
            pub struct OrderPlaced { $($body)* }

            $($extra)*

            impl tidings_core::Message for OrderPlaced {
                const TYPE: &'static str = "OrderPlaced";
                const VERSION: u32 = $version;
                const KIND: tidings_core::Kind = tidings_core::Kind::Event;
                const AGGREGATE: &'static str = "order";
                const TOPIC: &'static str = "orders";
                fn key(&self) -> String {
                    String::new()
                }
            }
        }
    };
}

order_placed!(base, 1, {
    pub order_id: String,
    pub total_cents: i64,
    pub status: Status,
    pub note: Option<String>,
}, #[derive(Debug, Serialize, Deserialize, JsonSchema)] pub enum Status { Placed, Paid });

order_placed!(documented, 1, {
    /// The order's id, as the shop shows it.
    pub order_id: String,
    pub total_cents: i64,
    pub status: Status,
    pub note: Option<String>,
}, #[derive(Debug, Serialize, Deserialize, JsonSchema)] pub enum Status { Placed, Paid });

order_placed!(added_optional, 1, {
    pub order_id: String,
    pub total_cents: i64,
    pub status: Status,
    pub note: Option<String>,
    #[serde(default)]
    pub coupon: Option<String>,
}, #[derive(Debug, Serialize, Deserialize, JsonSchema)] pub enum Status { Placed, Paid });

order_placed!(removed, 1, {
    pub order_id: String,
    pub total_cents: i64,
    pub status: Status,
}, #[derive(Debug, Serialize, Deserialize, JsonSchema)] pub enum Status { Placed, Paid });

order_placed!(renamed, 1, {
    pub order_id: String,
    pub amount_cents: i64,
    pub status: Status,
    pub note: Option<String>,
}, #[derive(Debug, Serialize, Deserialize, JsonSchema)] pub enum Status { Placed, Paid });

order_placed!(retyped, 1, {
    pub order_id: String,
    pub total_cents: String,
    pub status: Status,
    pub note: Option<String>,
}, #[derive(Debug, Serialize, Deserialize, JsonSchema)] pub enum Status { Placed, Paid });

order_placed!(new_required, 1, {
    pub order_id: String,
    pub total_cents: i64,
    pub status: Status,
    pub note: Option<String>,
    pub currency: String,
}, #[derive(Debug, Serialize, Deserialize, JsonSchema)] pub enum Status { Placed, Paid });

order_placed!(narrowed, 1, {
    pub order_id: String,
    pub total_cents: i64,
    pub status: Status,
    pub note: Option<String>,
}, #[derive(Debug, Serialize, Deserialize, JsonSchema)] pub enum Status { Placed });

order_placed!(widened, 1, {
    pub order_id: String,
    pub total_cents: i64,
    pub status: Status,
    pub note: Option<String>,
}, #[derive(Debug, Serialize, Deserialize, JsonSchema)] pub enum Status { Placed, Paid, Refunded });

order_placed!(null_refused, 1, {
    pub order_id: String,
    pub total_cents: i64,
    pub status: Status,
    #[serde(default)]
    pub note: String,
}, #[derive(Debug, Serialize, Deserialize, JsonSchema)] pub enum Status { Placed, Paid });

order_placed!(v2, 2, {
    pub order_id: String,
    pub amount: Money,
    pub status: Status,
},
#[derive(Debug, Serialize, Deserialize, JsonSchema)] pub enum Status { Placed, Paid },
#[derive(Debug, Serialize, Deserialize, JsonSchema)] pub struct Money { pub cents: i64, pub currency: String });

order_placed!(with_password, 1, {
    pub order_id: String,
    pub total_cents: i64,
    pub status: Status,
    pub note: Option<String>,
    pub customer_password: String,
}, #[derive(Debug, Serialize, Deserialize, JsonSchema)] pub enum Status { Placed, Paid });

order_placed!(with_allowed_token, 1, {
    pub order_id: String,
    pub total_cents: i64,
    pub status: Status,
    pub note: Option<String>,
    #[serde(default)]
    #[schemars(extend("x-tidings-not-a-secret" = "the payment provider's opaque reference, useless without our API key"))]
    pub payment_token: Option<String>,
}, #[derive(Debug, Serialize, Deserialize, JsonSchema)] pub enum Status { Placed, Paid });

/// A fresh directory for one test's registry.
fn scratch() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("registry-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A registry committed from `base`, checked against `current`.
fn check_against_base(current: Registry) -> (Report, PathBuf) {
    let dir = scratch();
    Registry::new()
        .register::<base::OrderPlaced>()
        .generate(&dir)
        .unwrap();
    let committed = Registry::load(&dir).unwrap();
    (current.check(&committed), dir)
}

fn problems(report: &Report) -> Vec<String> {
    report.problems.iter().map(ToString::to_string).collect()
}

/// The one problem of `report`, which must be of `rule` on `path`.
fn only_problem(report: &Report, rule: &str, path: &str) -> String {
    assert_eq!(report.problems.len(), 1, "{:#?}", problems(report));
    let problem = &report.problems[0];
    assert_eq!(
        (problem.rule.as_str(), problem.path.as_str()),
        (rule, path),
        "{problem}"
    );
    problem.to_string()
}

#[test]
fn the_unchanged_type_passes() {
    let (report, _) = check_against_base(Registry::new().register::<base::OrderPlaced>());
    assert!(report.passed(), "{:#?}", problems(&report));
}

#[test]
fn an_added_optional_field_is_compatible_and_passes_once_generated() {
    let current = Registry::new().register::<added_optional::OrderPlaced>();
    let (report, dir) = check_against_base(current.clone());
    let message = only_problem(&report, "out of date", "");
    assert!(
        message.contains("field `coupon`: added optional field")
            && message.contains("run `tidings schema generate`"),
        "{message}"
    );
    let written = current.generate(&dir).unwrap();
    assert_eq!(written, vec![dir.join("OrderPlaced.v1.json")]);
    let report = current.check(&Registry::load(&dir).unwrap());
    assert!(report.passed(), "{:#?}", problems(&report));
}

#[test]
fn documentation_may_change() {
    let current = Registry::new().register::<documented::OrderPlaced>();
    let (report, dir) = check_against_base(current.clone());
    only_problem(&report, "out of date", "");
    current.generate(&dir).unwrap();
    assert!(current.check(&Registry::load(&dir).unwrap()).passed());
}

#[test]
fn a_removed_field_fails() {
    let (report, _) = check_against_base(Registry::new().register::<removed::OrderPlaced>());
    let message = only_problem(&report, "removed", "note");
    assert_eq!(
        message,
        "OrderPlaced v1: field `note`: removed: removed: readers that need it fail; \
         a breaking change needs a new version (OrderPlaced v2) with an upcaster"
    );
}

#[test]
fn a_renamed_field_fails() {
    let (report, _) = check_against_base(Registry::new().register::<renamed::OrderPlaced>());
    let message = only_problem(&report, "renamed", "total_cents");
    assert!(message.contains("renamed to `amount_cents`"), "{message}");
}

#[test]
fn a_retyped_field_fails() {
    let (report, _) = check_against_base(Registry::new().register::<retyped::OrderPlaced>());
    let message = only_problem(&report, "retyped", "total_cents");
    assert!(message.contains("integer -> string"), "{message}");
}

#[test]
fn a_new_required_field_fails() {
    let (report, _) = check_against_base(Registry::new().register::<new_required::OrderPlaced>());
    let message = only_problem(&report, "new required field", "currency");
    assert!(message.contains("old messages lack it"), "{message}");
}

#[test]
fn a_narrowed_enum_fails() {
    let (report, _) = check_against_base(Registry::new().register::<narrowed::OrderPlaced>());
    let message = only_problem(&report, "enum narrowed", "status");
    assert!(message.contains(r#"lost "Paid""#), "{message}");
}

#[test]
fn a_widened_enum_is_compatible() {
    let (report, _) = check_against_base(Registry::new().register::<widened::OrderPlaced>());
    let message = only_problem(&report, "out of date", "");
    assert!(
        message.contains(r#"enum widened: gained "Refunded""#),
        "{message}"
    );
}

#[test]
fn a_changed_meaning_of_null_fails() {
    let (report, _) = check_against_base(Registry::new().register::<null_refused::OrderPlaced>());
    let message = only_problem(&report, "meaning of null changed", "note");
    assert!(
        message.contains("null was allowed and is now refused"),
        "{message}"
    );
}

#[test]
fn generate_refuses_a_breaking_change_within_a_version_and_writes_nothing() {
    let dir = scratch();
    Registry::new()
        .register::<base::OrderPlaced>()
        .generate(&dir)
        .unwrap();
    let before = std::fs::read_to_string(dir.join("OrderPlaced.v1.json")).unwrap();
    let err = Registry::new()
        .register::<retyped::OrderPlaced>()
        .generate(&dir)
        .unwrap_err();
    assert!(matches!(err, SchemaError::Breaking { .. }), "{err}");
    assert!(err.to_string().contains("field `total_cents`: retyped"), "{err}");
    assert_eq!(
        std::fs::read_to_string(dir.join("OrderPlaced.v1.json")).unwrap(),
        before
    );
}

#[test]
fn a_new_version_may_break_and_records_how() {
    let dir = scratch();
    Registry::new()
        .register::<base::OrderPlaced>()
        .generate(&dir)
        .unwrap();
    // The code now declares v2 only; v1 stays in the registry for old events.
    let current = Registry::new().register::<v2::OrderPlaced>();
    let report = current.check(&Registry::load(&dir).unwrap());
    only_problem(&report, "unregistered", "");
    current.generate(&dir).unwrap();
    let committed = Registry::load(&dir).unwrap();
    let report = current.check(&committed);
    assert!(report.passed(), "{:#?}", problems(&report));
    assert_eq!(
        report.notes,
        vec!["OrderPlaced v1 is in the registry but not in the code (kept for reading old events)"]
    );
    let breaks = &committed.get("OrderPlaced", 2).unwrap().meta.breaks;
    assert!(
        breaks
            .iter()
            .any(|b| b.starts_with("field `total_cents`: renamed")
                || b.starts_with("field `total_cents`: removed")),
        "{breaks:?}"
    );
    assert!(
        breaks
            .iter()
            .any(|b| b.starts_with("field `amount`: new required field")),
        "{breaks:?}"
    );
    assert!(committed.get("OrderPlaced", 1).unwrap().meta.breaks.is_empty());
}

#[test]
fn a_field_named_like_a_password_fails_the_check() {
    let dir = scratch();
    let current = Registry::new().register::<with_password::OrderPlaced>();
    current.generate(&dir).unwrap();
    let report = current.check(&Registry::load(&dir).unwrap());
    let message = only_problem(&report, "secret", "customer_password");
    assert!(message.contains("a field named like a password"), "{message}");
}

#[test]
fn an_exempted_field_passes_the_secrets_lint() {
    let dir = scratch();
    let current = Registry::new().register::<with_allowed_token::OrderPlaced>();
    current.generate(&dir).unwrap();
    let report = current.check(&Registry::load(&dir).unwrap());
    assert!(report.passed(), "{:#?}", problems(&report));
}

#[test]
fn a_file_not_written_by_the_registry_is_named() {
    let dir = scratch();
    std::fs::write(dir.join("Stray.v1.json"), r#"{"type": "object"}"#).unwrap();
    let err = Registry::load(&dir).unwrap_err();
    assert!(
        err.to_string().contains("Stray.v1.json: no `x-tidings` record"),
        "{err}"
    );
}
