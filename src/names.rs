//! Name and symlink-target rules of a scope (SPEC §6): length, control characters, reserved names, confinement.

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

/// Checks a symlink target created in a directory at `link_dir_depth` levels below the scope root:
/// it must be relative, non-empty, free of NUL/control characters, and its lexical resolution
/// from the link's directory must stay inside the scope.
pub fn check_symlink_target(target: &[u8], link_dir_depth: usize) -> Result<(), EngineError> {
    if target.is_empty() || target.len() > 4095 {
        return Err(EngineError::Invalid("symlink target must be 1..4095 bytes"));
    }
    if target[0] == b'/' {
        return Err(EngineError::NotPermitted("absolute symlink targets are refused"));
    }
    if target.iter().any(|&b| b < 0x20 || b == 0x7f) {
        return Err(EngineError::NotPermitted("symlink target contains a control character"));
    }
    let mut depth = link_dir_depth as i64;
    for part in target.split(|&b| b == b'/') {
        match part {
            b"" | b"." => {}
            b".." => {
                depth -= 1;
                if depth < 0 {
                    return Err(EngineError::NotPermitted("symlink target escapes the scope"));
                }
            }
            _ => depth += 1,
        }
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
    fn symlink_targets() {
        assert!(check_symlink_target(b"a/b", 0).is_ok());
        assert!(check_symlink_target(b"../x", 1).is_ok());
        assert!(check_symlink_target(b"./../x", 1).is_ok());
        assert!(matches!(check_symlink_target(b"../x", 0), Err(EngineError::NotPermitted(_))));
        assert!(matches!(check_symlink_target(b"a/../../x", 0), Err(EngineError::NotPermitted(_))));
        assert!(matches!(check_symlink_target(b"/etc/passwd", 3), Err(EngineError::NotPermitted(_))));
        assert!(check_symlink_target(b"", 0).is_err());
    }
}
