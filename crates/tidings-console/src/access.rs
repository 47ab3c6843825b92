//! Who may do what: bearer tokens, each with a role and a name.
//!
//! Tokens come from the environment (`TIDINGS_CONSOLE_TOKENS`) or a file
//! (`console.tokens_file`), never from the configuration file itself. Each
//! entry is `role:name:token`, one per line (or separated by commas);
//! `#` at the start of a line or after a space or tab starts a comment. A
//! token may therefore contain neither `,`, `#` nor whitespace: one that
//! does is refused at start-up, naming its line. The role is `reader` (may read) or
//! `operator` (may also redrive, skip and purge); the name says who in the
//! audit trail and the logs, which never show a token. Only a SHA-256 of
//! each token is kept in memory.

use std::fmt;

use sha2::{Digest, Sha256};

/// The environment variable holding tokens.
pub const TOKENS_VAR: &str = "TIDINGS_CONSOLE_TOKENS";

/// The shortest token accepted: shorter ones are guessable.
pub const MIN_TOKEN_LEN: usize = 24;

/// What a token lets its bearer do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Read the pages and the API.
    Reader,
    /// Read, and redrive, skip or purge dead letters.
    Operator,
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Reader => "reader",
            Role::Operator => "operator",
        })
    }
}

/// Who presented a valid token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The token's name.
    pub name: String,
    /// The token's role.
    pub role: Role,
}

/// A token list that could not be read.
#[derive(Debug, thiserror::Error)]
#[error("console tokens, {place}: {problem}")]
pub struct TokensError {
    place: String,
    problem: String,
}

/// The tokens a console accepts, and whether reading needs one.
#[derive(Clone, Default)]
pub struct Access {
    tokens: Vec<(Role, String, [u8; 32])>,
    reads_need_token: bool,
}

impl fmt::Debug for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<String> = self
            .tokens
            .iter()
            .map(|(role, name, _)| format!("{name} ({role})"))
            .collect();
        f.debug_struct("Access")
            .field("tokens", &names)
            .field("reads_need_token", &self.reads_need_token)
            .finish()
    }
}

impl Access {
    /// No token at all: everything may be read, nothing changed.
    pub fn none() -> Access {
        Access::default()
    }

    /// Reads the entries of `text` (`role:name:token`, one per line or
    /// separated by commas; `#` at a line's start or after whitespace starts
    /// a comment); `place` names where they come from, for errors. A token
    /// holding `,`, `#` or whitespace is refused, naming its line.
    pub fn parse(text: &str, place: &str) -> Result<Access, TokensError> {
        let mut access = Access::default();
        for (l, line) in text.lines().enumerate() {
            let line = uncommented(line).trim();
            if line.is_empty() {
                continue;
            }
            let entries: Vec<&str> = line.split(',').map(str::trim).collect();
            if entries.iter().any(|e| e.is_empty()) {
                // A token ending in `,` would otherwise lose it unnoticed.
                return Err(TokensError {
                    place: format!("{place}, line {}", l + 1),
                    problem:
                        "an empty entry: a `,` separates entries, so a token may not contain or end with one"
                            .into(),
                });
            }
            for (i, entry) in entries.iter().enumerate() {
                let problem = |problem: String| TokensError {
                    place: if entries.len() > 1 {
                        format!("{place}, line {}, entry {}", l + 1, i + 1)
                    } else {
                        format!("{place}, line {}", l + 1)
                    },
                    problem,
                };
                access.tokens.push(entry_of(entry).map_err(problem)?);
            }
        }
        Ok(access)
    }

    /// The tokens of the environment variable [`TOKENS_VAR`] and of the
    /// file `file`, if given; none if neither has any.
    pub fn from_env_and_file(file: Option<&std::path::Path>) -> Result<Access, TokensError> {
        let mut access = match std::env::var(TOKENS_VAR) {
            Ok(text) => Access::parse(&text, TOKENS_VAR)?,
            Err(_) => Access::default(),
        };
        if let Some(file) = file {
            let place = file.display().to_string();
            let text = std::fs::read_to_string(file).map_err(|e| TokensError {
                place: place.clone(),
                problem: format!("cannot read it: {e}"),
            })?;
            access.tokens.extend(Access::parse(&text, &place)?.tokens);
        }
        Ok(access)
    }

    /// Whether reading (pages and API) needs a token too; by default it
    /// does not, for a console on the loopback interface.
    pub fn reads_need_token(mut self, yes: bool) -> Access {
        self.reads_need_token = yes;
        self
    }

    /// Whether reading needs a token.
    pub fn reading_needs_token(&self) -> bool {
        self.reads_need_token
    }

    /// How many tokens it accepts.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether it accepts no token.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Who presents `token`, if anyone.
    pub fn caller(&self, token: &str) -> Option<Caller> {
        let presented = digest(token);
        // Every entry is compared, in constant time each.
        let mut found = None;
        for (role, name, known) in &self.tokens {
            let differs = known
                .iter()
                .zip(presented.iter())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b));
            if differs == 0 && found.is_none() {
                found = Some(Caller {
                    name: name.clone(),
                    role: *role,
                });
            }
        }
        found
    }
}

