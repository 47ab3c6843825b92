//! The `impl Message` a derive writes, and the checks before it.

use proc_macro_crate::{FoundCrate, crate_name};
use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Data, DeriveInput, Error, Fields, Ident, LitStr, Member, Result};

use crate::attr::{self, Container, Kind, Text};
use crate::naming::{self, IRREGULAR_EXAMPLES, Misnamed};

/// Collects errors so that one compile reports every missing setting.
#[derive(Default)]
struct Errors(Option<Error>);

impl Errors {
    fn push(&mut self, at: impl ToTokens, message: impl std::fmt::Display) {
        let error = Error::new_spanned(at, message);
        match &mut self.0 {
            Some(all) => all.combine(error),
            None => self.0 = Some(error),
        }
    }

    fn push_error(&mut self, error: Error) {
        match &mut self.0 {
            Some(all) => all.combine(error),
            None => self.0 = Some(error),
        }
    }

    fn finish(self) -> Result<()> {
        self.0.map_or(Ok(()), Err)
    }
}

/// Where `Message` and `Kind` live, seen from the crate being compiled.
///
/// `crate = "..."` wins. Otherwise the crate's own `Cargo.toml` says which
/// of `tidings-core` and the `tidings` facade (which re-exports it) it
/// depends on, under whatever name it gave them. In `tidings-core` itself
/// (its tests, examples and doctests) the path is `::tidings_core`.
fn core_path(krate: Option<&syn::Path>) -> TokenStream {
    if let Some(path) = krate {
        return quote!(#path);
    }
    let found = crate_name("tidings-core").or_else(|_| crate_name("tidings"));
    match found {
        Ok(FoundCrate::Name(name)) => {
            let name = Ident::new(&name, Span::call_site());
            quote!(::#name)
        }
        Ok(FoundCrate::Itself) | Err(_) => quote!(::tidings_core),
    }
}

fn text(value: &Text) -> TokenStream {
    match value {
        Text::Lit(lit) => quote!(#lit),
        Text::Const(path) => quote!(#path),
    }
}

/// The key expression, from the one field marked `#[message(key)]`.
fn key_field(input: &DeriveInput, errors: &mut Errors) -> Option<TokenStream> {
    let ident = &input.ident;
    let fields = match &input.data {
        Data::Struct(data) => &data.fields,
        Data::Enum(data) => {
            for field in data.variants.iter().flat_map(|v| &v.fields) {
                match attr::field_key(&field.attrs) {
                    Ok(Some(at)) => errors.push(
                        at,
                        format!(
                            "`{ident}` is an enum: its key comes from a function, not a field; \
                             remove `#[message(key)]` and add `key_fn = path` to `#[message(...)]`"
                        ),
                    ),
                    Ok(None) => {}
                    Err(e) => errors.push_error(e),
                }
            }
            errors.push(
                ident,
                format!(
                    "`{ident}` is an enum, so no field can be its key: write `fn(&{ident}) -> String` \
                     and name it with `#[message(key_fn = path)]`"
                ),
            );
            return None;
        }
        // Refused before the key is looked for.
        Data::Union(_) => return None,
    };

    let mut keys: Vec<(TokenStream, String, Member, &syn::Type)> = Vec::new();
    let mut unreadable = false;
    for (index, field) in fields.iter().enumerate() {
        match attr::field_key(&field.attrs) {
            Ok(Some(at)) => {
                let (name, member) = match &field.ident {
                    Some(name) => (name.to_string(), Member::Named(name.clone())),
                    None => (index.to_string(), Member::from(index)),
                };
                keys.push((at, name, member, &field.ty));
            }
            Ok(None) => {}
            Err(e) => {
                unreadable = true;
                errors.push_error(e);
            }
        }
    }
    match keys.as_slice() {
        // The field attribute in error may have been meant as the key.
        [] if unreadable => None,
        [] => {
            let fix = match fields {
                Fields::Unit => format!(
                    "a unit struct has no field to mark, so write `fn(&{ident}) -> String` and name \
                     it with `#[message(key_fn = path)]`"
                ),
                _ => "put `#[message(key)]` on the field that holds the aggregate key (messages \
                      with the same key are published and handled in order), or name a function \
                      with `#[message(key_fn = path)]`"
                    .to_owned(),
            };
            errors.push(ident, format!("`{ident}` has no key: {fix}"));
            None
        }
        [(_, _, member, ty)] => {
            // Spanned at the field's type: a key that is not `Display` is
            // reported there.
            Some(quote_spanned!(ty.span()=> ::std::string::ToString::to_string(&self.#member)))
        }
        [(_, first, ..), rest @ ..] => {
            for (at, name, ..) in rest {
                errors.push(
                    at,
                    format!(
                        "`{ident}` has more than one key field (`{first}` and `{name}`): keep \
                         `#[message(key)]` on exactly one; for a key made of several fields, write \
                         `fn(&{ident}) -> String` and name it with `#[message(key_fn = path)]`"
                    ),
                );
            }
            None
        }
    }
}

/// Checks that the name reads as the kind says.
fn check_name(kind: Kind, name: &str, at: &TokenStream, errors: &mut Errors) {
    let checked = match kind {
        Kind::Event => naming::check_event(name),
        Kind::Command => naming::check_command(name),
    };
    let hatch = "if the name is right as it is, add `name_check = false` to `#[message(...)]`";
    match checked {
        Ok(()) => {}
        Err(Misnamed::EventNotPast(word)) => errors.push(
            at,
            format!(
                "event `{name}` is not named in the past tense: an event states what happened, so \
                 its verb, the last word (`{word}`), should be a past form, ending in `ed` or an \
                 irregular one such as {IRREGULAR_EXAMPLES}; rename it (`OrderPlaced`, not \
                 `PlaceOrder`), or, if it asks for something to be done, make it a `command`; {hatch}"
            ),
        ),
        Err(Misnamed::CommandPast(word)) => errors.push(
            at,
            format!(
                "command `{name}` is not named in the imperative: a command asks for something to \
                 be done, so its first word should be a verb like `Place` or `Capture`, but \
                 `{word}` is a past form; rename it (`PlaceOrder`, not `PlacedOrder`), or, if it \
                 states what happened, make it an `event`; {hatch}"
            ),
        ),
        Err(Misnamed::NoWords) => errors.push(
            at,
            format!("`{name}` has no words to check; give the message a name such as `OrderPlaced`"),
        ),
    }
}

/// Expands `#[derive(Message)]`.
pub(crate) fn derive(input: &DeriveInput) -> Result<TokenStream> {
    let ident = &input.ident;
    if let Data::Union(data) = &input.data {
        return Err(Error::new(
            data.union_token.span(),
            format!("`{ident}` is a union; a message is a struct or an enum"),
        ));
    }
    let c = Container::parse(&input.attrs)?;
    let mut errors = Errors::default();

    let Some(attr) = &c.attr else {
        return Err(Error::new_spanned(
            ident,
            format!(
                "`{ident}` derives `Message` but says nothing about it: add \
                 `#[message(event, topic = \"...\", aggregate = \"...\")]` (or `command`)"
            ),
        ));
    };

    let (name, name_span, name_at) = match &c.name {
        Some(lit) => (lit.value(), lit.span(), lit.to_token_stream()),
        None => (ident.to_string(), ident.span(), ident.to_token_stream()),
    };

    match c.kind {
        None => errors.push(
            attr,
            format!(
                "`{ident}` is neither an event nor a command: add `event` (a fact, named in the past \
                 tense) or `command` (a request, named in the imperative) to `#[message(...)]`"
            ),
        ),
        Some((kind, _)) => {
            if c.name_check.as_ref().is_none_or(|check| check.value) {
                check_name(kind, &name, &name_at, &mut errors);
            }
        }
    }
    if c.topic.is_none() {
        errors.push(
            attr,
            format!(
                "`{ident}` has no topic: add `topic = \"...\"` to `#[message(...)]`, where it goes \
                 (an event's topic, or the queue of the service that handles a command)"
            ),
        );
    }
    if c.aggregate.is_none() {
        errors.push(
            attr,
            format!(
                "`{ident}` has no aggregate: add `aggregate = \"...\"` to `#[message(...)]`, the \
                 kind of thing its key names (`order`)"
            ),
        );
    }

    let key = match &c.key_fn {
        Some(path) => {
            let fields: Vec<&syn::Field> = match &input.data {
                Data::Struct(data) => data.fields.iter().collect(),
                Data::Enum(data) => data.variants.iter().flat_map(|v| &v.fields).collect(),
                Data::Union(_) => Vec::new(),
            };
            for field in fields {
                match attr::field_key(&field.attrs) {
                    Ok(Some(at)) => errors.push(
                        at,
                        format!("`{ident}` has both `key_fn` and a `#[message(key)]` field; keep one"),
                    ),
                    Ok(None) => {}
                    Err(e) => errors.push_error(e),
                }
            }
            Some(quote_spanned!(path.span()=> ::std::string::ToString::to_string(&#path(self))))
        }
        None => key_field(input, &mut errors),
    };

    errors.finish()?;
    let (Some((kind, _)), Some(topic), Some(aggregate), Some(key)) = (c.kind, &c.topic, &c.aggregate, key)
    else {
        unreachable!("every missing setting is an error above");
    };

    let core = core_path(c.krate.as_ref());
    let type_name = LitStr::new(&name, name_span);
    let version = c.version.unwrap_or(1);
    let kind = match kind {
        Kind::Event => quote!(#core::Kind::Event),
        Kind::Command => quote!(#core::Kind::Command),
    };
    let topic = text(topic);
    let aggregate = text(aggregate);
    let upcast = c.upcast.as_ref().map(|path| {
        let value = quote!(#core::__private::serde_json::Value);
        quote! {
            fn upcast(
                version: u32,
                payload: #value,
            ) -> ::core::result::Result<#value, ::std::string::String> {
                #path(version, payload)
            }
        }
    });
    // A generic message is a message for the parameters that make it one:
    // the bounds of the trait, on the type itself, so that serde's own
    // bounds on the parameters need not be repeated on the struct.
    let mut generics = input.generics.clone();
    if !generics.params.is_empty() {
        let (_, ty_generics, _) = input.generics.split_for_impl();
        let serde = quote!(#core::__private::serde);
        generics.make_where_clause().predicates.push(syn::parse_quote! {
            #ident #ty_generics: #serde::Serialize
                + #serde::de::DeserializeOwned
                + ::core::marker::Send
                + ::core::marker::Sync
                + 'static
        });
    }
    let (impl_generics, ty_generics, where_clause) = generics.split_for_impl();

    Ok(quote! {
        #[automatically_derived]
        impl #impl_generics #core::Message for #ident #ty_generics #where_clause {
            const TYPE: &'static str = #type_name;
            const VERSION: u32 = #version;
            const KIND: #core::Kind = #kind;
            const AGGREGATE: &'static str = #aggregate;
            const TOPIC: &'static str = #topic;

            fn key(&self) -> ::std::string::String {
                #key
            }

            #upcast
        }
    })
}
