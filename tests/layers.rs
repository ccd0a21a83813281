//! Keeps the layering true: every `crate::…` path in src/ points down the
//! layer table that docs/ARCHITECTURE.md draws (between `<!-- layers -->`
//! markers), never up and never sideways into a loop. A module may use the
//! modules of lower layers and the modules to its left in its own layer; a
//! folder's files belong to their top-level module.
//!
//! Paths through the crate root (`crate::Tensor`) are resolved through
//! lib.rs's `pub use` lines to the module that defines the item. Inside a
//! folder, no files import each other in a circle. The doc's file map names
//! every file of src/, and only files that exist, and each entry begins with
//! its file's first `//!` sentence.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// (layer, position in the layer) of each top-level module, from the doc.
fn layer_table() -> BTreeMap<String, (usize, usize)> {
    let doc = fs::read_to_string("docs/ARCHITECTURE.md").expect("docs/ARCHITECTURE.md");
    let mut parts = doc.split("<!-- layers -->");
    let block = parts
        .nth(1)
        .expect("docs/ARCHITECTURE.md has a block between <!-- layers --> markers");
    let mut table = BTreeMap::new();
    for line in block.lines() {
        let mut words = line.split_whitespace();
        let Some(layer) = words.next().and_then(|w| w.parse::<usize>().ok()) else {
            continue;
        };
        for (i, m) in words.take_while(|w| !w.starts_with('(')).enumerate() {
            let m = m.trim_end_matches(',');
            if m.ends_with(".rs") || m.contains('/') {
                continue; // the CLI row names a file, not a module
            }
            let old = table.insert(m.to_string(), (layer, i));
            assert!(old.is_none(), "module {m} appears twice in the layer table");
        }
    }
    assert!(!table.is_empty(), "the layer table is empty");
    table
}

/// Source with comments and string contents removed (line and doc
/// comments, and the part of a line after `//` outside a string).
fn code_of(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let mut in_str = false;
        let mut prev = ' ';
        let mut kept = String::new();
        for c in line.chars() {
            if !in_str && c == '/' && prev == '/' {
                kept.pop();
                break;
            }
            if c == '"' && prev != '\\' {
                in_str = !in_str;
                kept.push(c);
            } else {
                kept.push(if in_str { ' ' } else { c });
            }
            prev = c;
        }
        out.push_str(&kept);
        out.push('\n');
    }
    out
}

/// The first segment of every `crate::` path in `code`, with `use crate::{a,
/// b::c}` groups expanded.
fn crate_refs(code: &str) -> Vec<(usize, String)> {
    let mut refs = Vec::new();
    for (n, line) in code.lines().enumerate() {
        let mut rest = line;
        while let Some(at) = rest.find("crate::") {
            rest = &rest[at + "crate::".len()..];
            if let Some(group) = rest.strip_prefix('{') {
                let end = group.find('}').unwrap_or(group.len());
                for item in group[..end].split(',') {
                    let name: String = item
                        .trim()
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    if !name.is_empty() {
                        refs.push((n + 1, name));
                    }
                }
            } else {
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                refs.push((n + 1, name));
            }
        }
    }
    refs
}

