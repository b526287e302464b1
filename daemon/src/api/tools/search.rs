//! Bounded search primitives of the file tools: the directory walk (entry budget and deadline),
//! glob patterns matched as a set of states (linear in the path, whatever the number of `**`),
//! and regular-expression search (the `regex` crate: linear in the data, compiled size bounded).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use regex::bytes::{Regex, RegexBuilder};
use scopefs::engine::{Attr, EngineError, FileKind, Ino, ScopeEngine};
use scopefs::limits::{self, Bound, LimitsConfig};

use super::super::ApiError;
use super::engine_err;

fn bad(message: &'static str) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, "invalid_pattern", message)
}

/// A pattern longer than its `[limits]` bound: 413, counted under `bound`.
pub fn pattern_too_large(bound: Bound, key: &str) -> ApiError {
    limits::refuse(bound);
    ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "too_large", format!("pattern is longer than limits.{key}"))
}

/// What a walk's visitor decides for one entry.
pub enum Visit<S> {
    /// Stop the walk (it reports itself cut short).
    Stop,
    /// Go on; for a directory, do not descend into it.
    Skip,
    /// Go on; for a directory, descend into it with this state.
    Descend(S),
}

/// Bounds of one walk: at most `max_entries` entries, at most `max_queued_bytes` of paths of
/// directories waiting to be visited, until `deadline`.
pub struct WalkBudget {
    max_entries: u64,
    max_queued_bytes: u64,
    deadline: Instant,
}

impl WalkBudget {
    /// `max_walk_entries` entries, for at most `http_request_timeout_secs` (after that the answer
    /// would not be awaited anyway).
    pub fn from_limits(l: &LimitsConfig) -> WalkBudget {
        WalkBudget {
            max_entries: l.max_walk_entries,
            max_queued_bytes: l.max_listing_bytes,
            deadline: Instant::now() + Duration::from_secs(l.http_request_timeout_secs),
        }
    }
}

/// Visits every entry below directory `dir` (breadth first, sorted per directory), never following
/// a symlink; a directory's children are visited with the state its visit returned. Stops when
/// the visitor says so, after the budget's entries, when the directories waiting would hold more
/// than its bytes of paths, or at its deadline. Returns whether it was cut short.
pub fn walk<S>(
    engine: &ScopeEngine,
    dir: &str,
    root: S,
    budget: &WalkBudget,
    mut visit: impl FnMut(&str, &Attr, &S) -> Result<Visit<S>, ApiError>,
) -> Result<bool, ApiError> {
    let start = engine.resolve_path(dir).map_err(engine_err)?;
    if start.kind != FileKind::Dir {
        return Err(engine_err(EngineError::NotDir));
    }
    let mut queue: VecDeque<(Ino, String, S)> = VecDeque::from([(start.ino, dir.to_string(), root)]);
    let (mut seen, mut queued_bytes) = (0u64, dir.len() as u64);
    while let Some((ino, prefix, state)) = queue.pop_front() {
        queued_bytes -= prefix.len() as u64;
        let mut entries = match engine.readdir(ino) {
            Ok(e) => e,
            // Removed or replaced while walking: skip it.
            Err(EngineError::NotFound | EngineError::NotDir) if ino != start.ino => continue,
            Err(e) => return Err(engine_err(e)),
        };
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        for e in entries {
            seen += 1;
            if seen > budget.max_entries {
                limits::refuse(Bound::WalkEntries);
                return Ok(true);
            }
            if Instant::now() >= budget.deadline {
                return Ok(true);
            }
            let name = String::from_utf8_lossy(&e.name);
            let path = if prefix.is_empty() { name.into_owned() } else { format!("{prefix}/{name}") };
            match visit(&path, &e.attr, &state)? {
                Visit::Stop => return Ok(true),
                Visit::Skip => {}
                Visit::Descend(s) if e.attr.kind == FileKind::Dir => {
                    queued_bytes += path.len() as u64;
                    if queued_bytes > budget.max_queued_bytes {
                        limits::refuse(Bound::ListingBytes);
                        return Ok(true);
                    }
                    queue.push_back((e.attr.ino, path, s))
                }
                Visit::Descend(_) => {}
            }
        }
    }
    Ok(false)
}

/// One component of a glob pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    /// `**`: any number of path components (none included).
    Any,
    /// `*`, `?` and `[...]` within one name.
    Name(Vec<u8>),
}

/// A glob pattern over `/`-separated relative paths, matched component by component as a set of
/// positions in the pattern (a Thompson-style simulation): each component costs at most one name
/// match per pattern part, whatever the number of `**`.
#[derive(Debug)]
pub struct Glob {
    parts: Vec<Part>,
}

