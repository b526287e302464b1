//! The text work of `edit_file`: the size of an edit computed before it is built, the replacement
//! in one allocation, and the bounded unified diff it answers with (seed 003 §6: `EditResult(diff)`).

/// Lines of context around the changed region of a diff.
const CONTEXT: usize = 3;

/// The length of `len` bytes after `count` replacements of `old` bytes by `new` bytes; `None` when
/// it does not fit a `usize`.
pub fn edited_len(len: usize, count: usize, old: usize, new: usize) -> Option<usize> {
    if new >= old {
        len.checked_add(count.checked_mul(new - old)?)
    } else {
        len.checked_sub(count.checked_mul(old - new)?)
    }
}

/// `text` with every `old` replaced by `new`, built in one allocation of `size` bytes (the length
/// [`edited_len`] computed and the caller bounded).
pub fn replace_bounded(text: &str, old: &str, new: &str, size: usize) -> String {
    let mut out = String::with_capacity(size);
    let mut last = 0;
    for (at, _) in text.match_indices(old) {
        out.push_str(&text[last..at]);
        out.push_str(new);
        last = at + old.len();
    }
    out.push_str(&text[last..]);
    out
}

/// A diff text that stops growing at `max` bytes.
struct Bounded {
    out: String,
    max: usize,
    cut: bool,
}

impl Bounded {
    fn push(&mut self, s: &str) {
        if self.cut {
            return;
        }
        if self.out.len() + s.len() <= self.max {
            self.out.push_str(s);
            return;
        }
        let mut end = self.max - self.out.len();
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        self.out.push_str(&s[..end]);
        self.cut = true;
    }

    fn line(&mut self, mark: &str, line: &str) {
        self.push(mark);
        self.push(line);
        if !line.ends_with('\n') {
            self.push("\n\\ No newline at end of file\n");
        }
    }
}

/// The `@@` range of `len` lines from 0-based `start` (an empty range names the line before it).
fn range(start: usize, len: usize) -> String {
    match len {
        0 => format!("{start},0"),
        1 => format!("{}", start + 1),
        n => format!("{},{n}", start + 1),
    }
}

/// A unified diff (one hunk over the changed region, [`CONTEXT`] lines around it) of `before` →
/// `after`, labelled `path`; at most `max` bytes, and whether it was cut there. Linear in the texts.
pub fn unified_diff(path: &str, before: &str, after: &str, max: usize) -> (String, bool) {
    let old: Vec<&str> = before.split_inclusive('\n').collect();
    let new: Vec<&str> = after.split_inclusive('\n').collect();
    let prefix = old.iter().zip(&new).take_while(|(a, b)| a == b).count();
    let room = old.len().min(new.len()) - prefix;
    let suffix = old.iter().rev().zip(new.iter().rev()).take(room).take_while(|(a, b)| a == b).count();
    let mut d = Bounded { out: String::new(), max, cut: false };
    if prefix == old.len() && prefix == new.len() {
        return (d.out, false);
    }
    let start = prefix - prefix.min(CONTEXT);
    let tail = suffix.min(CONTEXT);
    let (old_end, new_end) = (old.len() - suffix + tail, new.len() - suffix + tail);
    d.push(&format!("--- {path}\n+++ {path}\n"));
    d.push(&format!("@@ -{} +{} @@\n", range(start, old_end - start), range(start, new_end - start)));
    for line in &old[start..prefix] {
        d.line(" ", line);
    }
    for line in &old[prefix..old.len() - suffix] {
        d.line("-", line);
    }
    for line in &new[prefix..new.len() - suffix] {
        d.line("+", line);
    }
    for line in &new[new.len() - suffix..new_end] {
        d.line(" ", line);
    }
    (d.out, d.cut)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edit_sizes_are_computed_before_building() {
        assert_eq!(edited_len(10, 2, 1, 3), Some(14));
        assert_eq!(edited_len(10, 2, 3, 1), Some(6));
        // 10^7 matches by 1 MB each: too large to build, and overflow is caught, not wrapped.
        assert_eq!(edited_len(10_000_000, 10_000_000, 1, 1_000_001), Some(10_000_010_000_000));
        assert_eq!(edited_len(usize::MAX, 2, 1, 3), None);
        assert_eq!(edited_len(1, usize::MAX, 1, 3), None);
        let after = replace_bounded("a-b-a", "a", "xyz", edited_len(5, 2, 1, 3).unwrap());
        assert_eq!((after.as_str(), after.len()), ("xyz-b-xyz", 9));
    }

    #[test]
    fn diffs_are_unified_with_context() {
        let before = "1\n2\n3\n4\n5\n6\n7\n8\n9\n";
        let after = "1\n2\n3\n4\nfive\n6\n7\n8\n9\n";
        let (d, cut) = unified_diff("/workspace/n.txt", before, after, 1 << 20);
        assert!(!cut);
        assert_eq!(
            d,
            "--- /workspace/n.txt\n+++ /workspace/n.txt\n@@ -2,7 +2,7 @@\n 2\n 3\n 4\n-5\n+five\n 6\n 7\n 8\n"
        );
        let (d, _) = unified_diff("/w", "a\nb", "a\nc", 1 << 20);
        assert_eq!(
            d,
            "--- /w\n+++ /w\n@@ -1,2 +1,2 @@\n a\n-b\n\\ No newline at end of file\n+c\n\\ No newline at end of file\n"
        );
        let (d, _) = unified_diff("/w", "", "x\n", 1 << 20);
        assert_eq!(d, "--- /w\n+++ /w\n@@ -0,0 +1 @@\n+x\n");
        let (d, _) = unified_diff("/w", "a\nb\n", "a\n", 1 << 20);
        assert_eq!(d, "--- /w\n+++ /w\n@@ -1,2 +1 @@\n a\n-b\n");
        assert_eq!(unified_diff("/w", "same\n", "same\n", 10), (String::new(), false));
    }

    #[test]
    fn diffs_stop_at_their_bound() {
        let before = "é\n".repeat(10_000);
        let after = "ü\n".repeat(10_000);
        let (d, cut) = unified_diff("/w", &before, &after, 1001);
        assert!(cut);
        assert!(d.len() <= 1001 && d.starts_with("--- /w\n"));
    }
}
