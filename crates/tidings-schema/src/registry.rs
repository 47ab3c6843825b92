//! The registry: one JSON Schema per message type and version, generated
//! from the Rust types and committed as files (`OrderPlaced.v1.json`).

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use schemars::JsonSchema;
use schemars::generate::SchemaSettings;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tidings_core::envelope::schema_id;
use tidings_core::{Kind, Message};

use crate::{META, compat, secrets};

/// What the registry records about a schema, besides the schema itself
/// (under [`META`] in its file).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Meta {
    /// The message type (`OrderPlaced`).
    #[serde(rename = "type")]
    pub message_type: String,
    /// Its version.
    pub version: u32,
    /// Event or command.
    pub kind: Kind,
    /// The topic of an event, the queue of a command.
    pub topic: String,
    /// The aggregate type its key belongs to.
    pub aggregate: String,
    /// For a version after the first: the breaking changes it made to the
    /// one before (empty when it only added).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub breaks: Vec<String>,
}

/// The schema of one version of one message type.
#[derive(Debug, Clone, PartialEq)]
pub struct SchemaDoc {
    /// Type, version, topic and the rest.
    pub meta: Meta,
    /// The JSON Schema (draft 2020-12, subschemas inline), with `meta`
    /// under [`META`].
    pub schema: Value,
}

impl SchemaDoc {
    /// The schema of `M`.
    pub fn of<M: Message + JsonSchema>() -> SchemaDoc {
        let generator = SchemaSettings::draft2020_12()
            .with(|s| s.inline_subschemas = true)
            .into_generator();
        let schema =
            serde_json::to_value(generator.into_root_schema_for::<M>()).expect("a JSON Schema is JSON");
        let meta = Meta {
            message_type: M::TYPE.to_owned(),
            version: M::VERSION,
            kind: M::KIND,
            topic: M::TOPIC.to_owned(),
            aggregate: M::AGGREGATE.to_owned(),
            breaks: Vec::new(),
        };
        SchemaDoc::new(meta, schema)
    }

    fn new(meta: Meta, mut schema: Value) -> SchemaDoc {
        if let Some(map) = schema.as_object_mut() {
            map.insert("$id".into(), json!(schema_id(&meta.message_type, meta.version)));
            map.insert(META.into(), serde_json::to_value(&meta).expect("meta is JSON"));
        }
        SchemaDoc { meta, schema }
    }

    /// The file name in a registry directory: `OrderPlaced.v1.json`.
    pub fn file_name(&self) -> String {
        format!("{}.v{}.json", self.meta.message_type, self.meta.version)
    }

    /// The schema without the registry's own record (to compare contents).
    fn contract(&self) -> Value {
        let mut schema = self.schema.clone();
        if let Some(map) = schema.as_object_mut() {
            map.remove(META);
        }
        schema
    }

    fn to_file(&self) -> String {
        let mut text = serde_json::to_string_pretty(&self.schema).expect("a schema is JSON");
        text.push('\n');
        text
    }
}

/// The schemas of a set of message types, one per type and version.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Registry {
    docs: BTreeMap<(String, u32), SchemaDoc>,
}

/// Why the registry could not be read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SchemaError {
    /// A file or directory could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// A registry file is not a schema the registry wrote.
    #[error("{path}: {reason}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// Generating would overwrite a committed version with a breaking change.
    #[error("{}", problems.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
    Breaking {
        /// Each breaking change.
        problems: Vec<Problem>,
    },
}

/// One thing `check` found wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The message type.
    pub message_type: String,
    /// Its version.
    pub version: u32,
    /// The field, empty for the whole message.
    pub path: String,
    /// The rule broken: a [`compat::Rule`]'s name, `secret`, `unregistered` or `out of date`.
    pub rule: String,
    /// What happened and what to do.
    pub detail: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} v{}: ", self.message_type, self.version)?;
        if !self.path.is_empty() {
            write!(f, "field `{}`: ", self.path)?;
        }
        write!(f, "{}: {}", self.rule, self.detail)
    }
}

