//! A webhook provider: how it signs, where its event id, type and key are,
//! and the topic its deliveries become events on.

use std::path::Path;
use std::time::Duration;

use tidings_core::field::Field;
use tidings_core::secret::Secret;
use tidings_core::{Error, Result};

use crate::signature::{Encoding, Scheme};

/// A webhook provider the inbox accepts deliveries from, at
/// `POST <mount>/<name>`.
///
/// [`Provider::stripe`] and [`Provider::github`] know their provider;
/// [`Provider::hmac`] is any provider that signs the body with an
/// HMAC-SHA256 header. Every delivery becomes one event on the provider's
/// topic (its name unless set), of the type, key and id read from the
/// delivery.
#[derive(Debug, Clone)]
pub struct Provider {
    pub(crate) name: String,
    pub(crate) scheme: Scheme,
    pub(crate) secrets: Vec<Secret>,
    pub(crate) topic: String,
    pub(crate) event_id: Field,
    pub(crate) message_type: Field,
    pub(crate) key: Option<Field>,
    pub(crate) reads: Reads,
}

/// What a provider's deliveries are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reads {
    /// A webhook: one event per delivery, its id, type and key read where
    /// the provider's fields say.
    Webhook,
    /// CloudEvents over HTTP, as the HTTP protocol binding writes them:
    /// binary mode (`ce-` headers), structured mode
    /// (`application/cloudevents+json`) or a batch
    /// (`application/cloudevents-batch+json`).
    CloudEvents,
}

impl Provider {
    /// Stripe, named `stripe`: the `Stripe-Signature` scheme with a
    /// five-minute tolerance; the event id is the body's `/id` (`evt_...`),
    /// the type its `/type` (`payment_intent.succeeded`), the key the
    /// object's id (`/data/object/id`), so that the events of one payment
    /// are handled in order.
    pub fn stripe(secret: Secret) -> Provider {
        Provider {
            name: "stripe".into(),
            scheme: Scheme::Stripe {
                tolerance: Duration::from_secs(300),
            },
            secrets: vec![secret],
            topic: "stripe".into(),
            event_id: Field::json("/id"),
            message_type: Field::json("/type"),
            key: Some(Field::json("/data/object/id")),
            reads: Reads::Webhook,
        }
    }

    /// GitHub, named `github`: `X-Hub-Signature-256`; the event id is the
    /// `X-GitHub-Delivery` header (kept by GitHub's redeliveries), the type
    /// the `X-GitHub-Event` header (`push`), the key the repository
    /// (`/repository/full_name`).
    pub fn github(secret: Secret) -> Provider {
        Provider {
            name: "github".into(),
            scheme: Scheme::GitHub,
            secrets: vec![secret],
            topic: "github".into(),
            event_id: Field::header("x-github-delivery"),
            message_type: Field::header("x-github-event"),
            key: Some(Field::json("/repository/full_name")),
            reads: Reads::Webhook,
        }
    }

    /// A provider named `name` that signs the body with HMAC-SHA256 in the
    /// header `header` (hex, `sha256=` prefix optional; see
    /// [`Provider::encoding`]). The event id is the body's `/id` and the
    /// type is `name` until set; deliveries have no key (they are handled
    /// in parallel) until one is set.
    pub fn hmac(name: impl Into<String>, header: impl Into<String>, secret: Secret) -> Provider {
        let name = name.into();
        Provider {
            scheme: Scheme::Hmac {
                header: header.into().to_ascii_lowercase(),
                encoding: Encoding::Hex,
            },
            secrets: vec![secret],
            topic: name.clone(),
            event_id: Field::json("/id"),
            message_type: Field::Fixed(name.clone()),
            key: None,
            reads: Reads::Webhook,
            name,
        }
    }

    /// Another service delivering CloudEvents over HTTP, named `name`,
    /// authenticated by a shared token (`Authorization: Bearer <token>`;
    /// serve the inbox over TLS). Every mode of the HTTP protocol binding
    /// is read: binary (`ce-` headers, values percent-decoded), structured
    /// (`application/cloudevents+json`) and batches
    /// (`application/cloudevents-batch+json`, all of a batch in one
    /// transaction). Each event keeps what its producer wrote (its
    /// `source`, `id`, `type`, key, `time`, extensions and data) and is
    /// taken once per (`source`, `id`), as the spec defines uniqueness. A
    /// UUID `id` stays the event's message id, which consumers deduplicate
    /// on: one another source used already is refused (`409`). Batches
    /// carry at most [`MAX_BATCH_EVENTS`](crate::MAX_BATCH_EVENTS) events.
    pub fn cloudevents(name: impl Into<String>, token: Secret) -> Provider {
        let name = name.into();
        Provider {
            scheme: Scheme::Bearer,
            secrets: vec![token],
            topic: name.clone(),
            event_id: Field::json("/id"),
            message_type: Field::json("/type"),
            key: None,
            reads: Reads::CloudEvents,
            name,
        }
    }