/// Root re-exports (`pub use module::{A, B}` in lib.rs): item → module.
fn root_items(lib: &str) -> BTreeMap<String, String> {
    let mut items = BTreeMap::new();
    let code = code_of(lib);
    for stmt in code.split(';') {
        let stmt = stmt.trim();
        let Some(path) = stmt.strip_prefix("pub use ") else {
            continue;
        };
        let (module, rest) = path.split_once("::").expect("pub use module::…");
        let names = rest.trim_start_matches('{').trim_end_matches('}');
        for name in names.split(',') {
            let name = name.trim().rsplit("::").next().unwrap().trim();
            if !name.is_empty() {
                items.insert(name.to_string(), module.to_string());
            }
        }
    }
    items
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let p = entry.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// The top-level module a file of src/ belongs to (`None` for lib.rs).
fn module_of(file: &Path) -> Option<String> {
    let rel = file.strip_prefix("src").unwrap();
    let first = rel.components().next()?.as_os_str().to_str()?.to_string();
    if first == "lib.rs" {
        return None;
    }
    Some(first.trim_end_matches(".rs").to_string())
}

/// Every import in src/ that does not point down the layer table, as
/// "file:line: `crate::x` from module (layer L) points up to module (layer M)".
fn violations() -> Vec<String> {
    let table = layer_table();
    let lib = fs::read_to_string("src/lib.rs").unwrap();
    let roots = root_items(&lib);
    let mut files = Vec::new();
    rust_files(Path::new("src"), &mut files);
    files.sort();
    let mut seen = BTreeSet::new();
    let mut bad = Vec::new();
    for f in &files {
        let Some(from) = module_of(f) else { continue };
        seen.insert(from.clone());
        let Some(&here) = table.get(&from) else {
            bad.push(format!(
                "{}: module `{from}` is not in the layer table of docs/ARCHITECTURE.md",
                f.display()
            ));
            continue;
        };
        let code = code_of(&fs::read_to_string(f).unwrap());
        for (line, name) in crate_refs(&code) {
            let target = if table.contains_key(&name) {
                name.clone()
            } else if let Some(m) = roots.get(&name) {
                m.clone()
            } else {
                continue; // a macro or an item of lib.rs itself
            };
            if target == from {
                continue;
            }
            let there = table[&target];
            if there >= here {
                bad.push(format!(
                    "{}:{line}: `crate::{name}` from `{from}` (layer {}) points {} to `{target}` (layer {})",
                    f.display(),
                    here.0,
                    if there.0 > here.0 { "up" } else { "sideways" },
                    there.0
                ));
            }
        }
    }
    for m in table.keys() {
        if !seen.contains(m) && m != "prelude" {
            bad.push(format!(
                "the layer table names `{m}`, which src/ does not have"
            ));
        }
    }
    bad
}

#[test]
fn every_import_points_down_the_layer_table() {
    let bad = violations();
    assert!(
        bad.is_empty(),
        "{} import(s) break the layering:\n{}",
        bad.len(),
        bad.join("\n")
    );
}

#[test]
fn lib_declares_modules_in_layer_order() {
    let table = layer_table();
    let lib = code_of(&fs::read_to_string("src/lib.rs").unwrap());
    let declared: Vec<&str> = lib
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            l.strip_prefix("pub mod ")
                .or_else(|| l.strip_prefix("mod "))
                .map(|m| m.trim_end_matches(';'))
        })
        .collect();
    let positions: Vec<(usize, usize)> = declared
        .iter()
        .map(|m| {
            *table
                .get(*m)
                .unwrap_or_else(|| panic!("lib.rs declares `{m}`, absent from the layer table"))
        })
        .collect();
    let mut sorted = positions.clone();
    sorted.sort();
    assert_eq!(
        positions, sorted,
        "lib.rs declares {declared:?} out of layer order"
    );
    let public = user_modules(&lib);
    assert!(
        public.len() <= 12,
        "lib.rs has {} public modules (at most 12): {public:?}",
        public.len()
    );
}

/// The modules a user's build makes public: `pub mod` lines not behind
/// `#[cfg(feature = "internals")]` (the tests' paths inside).
fn user_modules(lib: &str) -> Vec<String> {
    let lines: Vec<&str> = lib.lines().map(str::trim).collect();
    let mut internal = false;
    let mut out = Vec::new();
    for l in lines {
        // (Strings are blanked by `code_of`: the feature's name is gone.)
        if l.starts_with("#[cfg(feature") {
            internal = true;
        } else if let Some(m) = l.strip_prefix("pub mod ") {
            if !internal {
                out.push(m.trim_end_matches(';').to_string());
            }
            internal = false;
        } else if !l.starts_with("#[") {
            internal = false;
        }
    }
    out
}

