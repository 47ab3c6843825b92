//! Every ```` ```rust ```` block of `README.md` and `docs/*.md` is compiled:
//! it is, verbatim, a region of `examples/snippets/src` marked with
//! `// snippet: <name>` and `// end snippet`, or the whole of
//! `examples/quickstart/src/main.rs`. And every marked region is shown in a
//! doc, so that no snippet outlives its block.
//!
//! Blocks and regions are compared line by line after removing their
//! common indentation, trailing spaces and blank lines at either end.

use std::fs;
use std::path::{Path, PathBuf};

/// The workspace's root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `README.md` and every `docs/*.md`, as paths relative to the root.
fn doc_files() -> Vec<String> {
    let mut docs: Vec<String> = fs::read_dir(root().join("docs"))
        .expect("docs/ is readable")
        .map(|entry| {
            entry
                .expect("a docs/ entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|name| name.ends_with(".md"))
        .map(|name| format!("docs/{name}"))
        .collect();
    docs.sort();
    docs.insert(0, "README.md".to_owned());
    docs
}

/// A ```` ```rust ```` block of a doc.
#[derive(Debug)]
struct Block {
    /// The doc, relative to the root.
    doc: String,
    /// The line of its opening fence, from 1.
    line: usize,
    /// Its code, normalised.
    code: String,
}

impl Block {
    fn first_line(&self) -> &str {
        self.code.lines().next().unwrap_or("")
    }

    /// Where its snippet belongs: `examples/snippets/src/<doc>.rs`.
    fn home(&self) -> String {
        let stem = Path::new(&self.doc)
            .file_stem()
            .expect("a file name")
            .to_string_lossy();
        format!("examples/snippets/src/{}.rs", stem.to_lowercase())
    }
}

/// A region of `examples/snippets/src` between snippet markers.
#[derive(Debug)]
struct Region {
    /// The file, relative to the root.
    file: String,
    /// The name after `// snippet: `.
    name: String,
    /// The line of its opening marker, from 1.
    line: usize,
    /// Its code, normalised.
    code: String,
}

/// `code` without its common indentation, trailing spaces, and blank lines
/// at either end.
fn normalise(code: &str) -> String {
    let lines: Vec<&str> = code.lines().map(str::trim_end).collect();
    let first = lines.iter().position(|l| !l.is_empty()).unwrap_or(lines.len());
    let last = lines.iter().rposition(|l| !l.is_empty()).map_or(first, |i| i + 1);
    let lines = &lines[first..last];
    let indent = lines
        .iter()
        .filter(|l| !l.is_empty())
        .map(|l| l.len() - l.trim_start().len())
        .min()
        .unwrap_or(0);
    lines
        .iter()
        .map(|l| if l.is_empty() { "" } else { &l[indent..] })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The ```` ```rust ```` blocks of every doc. A fence that names Rust in
/// another way (```` ```rust,ignore ````, ```` ```rs ````) would escape the
/// check, so it fails here.
fn blocks() -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut misfenced = Vec::new();
    for doc in doc_files() {
        let text = fs::read_to_string(root().join(&doc)).unwrap_or_else(|e| panic!("reading {doc}: {e}"));
        let mut open: Option<(usize, Option<Vec<&str>>)> = None;
        for (i, line) in text.lines().enumerate() {
            let fence = line.trim_start();
            match &mut open {
                None => {
                    if let Some(info) = fence.strip_prefix("```") {
                        let info = info.trim();
                        let lang = info.split([',', ' ']).next().unwrap_or("");
                        if info != "rust" && (lang == "rust" || lang == "rs") {
                            misfenced.push(format!("{doc}:{}: ```{info}", i + 1));
                        }
                        open = Some((i + 1, (info == "rust").then(Vec::new)));
                    }
                }
                Some((start, code)) => {
                    if fence.trim_end() == "```" {
                        if let Some(code) = code.take() {
                            blocks.push(Block {
                                doc: doc.clone(),
                                line: *start,
                                code: normalise(&code.join("\n")),
                            });
                        }
                        open = None;
                    } else if let Some(code) = code {
                        code.push(line);
                    }
                }
            }
        }
        assert!(open.is_none(), "{doc}: a code fence is never closed");
    }
    assert!(
        misfenced.is_empty(),
        "Rust blocks must be fenced with exactly ```rust, so that they are compiled: {misfenced:#?}"
    );
    blocks
}

/// The `.rs` files under `dir`, recursively.
fn rust_files(dir: &Path, files: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display())) {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, files);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            files.push(path);
        }
    }
}

