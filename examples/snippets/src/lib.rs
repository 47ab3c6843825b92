//! The Rust snippets of `README.md` and `docs/*.md`, compiled: each one is
//! here verbatim between `// snippet: <name>` and `// end snippet`, inside
//! the code that supplies what it assumes (imports, a URL, a store, a
//! function returning a `Result`). `tests/docs.rs` checks that every Rust
//! block of the docs is one of these regions, and every region one of the
//! blocks, so that the docs cannot drift from the API.
//!
//! One module per doc; `README.md`'s quickstart is `examples/quickstart`.

pub mod operations;
pub mod readme;
pub mod schemas;
