//! `tidings schema check` and `generate` on the checkout system's registry,
//! as CI runs them: a copy of the committed files, changed the way a
//! careless edit would.

mod common;

use std::path::{Path, PathBuf};

use common::tidings;

const COMMITTED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/checkout/schemas");

/// A copy of the committed registry to change.
fn copy_of_registry() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("schemas-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for entry in std::fs::read_dir(COMMITTED).expect("the committed registry") {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.join(path.file_name().unwrap())).unwrap();
    }
    dir
}

fn schema(command: &str, dir: &Path) -> (i32, String, String) {
    let out = tidings()
        .args(["schema", command, "--dir"])
        .arg(dir)
        .output()
        .expect("running tidings");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_committed_registry_matches_the_code_and_a_breaking_edit_fails() {
    let dir = copy_of_registry();
    let (code, stdout, stderr) = schema("check", &dir);
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(
        stdout.contains("8 schemas, no breaking change, no secrets"),
        "{stdout}"
    );

    // The registry says OrderPlaced v1 carries `currency` and `total_cents`
    // as an integer; the code has no `currency`: the code removed a field.
    let file = dir.join("OrderPlaced.v1.json");
    let mut committed: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    committed["properties"]["currency"] = serde_json::json!({"type": "string"});
    committed["required"]
        .as_array_mut()
        .unwrap()
        .push("currency".into());
    std::fs::write(&file, serde_json::to_string_pretty(&committed).unwrap()).unwrap();

    let (code, _, stderr) = schema("check", &dir);
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("OrderPlaced v1: field `currency`: removed: removed: readers that need it fail"),
        "{stderr}"
    );
    // generate refuses to paper over it, and leaves the file alone.
    let before = std::fs::read_to_string(&file).unwrap();
    let (code, _, stderr) = schema("generate", &dir);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("refused: nothing written"), "{stderr}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), before);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// What CI checks of every reference system: its committed registry is the
/// one its code would write, with no breaking change and no secret.
#[test]
fn every_reference_systems_committed_registry_is_current() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    for system in ["checkout", "payments", "upload", "clicks"] {
        let out = tidings()
            .current_dir(root)
            .args(["schema", "check", "--system", system])
            .output()
            .expect("running tidings");
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert!(out.status.success(), "{system}: {stdout}{stderr}");
        assert!(
            stdout.contains("no breaking change, no secrets"),
            "{system}: {stdout}"
        );
    }
}