/// Every marked region of `examples/snippets/src`.
fn regions() -> Vec<Region> {
    let mut files = Vec::new();
    rust_files(&root().join("examples/snippets/src"), &mut files);
    files.sort();
    let mut regions = Vec::new();
    for path in files {
        let file = path
            .strip_prefix(root())
            .expect("under the root")
            .to_string_lossy()
            .into_owned();
        let text = fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {file}: {e}"));
        let mut open: Option<(String, usize, Vec<&str>)> = None;
        for (i, line) in text.lines().enumerate() {
            let marker = line.trim();
            if let Some(name) = marker.strip_prefix("// snippet:") {
                if let Some((name, ..)) = &open {
                    panic!("{file}:{}: snippet `{name}` is still open", i + 1);
                }
                open = Some((name.trim().to_owned(), i + 1, Vec::new()));
            } else if marker == "// end snippet" {
                let (name, line, code) = open
                    .take()
                    .unwrap_or_else(|| panic!("{file}:{}: `// end snippet` without a start", i + 1));
                regions.push(Region {
                    file: file.clone(),
                    name,
                    line,
                    code: normalise(&code.join("\n")),
                });
            } else if let Some((_, _, code)) = &mut open {
                code.push(line);
            }
        }
        if let Some((name, line, _)) = open {
            panic!("{file}:{line}: snippet `{name}` has no `// end snippet`");
        }
    }
    for (i, region) in regions.iter().enumerate() {
        if let Some(twin) = regions[..i].iter().find(|r| r.name == region.name) {
            panic!(
                "two snippets are named `{}`: {}:{} and {}:{}",
                region.name, twin.file, twin.line, region.file, region.line
            );
        }
    }
    regions
}

/// The quickstart, shown whole in the README.
fn quickstart() -> String {
    let path = root().join("examples/quickstart/src/main.rs");
    normalise(&fs::read_to_string(path).expect("the quickstart is readable"))
}

/// The first line where `doc` and `code` differ, for the failure message.
fn first_difference(doc: &str, code: &str) -> String {
    let (doc, code): (Vec<&str>, Vec<&str>) = (doc.lines().collect(), code.lines().collect());
    let at = (0..doc.len().max(code.len()))
        .find(|&i| doc.get(i) != code.get(i))
        .unwrap_or(0);
    format!(
        "at its line {}, the doc has {:?} and the code {:?}",
        at + 1,
        doc.get(at).copied().unwrap_or("(nothing)"),
        code.get(at).copied().unwrap_or("(nothing)")
    )
}

#[test]
fn every_rust_block_of_the_docs_is_compiled() {
    let blocks = blocks();
    let regions = regions();
    let quickstart = quickstart();
    assert!(
        blocks
            .iter()
            .any(|b| b.doc == "README.md" && b.code == quickstart),
        "README.md shows examples/quickstart/src/main.rs whole"
    );
    let mut failures = Vec::new();
    for block in &blocks {
        if block.code == quickstart || regions.iter().any(|r| r.code == block.code) {
            continue;
        }
        let near = regions
            .iter()
            .find(|r| r.code.lines().next() == Some(block.first_line()))
            .map(|r| {
                format!(
                    "\n    it differs from snippet `{}` ({}:{}): {}",
                    r.name,
                    r.file,
                    r.line,
                    first_difference(&block.code, &r.code)
                )
            })
            .unwrap_or_default();
        failures.push(format!(
            "{}:{}: the ```rust block starting {:?} is not compiled: put it in {} between \
             `// snippet: <name>` and `// end snippet`, inside code that compiles, the same as \
             the doc shows it (after `cargo fmt`){near}",
            block.doc,
            block.line,
            block.first_line(),
            block.home()
        ));
    }
    assert!(failures.is_empty(), "\n{}\n", failures.join("\n"));
}

#[test]
fn every_snippet_is_shown_in_the_docs() {
    let blocks = blocks();
    let stale: Vec<String> = regions()
        .iter()
        .filter(|r| !blocks.iter().any(|b| b.code == r.code))
        .map(|r| {
            format!(
                "{}:{}: snippet `{}` is in no ```rust block of README.md or docs/*.md: show it in its doc, \
                 or remove it",
                r.file, r.line, r.name
            )
        })
        .collect();
    assert!(!regions().is_empty(), "examples/snippets/src has marked snippets");
    assert!(stale.is_empty(), "\n{}\n", stale.join("\n"));
}

#[test]
fn normalising_removes_common_indentation_only() {
    assert_eq!(
        normalise("\n    a {\n\n        b\n    }  \n\n"),
        "a {\n\n    b\n}"
    );
    assert_eq!(normalise("a\n  b"), "a\n  b");
}