/// What a user finds at the crate root: its public modules and its
/// re-exported names, at most 35 (issue #63: the root is what a program
/// names first; the rest lives in the modules).
#[test]
fn the_root_holds_at_most_35_names() {
    let lib = code_of(&fs::read_to_string("src/lib.rs").unwrap());
    let mut names: Vec<String> = root_items(&lib).into_keys().collect();
    names.extend(user_modules(&lib));
    assert!(
        names.len() <= 35,
        "the crate root has {} names (at most 35): {names:?}",
        names.len()
    );
    assert!(
        user_modules("#[cfg(feature = \"internals\")]\npub mod exec;\npub mod tools;") == ["tools"],
        "an internals-only module is not the user's"
    );
}

/// The checker itself: an upward import in a scratch tree is found and
/// named, so the test above cannot pass by reading nothing.
#[test]
fn an_upward_import_is_named() {
    let code =
        code_of("use crate::group::GroupCoordinator; // crate::bench\nlet s = \"crate::x\";");
    let refs = crate_refs(&code);
    assert_eq!(refs, vec![(1, "group".to_string())]);
    let grouped = crate_refs("use crate::{error::Error, tensor::Tensor};");
    assert_eq!(
        grouped.iter().map(|r| r.1.as_str()).collect::<Vec<_>>(),
        ["error", "tensor"]
    );
    let roots = root_items("pub use group::{Collectives, Runtime};\npub use error::Error;");
    assert_eq!(roots["Runtime"], "group");
    assert_eq!(roots["Error"], "error");
}

/// The first segment after each `prefix` in `code` (`prefix{a, b::c}`
/// groups expanded), as `crate_refs` does for `crate::`.
fn refs_after(code: &str, prefix: &str) -> Vec<String> {
    let mut refs = Vec::new();
    for line in code.lines() {
        let mut rest = line;
        while let Some(at) = rest.find(prefix) {
            rest = &rest[at + prefix.len()..];
            let word = |s: &str| -> String {
                s.trim()
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect()
            };
            if let Some(group) = rest.strip_prefix('{') {
                let end = group.find('}').unwrap_or(group.len());
                refs.extend(group[..end].split(',').map(word));
            } else {
                refs.push(word(rest));
            }
        }
    }
    refs.retain(|r| !r.is_empty());
    refs
}

/// Code without its unit tests (`super::` inside `mod tests` is the file
/// itself, not the folder).
fn without_tests(code: &str) -> &str {
    code.find("#[cfg(test)]\nmod tests")
        .map_or(code, |at| &code[..at])
}

/// The imports between the files of one folder of src/ (a subfolder
/// counts as one unit): unit → the sibling units it names.
fn folder_edges(folder: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let module = folder.file_name().unwrap().to_str().unwrap().to_string();
    let mut units = BTreeSet::new();
    for entry in fs::read_dir(folder).unwrap() {
        let p = entry.unwrap().path();
        let name = p.file_stem().unwrap().to_str().unwrap().to_string();
        if p.is_dir() || (p.extension().is_some_and(|e| e == "rs") && name != "mod") {
            units.insert(name);
        }
    }
    let mut files = Vec::new();
    rust_files(folder, &mut files);
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in files {
        let rel = f.strip_prefix(folder).unwrap();
        let nested = rel.components().count() > 1;
        let unit = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_str()
            .unwrap();
        let unit = unit.trim_end_matches(".rs").to_string();
        if !units.contains(&unit) {
            continue; // the folder's mod.rs
        }
        let text = fs::read_to_string(&f).unwrap();
        let code = code_of(without_tests(&text));
        let mut named = refs_after(&code, &format!("crate::{module}::"));
        named.extend(refs_after(
            &code,
            if nested { "super::super::" } else { "super::" },
        ));
        for target in named {
            if target != unit && units.contains(&target) {
                edges.entry(unit.clone()).or_default().insert(target);
            }
        }
    }
    edges
}

