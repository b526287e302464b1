//! Name and symlink-target rules of a scope (SPEC §6): length, control characters, reserved names.

use crate::engine::EngineError;

/// Longest allowed name component, in bytes.
pub const MAX_NAME_LEN: usize = 255;

/// Top-level names no scope may create.
pub const RESERVED_TOP_LEVEL: &[&str] = &[".control", ".secrets", "__evosci_internal__"];

/// Checks a new name: non-empty, ≤ 255 bytes, no `/`, NUL or control characters, not `.`/`..`,
/// and (in the root directory) not a reserved name.
pub fn check_new_name(name: &[u8], in_root: bool) -> Result<(), EngineError> {
    if name.len() > MAX_NAME_LEN {
        return Err(EngineError::NameTooLong);
    }
    if name.is_empty() || name == b"." || name == b".." {
        return Err(EngineError::InvalidName("empty, '.' or '..'"));
    }
    if name.contains(&b'/') {
        return Err(EngineError::InvalidName("contains '/'"));
    }
    if name.iter().any(|&b| b < 0x20 || b == 0x7f) {
        return Err(EngineError::InvalidName("contains a control character"));
    }
    if let Ok(s) = std::str::from_utf8(name) {
        if s.chars().any(char::is_control) {
            return Err(EngineError::InvalidName("contains a control character"));
        }
        if in_root && RESERVED_TOP_LEVEL.contains(&s) {
            return Err(EngineError::InvalidName("reserved name"));
        }
    }
    Ok(())
}

/// Checks a lookup name: only length (existing names are looked up as they are).
pub fn check_lookup_name(name: &[u8]) -> Result<(), EngineError> {
    if name.len() > MAX_NAME_LEN {
        return Err(EngineError::NameTooLong);
    }
    Ok(())
}

/// Checks a symlink target: any target POSIX allows (absolute, with `..`, anything) of 1..4095
/// bytes. Targets are not confined: inside a container a link resolves in the container's own
/// namespace, host processes see mounts through a `nosymfollow` view, and the HTTP API, zip
/// download, import and CLI never follow a link (SPEC §6). Lexical confinement cannot work
/// (`s -> .` makes any depth of `..` reachable) and broke real trees (a venv's `bin/python3`).
pub fn check_symlink_target(target: &[u8]) -> Result<(), EngineError> {
    if target.is_empty() || target.len() > 4095 {
        return Err(EngineError::BadSymlinkTarget);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(check_new_name(b"ok.txt", true).is_ok());
        assert!(check_new_name("résumé".as_bytes(), true).is_ok());
        assert!(matches!(check_new_name(&[b'a'; 256], false), Err(EngineError::NameTooLong)));
        assert!(check_new_name(&[b'a'; 255], false).is_ok());
        assert!(matches!(check_new_name(b"a\nb", false), Err(EngineError::InvalidName(_))));
        assert!(matches!(check_new_name(b"a\x7fb", false), Err(EngineError::InvalidName(_))));
        assert!(matches!(check_new_name("a\u{85}b".as_bytes(), false), Err(EngineError::InvalidName(_))));
        assert!(matches!(check_new_name(b".control", true), Err(EngineError::InvalidName(_))));
        assert!(check_new_name(b".control", false).is_ok());
        assert!(matches!(check_new_name(b"..", false), Err(EngineError::InvalidName(_))));
    }

    #[test]
    fn every_symlink_target_posix_allows_is_accepted() {
        for t in [&b"a/b"[..], b"../x", b"../../../../etc/shadow", b"/etc/passwd", b"/usr/local/bin/python3", b"s/s/.."]
        {
            assert!(check_symlink_target(t).is_ok(), "{}", String::from_utf8_lossy(t));
        }
        assert!(check_symlink_target(&[b'a'; 4095]).is_ok());
        assert!(check_symlink_target(&[b'a'; 4096]).is_err());
        assert!(check_symlink_target(b"").is_err());
    }
}
