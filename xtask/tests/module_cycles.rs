//! No import cycle between the top-level modules of any crate: a module that names
//! `crate::other` depends on `other`, and the dependencies must form a DAG, so the data flow
//! (probe sites → events → requests → parts → reports) reads one way. Unit tests (from a
//! file's `#[cfg(test)]` on) may use any module: a fixture is no dependency of the code.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

const CRATES: [&str; 8] = [
    "gateway",
    "harness",
    "loadgen",
    "session",
    "testproc",
    "tracer",
    "tracer-ebpf",
    "xtask",
];

type Graph = BTreeMap<String, BTreeSet<String>>;

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file of `src` belongs to; `None` for the crate roots and binaries.
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).ok()?;
    let first = rel.components().next()?.as_os_str().to_str()?;
    match first {
        "lib.rs" | "main.rs" | "bin" => None,
        name => Some(name.trim_end_matches(".rs").to_owned()),
    }
}

/// Modules named as `crate::<name>` in code (comments and unit tests left out).
fn named_modules(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text
        .lines()
        .take_while(|line| line.trim() != "#[cfg(test)]")
    {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            let after = &rest[at + "crate::".len()..];
            let name: String = after
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                names.insert(name);
            }
            rest = after;
        }
    }
    names
}

fn graph(src: &Path) -> Graph {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let modules: BTreeSet<String> = files.iter().filter_map(|f| module_of(src, f)).collect();
    let mut graph = Graph::new();
    for file in &files {
        let Some(module) = module_of(src, file) else {
            continue;
        };
        let text = fs::read_to_string(file).unwrap();
        let deps = graph.entry(module.clone()).or_default();
        for name in named_modules(&text) {
            if name != module && modules.contains(&name) {
                deps.insert(name);
            }
        }
    }
    graph
}

/// One cycle, as the modules along it, if there is any.
fn find_cycle(graph: &Graph) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &Graph,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut cycle = path[at..].to_vec();
            cycle.push(node.to_owned());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut Vec::new(), &mut done))
}

#[test]
fn no_crate_has_an_import_cycle_between_its_modules() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    for krate in CRATES {
        let graph = graph(&root.join(krate).join("src"));
        if let Some(cycle) = find_cycle(&graph) {
            panic!("{krate}: import cycle {}", cycle.join(" → "));
        }
    }
}

#[test]
fn a_cycle_is_found_and_comments_do_not_count() {
    let graph = Graph::from([
        ("a".to_owned(), BTreeSet::from(["b".to_owned()])),
        ("b".to_owned(), BTreeSet::from(["c".to_owned()])),
        ("c".to_owned(), BTreeSet::from(["a".to_owned()])),
    ]);
    assert_eq!(find_cycle(&graph).unwrap(), ["a", "b", "c", "a"]);
    let text = "use crate::a::X;\n//! see [`crate::b`]\nlet y = crate::c::f(); // crate::d\n\
                #[cfg(test)]\nmod tests { use crate::e; }";
    assert_eq!(
        named_modules(text),
        BTreeSet::from(["a".to_owned(), "c".to_owned()])
    );
}
