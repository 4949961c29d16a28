//! Operator bearer tokens (PURE apart from [`OperatorTokens::load`] and [`generate`]).
//!
//! A token is a random secret an operator sends as `Authorization: Bearer TOKEN` to the
//! master's HTTPS API. The master never stores the secret: its `--operator-tokens FILE` holds the
//! SHA-256 of each token with the operator name it stands for, and a presented token is hashed
//! and compared with every entry in constant time. `gantryctl token create NAME` makes one
//! (256 random bits); `gantryctl token hash` accepts an operator's own token only when it is
//! strong ([`weakness`]: at least [`MIN_TOKEN_LEN`] characters and an estimated 128 bits). The
//! file holds digests, so the master can not see how strong a token is: it refuses any presented
//! token shorter than [`MIN_TOKEN_LEN`] instead (such a token can never authenticate).
//!
//! ```toml
//! [[tokens]]
//! name = "ci"                 # the operator name ACLs grant actions to
//! sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
//! ```

use std::path::Path;

use serde::Deserialize;
use subtle::ConstantTimeEq;

/// Bytes of randomness in a generated token (hex-encoded: 64 characters).
const TOKEN_BYTES: usize = 32;
/// Longest token accepted at all (longer ones are refused before hashing).
pub const MAX_TOKEN_LEN: usize = 512;
/// Shortest token accepted at all (32 hexadecimal characters are 128 bits).
pub const MIN_TOKEN_LEN: usize = 32;
/// Estimated bits a token must carry for `gantryctl token hash` to accept it.
pub const MIN_TOKEN_BITS: f64 = 128.0;

/// Why a token file can not be used.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("reading token file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("token file {path} is not valid: {source}")]
    Parse {
        path: String,
        source: toml::de::Error,
    },
    #[error("token file {path}, entry {index}: {message}")]
    Invalid {
        path: String,
        index: usize,
        message: String,
    },
    #[error("token file {path} is readable or writable by others (mode {mode:o}); run `chmod 600 {path}`")]
    Permissions { path: String, mode: u32 },
    #[error("no system randomness: {0}")]
    Random(String),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    tokens: Vec<Entry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    name: String,
    sha256: String,
}

/// The operator tokens the master accepts: (SHA-256 digest, operator name).
#[derive(Debug, Clone, Default)]
pub struct OperatorTokens {
    entries: Vec<([u8; 32], String)>,
}

impl OperatorTokens {
    /// No tokens: only client certificates authenticate.
    pub fn none() -> Self {
        Self::default()
    }

    /// Loads a token file; refuses one that group or others may read or write.
    pub fn load(path: &Path) -> Result<Self, TokenError> {
        use std::os::unix::fs::PermissionsExt;
        let shown = path.display().to_string();
        let meta = std::fs::metadata(path).map_err(|source| TokenError::Read {
            path: shown.clone(),
            source,
        })?;
        let mode = meta.permissions().mode() & 0o7777;
        if mode & 0o022 != 0 || mode & 0o004 != 0 {
            return Err(TokenError::Permissions { path: shown, mode });
        }
        let text = std::fs::read_to_string(path).map_err(|source| TokenError::Read {
            path: shown.clone(),
            source,
        })?;
        Self::from_toml(&text, &shown)
    }

    /// Parses the token file format (`path` only names it in errors).
    pub fn from_toml(text: &str, path: &str) -> Result<Self, TokenError> {
        let file: File = toml::from_str(text).map_err(|source| TokenError::Parse {
            path: path.to_string(),
            source,
        })?;
        let mut entries = Vec::with_capacity(file.tokens.len());
        for (index, e) in file.tokens.into_iter().enumerate() {
            let invalid = |message: String| TokenError::Invalid {
                path: path.to_string(),
                index,
                message,
            };
            if !gantry_transport::tls::valid_name(&e.name) {
                return Err(invalid(format!("invalid operator name {:?}", e.name)));
            }
            let digest = parse_hex32(&e.sha256)
                .ok_or_else(|| invalid("sha256 must be 64 hexadecimal characters".into()))?;
            entries.push((digest, e.name));
        }
        Ok(Self { entries })
    }