/// The positions of a [`Glob`] reachable after some path components (sorted, no duplicates).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GlobState(Vec<usize>);

impl Glob {
    /// Parses `pattern`; longer than `max_bytes` is 413 (`glob_max_pattern_bytes`).
    pub fn parse(pattern: &str, max_bytes: u64) -> Result<Glob, ApiError> {
        if pattern.len() as u64 > max_bytes {
            return Err(pattern_too_large(Bound::GlobPattern, "glob_max_pattern_bytes"));
        }
        if pattern.is_empty() {
            return Err(bad("pattern must not be empty"));
        }
        if pattern.starts_with('/') {
            return Err(bad("pattern must be relative to the directory searched"));
        }
        if pattern.chars().any(char::is_control) || pattern.contains('\\') {
            return Err(bad("pattern contains a control character or backslash"));
        }
        let raw: Vec<&str> = pattern.split('/').filter(|p| !p.is_empty() && *p != ".").collect();
        if raw.contains(&"..") {
            return Err(bad("pattern contains '..'"));
        }
        let mut parts: Vec<Part> = Vec::with_capacity(raw.len());
        for p in raw {
            let part = if p == "**" { Part::Any } else { Part::Name(p.as_bytes().to_vec()) };
            // `**/**` matches what `**` matches.
            if !(part == Part::Any && parts.last() == Some(&Part::Any)) {
                parts.push(part);
            }
        }
        Ok(Glob { parts })
    }

    /// The state before any component.
    pub fn start(&self) -> GlobState {
        let mut marks = vec![false; self.parts.len() + 1];
        marks[0] = true;
        self.close(marks)
    }

    /// Adds the positions reachable by skipping `**` (which may match no component): one forward
    /// pass, as skipping only moves forward.
    fn close(&self, mut marks: Vec<bool>) -> GlobState {
        for pos in 0..self.parts.len() {
            if marks[pos] && self.parts[pos] == Part::Any {
                marks[pos + 1] = true;
            }
        }
        GlobState(marks.iter().enumerate().filter(|(_, m)| **m).map(|(i, _)| i).collect())
    }

    /// The state after one more component `name`.
    pub fn step(&self, state: &GlobState, name: &[u8]) -> GlobState {
        let mut marks = vec![false; self.parts.len() + 1];
        for &pos in &state.0 {
            match self.parts.get(pos) {
                Some(Part::Any) => marks[pos] = true,
                Some(Part::Name(p)) if match_name(p, name) => marks[pos + 1] = true,
                _ => {}
            }
        }
        self.close(marks)
    }

    /// Whether a path whose components led to `state` matches.
    pub fn accepts(&self, state: &GlobState) -> bool {
        state.0.contains(&self.parts.len())
    }

    /// Whether nothing below a directory in `state` can match (no position is left).
    pub fn dead(state: &GlobState) -> bool {
        state.0.is_empty()
    }

    /// Whether the whole relative `path` matches.
    pub fn matches(&self, path: &str) -> bool {
        let end = path.split('/').fold(self.start(), |s, seg| self.step(&s, seg.as_bytes()));
        self.accepts(&end)
    }
}