/// `line` without its comment: from a `#` that starts it or follows a
/// space or tab. A `#` anywhere else is part of an entry (and refused there).
fn uncommented(line: &str) -> &str {
    let mut previous = None;
    for (at, c) in line.char_indices() {
        if c == '#' && previous.is_none_or(|p: char| p == ' ' || p == '\t') {
            return &line[..at];
        }
        previous = Some(c);
    }
    line
}

/// One `role:name:token` entry, or what is wrong with it (never showing
/// the token).
fn entry_of(entry: &str) -> Result<(Role, String, [u8; 32]), String> {
    let mut parts = entry.splitn(3, ':');
    let (Some(role), Some(name), Some(token)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(
            "expected role:name:token (a `,` separates entries, so a token may not contain one)".into(),
        );
    };
    let role = match role.trim() {
        "reader" => Role::Reader,
        "operator" => Role::Operator,
        other => return Err(format!("unknown role `{other}` (reader or operator)")),
    };
    let name = name.trim();
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.@".contains(c))
    {
        return Err(format!("the name `{name}` must be letters, digits, or - _ . @"));
    }
    let token = token.trim();
    if token.contains('#') || token.chars().any(char::is_whitespace) {
        return Err(format!(
            "the token of `{name}` contains `#` or whitespace, which a token may not \
             (`#` after a space starts a comment, `,` separates entries): \
             make one of letters and digits (`openssl rand -hex 24`)"
        ));
    }
    if token.len() < MIN_TOKEN_LEN {
        return Err(format!(
            "the token of `{name}` is {} characters; at least {MIN_TOKEN_LEN} are needed (`openssl rand -hex 24` makes one)",
            token.len()
        ));
    }
    Ok((role, name.to_owned(), digest(token)))
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    const OPS: &str = "0123456789abcdef0123456789abcdef";
    const READ: &str = "fedcba9876543210fedcba9876543210";

    #[test]
    fn entries_give_roles_and_names() {
        let access = Access::parse(
            &format!("# who may\noperator:alice:{OPS}\nreader:grafana:{READ} # dashboards\n"),
            "test",
        )
        .unwrap();
        assert_eq!(access.len(), 2);
        assert_eq!(
            access.caller(OPS),
            Some(Caller {
                name: "alice".into(),
                role: Role::Operator
            })
        );
        assert_eq!(access.caller(READ).map(|c| c.role), Some(Role::Reader));
        assert_eq!(access.caller("0123456789abcdef0123456789abcdeX"), None);
        assert_eq!(access.caller(""), None);
        let commas = Access::parse(&format!("operator:a:{OPS}, reader:b:{READ}"), "var").unwrap();
        assert_eq!(commas.len(), 2);
    }

    #[test]
    fn bad_entries_are_refused_naming_the_entry_and_never_the_token() {
        for (text, says) in [
            ("operator:alice", "expected role:name:token"),
            (
                "admin:alice:0123456789abcdef0123456789abcdef",
                "unknown role `admin`",
            ),
            ("reader:a b:0123456789abcdef0123456789abcdef", "the name `a b`"),
            ("operator:alice:short-secret", "at least 24"),
        ] {
            let e = Access::parse(text, "tokens.txt").unwrap_err().to_string();
            assert!(e.contains("tokens.txt, line 1") && e.contains(says), "{e}");
            assert!(
                !e.contains("short-secret") && !e.contains("0123456789abcdef"),
                "{e}"
            );
        }
        let debug = format!(
            "{:?}",
            Access::parse(&format!("operator:alice:{OPS}"), "t").unwrap()
        );
        assert!(
            debug.contains("alice (operator)") && !debug.contains(OPS),
            "{debug}"
        );
    }

    #[test]
    fn a_hash_or_comma_inside_a_token_is_refused_naming_the_line() {
        let hash = "0123456789abcdef#0123456789abcdef";
        let e = Access::parse(&format!("# tokens\noperator:alice:{hash}"), "tokens.txt")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("tokens.txt, line 2") && e.contains("`alice` contains `#`"),
            "{e}"
        );
        assert!(!e.contains("0123456789abcdef"), "{e}");

        let comma = "0123456789abcdef0123456789,abcdef";
        let e = Access::parse(&format!("reader:grafana:{READ}\noperator:alice:{comma}"), "var")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("var, line 2, entry 2") && e.contains("may not contain one"),
            "{e}"
        );
        assert!(!e.contains("abcdef"), "{e}");

        let e = Access::parse(&format!("reader:grafana:{READ}\noperator:alice:{OPS},"), "var")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("var, line 2") && e.contains("may not contain or end with one"),
            "{e}"
        );
        assert!(!e.contains(OPS), "{e}");

        let e = Access::parse("operator:alice:0123456789abcdef 0123456789abcdef", "t")
            .unwrap_err()
            .to_string();
        assert!(e.contains("whitespace"), "{e}");

        // A comment after a space, or on its own line, is still one.
        let commented = Access::parse(&format!("operator:alice:{OPS} # on call\n  # none"), "t").unwrap();
        assert_eq!(commented.caller(OPS).map(|c| c.name), Some("alice".into()));
        assert_eq!(commented.len(), 1);
    }
}
