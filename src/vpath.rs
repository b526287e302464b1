//! Virtual workspace paths (SPEC §7.2, seed 003 §3.3): validation and normalization of the paths the
//! HTTP API receives, and opening a file below a host directory without following symlinks.
//!
//! A virtual path names a file relative to the scope root. The rules, applied in this order:
//!
//! 1. No Unicode normalization: a name is kept byte for byte, exactly as FUSE stores and a listing
//!    shows it, so an API path always names the entry listed under it (a Kelvin sign `\u{212A}`
//!    never reaches `K`, a decomposed `e\u{301}` never reaches a composed `é`).
//! 2. Refused: the empty path, NUL and every control character (C0, DEL, C1), backslashes (no
//!    second separator), Windows drive prefixes (`C:`), and a leading `/`: **paths are relative
//!    to the workspace root**; `/paper.pdf` is the *display* form ([`virtual_path`]) used in chat
//!    messages and upload results. The HTTP API takes it back as a path: [`normalize_virtual`]
//!    drops that one leading `/` first (seed 003 §3.3), then applies these rules. The root itself
//!    is the empty path, which only [`normalize_dir`] accepts.
//! 3. Refused after one more percent-decoding (the query string was already decoded once by the HTTP
//!    layer): anything whose decoded form would add a separator (`%2f`, `%5c`), a control character,
//!    a drive prefix or a `.`/`..` component (`%2e%2e`). A name whose decoded form is harmless (such
//!    as `100%25.txt` arriving as `100%.txt`, or `a%20b`) is kept literally, never decoded.
//! 4. Empty components (`a//b`, a trailing `/`) are dropped; `.` and `..` components are refused;
//!    the first component may not be a reserved name (`.control`, `.secrets`, `__evosci_internal__`);
//!    every component is at most 255 bytes.
//!
//! The result is the components joined by `/`, without a leading or trailing `/`.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use crate::names::{MAX_NAME_LEN, RESERVED_TOP_LEVEL};

/// Why a path was refused. Messages never repeat the path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("path is empty")]
    Empty,
    #[error("path contains a control character")]
    ControlCharacter,
    #[error("path contains a backslash")]
    Backslash,
    #[error("path has a drive prefix")]
    DrivePrefix,
    #[error("path must be relative to the workspace root (no leading '/')")]
    Absolute,
    #[error("path contains a percent-encoded separator, traversal or control character")]
    EncodedTraversal,
    #[error("path contains a '.' or '..' component")]
    Traversal,
    #[error("path starts with a reserved name")]
    Reserved,
    #[error("a path component is longer than 255 bytes")]
    NameTooLong,
}

/// Validates and normalizes a path naming something below the root (never the root itself).
pub fn normalize(raw: &str) -> Result<String, PathError> {
    normalize_inner(raw, true)
}

fn normalize_inner(raw: &str, top_level: bool) -> Result<String, PathError> {
    let path = raw;
    if path.is_empty() {
        return Err(PathError::Empty);
    }
    check_surface(path)?;
    if path.starts_with('/') {
        return Err(PathError::Absolute);
    }
    check_encoded(path)?;
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    if parts.is_empty() {
        return Err(PathError::Empty);
    }
    for p in &parts {
        if *p == "." || *p == ".." {
            return Err(PathError::Traversal);
        }
        if p.len() > MAX_NAME_LEN {
            return Err(PathError::NameTooLong);
        }
    }
    if top_level && RESERVED_TOP_LEVEL.contains(&parts[0]) {
        return Err(PathError::Reserved);
    }
    Ok(parts.join("/"))
}

/// Like [`normalize`], but the empty path (the workspace root) is allowed and returned as `""`.
pub fn normalize_dir(raw: &str) -> Result<String, PathError> {
    if raw.is_empty() {
        Ok(String::new())
    } else {
        normalize(raw)
    }
}

/// Like [`normalize`], but also accepts the display form the API returns ([`virtual_path`],
/// `/paper.pdf`): one leading `/` is dropped first (seed 003 §3.3 strips it), so a returned
/// `virtual_path` can be sent back as a `path`. Everything else is refused exactly as
/// [`normalize`] refuses it (`//x` included).
pub fn normalize_virtual(raw: &str) -> Result<String, PathError> {
    normalize(raw.strip_prefix('/').unwrap_or(raw))
}

