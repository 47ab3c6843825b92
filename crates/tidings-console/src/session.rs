//! Signing in to the pages: a browser cannot send a bearer token with a
//! link or a form, so the sign-in form takes one and opens a session. The
//! browser holds only the session's random id, in a cookie scripts cannot
//! read and other sites cannot send (`HttpOnly`, `SameSite=Strict`); each
//! form that changes something also carries the session's own random
//! anti-forgery token, checked on arrival. Sessions live in memory for
//! [`SESSION_TTL`] and end with the process.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::HeaderMap;
use axum::http::header::COOKIE;

use crate::access::Caller;

/// The session cookie's name.
pub const COOKIE_NAME: &str = "tidings_console";

/// How long a session lasts.
pub(crate) const SESSION_TTL: Duration = Duration::from_secs(8 * 3600);

/// Sessions open at once at most: past it, the oldest is closed.
const MAX_SESSIONS: usize = 1024;

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
        if sessions.len() >= MAX_SESSIONS
            && let Some(oldest) = sessions
                .iter()
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

/// The cookie that opens a session `id`.
pub(crate) fn set_cookie(id: &str) -> String {
    format!(
        "{COOKIE_NAME}={id}; Path=/; HttpOnly; SameSite=Strict; Max-Age={}",
        SESSION_TTL.as_secs()
    )
}

/// The cookie that ends it.
pub(crate) fn clear_cookie() -> String {
    format!("{COOKIE_NAME}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0")
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
