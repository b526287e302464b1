//! Acceptance c of issue 11, checked on the sources (std only): in `src/`, `fs/src/` and
//! `daemon/src/` no `.rs` file is over 700 lines and no function is over 80 lines (from its `fn`
//! line to its closing brace; route tables excepted: a fn named `add_routes` or `route_table`, or
//! with a `// route table` comment on its `fn` line); nowhere in those trees or in `tests/` is
//! `dead_code` allowed. Each offender is named with its path and line.

use std::path::{Path, PathBuf};

const MAX_FILE_LINES: usize = 700;
const MAX_FN_LINES: usize = 80;
/// Trees whose files and functions are measured.
const MEASURED: [&str; 3] = ["src", "fs/src", "daemon/src"];
/// Trees searched for `allow(dead_code)` as well.
const ALSO_DEAD_CODE: [&str; 1] = ["tests"];
const ROUTE_TABLE_NAMES: [&str; 2] = ["add_routes", "route_table"];
const ROUTE_TABLE_MARK: &str = "// route table";

fn repo_root() -> PathBuf {
    // The root crate's manifest dir is the repository root.
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every `.rs` file below `dir`, sorted (no `target/` or `vendor/` directory is entered).
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if path.is_dir() {
            if name != "target" && name != "vendor" {
                rust_files(&path, out);
            }
        } else if name.ends_with(".rs") {
            out.push(path);
        }
    }
}

/// The source with comments, string and char literals blanked (newlines kept), so braces and
/// keywords can be found by position.
fn code_only(src: &str) -> Vec<char> {
    let c: Vec<char> = src.chars().collect();
    let mut out = c.clone();
    let blank = |out: &mut Vec<char>, from: usize, to: usize| {
        for ch in out.iter_mut().take(to.min(c.len())).skip(from) {
            if *ch != '\n' {
                *ch = ' ';
            }
        }
    };
    let ident = |ch: char| ch.is_alphanumeric() || ch == '_';
    let mut i = 0;
    while i < c.len() {
        let next = c.get(i + 1).copied();
        if c[i] == '/' && next == Some('/') {
            let end = c[i..].iter().position(|&ch| ch == '\n').map_or(c.len(), |p| i + p);
            blank(&mut out, i, end);
            i = end;
        } else if c[i] == '/' && next == Some('*') {
            let (mut depth, mut j) = (1, i + 2);
            while j < c.len() && depth > 0 {
                if c[j] == '/' && c.get(j + 1) == Some(&'*') {
                    depth += 1;
                    j += 1;
                } else if c[j] == '*' && c.get(j + 1) == Some(&'/') {
                    depth -= 1;
                    j += 1;
                }
                j += 1;
            }
            blank(&mut out, i, j);
            i = j;
        } else if (c[i] == 'r' || (c[i] == 'b' && next == Some('r')))
            && (i == 0 || !ident(c[i - 1]))
            && raw_string_end(&c, i).is_some()
        {
            let end = raw_string_end(&c, i).unwrap();
            blank(&mut out, i, end);
            i = end;
        } else if c[i] == '"' {
            let mut j = i + 1;
            while j < c.len() && c[j] != '"' {
                j += if c[j] == '\\' { 2 } else { 1 };
            }
            blank(&mut out, i, j + 1);
            i = j + 1;
        } else if c[i] == '\'' {
            // A char literal ('x', '\n', '\u{..}'), else a lifetime or label ('a).
            if next == Some('\\') {
                let end = c[i + 2..].iter().position(|&ch| ch == '\'').map_or(c.len(), |p| i + 2 + p + 1);
                blank(&mut out, i, end);
                i = end;
            } else if c.get(i + 2) == Some(&'\'') {
                blank(&mut out, i, i + 3);
                i += 3;
            } else {
                i += 1;
            }
        } else {
            i += 1;
        }
    }
    out
}

/// The end (exclusive) of a raw string literal starting at `i` (`r"`, `r#"`, `br#"`...), if one does.
fn raw_string_end(c: &[char], i: usize) -> Option<usize> {
    let mut j = i + if c[i] == 'b' { 2 } else { 1 };
    let hashes = c[j..].iter().take_while(|&&ch| ch == '#').count();
    j += hashes;
    if c.get(j) != Some(&'"') {
        return None;
    }
    let mut k = j + 1;
    while k < c.len() {
        if c[k] == '"' && c[k + 1..].iter().take(hashes).filter(|&&ch| ch == '#').count() == hashes {
            return Some(k + 1 + hashes);
        }
        k += 1;
    }
    Some(c.len())
}

