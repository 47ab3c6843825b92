//! Where a value of a foreign message is: a header, a member of its JSON
//! body, or a value fixed by configuration. The webhook inbox reads a
//! delivery's event id, type and key with it; a consumer reads a plain
//! JSON record's id and key ([`crate::plain`]).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer};
use serde_json::Value;

/// Where a value is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Field {
    /// A header, by name in any case (`X-GitHub-Delivery`).
    Header(String),
    /// A member of the JSON body, by JSON pointer (`/data/object/id`).
    Json(String),
    /// The same value for every message (a message type).
    Fixed(String),
}

impl Field {
    /// A member of the JSON body at `pointer` (`/id`).
    pub fn json(pointer: impl Into<String>) -> Field {
        Field::Json(pointer.into())
    }

    /// The header `name`.
    pub fn header(name: impl Into<String>) -> Field {
        Field::Header(name.into())
    }

    /// The value in a message whose headers `header` looks up (by the
    /// lower-case name) and whose body is `body`, if present and not empty:
    /// text as it is, numbers written out; anything else (an object,
    /// `null`) is absent.
    pub fn read<'h>(&self, header: impl Fn(&str) -> Option<&'h str>, body: &Value) -> Option<String> {
        let value = match self {
            Field::Header(name) => header(&name.to_ascii_lowercase())?.trim().to_owned(),
            Field::Json(pointer) => match body.pointer(pointer)? {
                Value::String(s) => s.clone(),
                Value::Number(n) => n.to_string(),
                _ => return None,
            },
            Field::Fixed(value) => value.clone(),
        };
        (!value.is_empty()).then_some(value)
    }
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Field::Header(name) => write!(f, "the header {name}"),
            Field::Json(pointer) => write!(f, "the body's {pointer}"),
            Field::Fixed(value) => write!(f, "{value:?}"),
        }
    }
}

impl FromStr for Field {
    type Err = String;

    /// `header:<name>`, `json:<pointer>` (`json:/data/object/id`) or
    /// `fixed:<value>`.
    fn from_str(s: &str) -> Result<Field, String> {
        match s.split_once(':') {
            Some(("header", name)) if !name.trim().is_empty() => Ok(Field::header(name.trim())),
            Some(("json", pointer)) if pointer.starts_with('/') => Ok(Field::json(pointer)),
            Some(("fixed", value)) if !value.is_empty() => Ok(Field::Fixed(value.to_owned())),
            _ => Err(format!(
                "{s:?} is not a field: write header:<name>, json:<pointer> (json:/data/object/id) or fixed:<value>"
            )),
        }
    }
}

impl<'de> Deserialize<'de> for Field {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Field, D::Error> {
        String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_read_headers_in_any_case_members_and_fixed_values() {
        let body = serde_json::json!({"id": "evt_1", "n": 7, "obj": {}, "empty": ""});
        let headers = |name: &str| (name == "x-delivery").then_some(" d-1 ");
        assert_eq!(
            Field::header("X-Delivery").read(headers, &body).as_deref(),
            Some("d-1")
        );
        assert_eq!(Field::json("/id").read(headers, &body).as_deref(), Some("evt_1"));
        assert_eq!(Field::json("/n").read(headers, &body).as_deref(), Some("7"));
        for absent in [
            Field::json("/obj"),
            Field::json("/empty"),
            Field::json("/nope"),
            Field::header("x-other"),
        ] {
            assert_eq!(absent.read(headers, &body), None, "{absent}");
        }
        assert_eq!("fixed:T".parse::<Field>(), Ok(Field::Fixed("T".into())));
        assert_eq!("header:X-Id".parse::<Field>(), Ok(Field::header("X-Id")));
        assert!("/id".parse::<Field>().unwrap_err().contains("is not a field"));
    }
}
