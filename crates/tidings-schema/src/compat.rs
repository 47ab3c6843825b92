//! What counts as a breaking change within one version of a message type.
//!
//! Events are read long after they are written (consumers lag, replays
//! go back weeks), so within one version a schema must stay readable both
//! ways: new code reads old events, and old code reads new ones. Adding an
//! optional field keeps both; everything else that changes what a reader
//! may find breaks one of them:
//!
//! | Change | Rule |
//! |---|---|
//! | a field removed (or renamed: removed plus an added field of the same shape) | [`Rule::Removed`], [`Rule::Renamed`] |
//! | a field's type or format changed | [`Rule::Retyped`] |
//! | a new required field, or an optional one made required | [`Rule::NewRequired`] |
//! | a required field made optional | [`Rule::NoLongerRequired`] |
//! | an enum lost a value | [`Rule::EnumNarrowed`] |
//! | `null` allowed where it was not, or refused where it was | [`Rule::NullChanged`] |
//! | any other change of shape (variants of a tagged enum, constraints) | [`Rule::Reshaped`] |
//!
//! Documentation (`description`, `title`, examples) and `x-` extensions
//! may change freely. A change that breaks belongs in a new version of the
//! type, with an upcaster for consumers of the new one
//! ([`Message::upcast`](tidings_core::Message::upcast)).
//!
//! The comparison works on the schemas the registry writes: subschemas
//! inline, `Option<T>` as a `null` alternative.

use std::collections::BTreeSet;
use std::fmt;

use serde_json::{Map, Value};

/// The kind of a change between two schemas of one version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum Rule {
    /// A field is gone: readers that need it fail.
    Removed,
    /// A field is gone and another of the same shape appeared.
    Renamed,
    /// A field's type (or format) changed.
    Retyped,
    /// A field old messages lack is now required.
    NewRequired,
    /// A field readers relied on may now be missing.
    NoLongerRequired,
    /// An enum lost values old messages may carry.
    EnumNarrowed,
    /// `null` is now allowed where it was not, or refused where it was.
    NullChanged,
    /// A change of shape the checker cannot prove compatible.
    Reshaped,
    /// An optional field was added (compatible).
    Added,
    /// An enum gained values (compatible for new readers; old readers must
    /// tolerate values they do not know).
    EnumWidened,
}

impl Rule {
    /// Whether the change breaks readers within one version.
    pub fn is_breaking(self) -> bool {
        !matches!(self, Rule::Added | Rule::EnumWidened)
    }

    /// A short name for the rule (`removed`, `retyped`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Rule::Removed => "removed",
            Rule::Renamed => "renamed",
            Rule::Retyped => "retyped",
            Rule::NewRequired => "new required field",
            Rule::NoLongerRequired => "no longer required",
            Rule::EnumNarrowed => "enum narrowed",
            Rule::NullChanged => "meaning of null changed",
            Rule::Reshaped => "reshaped",
            Rule::Added => "added optional field",
            Rule::EnumWidened => "enum widened",
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One difference between an old and a new schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// The field, as a path (`lines[].sku`); empty for the message itself.
    pub path: String,
    /// What kind of change.
    pub rule: Rule,
    /// What changed, in words.
    pub detail: String,
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            write!(f, "{}: {}", self.rule, self.detail)
        } else {
            write!(f, "field `{}`: {}: {}", self.path, self.rule, self.detail)
        }
    }
}

/// Every difference between `old` and `new`, breaking and compatible (see
/// [`Rule::is_breaking`]), in field order.
pub fn compare(old: &Value, new: &Value) -> Vec<Change> {
    let mut changes = Vec::new();
    compare_at("", old, new, &mut changes);
    changes
}

/// Only the breaking differences between `old` and `new`.
pub fn breaking(old: &Value, new: &Value) -> Vec<Change> {
    compare(old, new)
        .into_iter()
        .filter(|c| c.rule.is_breaking())
        .collect()
}

fn push(out: &mut Vec<Change>, path: &str, rule: Rule, detail: String) {
    out.push(Change {
        path: path.to_owned(),
        rule,
        detail,
    });
}