/// What [`Registry::check`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// What fails the check.
    pub problems: Vec<Problem>,
    /// What is worth knowing but passes (compatible changes already
    /// committed, old versions kept for old events).
    pub notes: Vec<String>,
}

impl Report {
    /// Whether the check passes.
    pub fn passed(&self) -> bool {
        self.problems.is_empty()
    }
}

impl fmt::Display for Report {
    /// One problem per line, then one note per line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for problem in &self.problems {
            writeln!(f, "{problem}")?;
        }
        for note in &self.notes {
            writeln!(f, "note: {note}")?;
        }
        Ok(())
    }
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Registry {
        Registry::default()
    }

    /// Adds the schema of `M` (type and version from its [`Message`] constants).
    pub fn register<M: Message + JsonSchema>(mut self) -> Registry {
        self.insert(SchemaDoc::of::<M>());
        self
    }

    fn insert(&mut self, doc: SchemaDoc) {
        self.docs
            .insert((doc.meta.message_type.clone(), doc.meta.version), doc);
    }

    /// The schema of `message_type` at `version`.
    pub fn get(&self, message_type: &str, version: u32) -> Option<&SchemaDoc> {
        self.docs.get(&(message_type.to_owned(), version))
    }

    /// Every schema, by type then version.
    pub fn docs(&self) -> impl Iterator<Item = &SchemaDoc> {
        self.docs.values()
    }

    /// The latest version of `message_type` before `version`.
    fn previous(&self, message_type: &str, version: u32) -> Option<&SchemaDoc> {
        self.docs
            .range((message_type.to_owned(), 0)..(message_type.to_owned(), version))
            .next_back()
            .map(|(_, doc)| doc)
    }

    /// Reads a registry directory (every `*.json` file in it). A missing
    /// directory is an empty registry.
    pub fn load(dir: impl AsRef<Path>) -> Result<Registry, SchemaError> {
        let dir = dir.as_ref();
        let mut registry = Registry::new();
        let entries = match std::fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(registry),
            Err(source) => {
                return Err(SchemaError::Io {
                    path: dir.to_owned(),
                    source,
                });
            }
        };
        let mut paths: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect();
        paths.sort();
        for path in paths {
            let text = std::fs::read_to_string(&path).map_err(|source| SchemaError::Io {
                path: path.clone(),
                source,
            })?;
            let invalid = |reason: String| SchemaError::Invalid {
                path: path.clone(),
                reason,
            };
            let schema: Value = serde_json::from_str(&text).map_err(|e| invalid(e.to_string()))?;
            let meta: Meta = schema
                .get(META)
                .cloned()
                .ok_or_else(|| invalid(format!("no `{META}` record: not written by the registry")))
                .and_then(|m| serde_json::from_value(m).map_err(|e| invalid(format!("`{META}`: {e}"))))?;
            let doc = SchemaDoc { meta, schema };
            if path.file_name().and_then(|n| n.to_str()) != Some(doc.file_name().as_str()) {
                return Err(invalid(format!(
                    "holds {} and should be named so",
                    doc.file_name()
                )));
            }
            registry.insert(doc);
        }
        Ok(registry)
    }

    /// Writes the schemas into `dir` for committing, keeping the versions
    /// already there. A new version records the breaking changes it makes
    /// to the one before; a version already committed is rewritten only
    /// with compatible changes, and a breaking change within it is refused
    /// (`SchemaError::Breaking`, naming each), leaving every file as it was.
    ///
    /// Returns the files written (new or changed).
    pub fn generate(&self, dir: impl AsRef<Path>) -> Result<Vec<PathBuf>, SchemaError> {
        let dir = dir.as_ref();
        let committed = Registry::load(dir)?;
        let mut problems = Vec::new();
        let mut out = Vec::new();
        for doc in self.docs() {
            let (ty, version) = (&doc.meta.message_type, doc.meta.version);
            let mut doc = doc.clone();
            match committed.get(ty, version) {
                Some(old) => {
                    problems.extend(breaking_problems(old, &doc));
                    doc = SchemaDoc::new(
                        Meta {
                            breaks: old.meta.breaks.clone(),
                            ..doc.meta
                        },
                        doc.schema,
                    );
                }
                None => {
                    let before = self.previous(ty, version).or(committed.previous(ty, version));
                    if let Some(before) = before {
                        let breaks = compat::breaking(&before.contract(), &doc.contract())
                            .iter()
                            .map(ToString::to_string)
                            .collect();
                        doc = SchemaDoc::new(Meta { breaks, ..doc.meta }, doc.schema);
                    }
                }
            }
            out.push(doc);
        }
        if !problems.is_empty() {
            return Err(SchemaError::Breaking { problems });
        }
        std::fs::create_dir_all(dir).map_err(|source| SchemaError::Io {
            path: dir.to_owned(),
            source,
        })?;
        let mut written = Vec::new();
        for doc in out {
            let path = dir.join(doc.file_name());
            let text = doc.to_file();
            if std::fs::read_to_string(&path).ok().as_deref() != Some(text.as_str()) {
                std::fs::write(&path, text).map_err(|source| SchemaError::Io {
                    path: path.clone(),
                    source,
                })?;
                written.push(path);
            }
        }
        Ok(written)
    }

    /// Compares these schemas (from the code) against `committed` (the
    /// registry directory): a breaking change within a version, a type or
    /// version missing from the registry, a registry out of date with
    /// compatible changes, and fields named like secrets all fail.
    pub fn check(&self, committed: &Registry) -> Report {
        let mut report = Report::default();
        for doc in self.docs() {
            let (ty, version) = (&doc.meta.message_type, doc.meta.version);
            let problem = |path: &str, rule: &str, detail: String| Problem {
                message_type: ty.clone(),
                version,
                path: path.to_owned(),
                rule: rule.to_owned(),
                detail,
            };
            for finding in secrets::lint_schema(&doc.schema) {
                report.problems.push(problem(
                    &finding.path,
                    "secret",
                    format!(
                        "looks like {}: keep secrets out of events, or mark the field `{}` with the reason",
                        finding.what,
                        crate::NOT_A_SECRET
                    ),
                ));
            }
            let Some(old) = committed.get(ty, version) else {
                report.problems.push(problem(
                    "",
                    "unregistered",
                    "not in the registry: run `tidings schema generate` and commit the file".to_owned(),
                ));
                continue;
            };
            let breaking = breaking_problems(old, doc);
            if !breaking.is_empty() {
                report.problems.extend(breaking);
                continue;
            }
            let changes = compat::compare(&old.contract(), &doc.contract());
            if old.contract() != doc.contract()
                || old.meta.kind != doc.meta.kind
                || old.meta.topic != doc.meta.topic
            {
                let what = if changes.is_empty() {
                    "documentation or routing changed".to_owned()
                } else {
                    changes
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join("; ")
                };
                report.problems.push(problem(
                    "",
                    "out of date",
                    format!("compatible changes not in the registry ({what}): run `tidings schema generate` and commit"),
                ));
            }
        }
        for old in committed.docs() {
            if self.get(&old.meta.message_type, old.meta.version).is_none() {
                report.notes.push(format!(
                    "{} v{} is in the registry but not in the code (kept for reading old events)",
                    old.meta.message_type, old.meta.version
                ));
            }
        }
        report
    }
}

/// The breaking changes from `old` to `new` within one version, as problems.
fn breaking_problems(old: &SchemaDoc, new: &SchemaDoc) -> Vec<Problem> {
    let (ty, version) = (&new.meta.message_type, new.meta.version);
    compat::breaking(&old.contract(), &new.contract())
        .into_iter()
        .map(|change| Problem {
            message_type: ty.clone(),
            version,
            path: change.path.clone(),
            rule: change.rule.as_str().to_owned(),
            detail: format!(
                "{}; a breaking change needs a new version ({ty} v{}) with an upcaster",
                change.detail,
                version + 1
            ),
        })
        .collect()
}