    /// How many tokens are configured.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when no token is configured.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The operator a presented token stands for. Every entry is compared (in constant time),
    /// so the time taken does not tell which entry, or how much of one, matched.
    pub fn verify(&self, token: &str) -> Option<&str> {
        if token.len() < MIN_TOKEN_LEN || token.len() > MAX_TOKEN_LEN {
            return None;
        }
        self.name_of_digest(&sha256(token.as_bytes()))
    }

    /// The operator whose token has SHA-256 `digest` (compared in constant time like
    /// [`Self::verify`]).
    pub fn name_of_digest(&self, digest: &[u8; 32]) -> Option<&str> {
        let digest = *digest;
        let mut found = None;
        for (d, name) in &self.entries {
            if bool::from(d.ct_eq(&digest)) && found.is_none() {
                found = Some(name.as_str());
            }
        }
        found
    }
}

fn sha256(data: &[u8]) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, data);
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

fn parse_hex32(s: &str) -> Option<[u8; 32]> {
    let s = s.trim();
    if s.len() != 64 || !s.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The SHA-256 of a token (what the file stores, and what a dashboard session remembers).
pub fn digest(token: &str) -> [u8; 32] {
    sha256(token.as_bytes())
}

/// Why `token` is too weak to accept, if it is: shorter than [`MIN_TOKEN_LEN`], longer than
/// [`MAX_TOKEN_LEN`], not printable ASCII without spaces, or under [`MIN_TOKEN_BITS`] estimated
/// as length × log2(distinct characters) (so `aaaa…` or `abababab…` of any length fails).
pub fn weakness(token: &str) -> Option<String> {
    if token.len() < MIN_TOKEN_LEN {
        return Some(format!(
            "tokens must be at least {MIN_TOKEN_LEN} characters (this one has {})",
            token.len()
        ));
    }
    if token.len() > MAX_TOKEN_LEN {
        return Some(format!("tokens must be at most {MAX_TOKEN_LEN} characters"));
    }
    if !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Some("tokens must be printable ASCII without spaces".into());
    }
    let mut seen = [false; 128];
    for b in token.bytes() {
        seen[usize::from(b)] = true;
    }
    let distinct = seen.iter().filter(|s| **s).count();
    let bits = token.len() as f64 * (distinct as f64).log2();
    if bits < MIN_TOKEN_BITS {
        return Some(format!(
            "this token carries about {bits:.0} bits ({distinct} distinct characters); at least \
             {MIN_TOKEN_BITS:.0} are needed: use `gantryctl token create`"
        ));
    }
    None
}

/// The SHA-256 of a token, hex-encoded, as the token file stores it.
pub fn hash_token(token: &str) -> String {
    hex(&sha256(token.as_bytes()))
}

/// A new random token (64 hexadecimal characters from the system CSPRNG).
pub fn generate() -> Result<String, TokenError> {
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; TOKEN_BYTES];
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|e| TokenError::Random(e.to_string()))?;
    Ok(hex(&bytes))
}

/// The token file entry for `name` and `token` (TOML).
pub fn file_entry(name: &str, token: &str) -> String {
    format!(
        "[[tokens]]\nname = \"{name}\"\nsha256 = \"{}\"\n",
        hash_token(token)
    )
}

/// Operator tokens shared with the shell, which may replace them (reload) while serving.
#[derive(Clone, Debug, Default)]
pub struct SharedTokens(std::sync::Arc<std::sync::RwLock<OperatorTokens>>);

impl SharedTokens {
    /// Shares `tokens`.
    pub fn new(tokens: OperatorTokens) -> Self {
        Self(std::sync::Arc::new(std::sync::RwLock::new(tokens)))
    }

    /// Replaces the tokens (requests from now on see the new set).
    pub fn replace(&self, tokens: OperatorTokens) {
        match self.0.write() {
            Ok(mut t) => *t = tokens,
            Err(poisoned) => *poisoned.into_inner() = tokens,
        }
    }