/// Like [`normalize_dir`], with the display form accepted as in [`normalize_virtual`]: `/` is the
/// workspace root.
pub fn normalize_virtual_dir(raw: &str) -> Result<String, PathError> {
    normalize_dir(raw.strip_prefix('/').unwrap_or(raw))
}

/// Joins a normalized directory (possibly `""`) and a relative name, and validates the result.
pub fn join(dir: &str, name: &str) -> Result<String, PathError> {
    if dir.is_empty() {
        normalize(name)
    } else {
        // Validate the name on its own first: `..` must not cancel a directory component.
        let name = normalize_inner(name, false)?;
        normalize(&format!("{dir}/{name}"))
    }
}

/// The display form of a normalized path: `/` + path (what chat messages cite, e.g. `/paper.pdf`).
pub fn virtual_path(normalized: &str) -> String {
    format!("/{normalized}")
}

/// The last component of a normalized path.
pub fn file_name(normalized: &str) -> &str {
    normalized.rsplit('/').next().unwrap_or(normalized)
}

/// Refusals visible without decoding.
fn check_surface(path: &str) -> Result<(), PathError> {
    if path.chars().any(char::is_control) {
        return Err(PathError::ControlCharacter);
    }
    if path.contains('\\') {
        return Err(PathError::Backslash);
    }
    if has_drive_prefix(path.as_bytes()) {
        return Err(PathError::DrivePrefix);
    }
    Ok(())
}

fn has_drive_prefix(p: &[u8]) -> bool {
    p.len() >= 2 && p[0].is_ascii_alphabetic() && p[1] == b':'
}

/// Refuses a path whose once-more-decoded form would be dangerous.
fn check_encoded(path: &str) -> Result<(), PathError> {
    if !path.contains('%') {
        return Ok(());
    }
    let decoded = percent_decode(path.as_bytes());
    let slashes = |b: &[u8]| b.iter().filter(|&&c| c == b'/').count();
    let dangerous = slashes(&decoded) != slashes(path.as_bytes())
        || decoded.contains(&b'\\')
        || decoded.iter().any(|&b| b < 0x20 || b == 0x7f)
        || has_drive_prefix(&decoded)
        || decoded.split(|&b| b == b'/').any(|c| c == b"." || c == b"..")
        || std::str::from_utf8(&decoded).is_ok_and(|s| s.chars().any(char::is_control));
    if dangerous {
        Err(PathError::EncodedTraversal)
    } else {
        Ok(())
    }
}

/// One round of `%XX` decoding; malformed escapes stay as they are.
fn percent_decode(input: &[u8]) -> Vec<u8> {
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(input.len());
    let mut i = 0;
    while i < input.len() {
        if input[i] == b'%' && i + 2 < input.len() {
            if let (Some(h), Some(l)) = (hex(input[i + 1]), hex(input[i + 2])) {
                out.push(h * 16 + l);
                i += 3;
                continue;
            }
        }
        out.push(input[i]);
        i += 1;
    }
    out
}

/// Opens the regular file at the normalized relative path `rel` below the directory `root`, following
/// no symlink on the way (each component is opened relative to the previous one with `O_NOFOLLOW`), so
/// the file opened is always inside `root`. A missing file, a symlink anywhere on the path and anything
/// that is not a regular file all answer `NotFound`.
pub fn open_regular_beneath(root: &Path, rel: &str) -> io::Result<File> {
    let parts: Vec<&str> = rel.split('/').filter(|p| !p.is_empty()).collect();
    if parts.is_empty() || parts.iter().any(|p| *p == "." || *p == "..") {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "not a normalized relative path"));
    }
    let mut dir = open_at(None, root.as_os_str().as_bytes(), libc::O_DIRECTORY)?;
    let (last, dirs) = parts.split_last().expect("non-empty");
    for part in dirs {
        dir = open_at(Some(&dir), part.as_bytes(), libc::O_DIRECTORY | libc::O_NOFOLLOW).map_err(not_found)?;
    }
    // O_NONBLOCK: opening a fifo must not wait for a writer; it is refused below anyway.
    let fd = open_at(Some(&dir), last.as_bytes(), libc::O_NOFOLLOW | libc::O_NONBLOCK).map_err(not_found)?;
    let file = File::from(fd);
    if !file.metadata()?.file_type().is_file() {
        return Err(io::Error::from(io::ErrorKind::NotFound));
    }
    Ok(file)
}