fn compare_at(path: &str, old: &Value, new: &Value, out: &mut Vec<Change>) {
    let (old, new) = (Shape::of(old), Shape::of(new));
    if old.nullable != new.nullable {
        let detail = if old.nullable {
            "null was allowed and is now refused"
        } else {
            "null is now allowed where readers never saw it"
        };
        push(out, path, Rule::NullChanged, detail.to_owned());
    }
    if !old.types.is_empty() && !new.types.is_empty() && old.types != new.types {
        push(
            out,
            path,
            Rule::Retyped,
            format!("{} -> {}", describe(&old.types), describe(&new.types)),
        );
        return;
    }
    let (old_format, new_format) = (old.body.get("format"), new.body.get("format"));
    if old_format != new_format {
        push(
            out,
            path,
            Rule::Retyped,
            format!("format {} -> {}", show(old_format), show(new_format)),
        );
        return;
    }
    match (old.values(), new.values()) {
        (Some(old_values), Some(new_values)) => {
            let lost: Vec<_> = old_values.difference(&new_values).cloned().collect();
            let gained: Vec<_> = new_values.difference(&old_values).cloned().collect();
            if !lost.is_empty() {
                push(out, path, Rule::EnumNarrowed, format!("lost {}", lost.join(", ")));
            }
            if !gained.is_empty() {
                push(
                    out,
                    path,
                    Rule::EnumWidened,
                    format!("gained {}", gained.join(", ")),
                );
            }
            return;
        }
        (None, None) => {}
        _ => {
            push(
                out,
                path,
                Rule::Reshaped,
                "changed between an enum and a free value".to_owned(),
            );
            return;
        }
    }
    if old.is_object() || new.is_object() {
        compare_objects(path, &old, &new, out);
    } else if old.body.contains_key("items") || new.body.contains_key("items") {
        let none = Value::Bool(true);
        let item_path = format!("{path}[]");
        compare_at(
            &item_path,
            old.body.get("items").unwrap_or(&none),
            new.body.get("items").unwrap_or(&none),
            out,
        );
    } else if old.rest() != new.rest() {
        push(
            out,
            path,
            Rule::Reshaped,
            "its variants or constraints changed".to_owned(),
        );
    }
}

fn compare_objects(path: &str, old: &Shape<'_>, new: &Shape<'_>, out: &mut Vec<Change>) {
    let (old_props, new_props) = (old.properties(), new.properties());
    let (old_required, new_required) = (old.required(), new.required());
    let field = |name: &str| {
        if path.is_empty() {
            name.to_owned()
        } else {
            format!("{path}.{name}")
        }
    };
    let added: Vec<&String> = new_props.keys().filter(|k| !old_props.contains_key(*k)).collect();
    let mut renamed_to = BTreeSet::new();
    for (name, old_schema) in &old_props {
        match new_props.get(name) {
            Some(new_schema) => {
                let here = field(name);
                match (old_required.contains(name), new_required.contains(name)) {
                    (false, true) => push(
                        out,
                        &here,
                        Rule::NewRequired,
                        "was optional and is now required: old messages may lack it".to_owned(),
                    ),
                    (true, false) => push(
                        out,
                        &here,
                        Rule::NoLongerRequired,
                        "was required and may now be missing".to_owned(),
                    ),
                    _ => {}
                }
                compare_at(&here, old_schema, new_schema, out);
            }
            None => {
                let twin = added
                    .iter()
                    .find(|a| new_props.get(a.as_str()).map(strip) == Some(strip(old_schema)));
                match twin {
                    Some(to) => {
                        renamed_to.insert(to.as_str());
                        push(
                            out,
                            &field(name),
                            Rule::Renamed,
                            format!("renamed to `{}`: readers of `{name}` find nothing", field(to)),
                        );
                    }
                    None => push(
                        out,
                        &field(name),
                        Rule::Removed,
                        "removed: readers that need it fail".to_owned(),
                    ),
                }
            }
        }
    }
    for name in added.into_iter().filter(|a| !renamed_to.contains(a.as_str())) {
        if new_required.contains(name) {
            push(
                out,
                &field(name),
                Rule::NewRequired,
                "added as required: old messages lack it".to_owned(),
            );
        } else {
            push(out, &field(name), Rule::Added, "added, optional".to_owned());
        }
    }
}

/// A schema with its `null` alternative taken apart.
struct Shape<'a> {
    nullable: bool,
    types: BTreeSet<String>,
    body: &'a Map<String, Value>,
    empty: bool,
}