    /// How many tokens are configured.
    pub fn len(&self) -> usize {
        self.0.read().map(|t| t.len()).unwrap_or(0)
    }

    /// True when no token is configured.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The operator a presented token stands for.
    pub fn verify(&self, token: &str) -> Option<String> {
        let t = self.0.read().ok()?;
        t.verify(token).map(str::to_string)
    }

    /// The operator whose token has this digest, while the token is still configured (a
    /// dashboard session ends with its token).
    pub fn verify_digest(&self, digest: &[u8; 32]) -> Option<String> {
        let t = self.0.read().ok()?;
        t.name_of_digest(digest).map(str::to_string)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_matches_the_standard_test_vector() {
        assert_eq!(
            hash_token("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn a_generated_token_verifies_and_others_do_not() {
        let a = generate().unwrap();
        let b = generate().unwrap();
        assert_eq!(a.len(), 64);
        assert_ne!(a, b);
        let text = format!("{}\n{}", file_entry("ci", &a), file_entry("alice", &b));
        let tokens = OperatorTokens::from_toml(&text, "t.toml").unwrap();
        assert_eq!(tokens.len(), 2);
        assert_eq!(tokens.verify(&a), Some("ci"));
        assert_eq!(tokens.verify(&b), Some("alice"));
        assert_eq!(tokens.verify(&a[..63]), None);
        assert_eq!(tokens.name_of_digest(&digest(&a)), Some("ci"));
        assert_eq!(tokens.name_of_digest(&digest("nope")), None);
        assert_eq!(tokens.verify(""), None);
        assert_eq!(tokens.verify(&"x".repeat(MAX_TOKEN_LEN + 1)), None);
        // The file holds only digests: the token itself appears nowhere in it.
        assert!(!text.contains(&a));
        assert_eq!(OperatorTokens::none().verify(&a), None);
    }

    #[test]
    fn bad_entries_are_refused_with_their_index() {
        let bad_hash = "[[tokens]]\nname = \"ci\"\nsha256 = \"abc\"\n";
        let err = OperatorTokens::from_toml(bad_hash, "t.toml").unwrap_err();
        assert!(matches!(err, TokenError::Invalid { index: 0, .. }), "{err}");
        let bad_name = format!(
            "{}[[tokens]]\nname = \"../x\"\nsha256 = \"{}\"\n",
            file_entry("ok", &"t".repeat(40)),
            hash_token("u")
        );
        let err = OperatorTokens::from_toml(&bad_name, "t.toml").unwrap_err();
        assert!(matches!(err, TokenError::Invalid { index: 1, .. }), "{err}");
        let unknown = "[[tokens]]\nname = \"ci\"\nsecret = \"plain\"\n";
        assert!(OperatorTokens::from_toml(unknown, "t.toml").is_err());
    }

    #[test]
    fn short_and_weak_tokens_are_refused() {
        // A short token in the file (hashed by hand) never authenticates.
        let short = "correct-horse";
        let tokens = OperatorTokens::from_toml(&file_entry("ci", short), "t.toml").unwrap();
        assert_eq!(tokens.verify(short), None);
        assert!(weakness(short).unwrap().contains("at least 32"));
        assert!(weakness(&"a".repeat(64)).unwrap().contains("bits"));
        assert!(weakness(&"ab".repeat(40)).unwrap().contains("bits"));
        assert!(weakness(&format!("{} x", "0123456789abcdef".repeat(2))).is_some());
        assert_eq!(weakness(&generate().unwrap()), None);
        assert_eq!(
            weakness("0123456789abcdef0123456789abcdef"),
            None,
            "32 hex: 128 bits"
        );
    }

    #[test]
    fn a_token_file_others_can_read_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.toml");
        let secret = generate().unwrap();
        std::fs::write(&path, file_entry("ci", &secret)).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(
            OperatorTokens::load(&path),
            Err(TokenError::Permissions { .. })
        ));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(
            OperatorTokens::load(&path).unwrap().verify(&secret),
            Some("ci")
        );
    }
}
