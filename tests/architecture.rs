//! The shape of the code, checked: no import cycle among the modules of `src/`, rooms of a size
//! a reader holds in mind, and no declared dependency left unused. Run alone with
//! `cargo test --test architecture`.
//!
//! - **Import graph.** Each top-level file of `src/` and each top-level folder (`config/`,
//!   `store/`, `limit/`, ...) is one node; an edge is a `crate::` path from one node to
//!   another, in code (comments are skipped). The graph must have no cycle, and `config`, the
//!   ground floor, may import only the pure `limit` and `redact` modules.
//! - **Sizes.** No production file in `src/` over 600 lines and no function over 80, not
//!   counting `#[cfg(test)]` modules and `tests.rs` files.
//! - **Dependencies.** Every `[dependencies]` entry is named in `src/`, every
//!   `[dev-dependencies]` entry in `src/` (unit tests), `tests/`, `benches/` or `examples/`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const MAX_FILE_LINES: usize = 600;
const MAX_FN_LINES: usize = 80;

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("read {}: {e}", d.display())) {
            let p = e.expect("dir entry").path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// The code of a file without comments (a `//` to the end of the line; the crate uses no
/// block comments).
fn code(text: &str) -> String {
    text.lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The node of a file under `src/`: its top-level file stem or folder.
fn node(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).expect("under src");
    let first = rel.components().next().expect("a component");
    let name = first.as_os_str().to_string_lossy();
    name.strip_suffix(".rs").unwrap_or(&name).to_string()
}

/// Every module named right after `crate::`, also inside `crate::{a, b::c}`.
fn crate_paths(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    for (i, _) in code.match_indices("crate::") {
        let before = code[..i].chars().next_back();
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$') {
            continue;
        }
        let rest = &code[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // The first name of every item at the top level of the braces.
            let (mut depth, mut start) = (0usize, true);
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => start = true,
                    c if start && !c.is_whitespace() => {
                        let name = ident(&group[j..]);
                        if !name.is_empty() {
                            out.insert(name);
                        }
                        start = false;
                    }
                    _ => {}
                }
            }
        } else {
            let name = ident(rest);
            if !name.is_empty() {
                out.insert(name);
            }
        }
    }
    out
}

fn import_graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(ROOT).join("src");
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in rust_files(&src) {
        let from = node(&src, &f);
        if from == "main" || from == "lib" {
            continue;
        }
        let text = std::fs::read_to_string(&f).expect("read source");
        let edges = graph.entry(from.clone()).or_default();
        for to in crate_paths(&code(&text)) {
            if to != from {
                edges.insert(to);
            }
        }
    }
    graph
}

/// A cycle through `start`, if any, as the path of nodes.
fn cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == n) {
            let mut c = path[i..].to_vec();
            c.push(n.to_string());
            return Some(c);
        }
        if done.contains(n) {
            return None;
        }
        path.push(n.to_string());
        for m in graph.get(n).into_iter().flatten() {
            if let Some(c) = visit(m, graph, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(n.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|n| visit(n, graph, &mut Vec::new(), &mut done))
}

#[test]
fn modules_import_each_other_without_a_cycle() {
    let graph = import_graph();
    assert!(graph.len() > 5, "found the modules of src/: {graph:?}");
    if let Some(c) = cycle(&graph) {
        panic!("import cycle: {}\ngraph: {graph:#?}", c.join(" -> "));
    }
}

#[test]
fn config_is_the_ground_floor() {
    let graph = import_graph();
    let config = &graph["config"];
    let pure = ["limit", "pingora_patches", "redact"];
    let allowed: BTreeSet<String> = pure.map(String::from).into();
    assert!(
        config.is_subset(&allowed),
        "config may import only the pure limit, pingora_patches and redact modules, imports {config:?}"
    );
    for pure in pure {
        assert!(graph[pure].is_empty(), "{pure} is pure: {:?}", graph[pure]);
    }
}

#[test]
fn the_checker_sees_cycles_and_grouped_imports() {
    assert_eq!(
        crate_paths("use crate::{config::{A, B}, store};\nlet x = crate::limit::f();"),
        ["config", "limit", "store"].map(String::from).into()
    );
    let g: BTreeMap<String, BTreeSet<String>> = [
        ("a".to_string(), ["b".to_string()].into()),
        ("b".to_string(), ["c".to_string()].into()),
        ("c".to_string(), ["a".to_string()].into()),
    ]
    .into();
    assert_eq!(cycle(&g).expect("a cycle"), ["a", "b", "c", "a"]);
    assert_eq!(code("let a = 1; // crate::x\n"), "let a = 1; ");
}

/// The lines of a file that count: everything but a `#[cfg(test)]` module at the top level.
fn production_lines(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut lines = text.lines().peekable();
    while let Some(l) = lines.next() {
        if l == "#[cfg(test)]" && lines.peek().is_some_and(|n| n.starts_with("mod ")) {
            let m = lines.next().expect("peeked");
            if m.ends_with(';') {
                continue;
            }
            for l in lines.by_ref() {
                if l == "}" {
                    break;
                }
            }
            continue;
        }
        out.push(l);
    }
    out
}

/// Functions longer than [`MAX_FN_LINES`]: (name, lines). A function ends at the first line
/// that is its own indentation and `}` (rustfmt's layout).
fn long_functions(lines: &[&str]) -> Vec<(String, usize)> {
    let mut out = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        let trimmed = l.trim_start();
        let indent = l.len() - trimmed.len();
        let sig = [
            "fn ",
            "pub fn ",
            "pub(crate) fn ",
            "pub(super) fn ",
            "async fn ",
            "pub async fn ",
            "pub(super) async fn ",
            "pub(crate) async fn ",
            "unsafe fn ",
        ];
        let Some(rest) = sig.iter().find_map(|s| trimmed.strip_prefix(s)) else {
            continue;
        };
        if l.ends_with(';') {
            continue;
        }
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        let close = format!("{}}}", " ".repeat(indent));
        let end = lines[i..].iter().position(|x| *x == close);
        if let Some(len) = end.map(|e| e + 1) {
            if len > MAX_FN_LINES {
                out.push((name, len));
            }
        }
    }
    out
}