/// Missing, a symlink (`ELOOP`) or a non-directory in the middle (`ENOTDIR`) all look the same.
fn not_found(e: io::Error) -> io::Error {
    match e.raw_os_error() {
        Some(libc::ENOENT | libc::ELOOP | libc::ENOTDIR) => io::Error::from(io::ErrorKind::NotFound),
        _ => e,
    }
}

fn open_at(dir: Option<&OwnedFd>, name: &[u8], flags: i32) -> io::Result<OwnedFd> {
    use std::os::fd::AsRawFd;
    let c = CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let dirfd = dir.map_or(libc::AT_FDCWD, |d| d.as_raw_fd());
    // SAFETY: `c` is a valid NUL-terminated string that outlives the call; `dirfd` is open or AT_FDCWD.
    let fd = unsafe { libc::openat(dirfd, c.as_ptr(), flags | libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by openat and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(p: &str) -> PathError {
        normalize(p).expect_err(p)
    }

    #[test]
    fn plain_paths_normalize() {
        assert_eq!(normalize("result.txt").unwrap(), "result.txt");
        assert_eq!(normalize("docs/a b/c.md").unwrap(), "docs/a b/c.md");
        assert_eq!(normalize("docs//c.md/").unwrap(), "docs/c.md");
        assert_eq!(normalize("sub/.control").unwrap(), "sub/.control");
        assert_eq!(normalize(".hidden").unwrap(), ".hidden");
        assert_eq!(normalize("...").unwrap(), "...");
    }

    #[test]
    fn names_are_kept_byte_for_byte() {
        // Normalizing would make these address the composed/ASCII names a listing shows separately.
        assert_eq!(normalize("cafe\u{301}.txt").unwrap(), "cafe\u{301}.txt");
        assert_eq!(normalize("\u{212A}ey.txt").unwrap(), "\u{212A}ey.txt");
        assert_eq!(normalize("d/\u{212A}ey.txt").unwrap(), "d/\u{212A}ey.txt");
    }

    #[test]
    fn empty_is_refused_but_root_is_a_directory() {
        assert_eq!(err(""), PathError::Empty);
        assert_eq!(err("//"), PathError::Absolute);
        assert_eq!(normalize_dir("").unwrap(), "");
        assert_eq!(normalize_dir("docs/").unwrap(), "docs");
    }

    #[test]
    fn control_characters_are_refused() {
        for p in ["a\0b", "a\nb", "a\tb", "a\x7fb", "a\u{85}b", "\rx"] {
            assert_eq!(err(p), PathError::ControlCharacter, "{p:?}");
        }
    }

    #[test]
    fn backslashes_and_drive_prefixes_are_refused() {
        assert_eq!(err("a\\b"), PathError::Backslash);
        assert_eq!(err("..\\..\\etc"), PathError::Backslash);
        assert_eq!(err("C:"), PathError::DrivePrefix);
        assert_eq!(err("c:/windows"), PathError::DrivePrefix);
        assert_eq!(err("C:foo"), PathError::DrivePrefix);
        assert_eq!(normalize("ab:c").unwrap(), "ab:c");
    }

    #[test]
    fn absolute_paths_are_refused() {
        assert_eq!(err("/etc/passwd"), PathError::Absolute);
        assert_eq!(err("/result.txt"), PathError::Absolute);
    }

    #[test]
    fn traversal_is_refused() {
        for p in ["..", ".", "../x", "a/../b", "a/./b", "a/..", "x/../../etc/passwd"] {
            assert_eq!(err(p), PathError::Traversal, "{p:?}");
        }
    }

    #[test]
    fn encoded_traversal_is_refused_after_one_decode() {
        for p in [
            "%2e%2e",
            "%2E%2E/x",
            "a/%2e%2e/b",
            "%2e",
            "a%2fb",
            "a%2Fb",
            "a%5cb",
            "%00",
            "a%0ab",
            "C%3a",
            "%2e%2e%2fetc",
        ] {
            assert_eq!(err(p), PathError::EncodedTraversal, "{p:?}");
        }
        // Harmless escapes are kept literally, not decoded.
        assert_eq!(normalize("100%.txt").unwrap(), "100%.txt");
        assert_eq!(normalize("a%20b").unwrap(), "a%20b");
        assert_eq!(normalize("%").unwrap(), "%");
        assert_eq!(normalize("x%2").unwrap(), "x%2");
    }

    #[test]
    fn reserved_first_components_are_refused() {
        for p in [".control", ".secrets/token", "__evosci_internal__/x", "./.control"] {
            assert!(matches!(err(p), PathError::Reserved | PathError::Traversal), "{p:?}");
        }
        assert_eq!(err(".secrets"), PathError::Reserved);
        assert_eq!(err("//.control/x"), PathError::Absolute);
    }

    #[test]
    fn long_names_are_refused() {
        let ok = "a".repeat(255);
        assert_eq!(normalize(&ok).unwrap(), ok);
        assert_eq!(err(&"a".repeat(256)), PathError::NameTooLong);
        assert_eq!(err(&format!("d/{}", "é".repeat(128))), PathError::NameTooLong);
    }

    #[test]
    fn join_validates_the_whole_path() {
        assert_eq!(join("", "a.txt").unwrap(), "a.txt");
        assert_eq!(join("docs", "a.txt").unwrap(), "docs/a.txt");
        assert_eq!(join("docs", "sub/a.txt").unwrap(), "docs/sub/a.txt");
        assert_eq!(join("docs", ".control").unwrap(), "docs/.control");
        assert_eq!(join("", ".control").unwrap_err(), PathError::Reserved);
        assert_eq!(join("docs", "../x").unwrap_err(), PathError::Traversal);
        assert_eq!(join("docs", "/x").unwrap_err(), PathError::Absolute);
        assert_eq!(join("docs", "a\\b").unwrap_err(), PathError::Backslash);
    }

    #[test]
    fn display_form_and_file_name() {
        assert_eq!(virtual_path("paper.pdf"), "/paper.pdf");
        // The display form comes back as a path; nothing else a leading '/' could hide does.
        assert_eq!(normalize_virtual(&virtual_path("docs/paper.pdf")).unwrap(), "docs/paper.pdf");
        assert_eq!(normalize_virtual("docs/paper.pdf").unwrap(), "docs/paper.pdf");
        assert_eq!(normalize_virtual_dir("/").unwrap(), "");
        assert_eq!(normalize_virtual_dir("").unwrap(), "");
        for bad in ["//etc/passwd", "/", "/../x", "/a/../../x", "/.control/x", "/a\u{1}b", "/C:/x", "/%2e%2e/x"] {
            assert!(normalize_virtual(bad).is_err(), "{bad:?}");
        }
        assert!(normalize_virtual_dir("//x").is_err());
        assert_eq!(file_name("a/b/c.txt"), "c.txt");
        assert_eq!(file_name("c.txt"), "c.txt");
    }

    #[test]
    fn open_beneath_never_follows_symlinks() {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), b"s").unwrap();
        std::fs::create_dir(root.path().join("d")).unwrap();
        std::fs::write(root.path().join("d/f.txt"), b"hello").unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret"), root.path().join("link")).unwrap();
        std::os::unix::fs::symlink(outside.path(), root.path().join("dirlink")).unwrap();
        std::os::unix::fs::symlink("f.txt", root.path().join("d/rel")).unwrap();

        let mut s = String::new();
        io::Read::read_to_string(&mut open_regular_beneath(root.path(), "d/f.txt").unwrap(), &mut s).unwrap();
        assert_eq!(s, "hello");
        for p in ["link", "dirlink/secret", "d/rel", "d", "missing", "d/f.txt/x"] {
            let e = open_regular_beneath(root.path(), p).expect_err(p);
            assert_eq!(e.kind(), io::ErrorKind::NotFound, "{p}");
        }
        assert_eq!(open_regular_beneath(root.path(), "../x").unwrap_err().kind(), io::ErrorKind::InvalidInput);
    }
}
