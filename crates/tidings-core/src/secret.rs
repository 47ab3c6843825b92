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

/// Query parameters whose values are secrets, compared without regard to case.
const SECRET_PARAMETERS: [&str; 5] = ["password", "sslpassword", "token", "secret", "sslkey"];

/// A URL fit to print: the password of its userinfo is taken out
/// (`scheme://user:password@host` -> `scheme://user@host`), so is a NATS
/// token (`nats://token@host` -> `nats://host`, also for `tls://`), and the
/// values of the query parameters `password`, `sslpassword`, `token`,
/// `secret` and `sslkey` (in any case) become `***`. Everything else comes
/// back unchanged, and so does a URL without any of these.
///
/// The URL is read as every client reads it (the authority ends at the
/// first `/`, `?` or `#`, the userinfo at its last `@`), with one
/// exception: a password holding an unencoded `?` or `#` (`u:pa?ss@host`,
/// which a client reads as host `u` with a bad port) is still hidden, up to
/// the last `@` of all, and whatever follows is then read as a query. A
/// hidden password is never given back, at the price of printing such a
/// malformed URL oddly.
///
/// ```
/// use tidings_core::secret::redact_url;
/// assert_eq!(redact_url("postgres://app:hunter2@db:5432/shop"), "postgres://app@db:5432/shop");
/// assert_eq!(redact_url("nats://127.0.0.1:4222"), "nats://127.0.0.1:4222");
/// assert_eq!(
///     redact_url("postgres://app@db/shop?sslmode=require&sslpassword=hunter2"),
///     "postgres://app@db/shop?sslmode=require&sslpassword=***"
/// );
/// ```
pub fn redact_url(url: &str) -> String {
    let parts = Parts::of(url);
    let mut out = String::with_capacity(url.len());
    out.push_str(parts.scheme);
    match parts.userinfo {
        Some(Userinfo::User(user)) => {
            out.push_str(user);
            out.push('@');
        }
        Some(Userinfo::Hidden) => {}
        None => {}
    }
    out.push_str(parts.before_query);
    for (i, pair) in parts.query.split('&').enumerate() {
        if i > 0 {
            out.push('&');
        }
        match pair.split_once('=') {
            Some((key, _value)) if is_secret_parameter(key) => {
                out.push_str(key);
                out.push_str("=***");
            }
            _ => out.push_str(pair),
        }
    }
    out.push_str(parts.fragment);
    out
}

/// Whether `url` carries a password: in its userinfo
/// (`scheme://user:password@host`) or as a secret query parameter
/// (`?password=...`, the ones [`redact_url`] hides). It reads the URL as
/// [`redact_url`] does, so the two always agree.
///
/// ```
/// use tidings_core::secret::has_password;
/// assert!(has_password("amqp://guest:guest@127.0.0.1:5672/%2f"));
/// assert!(has_password("postgres://app@db/shop?sslmode=require&password=pw"));
/// assert!(!has_password("postgres://app@db/shop?sslmode=require"));
/// ```
pub fn has_password(url: &str) -> bool {
    let parts = Parts::of(url);
    parts.password_in_userinfo
        || parts
            .query
            .split('&')
            .filter_map(|pair| pair.split_once('='))
            .any(|(key, _)| is_secret_parameter(key))
}

fn is_secret_parameter(key: &str) -> bool {
    SECRET_PARAMETERS.iter().any(|s| key.eq_ignore_ascii_case(s))
}

/// What of a userinfo is printed.
enum Userinfo<'a> {
    /// The user name alone.
    User(&'a str),
    /// Nothing: a token, or a user name that cannot be told from its password.
    Hidden,
}

/// A URL cut where [`redact_url`] and [`has_password`] look.
struct Parts<'a> {
    /// `scheme://`, or empty when the URL has no scheme.
    scheme: &'a str,
    userinfo: Option<Userinfo<'a>>,
    password_in_userinfo: bool,
    /// The host(s), port(s) and path, with the `?` that ends them.
    before_query: &'a str,
    /// The query, without its `?`.
    query: &'a str,
    /// `#` and what follows it.
    fragment: &'a str,
}

