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
/// Passwords holding a `/`, `@`, `?` or `#` that is not percent-encoded
/// are still hidden: with a password, the userinfo is taken to end at the
/// last `@` of all (unless the `:` is a port's: `host:5432/db?to=a@b` has
/// no userinfo). A hidden password is never given back, at the price of
/// printing such a malformed URL oddly, and of hiding the host of a URL
/// whose query holds an `@` after a password.
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
    let (head, rest) = match scheme_end(url) {
        Some(end) => url.split_at(end),
        None => ("", url),
    };
    let scheme = head.strip_suffix("://").unwrap_or("");
    let mut out = String::with_capacity(url.len());
    out.push_str(head);
    let after_userinfo = match (!head.is_empty()).then(|| userinfo_end(rest)).flatten() {
        Some(at) => {
            let userinfo = &rest[..at];
            match userinfo.split_once(':') {
                Some((user, _password)) if !user.contains(['/', '?', '#']) => {
                    out.push_str(user);
                    out.push('@');
                }
                // What holds a `?` or `#` may hold a query's secret
                // (`host?password=p@ss`): none of it is printed.
                Some(_) => {}
                None if userinfo.contains(['?', '#']) => {}
                // A NATS URL's lone userinfo is a token, not a user name.
                None if scheme.eq_ignore_ascii_case("nats") || scheme.eq_ignore_ascii_case("tls") => {}
                None => {
                    out.push_str(userinfo);
                    out.push('@');
                }
            }
            &rest[at + 1..]
        }
        None => rest,
    };
    let (before_query, query) = match after_userinfo.find('?') {
        Some(q) => after_userinfo.split_at(q + 1),
        None => (after_userinfo, ""),
    };
    out.push_str(before_query);
    let (query, fragment) = match query.find('#') {
        Some(f) => query.split_at(f),
        None => (query, ""),
    };
    for (i, pair) in query.split('&').enumerate() {
        if i > 0 {
            out.push('&');
        }
        match pair.split_once('=') {
            Some((key, _value)) if SECRET_PARAMETERS.iter().any(|s| key.eq_ignore_ascii_case(s)) => {
                out.push_str(key);
                out.push_str("=***");
            }
            _ => out.push_str(pair),
        }
    }
    out.push_str(fragment);
    out
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

/// The `@` that ends the userinfo of `rest` (what follows `scheme://`), if any.
///
/// Unencoded `@`, `/`, `?` and `#` in a password make a URL ambiguous; the
/// reading that hides more wins: a `:` before the last `@` that does not
/// start a port (`host:5432/db?to=a@b`) makes all of it userinfo.
fn userinfo_end(rest: &str) -> Option<usize> {
    let at = rest.rfind('@')?;
    let userinfo = &rest[..at];
    // A user name holds no `/`, `?` or `#`: a `:` after one is the path's
    // or the query's.
    if let Some(colon) = userinfo.find(':')
        && !userinfo[..colon].contains(['/', '?', '#'])
    {
        return (!starts_with_host_and_port(userinfo)).then_some(at);
    }
    let query = rest.find(['?', '#']).unwrap_or(rest.len());
    // `user?x@host`: an unencoded `?` or `#` in a lone user name or token.
    // A path (`host/db?to=a@b`) means the `@` is the query's.
    rest[..query]
        .rfind('@')
        .or_else(|| (!rest[..query].contains('/')).then_some(at))
}

/// Whether `text` starts with a host (a name, or an IPv6 address in
/// brackets), an optional `:port`, then `/`, `?` or `#`: an authority
/// without userinfo, whose `@` is the path's or the query's.
fn starts_with_host_and_port(text: &str) -> bool {
    let after_host = match text.strip_prefix('[') {
        Some(v6) => match v6.find(']') {
            Some(end) if is_ipv6(&v6[..end]) => &v6[end + 1..],
            _ => return false, // `[:p/w@host`: a user name, not an address
        },
        None => text.trim_start_matches(|c| !matches!(c, ':' | '/' | '?' | '#' | '@' | '[')),
    };
    let after_port = match after_host.strip_prefix(':') {
        Some(port) => {
            let rest = port.trim_start_matches(|c: char| c.is_ascii_digit());
            if rest.len() == port.len() {
                return false; // `user:/pw@host`: no port, so a password
            }
            rest
        }
        None => after_host,
    };
    after_port.starts_with(['/', '?', '#'])
}

/// Whether `text` is an IPv6 address, with or without a zone (`%eth0`).
fn is_ipv6(text: &str) -> bool {
    let address = text.split('%').next().unwrap_or(text);
    address.parse::<std::net::Ipv6Addr>().is_ok()
}

/// Whether `url` carries a password: in its userinfo
/// (`scheme://user:password@host`) or as a secret query parameter
/// (`?password=...`, the ones [`redact_url`] hides).
///
/// ```
/// use tidings_core::secret::has_password;
/// assert!(has_password("amqp://guest:guest@127.0.0.1:5672/%2f"));
/// assert!(has_password("postgres://app@db/shop?sslmode=require&password=pw"));
/// assert!(!has_password("postgres://app@db/shop?sslmode=require"));
/// ```
pub fn has_password(url: &str) -> bool {
    // The userinfo as `redact_url` finds it, so the two always agree.
    let in_userinfo = scheme_end(url).is_some_and(|start| {
        let rest = &url[start..];
        userinfo_end(rest).is_some_and(|at| rest[..at].contains(':'))
    });
    let query = url.split_once('?').map_or("", |(_, q)| q);
    let query = query.split_once('#').map_or(query, |(q, _)| q);
    in_userinfo
        || query
            .split('&')
            .filter_map(|pair| pair.split_once('='))
            .any(|(key, _)| SECRET_PARAMETERS.iter().any(|s| key.eq_ignore_ascii_case(s)))
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
        assert_eq!(redact_url("amqp://{:@g/?ooo@/"), "amqp://{@/");
        assert_eq!(redact_url("amqp://ysql:/ooooo@/"), "amqp://ysql@/");
        assert_eq!(redact_url("amqp://[:p/:[]/:?@/?="), "amqp://[@/?=");
        assert_eq!(redact_url("sqlite://[:]/?v:Ta@@@@@/?="), "sqlite://[@/?=");
        // A password in the query holding `:` and `@`, and one with no path before it.
        assert_eq!(
            redact_url("amqp://h/v?sslpassword=@/o$:A@=b"),
            "amqp://h/v?sslpassword=***"
        );
        assert_eq!(redact_url("amqp://host?password=p@ss"), "amqp://ss");
        // The reading that hides more wins.
        assert_eq!(redact_url("postgres://u:pw@db/shop?to=a@b"), "postgres://u@b");
    }

    #[test]
    fn an_at_sign_after_the_host_is_not_userinfo() {
        for url in [
            "postgres://db:5432/shop?application_name=a@b",
            "postgres://[::1]:5432/shop?application_name=a@b",
            "postgres://db/shop?application_name=a@b",
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