/// (name, first line, last line) of every function with a body, 1-based lines.
fn functions(src: &str) -> Vec<(String, usize, usize)> {
    let code = code_only(src);
    let line_of: Vec<usize> = {
        let mut line = 1;
        code.iter()
            .map(|&ch| {
                let l = line;
                if ch == '\n' {
                    line += 1;
                }
                l
            })
            .collect()
    };
    let ident = |ch: char| ch.is_alphanumeric() || ch == '_';
    let mut found = Vec::new();
    for i in 0..code.len().saturating_sub(3) {
        let keyword = code[i] == 'f' && code[i + 1] == 'n' && code[i + 2].is_whitespace();
        if !keyword || (i > 0 && ident(code[i - 1])) {
            continue;
        }
        let mut j = i + 2;
        while j < code.len() && code[j].is_whitespace() {
            j += 1;
        }
        let name: String = code[j..].iter().take_while(|&&ch| ident(ch)).collect();
        if name.is_empty() {
            continue; // `fn(..)` pointer types
        }
        // The body's opening brace, unless a `;` at bracket depth 0 ends a declaration first.
        let mut depth = 0i32;
        let mut open = None;
        for (k, &ch) in code.iter().enumerate().skip(j + name.len()) {
            match ch {
                '(' | '[' => depth += 1,
                ')' | ']' => depth -= 1,
                ';' if depth == 0 => break,
                '{' if depth == 0 => {
                    open = Some(k);
                    break;
                }
                _ => {}
            }
        }
        let Some(open) = open else { continue };
        let mut braces = 0i32;
        let close = code[open..].iter().position(|&ch| {
            braces += match ch {
                '{' => 1,
                '}' => -1,
                _ => 0,
            };
            braces == 0
        });
        let last = close.map_or(*line_of.last().unwrap_or(&1), |p| line_of[open + p]);
        found.push((name, line_of[i], last));
    }
    found
}

/// Offences of one file's text, each as `line: what`.
fn offences(text: &str, measured: bool) -> Vec<String> {
    let mut out = Vec::new();
    let lines: Vec<&str> = text.lines().collect();
    if measured && lines.len() > MAX_FILE_LINES {
        out.push(format!("1: file has {} lines (max {MAX_FILE_LINES})", lines.len()));
    }
    for (n, line) in lines.iter().enumerate() {
        let t = line.trim_start();
        if t.starts_with('#') && t.contains("allow(") && t.contains("dead_code") {
            out.push(format!("{}: allows dead_code: {}", n + 1, t.trim_end()));
        }
    }
    if measured {
        for (name, first, last) in functions(text) {
            let len = last - first + 1;
            let route_table = ROUTE_TABLE_NAMES.contains(&name.as_str())
                || lines.get(first - 1).is_some_and(|l| l.contains(ROUTE_TABLE_MARK));
            if len > MAX_FN_LINES && !route_table {
                out.push(format!("{first}: fn {name} has {len} lines (max {MAX_FN_LINES})"));
            }
        }
    }
    out
}

#[test]
fn sources_keep_their_shape() {
    let root = repo_root();
    let mut report = Vec::new();
    let trees = MEASURED.iter().map(|t| (t, true)).chain(ALSO_DEAD_CODE.iter().map(|t| (t, false)));
    for (tree, measured) in trees {
        let mut files = Vec::new();
        rust_files(&root.join(tree), &mut files);
        assert!(!files.is_empty() || !measured, "no Rust files under {tree}");
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("reading {}: {e}", file.display()));
            let rel = file.strip_prefix(&root).unwrap_or(&file).display().to_string();
            report.extend(offences(&text, measured).into_iter().map(|o| format!("{rel}:{o}")));
        }
    }
    assert!(report.is_empty(), "{} offenders of the code shape (issue 11 c):\n{}", report.len(), report.join("\n"));
}

#[test]
fn the_checker_finds_what_it_must() {
    let body: String = (0..MAX_FN_LINES).map(|i| format!("    let _x{i} = \"}}{{\"; // }}\n")).collect();
    let long = format!("fn long_one() {{\n{body}}}\n");
    let just = format!("fn just_fits() {{\n{}}}\n", body.lines().skip(2).map(|l| format!("{l}\n")).collect::<String>());
    let routes = format!("fn add_routes() {{\n{body}}}\nfn other() {{ // route table\n{body}}}\n");
    assert_eq!(offences(&long, true), vec![format!("1: fn long_one has {} lines (max 80)", MAX_FN_LINES + 2)]);
    assert!(offences(&just, true).is_empty(), "{:?}", offences(&just, true));
    assert!(offences(&routes, true).is_empty(), "{:?}", offences(&routes, true));
    let braces = "fn a() {\n    let c = '{';\n    let s = r#\"}\"#;\n    /* } */\n}\nfn b<'a>(x: &'a str) -> [u8; 2] { [0; 2] }\n";
    assert_eq!(functions(braces), vec![("a".to_string(), 1, 5), ("b".to_string(), 6, 6)]);
    assert_eq!(functions("trait T { fn decl(&self); fn with_body(&self) {} }"), vec![("with_body".to_string(), 1, 1)]);
    let allows =
        "#[allow(dead_code)]\nfn x() {}\n#![allow(unused, dead_code)]\n// #[allow(dead_code)] in a comment is fine\n";
    assert_eq!(offences(allows, false).len(), 2);
    let big: String = "\n".repeat(MAX_FILE_LINES + 1);
    assert_eq!(offences(&big, true), vec![format!("1: file has {} lines (max 700)", MAX_FILE_LINES + 1)]);
    assert!(offences(&big, false).is_empty(), "tests/ files are not measured");
}
