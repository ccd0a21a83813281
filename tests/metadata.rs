//! Cargo metadata that tells the truth: `rust-version` is at least the
//! highest `rust_version` any crate in rankmesh's own dependency closure
//! (normal, build and dev dependencies; not the candle example's) declares,
//! so a user on the promised toolchain never meets a resolver error.

use serde_json::Value;
use std::collections::{BTreeSet, HashMap};
use std::process::Command;

/// "1.85" or "1.85.0" as (1, 85, 0).
fn version(v: &str) -> (u64, u64, u64) {
    let mut parts = v.split('.').map(|p| p.parse::<u64>().unwrap_or(0));
    (
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
    )
}

#[test]
fn rust_version_covers_every_dependency() {
    let out = Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--locked"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: Value = serde_json::from_slice(&out.stdout).unwrap();
    let packages: HashMap<&str, &Value> = meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["id"].as_str().unwrap(), p))
        .collect();
    let nodes: HashMap<&str, &Value> = meta["resolve"]["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| (n["id"].as_str().unwrap(), n))
        .collect();
    let root = packages
        .values()
        .find(|p| p["name"] == "rankmesh")
        .map(|p| p["id"].as_str().unwrap())
        .unwrap();
    let declared = packages[root]["rust_version"]
        .as_str()
        .expect("Cargo.toml declares rust-version");
    // rankmesh's direct dependencies of every kind, then everything they
    // need to build (their own dev-dependencies are not built).
    let mut seen = BTreeSet::new();
    let mut todo: Vec<&str> = vec![root];
    while let Some(id) = todo.pop() {
        if !seen.insert(id) {
            continue;
        }
        for dep in nodes[id]["deps"].as_array().unwrap() {
            let kinds = dep["dep_kinds"].as_array().unwrap();
            let wanted = kinds
                .iter()
                .any(|k| id == root || k["kind"].is_null() || k["kind"] == "build");
            if wanted {
                todo.push(dep["pkg"].as_str().unwrap());
            }
        }
    }
    let (needs, who) = seen
        .iter()
        .filter(|id| **id != root)
        .filter_map(|id| {
            let p = packages[id];
            let rv = p["rust_version"].as_str()?;
            Some((
                version(rv),
                format!("{} {}", p["name"].as_str()?, p["version"].as_str()?),
            ))
        })
        .max()
        .expect("dependencies declare rust versions");
    assert!(
        version(declared) >= needs,
        "rust-version = {declared:?} but {who} needs {}.{}.{}",
        needs.0,
        needs.1,
        needs.2
    );
}

#[test]
fn versions_compare_numerically() {
    assert!(version("1.100") > version("1.88.0"));
    assert!(version("1.88") >= version("1.88.0"));
    assert!(version("1.85") < version("1.87.0"));
}
