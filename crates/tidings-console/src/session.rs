//! Signing in to the pages: a browser cannot send a bearer token with a
//! link or a form, so the sign-in form takes one and opens a session. The
//! browser holds only the session's random id, in a cookie scripts cannot
//! read and other sites cannot send (`HttpOnly`, `SameSite=Strict`); each
//! form that changes something also carries the session's own random
//! anti-forgery token, checked on arrival. A sign-in or sign-out whose
//! `Origin` header names another site than the console is refused, and the
//! cookie is `Secure` when the browser says (by its `Origin` or `Referer`)
//! that it reached the console over https. Sessions live in memory for
//! [`SESSION_TTL`] and end with the process.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::HeaderMap;
use axum::http::header::{COOKIE, HOST, ORIGIN, REFERER};

use crate::access::Caller;

/// The session cookie's name.
pub const COOKIE_NAME: &str = "tidings_console";

/// How long a session lasts.
pub(crate) const SESSION_TTL: Duration = Duration::from_secs(8 * 3600);

/// Sessions open at once at most: past it, the oldest is closed.
const MAX_SESSIONS: usize = 1024;

/// Sessions one token's holder has open at once at most: past it, their
/// oldest is closed.
const MAX_SESSIONS_EACH: usize = 16;

/// A signed-in browser.
#[derive(Debug, Clone)]
pub(crate) struct Session {
    /// Who signed in.
    pub(crate) caller: Caller,
    /// The token its forms carry.
    pub(crate) csrf: String,
    opened: Instant,
}

/// The open sessions, by id.
#[derive(Debug, Clone, Default)]
pub(crate) struct Sessions(Arc<Mutex<HashMap<String, Session>>>);

/// 256 random bits, in hex.
fn random_id() -> String {
    format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

impl Sessions {
    /// Opens a session for `caller`; returns its id.
    pub(crate) fn open(&self, caller: Caller) -> String {
        let id = random_id();
        let mut sessions = self.0.lock().unwrap_or_else(|e| e.into_inner());
        sessions.retain(|_, s| s.opened.elapsed() < SESSION_TTL);
        // Their own oldest first, so that signing in again and again closes
        // no one else's session; else the oldest of all.
        let theirs_full =
            sessions.values().filter(|s| s.caller.name == caller.name).count() >= MAX_SESSIONS_EACH;
        if (theirs_full || sessions.len() >= MAX_SESSIONS)
            && let Some(oldest) = sessions
                .iter()
                .filter(|(_, s)| !theirs_full || s.caller.name == caller.name)
                .min_by_key(|(_, s)| s.opened)
                .map(|(id, _)| id.clone())
        {
            sessions.remove(&oldest);
        }
        sessions.insert(
            id.clone(),
            Session {
                caller,
                csrf: random_id(),
                opened: Instant::now(),
            },
        );
        id
    }

    /// The live session whose cookie `headers` carry, if any.
    pub(crate) fn of(&self, headers: &HeaderMap) -> Option<Session> {
        let id = cookie(headers, COOKIE_NAME)?;
        let sessions = self.0.lock().unwrap_or_else(|e| e.into_inner());
        sessions
            .get(id)
            .filter(|s| s.opened.elapsed() < SESSION_TTL)
            .cloned()
    }

    /// Closes the session whose cookie `headers` carry.
    pub(crate) fn close(&self, headers: &HeaderMap) {
        if let Some(id) = cookie(headers, COOKIE_NAME) {
            self.0.lock().unwrap_or_else(|e| e.into_inner()).remove(id);
        }
    }
}

/// The cookie that opens a session `id`; `Secure` when `secure`.
pub(crate) fn set_cookie(id: &str, secure: bool) -> String {
    format!(
        "{COOKIE_NAME}={id}; Path=/; HttpOnly; SameSite=Strict; Max-Age={}{}",
        SESSION_TTL.as_secs(),
        if secure { "; Secure" } else { "" }
    )
}

/// The cookie that ends it; `Secure` when `secure`.
pub(crate) fn clear_cookie(secure: bool) -> String {
    format!(
        "{COOKIE_NAME}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0{}",
        if secure { "; Secure" } else { "" }
    )
}

/// Whether the browser says it reached the console over https: its
/// `Origin`, else its `Referer`, is an https address.
pub(crate) fn over_https(headers: &HeaderMap) -> bool {
    headers
        .get(ORIGIN)
        .or_else(|| headers.get(REFERER))
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.len() >= 8 && v[..8].eq_ignore_ascii_case("https://"))
}

/// The `Origin` of a request that has one and it is not the console's own
/// (`http://` or `https://` and the request's `Host`, or the host a proxy
/// in front says it was asked for: the first `X-Forwarded-Host`), else
/// `None`. A page of another site cannot set `X-Forwarded-Host`, and its
/// browser names that site in `Origin`, so trusting the header lets no one
/// in. A request without `Origin` (a command-line client, an older browser)
/// is not refused for it: its cookie still cannot come from another site.
pub(crate) fn foreign_origin(headers: &HeaderMap) -> Option<String> {
    let origin = headers.get(ORIGIN)?;
    let shown = String::from_utf8_lossy(origin.as_bytes()).into_owned();
    let Some(origin) = origin.to_str().ok() else {
        return Some(shown);
    };
    let forwarded = headers
        .get(FORWARDED_HOST)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(',').next());
    let hosts = [headers.get(HOST).and_then(|v| v.to_str().ok()), forwarded];
    let own = hosts
        .into_iter()
        .flatten()
        .any(|host| same_authority(origin, host));
    (!own).then_some(shown)
}

