//! A URL with a password in it, in its userinfo or in a secret query
//! parameter, built from any parts (unencoded `@`, `/`, `?`, `#` and `:` in
//! the password included): the redacted form never holds the password, and
//! `has_password` sees it. Any other text redacts without panicking.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use tidings_core::secret::{has_password, redact_url};

#[derive(Debug, Arbitrary)]
enum Where {
    Userinfo,
    Query(u8),
}

#[derive(Debug, Arbitrary)]
struct Url {
    scheme: u8,
    user: String,
    password: String,
    host: String,
    path: String,
    query: Vec<(String, String)>,
    fragment: Option<String>,
    place: Where,
}

const SCHEMES: &[&str] = &[
    "postgres",
    "postgresql",
    "mysql",
    "amqp",
    "amqps",
    "nats",
    "kafka",
    "sqlite",
];
const PARAMETERS: &[&str] = &["password", "sslpassword", "token", "secret", "sslkey", "PassWord"];

/// Parts that hold none of the characters that end the part they are in.
fn clean(s: &str, stops: &[char]) -> String {
    s.chars()
        .filter(|c| !stops.contains(c) && !c.is_control())
        .collect()
}

fuzz_target!(|input: (Url, String)| {
    let (u, text) = input;
    let _ = redact_url(&text);
    let _ = has_password(&text);

    // A password too short or too common to search for in the output
    // (`a` may stand in the host) proves nothing.
    let password: String = u.password.chars().filter(|c| !c.is_control()).collect();
    if password.chars().count() < 6 || password.contains('&') || password.contains('#') {
        return;
    }
    // `u:12/34@host` is host `u`, port 12 and path `/34@host` to every URL
    // parser, the database's client included, and `u:12,h/x@host` a list
    // of hosts: no password there.
    let digits = password.trim_start_matches(|c: char| c.is_ascii_digit());
    if matches!(u.place, Where::Userinfo)
        && digits.len() < password.len()
        && digits.starts_with(['/', '?', '#', ','])
    {
        return;
    }
    // `u:p@g/x@host`: every client reads host `g` and path `/x@host`, so
    // the password is `p`; the URL means something else than was meant.
    if matches!(u.place, Where::Userinfo)
        && password
            .find('@')
            .is_some_and(|at| password[at..].contains(['/', '?', '#']))
    {
        return;
    }
    let scheme = SCHEMES[usize::from(u.scheme) % SCHEMES.len()];
    // RFC 3986 allows no unencoded `[` or `]` in a userinfo: a user `[`
    // and a password `:]/...` make `[::]/...`, an IPv6 host to any parser.
    let user = clean(&u.user, &[':', '@', '/', '?', '#', '[', ']']);
    let host = clean(&u.host, &['@', '/', '?', '#', ':']);
    let path = clean(&u.path, &['@', '?', '#']);
    let mut url = match u.place {
        Where::Userinfo if !user.is_empty() => format!("{scheme}://{user}:{password}@{host}/{path}"),
        Where::Userinfo => return, // the userinfo form needs a user
        Where::Query(_) => format!("{scheme}://{host}/{path}"),
    };
    let mut pairs: Vec<String> = u
        .query
        .iter()
        .map(|(k, v)| format!("{}={}", clean(k, &['=', '&', '#']), clean(v, &['&', '#'])))
        .collect();
    if let Where::Query(n) = u.place {
        let name = PARAMETERS[usize::from(n) % PARAMETERS.len()];
        let at = usize::from(n) % (pairs.len() + 1);
        pairs.insert(at, format!("{name}={password}"));
    }
    if !pairs.is_empty() {
        url.push('?');
        url.push_str(&pairs.join("&"));
    }
    if let Some(f) = &u.fragment {
        url.push('#');
        url.push_str(&clean(f, &[]));
    }
    // A character of the password found nowhere else in the URL (nor one
    // that redaction writes) marks it: if the mark is in the output, so is
    // (part of) the password. The password may stand whole elsewhere by
    // chance (`postgresql://=:ql://=@...`), so the whole is no proof.
    let others = url.replacen(&password, "", 1);
    let Some(mark) = password
        .chars()
        .find(|c| !others.contains(*c) && !"@=*:/".contains(*c))
    else {
        return;
    };
    let redacted = redact_url(&url);
    assert!(
        !redacted.contains(mark),
        "{url:?} redacted to {redacted:?} still holds the password {password:?}"
    );
    assert!(has_password(&url), "{url:?} holds a password has_password missed");
});
