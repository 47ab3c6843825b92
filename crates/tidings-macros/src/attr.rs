//! The `#[message(...)]` attributes, read from the derive input.

use proc_macro2::{Span, TokenStream};
use quote::ToTokens;
use syn::spanned::Spanned;
use syn::{Attribute, Error, LitBool, LitInt, LitStr, Path, Result};

/// Every setting of the container attribute, for error messages.
const SETTINGS: &str =
    "`event`, `command`, `topic`, `aggregate`, `version`, `name`, `name_check`, `key_fn`, `upcast`, `crate`";

/// Event or command.
#[derive(Clone, Copy)]
pub(crate) enum Kind {
    Event,
    Command,
}

impl Kind {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Kind::Event => "event",
            Kind::Command => "command",
        }
    }
}

/// A `&'static str` setting: a string literal, or the path of a constant.
pub(crate) enum Text {
    Lit(LitStr),
    Const(Path),
}

impl Text {
    fn parse(setting: &str, input: syn::parse::ParseStream) -> Result<Text> {
        if input.peek(LitStr) {
            let lit: LitStr = input.parse()?;
            if lit.value().trim().is_empty() {
                return Err(Error::new(lit.span(), format!("`{setting}` must not be empty")));
            }
            Ok(Text::Lit(lit))
        } else {
            input.parse::<Path>().map(Text::Const).map_err(|e| {
                Error::new(
                    e.span(),
                    format!(
                        "expected a string literal or the path of a `&'static str` constant: `{setting} = \"...\"`"
                    ),
                )
            })
        }
    }
}

/// The settings of `#[message(...)]` on the type.
#[derive(Default)]
pub(crate) struct Container {
    /// The first `#[message]` attribute, where errors about a missing
    /// setting point.
    pub(crate) attr: Option<TokenStream>,
    pub(crate) kind: Option<(Kind, Span)>,
    pub(crate) topic: Option<Text>,
    pub(crate) aggregate: Option<Text>,
    pub(crate) version: Option<u32>,
    pub(crate) name: Option<LitStr>,
    pub(crate) name_check: Option<LitBool>,
    pub(crate) key_fn: Option<Path>,
    pub(crate) upcast: Option<Path>,
    pub(crate) krate: Option<Path>,
}

fn once<T>(slot: &mut Option<T>, value: T, span: Span, setting: &str) -> Result<()> {
    if slot.is_some() {
        return Err(Error::new(
            span,
            format!("`{setting}` is given twice in `#[message(...)]`; keep one"),
        ));
    }
    *slot = Some(value);
    Ok(())
}

impl Container {
    /// Reads every `#[message(...)]` attribute of the type.
    pub(crate) fn parse(attrs: &[Attribute]) -> Result<Container> {
        let mut c = Container::default();
        for attr in attrs.iter().filter(|a| a.path().is_ident("message")) {
            c.attr.get_or_insert_with(|| attr.to_token_stream());
            attr.parse_nested_meta(|meta| {
                let path = &meta.path;
                let span = path.span();
                if path.is_ident("event") || path.is_ident("command") {
                    let kind = if path.is_ident("event") { Kind::Event } else { Kind::Command };
                    if let Some((before, _)) = c.kind {
                        let msg = if before.as_str() == kind.as_str() {
                            format!("`{}` is given twice in `#[message(...)]`; keep one", kind.as_str())
                        } else {
                            "a message is either an `event` or a `command`, not both; keep one".to_owned()
                        };
                        return Err(Error::new(span, msg));
                    }
                    c.kind = Some((kind, span));
                } else if path.is_ident("topic") {
                    let value = Text::parse("topic", meta.value()?)?;
                    once(&mut c.topic, value, span, "topic")?;
                } else if path.is_ident("aggregate") {
                    let value = Text::parse("aggregate", meta.value()?)?;
                    once(&mut c.aggregate, value, span, "aggregate")?;
                } else if path.is_ident("version") {
                    let lit: LitInt = meta.value()?.parse().map_err(|e| {
                        Error::new(e.span(), "expected an integer: `version = 2`")
                    })?;
                    let version = match lit.base10_parse::<u32>() {
                        Ok(0) => {
                            return Err(Error::new(
                                lit.span(),
                                "versions count from 1: `version = 1` is the first",
                            ));
                        }
                        Ok(version) => version,
                        Err(_) => {
                            return Err(Error::new(lit.span(), "`version` must fit in a `u32`"));
                        }
                    };
                    once(&mut c.version, version, span, "version")?;
                } else if path.is_ident("name") {
                    let lit: LitStr = meta.value()?.parse()?;
                    if lit.value().trim().is_empty() {
                        return Err(Error::new(lit.span(), "`name` must not be empty"));
                    }
                    once(&mut c.name, lit, span, "name")?;
                } else if path.is_ident("name_check") {
                    let lit: LitBool = meta.value()?.parse().map_err(|e| {
                        Error::new(e.span(), "expected `name_check = false` (or `true`)")
                    })?;
                    once(&mut c.name_check, lit, span, "name_check")?;
                } else if path.is_ident("key_fn") {
                    let value: Path = meta.value()?.parse()?;
                    once(&mut c.key_fn, value, span, "key_fn")?;
                } else if path.is_ident("upcast") {
                    let value: Path = meta.value()?.parse()?;
                    once(&mut c.upcast, value, span, "upcast")?;
                } else if path.is_ident("crate") {
                    let lit: LitStr = meta.value()?.parse()?;
                    let value: Path = lit.parse()?;
                    once(&mut c.krate, value, span, "crate")?;
                } else if path.is_ident("key") {
                    return Err(meta.error(
                        "`key` marks a field: put `#[message(key)]` on the field that holds the aggregate key",
                    ));
                } else {
                    let name = path
                        .get_ident()
                        .map_or_else(|| "this".to_owned(), |i| format!("`{i}`"));
                    return Err(meta.error(format!(
                        "unknown `#[message]` setting {name}; expected one of {SETTINGS}"
                    )));
                }
                Ok(())
            })?;
        }
        Ok(c)
    }
}

/// Whether a field carries `#[message(key)]`: the attribute, to point at.
pub(crate) fn field_key(attrs: &[Attribute]) -> Result<Option<TokenStream>> {
    let mut key = None;
    for attr in attrs.iter().filter(|a| a.path().is_ident("message")) {
        attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("key") {
                once(&mut key, attr.to_token_stream(), meta.path.span(), "key")
            } else {
                Err(meta.error("unknown `#[message]` setting on a field; the only one is `#[message(key)]`"))
            }
        })?;
    }
    Ok(key)
}
