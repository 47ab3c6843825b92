//! `tidings.toml` and its environment overrides, as the daemon loads them.
//! Any text with any overrides loads or is refused without panicking; and
//! in a file put together from the daemon's sections and keys, with a
//! password planted in URLs (in the userinfo or in the query), neither a
//! refusal nor what loads ever prints the password, and a password written
//! in the file itself is refused.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use tidings_config::{Loaded, Schemes};
use tidings_core::secret::has_password;

const PLANTED: &str = "Pl4nted-pw-Zq9";

const SCHEMES: Schemes = Schemes {
    database: |url| {
        ["postgres://", "mysql://", "sqlite:"]
            .iter()
            .any(|s| url.starts_with(s))
    },
    broker: |url| {
        url == "log"
            || ["nats://", "amqp://", "kafka://"]
                .iter()
                .any(|s| url.starts_with(s))
    },
};

const SECTIONS: &[&str] = &[
    "database", "broker", "relay", "log", "consumer", "metrics", "other",
];
const KEYS: &[&str] = &[
    "url",
    "max_connections",
    "migrate",
    "outbox_retention",
    "prefix",
    "partitions",
    "enabled",
    "mode",
    "group",
    "slot_wal_cap_mib",
    "batch_size",
    "poll_interval",
    "publish_timeout",
    "lease_ttl",
    "cleanup_interval",
    "member",
    "retention",
    "dedupe_retention",
    "listen",
    "lag_interval",
    "other",
];
const URL_SCHEMES: &[&str] = &["postgres", "mysql", "sqlite", "nats", "amqp", "kafka", "pulsar"];

#[derive(Debug, Arbitrary)]
enum Value {
    /// A URL holding the planted password.
    Url {
        scheme: u8,
        user: String,
        host: String,
        in_query: bool,
    },
    Text(String),
    Int(i64),
    Bool(bool),
    Float(f64),
    List(Vec<Value>),
}

impl Value {
    /// Whether the password is written here other than in a URL: a plain
    /// string that happens to be it is no password to hide.
    fn spells_it(&self) -> bool {
        match self {
            Value::Text(s) => s.contains(PLANTED),
            Value::List(items) => items.iter().any(Value::spells_it),
            _ => false,
        }
    }

    fn toml(&self) -> toml::Value {
        match self {
            Value::Url {
                scheme,
                user,
                host,
                in_query,
            } => {
                let clean = |s: &str| -> String {
                    s.chars()
                        .filter(|c| c.is_ascii_alphanumeric() || *c == '.')
                        .take(20)
                        .collect()
                };
                let scheme = URL_SCHEMES[usize::from(*scheme) % URL_SCHEMES.len()];
                let (user, host) = (clean(user), clean(host));
                toml::Value::String(if *in_query {
                    format!("{scheme}://{user}@{host}/db?sslmode=require&password={PLANTED}")
                } else {
                    format!("{scheme}://{user}:{PLANTED}@{host}/db")
                })
            }
            Value::Text(s) => toml::Value::String(s.clone()),
            Value::Int(n) => toml::Value::Integer(*n),
            Value::Bool(b) => toml::Value::Boolean(*b),
            Value::Float(x) => toml::Value::Float(*x),
            Value::List(items) => toml::Value::Array(items.iter().map(Value::toml).collect()),
        }
    }
}

#[derive(Debug, Arbitrary)]
enum Input {
    /// Any text and any overrides.
    Raw(String, Vec<(String, String)>),
    /// A file of `[section]` tables and overrides of the same keys.
    Built(Vec<(u8, u8, Value)>, Vec<(u8, u8, Value)>),
}

/// `url_file` reads the file it names: not from a fuzzer.
fn reads_files(text: &str) -> bool {
    text.to_ascii_lowercase().contains("url_file")
}

fuzz_target!(|input: Input| {
    match input {
        Input::Raw(text, env) => {
            if reads_files(&text) || env.iter().any(|(k, _)| reads_files(k)) {
                return;
            }
            let _ = Loaded::from_text("fuzz.toml", &text, env, SCHEMES);
        }
        Input::Built(file, env) => {
            if file.iter().chain(&env).any(|(_, _, v)| v.spells_it()) {
                return;
            }
            let pick = |section: u8, key: u8| {
                (
                    SECTIONS[usize::from(section) % SECTIONS.len()],
                    KEYS[usize::from(key) % KEYS.len()],
                )
            };
            let mut table = toml::Table::new();
            for (section, key, value) in &file {
                let (section, key) = pick(*section, *key);
                table
                    .entry(section)
                    .or_insert_with(|| toml::Value::Table(toml::Table::new()))
                    .as_table_mut()
                    .expect("a section")
                    .insert(key.to_owned(), value.toml());
            }
            let text = toml::to_string(&table).expect("a table prints as TOML");
            let env: Vec<(String, String)> = env
                .iter()
                .map(|(section, key, value)| {
                    let (section, key) = pick(*section, *key);
                    let value = match value.toml() {
                        toml::Value::String(s) => s,
                        other => other.to_string(),
                    };
                    (format!("TIDINGS_{}__{}", section, key).to_uppercase(), value)
                })
                .collect();
            let planted_in_env = env.iter().any(|(_, v)| v.contains(PLANTED));
            let env_keys: Vec<String> = env.iter().map(|(k, _)| k.clone()).collect();
            match Loaded::from_text("fuzz.toml", &text, env, SCHEMES) {
                Ok(loaded) => {
                    // A password may come from the environment, planted or
                    // any other: only the URL the environment set may hold one.
                    let urls = [
                        (loaded.database_url.expose(), "TIDINGS_DATABASE__URL"),
                        (loaded.broker_url.expose(), "TIDINGS_BROKER__URL"),
                    ];
                    for (url, var) in urls {
                        let from_env = env_keys.iter().any(|k| k == var);
                        assert!(
                            !url.contains(PLANTED) || planted_in_env,
                            "a password written in the file loaded: {text}"
                        );
                        assert!(!has_password(url) || from_env, "{url}");
                    }
                    // What may be logged: the URLs, wherever they are kept.
                    let shown = format!(
                        "{:?} {:?} {:?} {:?}",
                        loaded.database_url,
                        loaded.broker_url,
                        loaded.config.database.url,
                        loaded.config.broker.url
                    );
                    assert!(
                        !shown.contains(PLANTED),
                        "the loaded URLs show a password: {shown}"
                    );
                }
                Err(e) => {
                    let shown = e.to_string();
                    assert!(
                        !shown.contains(PLANTED),
                        "a refusal shows the password: {shown}\n{text}"
                    );
                }
            }
        }
    }
});
