//! API tokens: taken from config/env or generated once into `<data_dir>/control/<name>-token` (0600); constant-time checks.

use std::fmt;
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use sha2::{Digest, Sha256};

/// A bearer secret. `Debug` never shows it.
pub struct Token(String);

impl Token {
    pub fn new(secret: String) -> Token {
        Token(secret)
    }

    /// The secret itself: printed by `token show`, and the HMAC key of signed requests.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Constant-time comparison: both sides are hashed to fixed-size digests first, so neither the
    /// content nor the length of the secret leaks through timing.
    pub fn matches(&self, presented: &str) -> bool {
        let a = Sha256::digest(self.0.as_bytes());
        let b = Sha256::digest(presented.as_bytes());
        a.iter().zip(b.iter()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

/// The configured token, else the one stored in `file`, else a new random one written to `file`
/// (32 random bytes, hex, mode 0600).
pub fn load_or_generate(configured: Option<&str>, file: &Path) -> io::Result<Token> {
    if let Some(secret) = configured.map(str::trim).filter(|s| !s.is_empty()) {
        return Ok(Token::new(secret.to_owned()));
    }
    match read_token_file(file) {
        Ok(token) => return Ok(token),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let secret = hex::encode(rand::random::<[u8; 32]>());
    let created = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(file);
    match created {
        Ok(mut f) => {
            f.write_all(secret.as_bytes())?;
            f.write_all(b"\n")?;
            f.sync_all()?;
            Ok(Token::new(secret))
        }
        // Another process created it first: use theirs.
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => read_token_file(file),
        Err(e) => Err(e),
    }
}

fn read_token_file(file: &Path) -> io::Result<Token> {
    let text = std::fs::read_to_string(file)?;
    std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o600))?;
    let secret = text.trim();
    if secret.is_empty() {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "token file is empty"));
    }
    Ok(Token::new(secret.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_only_the_exact_secret() {
        let t = Token::new("abc123".into());
        assert!(t.matches("abc123"));
        assert!(!t.matches("abc124"));
        assert!(!t.matches("abc12"));
        assert!(!t.matches(""));
        assert_eq!(format!("{t:?}"), "Token(<redacted>)");
    }

    #[test]
    fn generates_once_then_reuses_and_prefers_config() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("service-token");
        let first = load_or_generate(None, &file).unwrap();
        assert_eq!(first.expose().len(), 64);
        assert!(first.expose().bytes().all(|b| b.is_ascii_hexdigit()));
        let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let again = load_or_generate(None, &file).unwrap();
        assert_eq!(again.expose(), first.expose());
        let configured = load_or_generate(Some("from-config"), &file).unwrap();
        assert_eq!(configured.expose(), "from-config");
        let other = load_or_generate(None, &dir.path().join("admin-token")).unwrap();
        assert_ne!(other.expose(), first.expose());
    }
}