impl<'a> Parts<'a> {
    fn of(url: &'a str) -> Parts<'a> {
        let (scheme, rest) = match scheme_end(url) {
            Some(end) => url.split_at(end),
            None => ("", url),
        };
        let token = ["nats://", "tls://"]
            .iter()
            .any(|t| scheme.eq_ignore_ascii_case(t));
        let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let query_start = rest.find(['?', '#']).unwrap_or(rest.len());
        let at = if scheme.is_empty() {
            None
        } else if let Some(at) = rest[..authority_end].rfind('@') {
            Some(at)
        } else {
            // An unencoded `/`, `?` or `#` in a password or token: the
            // userinfo runs to the last `@` of all, unless what stands
            // before it reads as hosts and ports (`db:5432/a?to=x@y`).
            let head = &rest[..query_start];
            let password = head.find(':').is_some_and(|colon| !head[..colon].contains('/'));
            rest.rfind('@')
                .filter(|_| (password && !is_host_list(rest)) || (token && !password && !head.contains('/')))
        };
        let Some(at) = at else {
            return Parts::after_userinfo(scheme, None, false, rest);
        };
        let userinfo = &rest[..at];
        let (shown, password) = match userinfo.split_once(':') {
            Some((user, _)) if !user.contains(['/', '?', '#']) => (Userinfo::User(user), true),
            Some(_) => (Userinfo::Hidden, true),
            None if token => (Userinfo::Hidden, false),
            None => (Userinfo::User(userinfo), false),
        };
        let parts = Parts::after_userinfo(scheme, Some(shown), password, &rest[at + 1..]);
        // The `?` or `#` was the password's: what follows the `@` may hold
        // the query already (`u:p?w@db/x?a=b@c&password=...`).
        if at > query_start && parts.query.is_empty() && parts.before_query.contains('=') {
            return Parts {
                before_query: "",
                query: parts.before_query,
                ..parts
            };
        }
        parts
    }

    fn after_userinfo(
        scheme: &'a str,
        userinfo: Option<Userinfo<'a>>,
        password_in_userinfo: bool,
        rest: &'a str,
    ) -> Parts<'a> {
        let (rest, fragment) = match rest.find('#') {
            Some(f) => rest.split_at(f),
            None => (rest, ""),
        };
        let (before_query, query) = match rest.find('?') {
            Some(q) => (&rest[..=q], &rest[q + 1..]),
            None => (rest, ""),
        };
        Parts {
            scheme,
            userinfo,
            password_in_userinfo,
            before_query,
            query,
            fragment,
        }
    }
}

/// Where the authority starts (just after `scheme://`), if `url` has a scheme.
fn scheme_end(url: &str) -> Option<usize> {
    let colon = url.find("://")?;
    let scheme = &url[..colon];
    let mut chars = scheme.chars();
    let valid = chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    valid.then_some(colon + 3)
}

/// Whether `text` starts with one host or a comma-separated list of them
/// (names, or IPv6 addresses in brackets), each with an optional `:port`,
/// then ends or goes on with `/`, `?` or `#`: an authority without
/// userinfo, whose `@` is the path's or the query's.
fn is_host_list(text: &str) -> bool {
    let mut rest = text;
    loop {
        rest = match rest.strip_prefix('[') {
            Some(v6) => match v6.find(']') {
                Some(end) if is_ipv6(&v6[..end]) => &v6[end + 1..],
                _ => return false, // `[:p/w@host`: a user name, not an address
            },
            None => rest.trim_start_matches(|c| !matches!(c, ':' | '/' | '?' | '#' | '@' | '[' | ',')),
        };
        if let Some(port) = rest.strip_prefix(':') {
            let after = port.trim_start_matches(|c: char| c.is_ascii_digit());
            if after.len() == port.len() {
                return false; // `user:/pw@host`: no port, so a password
            }
            rest = after;
        }
        match rest.strip_prefix(',') {
            Some(next) => rest = next,
            None => return rest.is_empty() || rest.starts_with(['/', '?', '#']),
        }
    }
}

