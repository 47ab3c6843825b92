//! A provider as a configuration file describes it (`[[inbox.providers]]`
//! in `tidings.toml`), its secret named by an environment variable or a
//! file, never written in the file.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Deserializer};
use tidings_core::{Error, Result};

use crate::provider::{Provider, secret_from_env, secret_from_file};
use crate::signature::Encoding;
use tidings_core::field::Field;

/// How a configured provider signs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SchemeName {
    /// [`Provider::stripe`].
    Stripe,
    /// [`Provider::github`].
    GitHub,
    /// [`Provider::hmac`].
    Hmac,
    /// [`Provider::cloudevents`]: CloudEvents over HTTP, with a bearer token.
    CloudEvents,
}

/// One `[[inbox.providers]]` entry. Fields left out keep the scheme's
/// defaults ([`Provider::stripe`], [`Provider::github`], [`Provider::hmac`]).
///
/// ```toml
/// [[inbox.providers]]
/// name = "stripe"
/// scheme = "stripe"
/// secret_env = "STRIPE_WEBHOOK_SECRET"
/// topic = "payments"
///
/// [[inbox.providers]]
/// name = "acme"
/// scheme = "hmac"
/// header = "X-Acme-Signature"
/// encoding = "base64"
/// secret_file = "/run/secrets/acme-webhook"
/// event_id = "header:X-Acme-Delivery"
/// message_type = "json:/kind"
/// key = "json:/account"
///
/// [[inbox.providers]]
/// name = "billing"
/// scheme = "cloudevents"
/// secret_env = "BILLING_EVENTS_TOKEN"
/// ```
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderConfig {
    /// The provider's name: its path segment (`POST <path>/<name>`).
    pub name: String,
    /// `stripe`, `github`, `hmac` or `cloudevents`.
    pub scheme: SchemeName,
    /// The environment variable holding the secret.
    pub secret_env: Option<String>,
    /// The file holding the secret (a mounted secret).
    pub secret_file: Option<PathBuf>,
    /// The topic of its events (its name unless set).
    pub topic: Option<String>,
    /// Stripe: how far a signature's timestamp may be from now (`5m`).
    #[serde(default, deserialize_with = "optional_duration")]
    pub tolerance: Option<Duration>,
    /// `hmac`: the header holding the signature.
    pub header: Option<String>,
    /// `hmac`: `hex` (the default) or `base64`.
    pub encoding: Option<Encoding>,
    /// Where the event id is: `header:<name>` or `json:<pointer>`.
    pub event_id: Option<Field>,
    /// The message type: `fixed:<type>`, `header:<name>` or `json:<pointer>`.
    pub message_type: Option<Field>,
    /// The key: `header:<name>`, `json:<pointer>`, or `none` for no key.
    pub key: Option<KeySetting>,
}

/// Where a configured provider's key is, or that it has none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySetting {
    /// No key: deliveries are handled in parallel.
    None,
    /// The key is read here.
    From(Field),
}

impl ProviderConfig {
    /// The provider, its secret read now from the environment or its file.
    pub fn provider(&self) -> Result<Provider> {
        let secret = match (&self.secret_env, &self.secret_file) {
            (Some(var), None) => secret_from_env(var)?,
            (None, Some(path)) => secret_from_file(path)?,
            _ => return Err(self.secret_missing()),
        };
        self.build(secret)
    }

    /// Checks everything but the secret itself (which is read when the
    /// daemon starts): what `tidings run --check` can tell from the file.
    pub fn validate(&self) -> Result<()> {
        if self.secret_env.is_some() == self.secret_file.is_some() {
            return Err(self.secret_missing());
        }
        self.build(tidings_core::secret::Secret::new("checked later"))
            .map(drop)
    }

    fn secret_missing(&self) -> Error {
        Error::Config {
            key: format!("inbox.providers.{}", self.name),
            reason: "give the secret as exactly one of secret_env (an environment variable) \
                     and secret_file (a file); never in this file"
                .into(),
        }
    }

    /// The provider with `secret`.
    fn build(&self, secret: tidings_core::secret::Secret) -> Result<Provider> {
        let key = format!("inbox.providers.{}", self.name);
        let mut provider = match self.scheme {
            SchemeName::Stripe => Provider::stripe(secret),
            SchemeName::GitHub => Provider::github(secret),
            SchemeName::Hmac => {
                let Some(header) = &self.header else {
                    return Err(Error::Config {
                        key,
                        reason: "an hmac provider names the header holding its signature (header = \"X-Signature\")"
                            .into(),
                    });
                };
                Provider::hmac(&self.name, header, secret)
            }
            SchemeName::CloudEvents => {
                // Each event names its own id, type and key.
                for (given, what) in [
                    (self.event_id.is_some(), "event_id"),
                    (self.message_type.is_some(), "message_type"),
                    (self.key.is_some(), "key"),
                ] {
                    if given {
                        return Err(Error::Config {
                            key: format!("inbox.providers.{}.{what}", self.name),
                            reason: "a cloudevents provider reads it from each event".into(),
                        });
                    }
                }
                Provider::cloudevents(&self.name, secret)
            }
        }
        .named(&self.name);
        let not_for = |what: &str, scheme: &str| Error::Config {
            key: format!("inbox.providers.{}.{what}", self.name),
            reason: format!("only {scheme} providers take it"),
        };
        if self.tolerance.is_some() && self.scheme != SchemeName::Stripe {
            return Err(not_for("tolerance", "stripe"));
        }
        if self.scheme != SchemeName::Hmac {
            if self.header.is_some() {
                return Err(not_for("header", "hmac"));
            }
            if self.encoding.is_some() {
                return Err(not_for("encoding", "hmac"));
            }
        }
        provider = provider.topic(self.topic.clone().unwrap_or_else(|| self.name.clone()));
        if let Some(tolerance) = self.tolerance {
            provider = provider.tolerance(tolerance);
        }
        if let Some(encoding) = self.encoding {
            provider = provider.encoding(encoding);
        }
        if let Some(field) = &self.event_id {
            provider = provider.event_id(field.clone());
        }
        if let Some(field) = &self.message_type {
            provider = provider.message_type(field.clone());
        }
        match &self.key {
            Some(KeySetting::None) => provider = provider.key(None),
            Some(KeySetting::From(field)) => provider = provider.key(Some(field.clone())),
            None => {}
        }
        provider.check()?;
        Ok(provider)
    }
}