#[test]
fn files_and_functions_fit_in_a_readers_head() {
    let src = Path::new(ROOT).join("src");
    let mut problems = Vec::new();
    for f in rust_files(&src) {
        if f.file_name().is_some_and(|n| n == "tests.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&f).expect("read source");
        let lines = production_lines(&text);
        let rel = f.strip_prefix(ROOT).expect("under root").display();
        if lines.len() > MAX_FILE_LINES {
            problems.push(format!(
                "{rel}: {} lines (at most {MAX_FILE_LINES})",
                lines.len()
            ));
        }
        for (name, len) in long_functions(&lines) {
            problems.push(format!(
                "{rel}: fn {name} is {len} lines (at most {MAX_FN_LINES})"
            ));
        }
    }
    assert!(problems.is_empty(), "too big:\n{}", problems.join("\n"));
}

/// The crate names of a `[section]` of Cargo.toml.
fn dependencies(manifest: &str, section: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut inside = false;
    for l in manifest.lines() {
        let l = l.trim();
        if l.starts_with('[') {
            inside = l == section;
            continue;
        }
        if inside && !l.is_empty() && !l.starts_with('#') {
            if let Some((name, _)) = l.split_once('=') {
                out.push(name.trim().to_string());
            }
        }
    }
    out
}

fn all_code(dirs: &[&str]) -> String {
    dirs.iter()
        .map(|d| Path::new(ROOT).join(d))
        .filter(|d| d.exists())
        .flat_map(|d| rust_files(&d))
        .map(|f| code(&std::fs::read_to_string(f).expect("read source")))
        .collect::<Vec<_>>()
        .join("\n")
}

fn unused(deps: &[String], code: &str) -> Vec<String> {
    deps.iter()
        .filter(|d| {
            let ident = d.replace('-', "_");
            !code.contains(&format!("{ident}::")) && !code.contains(&format!("use {ident}"))
        })
        .cloned()
        .collect()
}

#[test]
fn every_dependency_is_used() {
    let manifest = std::fs::read_to_string(Path::new(ROOT).join("Cargo.toml")).expect("Cargo.toml");
    let deps = dependencies(&manifest, "[dependencies]");
    let dev = dependencies(&manifest, "[dev-dependencies]");
    assert!(
        deps.len() > 5 && !dev.is_empty(),
        "read the manifest: {deps:?} {dev:?}"
    );
    let unused_deps = unused(&deps, &all_code(&["src"]));
    assert!(
        unused_deps.is_empty(),
        "dependencies not used in src/: {unused_deps:?}"
    );
    // Unit tests in src/ use dev-dependencies too (proptest).
    let unused_dev = unused(&dev, &all_code(&["src", "tests", "benches", "examples"]));
    assert!(
        unused_dev.is_empty(),
        "dev-dependencies not used in src/, tests/, benches/ or examples/: {unused_dev:?}"
    );
}