/// A cycle in `edges`, as its units in order, if there is one.
fn find_circle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        at: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == at) {
            let mut circle = path[i..].to_vec();
            circle.push(at.to_string());
            return Some(circle);
        }
        if done.contains(at) {
            return None;
        }
        path.push(at.to_string());
        for next in edges.get(at).into_iter().flatten() {
            if let Some(c) = visit(next, edges, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(at.to_string());
        None
    }
    let mut done = BTreeSet::new();
    edges
        .keys()
        .find_map(|start| visit(start, edges, &mut Vec::new(), &mut done))
}

#[test]
fn no_import_circle_among_the_files_of_a_folder() {
    let mut circles = Vec::new();
    let mut folders = 0;
    for entry in fs::read_dir("src").unwrap() {
        let p = entry.unwrap().path();
        if p.is_dir() {
            folders += 1;
            if let Some(c) = find_circle(&folder_edges(&p)) {
                circles.push(format!("{}: {}", p.display(), c.join(" -> ")));
            }
        }
    }
    assert!(folders >= 10, "read {folders} folders of src/");
    assert!(
        circles.is_empty(),
        "import circles inside folders:\n{}",
        circles.join("\n")
    );
}

/// The circle finder itself, on a scratch graph: a three-file loop is
/// named, a chain is not.
#[test]
fn an_import_circle_is_named() {
    let graph = |pairs: &[(&str, &str)]| {
        let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (a, b) in pairs {
            g.entry(a.to_string()).or_default().insert(b.to_string());
        }
        g
    };
    let circle = find_circle(&graph(&[
        ("ring", "next"),
        ("deferred", "ring"),
        ("next", "deferred"),
    ]));
    assert_eq!(circle.unwrap(), ["deferred", "ring", "next", "deferred"]);
    assert_eq!(
        find_circle(&graph(&[("deferred", "ring"), ("ring", "next")])),
        None
    );
    let refs = refs_after(
        "use super::{next::Next, ring};\nuse super::posted::MpiPosts;",
        "super::",
    );
    assert_eq!(refs, ["next", "ring", "posted"]);
}

/// The files and folders the map in docs/ARCHITECTURE.md names, as paths
/// (the block that starts with `bin/rankmesh.rs`), each with its entry's
/// text: the description on its line and its continuation lines, joined by
/// single spaces. An entry is a name at two spaces per folder level; a
/// folder (`exec/`, or `wait/mod.rs`, which is both the folder and its
/// file) holds the entries indented under it. Continuation lines are
/// indented further.
fn map_entries(doc: &str) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
    let lines = doc
        .lines()
        .skip_while(|l| !l.starts_with("bin/rankmesh.rs "));
    let mut open: Vec<String> = Vec::new();
    let (mut files, mut folders) = (BTreeMap::new(), BTreeMap::new());
    // The entry that continuation lines extend: (is a folder, its path).
    let mut last: Option<(bool, String)> = None;
    for line in lines.take_while(|l| !l.starts_with("```")) {
        let indent = line.len() - line.trim_start().len();
        let Some(name) = line.split_whitespace().next() else {
            continue;
        };
        let text = line.trim();
        if indent >= 20 {
            if let Some((is_folder, path)) = &last {
                let entries = if *is_folder { &mut folders } else { &mut files };
                let entry: &mut String = entries.get_mut(path).unwrap();
                if !entry.is_empty() {
                    entry.push(' ');
                }
                entry.push_str(text);
            }
            continue;
        }
        if name.starts_with("--") {
            last = None; // a layer separator
            continue;
        }
        let text = text[name.len()..].trim().to_string();
        open.truncate(indent / 2);
        let path = open.iter().map(|f| format!("{f}/")).collect::<String>() + name;
        if let Some(folder) = path.strip_suffix('/') {
            folders.insert(folder.to_string(), text);
            last = Some((true, folder.to_string()));
            open.push(name.trim_end_matches('/').to_string());
            continue;
        }
        if let Some(folder) = name.strip_suffix("/mod.rs") {
            open.push(folder.to_string());
        }
        files.insert(path.clone(), text);
        last = Some((false, path));
    }
    (files, folders)
}

