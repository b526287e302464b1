//! Test: the dependency graph of the daemon's top-level modules (from `crate::` paths in
//! production code, test modules and comments left out) has no cycle, and the layers run one way:
//! `api` → `services` → (registry, engine, `services::mounter`, `executor`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Graph = BTreeMap<String, BTreeSet<String>>;

/// Every `.rs` file of a module: `src/<name>.rs` or everything below `src/<name>/`.
fn files_of(src: &Path, module: &str) -> Vec<PathBuf> {
    let file = src.join(format!("{module}.rs"));
    let mut out = if file.is_file() { vec![file] } else { Vec::new() };
    let mut dirs = vec![src.join(module)];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out
}

/// Production code of a file: without its `#[cfg(test)]` items and comments.
fn production_code(text: &str) -> String {
    let mut out = String::new();
    let mut skip_depth: Option<i64> = None;
    let mut depth = 0i64;
    let mut pending_test = false;
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or("");
        let opens = code.matches('{').count() as i64 - code.matches('}').count() as i64;
        if skip_depth.is_none() && pending_test && !code.trim().is_empty() && !code.trim_start().starts_with("#[") {
            pending_test = false;
            if code.contains('{') {
                skip_depth = Some(depth);
            } else if code.trim_end().ends_with(';') {
                depth += opens;
                continue;
            }
        }
        if code.trim_start().starts_with("#[cfg(test)]") {
            pending_test = true;
        }
        depth += opens;
        match skip_depth {
            Some(d) if depth <= d => skip_depth = None,
            Some(_) => {}
            None => {
                out.push_str(code);
                out.push('\n');
            }
        }
    }
    out
}

/// The first path segments after `crate::` (also inside `crate::{a, b::c}`).
fn crate_paths(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (i, _) in code.match_indices("crate::") {
        let before = code[..i].chars().last();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let rest = &code[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let inner = group.split('}').next().unwrap_or("");
            for part in inner.split(',') {
                let name: String = part.trim().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                if !name.is_empty() {
                    out.insert(name);
                }
            }
        } else {
            let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            out.insert(name);
        }
    }
    out
}

fn graph() -> Graph {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    let modules: Vec<String> =
        lib.lines().filter_map(|l| l.strip_prefix("pub mod ")).map(|m| m.trim_end_matches(';').to_string()).collect();
    assert!(modules.len() > 10, "lib.rs lists the modules: {modules:?}");
    let mut graph = Graph::new();
    for m in &modules {
        let mut deps = BTreeSet::new();
        for file in files_of(&src, m) {
            let code = production_code(&std::fs::read_to_string(&file).unwrap());
            deps.extend(crate_paths(&code).into_iter().filter(|d| d != m && modules.contains(d)));
        }
        graph.insert(m.clone(), deps);
    }
    graph
}

/// A cycle through `start`, if any.
fn cycle_from(graph: &Graph, start: &str) -> Option<Vec<String>> {
    let mut stack = vec![(start.to_string(), vec![start.to_string()])];
    let mut seen = BTreeSet::new();
    while let Some((node, path)) = stack.pop() {
        for next in graph.get(&node).into_iter().flatten() {
            if next == start {
                let mut cycle = path.clone();
                cycle.push(next.clone());
                return Some(cycle);
            }
            if seen.insert(next.clone()) {
                let mut p = path.clone();
                p.push(next.clone());
                stack.push((next.clone(), p));
            }
        }
    }
    None
}

fn reaches(graph: &Graph, from: &str, to: &str) -> bool {
    let mut stack = vec![from.to_string()];
    let mut seen = BTreeSet::new();
    while let Some(node) = stack.pop() {
        for next in graph.get(&node).into_iter().flatten() {
            if next == to {
                return true;
            }
            if seen.insert(next.clone()) {
                stack.push(next.clone());
            }
        }
    }
    false
}

#[test]
fn daemon_modules_have_no_cycle_and_layers_run_one_way() {
    let graph = graph();
    for m in graph.keys() {
        assert!(cycle_from(&graph, m).is_none(), "cycle: {:?}\ngraph: {graph:#?}", cycle_from(&graph, m));
    }
    assert!(reaches(&graph, "api", "services"), "{graph:#?}");
    for lower in ["services", "executor", "metrics", "billing_loop", "pools"] {
        assert!(!reaches(&graph, lower, "api"), "{lower} must not reach api: {graph:#?}");
    }
    for lower in ["executor", "metrics", "billing_loop"] {
        assert!(!reaches(&graph, lower, "services"), "{lower} must not reach services: {graph:#?}");
    }
}

#[test]
fn the_checker_sees_grouped_paths_and_skips_tests_and_comments() {
    let code = "use crate::{api, services::Scopes};\n// crate::metrics\nfn f() { crate::pools::x(); }\n\
                #[cfg(test)]\nmod tests {\n    use crate::serve;\n}\n";
    let found = crate_paths(&production_code(code));
    assert_eq!(found, ["api", "pools", "services"].map(String::from).into_iter().collect());
    let mut g = Graph::new();
    g.insert("a".into(), ["b".to_string()].into());
    g.insert("b".into(), ["a".to_string()].into());
    assert!(cycle_from(&g, "a").is_some());
}