/// Whether `text` is an IPv6 address, with or without a zone (`%eth0`).
fn is_ipv6(text: &str) -> bool {
    let address = text.split('%').next().unwrap_or(text);
    address.parse::<std::net::Ipv6Addr>().is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn userinfo_passwords_are_taken_out() {
        assert_eq!(
            redact_url("amqp://guest:secret@127.0.0.1:5672/%2f"),
            "amqp://guest@127.0.0.1:5672/%2f"
        );
        assert_eq!(redact_url("postgres://:pw@db/shop"), "postgres://@db/shop");
        assert_eq!(
            redact_url("nats://me:pw@127.0.0.1:4222"),
            "nats://me@127.0.0.1:4222"
        );
        // Unencoded `@`, `/`, `?` or `#` in the password: still hidden.
        assert_eq!(redact_url("amqp://u:p@ss@host/%2f"), "amqp://u@host/%2f");
        assert_eq!(redact_url("amqp://u:pa/ss@host/%2f"), "amqp://u@host/%2f");
        assert_eq!(redact_url("amqp://u:pa?ss@host/%2f"), "amqp://u@host/%2f");
        assert_eq!(redact_url("amqp://u:pa#ss@host"), "amqp://u@host");
        // Found by the url_redaction fuzz target: `/` and `?` together.
        assert_eq!(redact_url("postgres://res::///?=U@U/"), "postgres://res@U/");
        assert_eq!(redact_url("amqp://u:p/a?b@host/%2f"), "amqp://u@host/%2f");
        assert_eq!(redact_url("postgres://u:12345@db/shop"), "postgres://u@db/shop");
        // Every client reads host `g` here: the password is empty.
        assert_eq!(redact_url("amqp://{:@g/?ooo@/"), "amqp://{@g/?ooo@/");
        assert_eq!(redact_url("amqp://ysql:/ooooo@/"), "amqp://ysql@/");
        assert_eq!(redact_url("amqp://[:p/:[]/:?@/?="), "amqp://[@/?=");
        assert_eq!(redact_url("sqlite://[:]/?v:Ta@@@@@/?="), "sqlite://[@/?=");
        // A password in the query holding `:` and `@`, and one with no path before it.
        assert_eq!(
            redact_url("amqp://h/v?sslpassword=@/o$:A@=b"),
            "amqp://h/v?sslpassword=***"
        );
        assert_eq!(
            redact_url("amqp://host?password=p@ss"),
            "amqp://host?password=***"
        );
        assert_eq!(
            redact_url("postgres://u:p?w@db/shop?a=me@corp&sslpassword=x"),
            "postgres://u@corp&sslpassword=***"
        );
        assert_eq!(redact_url("nats://tok?en@host:4222"), "nats://host:4222");
        // An `@` in the query after a password is the query's.
        assert_eq!(
            redact_url("postgres://app:pw@db/shop?application_name=me@corp&sslpassword=hunter2"),
            "postgres://app@db/shop?application_name=me@corp&sslpassword=***"
        );
        assert_eq!(
            redact_url("postgres://db.internal?user=app@corp&password=hunter2"),
            "postgres://db.internal?user=app@corp&password=***"
        );
    }

    #[test]
    fn an_at_sign_after_the_host_is_not_userinfo() {
        for url in [
            "postgres://db:5432/shop?application_name=a@b",
            "postgres://[::1]:5432/shop?application_name=a@b",
            "postgres://db/shop?application_name=a@b",
            "postgres://db?application_name=a@b",
            "postgres://db:5432?application_name=a@b",
            "postgres://app@db:5432/shop?application_name=me@corp",
            "postgres://h1:5432,h2:5432/shop?application_name=a@b",
            "amqp://guest@127.0.0.1:5672/%2f?x=a@b",
        ] {
            assert_eq!(redact_url(url), url);
            assert!(!has_password(url), "{url}");
        }
    }

    #[test]
    fn nats_tokens_are_taken_out() {
        assert_eq!(
            redact_url("nats://s3cret@127.0.0.1:4222"),
            "nats://127.0.0.1:4222"
        );
        assert_eq!(
            redact_url("TLS://s3cret@nats.example:4222"),
            "TLS://nats.example:4222"
        );
        // Elsewhere a lone userinfo is a user name.
        assert_eq!(redact_url("postgres://app@db/shop"), "postgres://app@db/shop");
    }

    #[test]
    fn secret_query_values_are_hidden() {
        assert_eq!(
            redact_url("postgres://db/shop?password=hunter2&sslmode=require"),
            "postgres://db/shop?password=***&sslmode=require"
        );
        assert_eq!(
            redact_url(
                "postgres://app@db/shop?sslmode=verify-full&SSLPassword=a&sslkey=/k.pem&Token=t&secret=s#top"
            ),
            "postgres://app@db/shop?sslmode=verify-full&SSLPassword=***&sslkey=***&Token=***&secret=***#top"
        );
        assert_eq!(
            redact_url("postgres://db/shop?password="),
            "postgres://db/shop?password=***"
        );
        // Both forms at once.
        assert_eq!(
            redact_url("postgres://app:pw@db/shop?token=t"),
            "postgres://app@db/shop?token=***"
        );
        // A name that only contains a secret one is not secret.
        assert_eq!(
            redact_url("postgres://db/shop?password_file=/run/pw&passwords"),
            "postgres://db/shop?password_file=/run/pw&passwords"
        );
        // No scheme: the query is still looked at.
        assert_eq!(redact_url("db/shop?password=pw"), "db/shop?password=***");
    }

    #[test]
    fn urls_without_secrets_come_back_unchanged() {
        for url in [
            "nats://127.0.0.1:4222",
            "kafka://a:9092,b:9092",
            "127.0.0.1:9092",
            "amqp://guest@127.0.0.1:5672/%2f",
            "postgres://postgres@127.0.0.1:5432/test?sslmode=disable&application_name=tidings",
            "postgres://db:5432/shop?options=a@b",
            "sqlite://data.db",
            "sqlite::memory:",
            "log",
            "",
        ] {
            assert_eq!(redact_url(url), url);
        }
    }
}