#[test]
fn the_file_map_names_every_file_of_src_and_only_those() {
    let doc = fs::read_to_string("docs/ARCHITECTURE.md").unwrap();
    let (files, folders) = map_entries(&doc);
    let mut found = Vec::new();
    rust_files(Path::new("src"), &mut found);
    let on_disk: BTreeSet<String> = found.iter().map(|p| p.display().to_string()).collect();
    assert!(on_disk.len() >= 80, "read {} files of src/", on_disk.len());
    // A folder's own line stands for its mod.rs.
    let missing: Vec<&String> = on_disk
        .iter()
        .filter(|f| !files.contains_key(*f))
        .filter(|f| {
            !f.strip_suffix("/mod.rs")
                .is_some_and(|d| folders.contains_key(d))
        })
        .collect();
    let absent: Vec<&String> = files
        .keys()
        .filter(|f| f.starts_with("src/") && !on_disk.contains(*f))
        .collect();
    assert!(
        missing.is_empty() && absent.is_empty(),
        "docs/ARCHITECTURE.md's file map is out of date:\n  files it lacks: {missing:?}\n  files it names that do not exist: {absent:?}"
    );
}

/// The map reader on a scratch map: nesting by indent, a folder line and a
/// `mod.rs` line both open a folder, continuation lines are text.
#[test]
fn a_file_map_entry_is_found_at_its_depth() {
    let doc = "x\nbin/rankmesh.rs        CLI\nsrc/\n  lib.rs               root\n  \
               exec/                executors\n    mpi.rs             MPI and a long\n                       \
               continuation.rs line\n    shm/mod.rs         window\n    shm/ops.rs         ops\n  \
               -- layer 2\n  wait/mod.rs          waits\n    give_up.rs         giving up\n                       \
               --bind too\n  dtype.rs             types\n```\n  after.rs  no\n";
    let (files, folders) = map_entries(doc);
    assert_eq!(
        files["src/exec/mpi.rs"],
        "MPI and a long continuation.rs line"
    );
    assert_eq!(files["src/wait/mod.rs"], "waits");
    assert_eq!(files["src/wait/give_up.rs"], "giving up --bind too");
    assert_eq!(folders["src/exec"], "executors");
    assert_eq!(folders["src"], "");
    let files: Vec<&str> = files.keys().map(|s| s.as_str()).collect();
    assert_eq!(
        files,
        [
            "bin/rankmesh.rs",
            "src/dtype.rs",
            "src/exec/mpi.rs",
            "src/exec/shm/mod.rs",
            "src/exec/shm/ops.rs",
            "src/lib.rs",
            "src/wait/give_up.rs",
            "src/wait/mod.rs",
        ]
    );
    let folders: Vec<&str> = folders.keys().map(|s| s.as_str()).collect();
    assert_eq!(folders, ["src", "src/exec"]);
}

/// Rustdoc link syntax reduced to its text (`[`X`](…)` and `[`X`]` to
/// `` `X` ``, `[text](…)` and `[text]` to `text`), whitespace collapsed.
fn plain_text(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find('[') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let Some(end) = after.find([']', '[']) else {
            out.push('[');
            rest = after;
            continue;
        };
        if after.as_bytes()[end] == b'[' {
            out.push('[');
            rest = after;
            continue;
        }
        out.push_str(&after[..end]);
        rest = &after[end + 1..];
        if let Some(target) = rest.strip_prefix('(') {
            let mut depth = 1;
            let close = target.char_indices().find(|&(_, c)| {
                depth += match c {
                    '(' => 1,
                    ')' => -1,
                    _ => 0,
                };
                depth == 0
            });
            if let Some((close, _)) = close {
                rest = &target[close + 1..];
            }
        }
    }
    out.push_str(rest);
    out.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A file's first module-doc sentence: its leading `//!` lines up to the