impl<'de> Deserialize<'de> for KeySetting {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<KeySetting, D::Error> {
        let text = String::deserialize(d)?;
        if text == "none" {
            return Ok(KeySetting::None);
        }
        text.parse()
            .map(KeySetting::From)
            .map_err(serde::de::Error::custom)
    }
}

fn optional_duration<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<Option<Duration>, D::Error> {
    tidings_core::duration::deserialize(d).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::signature::Scheme;

    fn read(text: &str) -> std::result::Result<ProviderConfig, String> {
        toml::from_str(text).map_err(|e| e.to_string())
    }

    #[test]
    fn a_configured_provider_keeps_its_scheme_defaults_and_takes_overrides() {
        // A variable nothing sets.
        let var = "TIDINGS_INBOX_TEST_SECRET_A";
        let path = std::env::temp_dir().join(format!("tidings-inbox-secret-{}", uuid::Uuid::new_v4()));
        std::fs::write(&path, "whsec_from_file\n").unwrap();
        let config = read(&format!(
            "name = \"stripe-eu\"\nscheme = \"stripe\"\nsecret_file = {:?}\ntopic = \"payments\"\ntolerance = \"1m\"\n",
            path.display().to_string()
        ))
        .unwrap();
        let provider = config.provider().unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(provider.name(), "stripe-eu");
        assert_eq!(provider.topic, "payments");
        assert_eq!(
            provider.scheme,
            Scheme::Stripe {
                tolerance: Duration::from_secs(60)
            }
        );
        assert_eq!(provider.secrets[0].expose(), "whsec_from_file");
        assert_eq!(provider.event_id, Field::json("/id"));

        let config = read(&format!(
            "name = \"acme\"\nscheme = \"hmac\"\nheader = \"X-Sig\"\nencoding = \"base64\"\nsecret_env = \"{var}\"\n\
             event_id = \"header:X-Delivery\"\nmessage_type = \"fixed:AcmeEvent\"\nkey = \"none\"\n"
        ))
        .unwrap();
        let missing = config.provider().unwrap_err().to_string();
        assert!(missing.contains(var) && missing.contains("not set"), "{missing}");

        let config =
            read("name = \"billing\"\nscheme = \"cloudevents\"\nsecret_env = \"X\"\ntopic = \"invoices\"\n")
                .unwrap();
        config.validate().unwrap();
        let provider = config.build(tidings_core::secret::Secret::new("token")).unwrap();
        assert_eq!(provider.scheme, Scheme::Bearer);
        assert_eq!(provider.topic, "invoices");
        let typed = read(
            "name = \"billing\"\nscheme = \"cloudevents\"\nsecret_env = \"X\"\nmessage_type = \"fixed:A\"\n",
        )
        .unwrap();
        let refused = typed.validate().unwrap_err().to_string();
        assert!(
            refused.contains("message_type") && refused.contains("reads it from each event"),
            "{refused}"
        );
    }

    #[test]
    fn mistakes_are_named() {
        for (text, expected) in [
            (
                "name = \"a\"\nscheme = \"paypal\"\nsecret_env = \"X\"\n",
                "unknown variant",
            ),
            (
                "name = \"a\"\nscheme = \"hmac\"\nsecret_env = \"X\"\nevent_id = \"/id\"\n",
                "is not a field",
            ),
            (
                "name = \"a\"\nscheme = \"stripe\"\nsecret = \"whsec_x\"\n",
                "unknown field `secret`",
            ),
        ] {
            let err = read(text).unwrap_err();
            assert!(err.contains(expected), "{text}: {err}");
        }
        let both =
            read("name = \"a\"\nscheme = \"stripe\"\nsecret_env = \"X\"\nsecret_file = \"/x\"\n").unwrap();
        assert!(
            both.provider()
                .unwrap_err()
                .to_string()
                .contains("exactly one of secret_env")
        );
        let no_header = read("name = \"a\"\nscheme = \"hmac\"\nsecret_file = \"/nonexistent\"\n").unwrap();
        assert!(
            no_header
                .provider()
                .unwrap_err()
                .to_string()
                .contains("cannot be read")
        );
    }
}