/// `*`, `?` and `[...]` within one name (a leading `.` is matched like any character).
fn match_name(p: &[u8], s: &[u8]) -> bool {
    // Iterative matching with one backtrack point for the last `*`: O(|p|·|s|) at worst.
    let (mut pi, mut si) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while si < s.len() {
        if pi < p.len() {
            match p[pi] {
                b'*' => {
                    star = Some((pi, si));
                    pi += 1;
                    continue;
                }
                b'?' => {
                    pi += 1;
                    si += 1;
                    continue;
                }
                b'[' => {
                    if let Some((ok, next)) = class(&p[pi..], s[si]) {
                        if ok {
                            pi += next;
                            si += 1;
                            continue;
                        }
                    } else if s[si] == b'[' {
                        pi += 1;
                        si += 1;
                        continue;
                    }
                }
                c if c == s[si] => {
                    pi += 1;
                    si += 1;
                    continue;
                }
                _ => {}
            }
        }
        match star {
            Some((sp, ss)) => {
                pi = sp + 1;
                si = ss + 1;
                star = Some((sp, ss + 1));
            }
            None => return false,
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
}

/// A `[...]` class at the start of `p`: whether `c` is in it and the class's length; `None` if unclosed.
fn class(p: &[u8], c: u8) -> Option<(bool, usize)> {
    let end = p.iter().skip(2).position(|&b| b == b']')? + 2;
    let body = &p[1..end];
    let (negate, body) = match body.first() {
        Some(b'!' | b'^') => (true, &body[1..]),
        _ => (false, body),
    };
    let mut hit = false;
    let mut i = 0;
    while i < body.len() {
        if i + 2 < body.len() && body[i + 1] == b'-' {
            hit |= body[i] <= c && c <= body[i + 2];
            i += 3;
        } else {
            hit |= body[i] == c;
            i += 1;
        }
    }
    Some((hit != negate, end + 1))
}

/// `pattern` compiled for grep_files: at most `grep_max_pattern_bytes` long and
/// `grep_max_regex_bytes` compiled (program and lazy-DFA cache), else 413; invalid is 400
/// `invalid_pattern` with the parser's explanation. `^` and `$` match at line ends.
pub fn compile_regex(pattern: &str, l: &LimitsConfig) -> Result<Regex, ApiError> {
    if pattern.is_empty() {
        return Err(bad("pattern must not be empty"));
    }
    if pattern.len() as u64 > l.grep_max_pattern_bytes {
        return Err(pattern_too_large(Bound::GrepPattern, "grep_max_pattern_bytes"));
    }
    let size = usize::try_from(l.grep_max_regex_bytes).unwrap_or(usize::MAX);
    let built = RegexBuilder::new(pattern).multi_line(true).size_limit(size).dfa_size_limit(size).build();
    match built {
        Ok(re) => Ok(re),
        Err(regex::Error::CompiledTooBig(_)) => {
            limits::refuse(Bound::GrepRegex);
            Err(ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "too_large",
                "pattern compiles to more than limits.grep_max_regex_bytes",
            ))
        }
        Err(e) => {
            Err(ApiError::new(StatusCode::BAD_REQUEST, "invalid_pattern", format!("invalid regular expression: {e}")))
        }
    }
}

/// The lines of `data` where `re` matches (a match spanning lines counts for its first), as
/// (1-based line number, line without its `\n`), in order; at most `max` of them (and whether more
/// were there). Linear in `data`.
pub fn matching_lines<'d>(data: &'d [u8], re: &Regex, max: usize) -> (Vec<(usize, &'d [u8])>, bool) {
    let mut out = Vec::new();
    let (mut from, mut line_no, mut counted) = (0usize, 1usize, 0usize);
    while from <= data.len() {
        let Some(hit) = re.find_at(data, from).map(|m| m.start()) else { break };
        let start = memchr::memrchr(b'\n', &data[..hit]).map_or(0, |i| i + 1);
        let end = memchr::memchr(b'\n', &data[hit..]).map_or(data.len(), |i| hit + i);
        line_no += memchr::memchr_iter(b'\n', &data[counted..start]).count();
        counted = start;
        if out.len() == max {
            return (out, true);
        }
        out.push((line_no, &data[start..end]));
        if end >= data.len() {
            break;
        }
        from = end + 1;
    }
    (out, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn glob(p: &str) -> Glob {
        Glob::parse(p, 1024).unwrap()
    }

    /// Review N2: the directories a walk has yet to visit are held as paths; past
    /// `max_queued_bytes` of them it stops (truncated, counted) instead of growing.
    #[test]
    fn a_walk_stops_when_the_directories_waiting_hold_too_many_path_bytes() {
        use scopefs::engine::{Owner, Quota, Storage, StorageSettings};
        let dir = tempfile::tempdir().unwrap();
        let rt = tokio::runtime::Runtime::new().unwrap();
        let store = std::sync::Arc::new(scopefs::store::MemoryStore::new());
        let storage = Storage::new(store, StorageSettings::default(), &dir.path().join("data"), rt.handle().clone());
        let quota = Quota { bytes: 1 << 30, inodes: 10_000 };
        let e = storage.unwrap().open_scope(&scopefs::ids::ScopeId::generate(), quota).unwrap();
        for i in 0..100 {
            e.make_dirs(&format!("{i:03}{}", "d".repeat(200)), Owner { uid: 0, gid: 0 }).unwrap();
        }
        let count = |max_queued_bytes| {
            let budget =
                WalkBudget { max_entries: 1000, max_queued_bytes, deadline: Instant::now() + Duration::from_secs(60) };
            let mut seen = 0;
            let cut = walk(&e, "", (), &budget, |_, _, _| {
                seen += 1;
                Ok(Visit::Descend(()))
            });
            (cut.unwrap(), seen)
        };
        let refused = || limits::refusals().into_iter().find(|(l, _)| *l == "listing_bytes").map_or(0, |(_, n)| n);
        let before = refused();
        assert_eq!(count(10_000), (true, 50), "49 paths of 203 bytes fit in 10,000, the 50th does not");
        assert!(refused() > before);
        assert_eq!(count(1 << 20), (false, 100));
    }

    #[test]
    fn globs_match_names_and_directories() {
        let g = |p: &str, s: &str| glob(p).matches(s);
        assert!(g("*.py", "a.py"));
        assert!(!g("*.py", "d/a.py"));
        assert!(g("**/*.py", "a.py"));
        assert!(g("**/*.py", "d/e/a.py"));
        assert!(g("d/**", "d/e/a.py"));
        assert!(g("d/**", "d"));
        assert!(g("d/**/x/**/y", "d/x/y"));
        assert!(g("d/**/x/**/y", "d/a/b/x/c/y"));
        assert!(!g("d/**/x/**/y", "d/a/b/y/c/x"));
        assert!(g("?.[ch]", "x.c"));
        assert!(!g("?.[!ch]", "x.c"));
        assert!(g("a*b*c", "aXbYbc"));
        assert!(!g("a*b*c", "aXbYb"));
        assert!(Glob::parse("../*", 1024).is_err());
        assert!(Glob::parse("/etc/*", 1024).is_err());
        let long = Glob::parse(&"a".repeat(1025), 1024).unwrap_err();
        assert_eq!((long.status, long.code), (StatusCode::PAYLOAD_TOO_LARGE, "too_large"));
    }

    #[test]
    fn many_double_stars_stay_linear_in_depth() {
        // 2 000 components and every `**` the pattern can hold: the old backtracking matcher took
        // ~depth^k steps here; states are at most the pattern's parts per component.
        let deep = vec!["d"; 2000].join("/");
        let pattern = format!("{}nomatch", "**/d/".repeat(100));
        let g = glob(&pattern);
        let started = Instant::now();
        assert!(!g.matches(&deep));
        assert!(g.matches(&format!("{deep}/nomatch")));
        assert!(!glob("**/**/**/**/nomatch").matches(&deep));
        assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
        // A fixed prefix that does not match kills the state: nothing below is walked.
        let fixed = glob("src/**/*.rs");
        assert!(Glob::dead(&fixed.step(&fixed.start(), b"docs")));
        assert!(!Glob::dead(&fixed.step(&fixed.start(), b"src")));
    }

    fn re(p: &str) -> Regex {
        compile_regex(p, &LimitsConfig::default()).unwrap()
    }

    #[test]
    fn matching_lines_are_found_linearly() {
        let (lines, more) = matching_lines(b"xab\nno\n\nabab\nlast ab", &re("ab"), 10);
        assert_eq!(lines, vec![(1, &b"xab"[..]), (4, &b"abab"[..]), (5, &b"last ab"[..])]);
        assert!(!more);
        let (lines, more) = matching_lines(b"ab\nab\nab\n", &re("ab"), 2);
        assert_eq!((lines.len(), more), (2, true));
        assert_eq!(matching_lines(b"", &re("ab"), 2).0, vec![]);
        // Regular expressions, with `^`/`$` at line ends; an empty match still advances.
        let (lines, _) = matching_lines(b"fn a()\n  fn b()\nfn\n", &re(r"^fn \w+\(\)$"), 10);
        assert_eq!(lines, vec![(1, &b"fn a()"[..])]);
        assert_eq!(matching_lines(b"a\nb\n", &re("x*"), 10).0.len(), 3);
        // A pattern that backtracking engines take exponential time on stays linear here.
        let hay = vec![b'a'; 4 << 20];
        let started = Instant::now();
        assert!(matching_lines(&hay, &re("(a*)*b"), 10).0.is_empty());
        assert!(matching_lines(&hay, &re(&format!("{}b", "a".repeat(1000))), 10).0.is_empty());
        assert!(started.elapsed() < Duration::from_secs(20), "took {:?}", started.elapsed());
    }

    #[test]
    fn regex_patterns_are_bounded_and_explained() {
        let small = LimitsConfig { grep_max_regex_bytes: 10_000, ..LimitsConfig::default() };
        let big = compile_regex(r"\w{50}", &small).unwrap_err();
        assert_eq!((big.status, big.code), (StatusCode::PAYLOAD_TOO_LARGE, "too_large"));
        let invalid = compile_regex("a(b", &LimitsConfig::default()).unwrap_err();
        assert_eq!((invalid.status, invalid.code), (StatusCode::BAD_REQUEST, "invalid_pattern"));
        assert!(invalid.message.contains("unclosed group"), "{}", invalid.message);
        let long = compile_regex(&"a".repeat(1025), &LimitsConfig::default()).unwrap_err();
        assert_eq!(long.status, StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(compile_regex("", &LimitsConfig::default()).unwrap_err().code, "invalid_pattern");
    }
}