/// first empty one, joined, cut after the first `. ` (or at the end),
/// without its final period, as `plain_text`.
fn first_doc_sentence(source: &str) -> String {
    // A leading heading (lib.rs's `# rankmesh`) is the crate's title, not
    // its description: the sentence is the first paragraph after it.
    let docs: Vec<&str> = source
        .lines()
        .map_while(|l| l.trim().strip_prefix("//!"))
        .skip_while(|l| l.trim().is_empty() || l.trim_start().starts_with('#'))
        .take_while(|l| !l.trim().is_empty())
        .collect();
    let joined = docs.join(" ");
    let sentence = joined
        .find(". ")
        .map_or(joined.as_str(), |at| &joined[..=at])
        .trim_end();
    plain_text(sentence.strip_suffix('.').unwrap_or(sentence))
}

/// The sources the map describes: every file of src/ it names (a folder's
/// line stands for its `mod.rs` where the map gives that no line of its
/// own), and bin/ and build.rs where they carry `//!` docs.
fn described_sources(
    files: &BTreeMap<String, String>,
    folders: &BTreeMap<String, String>,
) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (path, text) in files {
        let tool = path.starts_with("bin/") || path == "build.rs";
        let docs = || fs::read_to_string(path).is_ok_and(|s| s.starts_with("//!"));
        if path.starts_with("src/") || (tool && docs()) {
            out.push((path.clone(), text.clone()));
        }
    }
    for (folder, text) in folders {
        let module = format!("{folder}/mod.rs");
        if folder.starts_with("src/") && !files.contains_key(&module) && Path::new(&module).exists()
        {
            out.push((module, text.clone()));
        }
    }
    out.sort();
    out
}

#[test]
fn each_map_entry_begins_with_its_files_first_doc_sentence() {
    let doc = fs::read_to_string("docs/ARCHITECTURE.md").unwrap();
    let (files, folders) = map_entries(&doc);
    let sources = described_sources(&files, &folders);
    let mut bad = Vec::new();
    let mut compared = 0;
    for (path, text) in &sources {
        let source = fs::read_to_string(path).unwrap_or_default();
        let first = first_doc_sentence(&source);
        let entry = plain_text(text);
        if first.is_empty() {
            bad.push(format!("{path}: no `//!` first sentence"));
            continue;
        }
        compared += 1;
        if !entry.starts_with(&first) {
            let shown: String = entry.chars().take(first.chars().count() + 20).collect();
            bad.push(format!("{path}:\n    doc: {first}\n    map: {shown}"));
        }
    }
    assert!(
        bad.is_empty(),
        "{} map entr(y/ies) of docs/ARCHITECTURE.md do not begin with their file's first \
         `//!` sentence:\n{}",
        bad.len(),
        bad.join("\n")
    );
    assert!(compared >= 80, "compared {compared} files with the map");
}

/// The sentence and link helpers on a scratch file, so the test above
/// cannot pass by reading nothing.
#[test]
fn a_first_doc_sentence_is_cut_and_plain() {
    let source = "//! The [`Runtime`](crate::Runtime)'s  [wait](super::wait) and\n\
                  //! [`Op`] rules, e.g. [here]. More.\n//!\n//! Later.\nuse x;\n";
    assert_eq!(
        first_doc_sentence(source),
        "The `Runtime`'s wait and `Op` rules, e.g"
    );
    assert_eq!(
        first_doc_sentence("//! One line only.\n\nfn f() {}\n"),
        "One line only"
    );
    assert_eq!(first_doc_sentence("//! Two\n//!   lines\n"), "Two lines");
    assert_eq!(first_doc_sentence("fn f() {}\n//! late\n"), "");
    assert_eq!(
        first_doc_sentence("//! # title\n//!\n//! The text. More.\n"),
        "The text"
    );
    assert_eq!(plain_text("a [b](f(x)) [`c`] &[u8] [d"), "a b `c` &u8 [d");
}
