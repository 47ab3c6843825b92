//! Validation at publish: the outbox refuses a payload that does not match
//! its registered schema, or that carries a likely secret.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::Arc;

use serde_json::Value;
use tidings_core::transport::OutgoingMessage;
use tidings_core::{Error, PublishGuard, Result};

use crate::registry::{Registry, SchemaError};
use crate::secrets;

struct Compiled {
    validator: jsonschema::Validator,
    schema: Value,
}

/// A [`PublishGuard`] over a [`Registry`]: each message's payload must be
/// valid against the schema of its type and version, and hold no likely
/// secret ([`secrets`]). A type the registry does not know is refused too,
/// so that nothing reaches consumers without a contract.
///
/// Both checks are on for every type; [`SchemaGuard::trust`] turns them off
/// for a type on a hot path whose payloads come only from its Rust type
/// (see `BENCHMARKS.md` for what validation costs).
///
/// ```no_run
/// # async fn run(registry: tidings_schema::Registry) -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use tidings_schema::SchemaGuard;
/// use tidings_store_postgres::{PgStore, PgStoreOptions};
///
/// let guard = SchemaGuard::new(&registry)?;
/// let options = PgStoreOptions::default().guard(Arc::new(guard));
/// let store = PgStore::connect_with("postgres://app@db/shop", options).await?;
/// # Ok(()) }
/// ```
pub struct SchemaGuard {
    schemas: HashMap<(String, u32), Arc<Compiled>>,
    trusted: HashSet<String>,
}

impl fmt::Debug for SchemaGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut types: Vec<_> = self.schemas.keys().map(|(t, v)| format!("{t} v{v}")).collect();
        types.sort();
        f.debug_struct("SchemaGuard")
            .field("types", &types)
            .field("trusted", &self.trusted)
            .finish()
    }
}

impl SchemaGuard {
    /// Compiles every schema of `registry` (usually [`Registry::load`]ed
    /// from the committed directory).
    pub fn new(registry: &Registry) -> Result<SchemaGuard, SchemaError> {
        let mut schemas = HashMap::new();
        for doc in registry.docs() {
            let validator = jsonschema::validator_for(&doc.schema).map_err(|e| SchemaError::Invalid {
                path: doc.file_name().into(),
                reason: format!("not a valid JSON Schema: {e}"),
            })?;
            schemas.insert(
                (doc.meta.message_type.clone(), doc.meta.version),
                Arc::new(Compiled {
                    validator,
                    schema: doc.schema.clone(),
                }),
            );
        }
        Ok(SchemaGuard {
            schemas,
            trusted: HashSet::new(),
        })
    }

    /// Skips validation and the secrets scan for `message_type`: for a hot
    /// path whose payloads are always serialized from its checked Rust
    /// type. It must still be registered.
    pub fn trust(mut self, message_type: &str) -> SchemaGuard {
        self.trusted.insert(message_type.to_owned());
        self
    }
}

impl PublishGuard for SchemaGuard {
    fn check(&self, message: &OutgoingMessage) -> Result<()> {
        let e = &message.envelope;
        let refuse = |reason: String| Error::Refused {
            message_type: e.message_type.clone(),
            version: e.version,
            reason,
        };
        let Some(compiled) = self.schemas.get(&(e.message_type.clone(), e.version)) else {
            return Err(refuse(
                "no schema registered for this type and version (run `tidings schema generate`)".to_owned(),
            ));
        };
        if self.trusted.contains(&e.message_type) {
            return Ok(());
        }
        let payload: Value = serde_json::from_slice(&e.payload)
            .map_err(|err| refuse(format!("the payload is not JSON: {err}")))?;
        if let Some(error) = compiled.validator.iter_errors(&payload).next() {
            let at = error.instance_path().to_string();
            let at = if at.is_empty() {
                "the payload".to_owned()
            } else {
                format!("`{at}`")
            };
            return Err(refuse(format!(
                "{at} does not match the registered schema: {error}"
            )));
        }
        if let Some(finding) = secrets::scan_payload(Some(&compiled.schema), &payload)
            .into_iter()
            .next()
        {
            return Err(refuse(finding.to_string()));
        }
        Ok(())
    }
}
