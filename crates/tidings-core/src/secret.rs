//! Keeping credentials out of logs, `Debug` output and error messages.

use std::fmt;

/// A value that must never be printed: its `Debug` and `Display` show
/// `***`. Read it with [`Secret::expose`] where it is used.
#[derive(Clone, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// Wraps `value`.
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The value itself, for the one place that needs it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// `scheme://user:password@host/path` -> `scheme://user@host/path`: a URL
/// fit to print. URLs without a password come back unchanged.
///
/// ```
/// use tidings_core::secret::redact_url;
/// assert_eq!(redact_url("postgres://app:hunter2@db:5432/shop"), "postgres://app@db:5432/shop");
/// assert_eq!(redact_url("nats://127.0.0.1:4222"), "nats://127.0.0.1:4222");
/// ```
pub fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            let user = userinfo.split(':').next().unwrap_or("");
            format!("{}{}{}", &url[..scheme + 3], user, &url[at..])
        }
        _ => url.to_owned(),
    }
}

/// Whether `url` carries a password (`scheme://user:password@host`).
///
/// ```
/// use tidings_core::secret::has_password;
/// assert!(has_password("amqp://guest:guest@127.0.0.1:5672/%2f"));
/// assert!(!has_password("postgres://app@db/shop"));
/// ```
pub fn has_password(url: &str) -> bool {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => url[scheme + 3..at].contains(':'),
        _ => false,
    }
}