/// The header a proxy in front of the console names the host it was asked for in.
const FORWARDED_HOST: &str = "x-forwarded-host";

/// Whether `origin` (`http://` or `https://`, then a host and maybe a
/// port) names `host` (a Host header), a default port being no port.
fn same_authority(origin: &str, host: &str) -> bool {
    let lower = origin.to_ascii_lowercase();
    [("http://", ":80"), ("https://", ":443")]
        .into_iter()
        .any(|(scheme, default_port)| {
            lower.strip_prefix(scheme).is_some_and(|authority| {
                let host = host.trim().to_ascii_lowercase();
                let host = host.strip_suffix(default_port).unwrap_or(&host);
                let authority = authority.strip_suffix(default_port).unwrap_or(authority);
                !authority.is_empty() && authority == host
            })
        })
}

/// The value of cookie `name` in `headers`.
fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(n, _)| *n == name)
        .map(|(_, v)| v)
}

/// Whether two secrets are equal, in time independent of where they differ.
pub(crate) fn same(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(axum::http::HeaderName, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(name.clone(), value.parse().unwrap());
        }
        map
    }

    #[test]
    fn only_an_origin_naming_another_site_is_foreign() {
        let host = (HOST, "console.example:9470");
        for own in [
            "http://console.example:9470",
            "https://console.example:9470",
            "HTTP://Console.Example:9470",
        ] {
            assert_eq!(
                foreign_origin(&headers(&[host.clone(), (ORIGIN, own)])),
                None,
                "{own}"
            );
        }
        assert_eq!(
            foreign_origin(&headers(std::slice::from_ref(&host))),
            None,
            "no Origin"
        );
        assert_eq!(
            foreign_origin(&headers(&[
                (HOST, "console.example"),
                (ORIGIN, "https://console.example:443")
            ])),
            None,
            "a default port is the same origin"
        );
        for foreign in [
            "http://evil.example",
            "http://console.example:9471",
            "https://console.example.evil.example:9470",
            "null",
            "ftp://console.example:9470",
        ] {
            assert_eq!(
                foreign_origin(&headers(&[host.clone(), (ORIGIN, foreign)])).as_deref(),
                Some(foreign),
                "{foreign}"
            );
        }
        assert!(
            foreign_origin(&headers(&[(ORIGIN, "http://console.example:9470")])).is_some(),
            "no Host"
        );
        // Behind a proxy that rewrites Host, the host it was asked for.
        let proxied = |origin: &str| {
            let mut h = headers(&[(HOST, "127.0.0.1:9470"), (ORIGIN, origin)]);
            h.insert(FORWARDED_HOST, "console.example, inner.example".parse().unwrap());
            foreign_origin(&h)
        };
        assert_eq!(proxied("https://console.example"), None);
        assert!(proxied("https://evil.example").is_some());
        assert!(
            proxied("https://inner.example").is_some(),
            "only the first, the one the browser asked for"
        );
    }

    #[test]
    fn signing_in_again_and_again_closes_only_ones_own_sessions() {
        let sessions = Sessions::default();
        let caller = |name: &str, role| Caller {
            name: name.into(),
            role,
        };
        let cookie_of = |id: &str| headers(&[(COOKIE, &format!("{COOKIE_NAME}={id}"))]);
        let alice = sessions.open(caller("alice", crate::Role::Operator));
        let first = sessions.open(caller("mallory", crate::Role::Reader));
        for _ in 0..MAX_SESSIONS + 10 {
            sessions.open(caller("mallory", crate::Role::Reader));
        }
        assert!(
            sessions.of(&cookie_of(&alice)).is_some(),
            "alice is still signed in"
        );
        assert!(
            sessions.of(&cookie_of(&first)).is_none(),
            "mallory's oldest closed"
        );
        let open = sessions.0.lock().unwrap().len();
        assert_eq!(open, 1 + MAX_SESSIONS_EACH);
    }

    #[test]
    fn the_cookie_is_secure_when_the_browser_came_over_https() {
        assert!(over_https(&headers(&[(ORIGIN, "https://console.example")])));
        assert!(over_https(&headers(&[(
            REFERER,
            "https://console.example/login"
        )])));
        assert!(!over_https(&headers(&[(ORIGIN, "http://console.example")])));
        assert!(!over_https(&HeaderMap::new()));
        assert!(set_cookie("id", true).ends_with("; Secure"));
        assert!(!set_cookie("id", false).contains("Secure"));
        assert!(clear_cookie(true).contains("Max-Age=0; Secure"));
    }
}