static EMPTY: std::sync::LazyLock<Map<String, Value>> = std::sync::LazyLock::new(Map::new);

fn is_null_schema(v: &Value) -> bool {
    v.get("type").and_then(Value::as_str) == Some("null") || v.get("const") == Some(&Value::Null)
}

impl<'a> Shape<'a> {
    fn of(schema: &'a Value) -> Shape<'a> {
        let Some(body) = schema.as_object() else {
            return Shape {
                nullable: schema == &Value::Bool(true),
                types: BTreeSet::new(),
                body: &EMPTY,
                empty: true,
            };
        };
        // `anyOf: [T, {type: null}]`, as for `Option<Struct>`.
        for key in ["anyOf", "oneOf"] {
            if let Some(Value::Array(alts)) = body.get(key) {
                let (nulls, others): (Vec<&Value>, Vec<&Value>) =
                    alts.iter().partition(|a| is_null_schema(a));
                if !nulls.is_empty() && others.len() == 1 {
                    let mut inner = Shape::of(others[0]);
                    inner.nullable = true;
                    return inner;
                }
            }
        }
        let mut types = BTreeSet::new();
        let mut nullable = false;
        match body.get("type") {
            Some(Value::String(t)) => {
                types.insert(t.clone());
            }
            Some(Value::Array(ts)) => types.extend(ts.iter().filter_map(Value::as_str).map(str::to_owned)),
            _ => {}
        }
        if types.remove("null") {
            nullable = true;
        }
        if let Some(Value::Array(values)) = body.get("enum")
            && values.contains(&Value::Null)
        {
            nullable = true;
        }
        // schemars writes integers as "integer"; a bare "number" is the same family only in name.
        Shape {
            nullable,
            types,
            body,
            empty: body.is_empty(),
        }
    }

    fn is_object(&self) -> bool {
        self.types.contains("object") || self.body.contains_key("properties")
    }

    fn properties(&self) -> Map<String, Value> {
        self.body
            .get("properties")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default()
    }

    fn required(&self) -> BTreeSet<String> {
        self.body
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).map(str::to_owned).collect())
            .unwrap_or_default()
    }

    /// The values of an enum: `enum`, `const`, or alternatives that are all constants.
    fn values(&self) -> Option<BTreeSet<String>> {
        if self.empty {
            return None;
        }
        let mut values = BTreeSet::new();
        if collect_values(self.body, &mut values) {
            Some(values)
        } else {
            None
        }
    }

    /// The schema without documentation, extensions, nullability and the
    /// keywords compared on their own.
    fn rest(&self) -> Value {
        let mut rest = strip(&Value::Object(self.body.clone()));
        if let Some(map) = rest.as_object_mut() {
            for key in [
                "type",
                "format",
                "enum",
                "const",
                "properties",
                "required",
                "items",
            ] {
                map.remove(key);
            }
        }
        rest
    }
}

fn collect_values(body: &Map<String, Value>, values: &mut BTreeSet<String>) -> bool {
    if let Some(Value::Array(vs)) = body.get("enum") {
        values.extend(vs.iter().filter(|v| !v.is_null()).map(Value::to_string));
        return true;
    }
    if let Some(v) = body.get("const") {
        values.insert(v.to_string());
        return true;
    }
    for key in ["oneOf", "anyOf"] {
        if let Some(Value::Array(alts)) = body.get(key) {
            let non_null: Vec<&Value> = alts.iter().filter(|a| !is_null_schema(a)).collect();
            return !non_null.is_empty()
                && non_null
                    .iter()
                    .all(|a| a.as_object().is_some_and(|m| collect_values(m, values)));
        }
    }
    false
}

/// The schema without what may change freely: documentation and `x-` extensions.
fn strip(schema: &Value) -> Value {
    match schema {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(k, _)| {
                    !k.starts_with("x-")
                        && !matches!(
                            k.as_str(),
                            "description" | "title" | "examples" | "default" | "deprecated" | "$comment"
                        )
                })
                .map(|(k, v)| (k.clone(), strip(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(strip).collect()),
        other => other.clone(),
    }
}

fn describe(types: &BTreeSet<String>) -> String {
    types.iter().cloned().collect::<Vec<_>>().join(" or ")
}

fn show(v: Option<&Value>) -> String {
    v.map_or_else(|| "none".to_owned(), Value::to_string)
}