    /// Renames the provider: its path segment, and its name in the inbox
    /// table and in metrics (two Stripe accounts are two providers).
    pub fn named(mut self, name: impl Into<String>) -> Provider {
        self.name = name.into();
        self
    }

    /// The topic deliveries are enqueued to.
    pub fn topic(mut self, topic: impl Into<String>) -> Provider {
        self.topic = topic.into();
        self
    }

    /// Where the provider's event id is: what makes a retried delivery a
    /// duplicate.
    pub fn event_id(mut self, field: Field) -> Provider {
        self.event_id = field;
        self
    }

    /// The message type of the events (a [`Field::Fixed`] name, or read
    /// from the delivery).
    pub fn message_type(mut self, field: Field) -> Provider {
        self.message_type = field;
        self
    }

    /// Where the aggregate key is, or `None` for no key (no order).
    pub fn key(mut self, field: Option<Field>) -> Provider {
        self.key = field;
        self
    }

    /// Accepts signatures made with `secret` as well: during a rotation,
    /// both the old and the new secret verify.
    pub fn also_secret(mut self, secret: Secret) -> Provider {
        self.secrets.push(secret);
        self
    }

    /// How far a Stripe signature's timestamp may be from now (five
    /// minutes unless set). Other schemes carry no timestamp.
    pub fn tolerance(mut self, tolerance: Duration) -> Provider {
        if let Scheme::Stripe { tolerance: t } = &mut self.scheme {
            *t = tolerance;
        }
        self
    }

    /// How a generic HMAC signature is written (hex unless set).
    pub fn encoding(mut self, encoding: Encoding) -> Provider {
        if let Scheme::Hmac { encoding: e, .. } = &mut self.scheme {
            *e = encoding;
        }
        self
    }

    /// The provider's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The `source` of its events (`inbox/stripe`).
    pub fn source(&self) -> String {
        format!("inbox/{}", self.name)
    }

    /// Whether the event id is outside what the signature covers (a
    /// header): then a signed body could be replayed under a new id.
    pub(crate) fn id_unsigned(&self) -> bool {
        self.reads == Reads::Webhook && matches!(self.event_id, Field::Header(_))
    }

    /// Why this provider cannot serve, if it cannot.
    pub(crate) fn check(&self) -> Result<()> {
        let refuse = |reason: String| {
            Err(Error::Config {
                key: format!("inbox provider {:?}", self.name),
                reason,
            })
        };
        let name_ok = !self.name.is_empty()
            && self.name.len() <= 64
            && self
                .name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
        if !name_ok {
            return refuse("a provider's name is 1 to 64 of a-z, 0-9, - and _ (it is a path segment)".into());
        }
        if self.secrets.iter().any(|s| s.expose().is_empty()) {
            return refuse("its secret is empty".into());
        }
        if self.topic.is_empty() {
            return refuse("its topic is empty".into());
        }
        if matches!(self.event_id, Field::Fixed(_)) {
            return refuse("its event id must be read from each delivery (a header or a body field)".into());
        }
        if let Scheme::Hmac { header, .. } = &self.scheme
            && axum::http::HeaderName::try_from(header.as_str()).is_err()
        {
            return refuse(format!("{header:?} is not a header name"));
        }
        Ok(())
    }
}

/// A webhook secret from the environment variable `name`.
///
/// Secrets are read from the environment or a file, never written in a
/// configuration file.
pub fn secret_from_env(name: &str) -> Result<Secret> {
    let is_name = name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !is_name {
        // Never echoed: it may be the secret itself, written by mistake.
        return Err(Error::Config {
            key: "secret_env".into(),
            reason: "this is not the name of an environment variable (letters, digits and _): \
                     give the variable's name, and the secret in that variable"
                .into(),
        });
    }
    match std::env::var(name) {
        Ok(value) if !value.trim().is_empty() => Ok(Secret::new(value.trim())),
        Ok(_) => Err(Error::Config {
            key: name.into(),
            reason: "the environment variable holding a webhook secret is empty".into(),
        }),
        Err(_) => Err(Error::Config {
            key: name.into(),
            reason: "the environment variable holding a webhook secret is not set (or not UTF-8)".into(),
        }),
    }
}

/// A webhook secret from the file at `path` (a mounted secret), without its
/// trailing newline.
pub fn secret_from_file(path: &Path) -> Result<Secret> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::Config {
        key: path.display().to_string(),
        reason: format!("the file holding a webhook secret cannot be read: {e}"),
    })?;
    let secret = text.trim();
    if secret.is_empty() {
        return Err(Error::Config {
            key: path.display().to_string(),
            reason: "the file holding a webhook secret is empty".into(),
        });
    }
    Ok(Secret::new(secret))
}
