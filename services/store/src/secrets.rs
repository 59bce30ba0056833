//! Secrets the control plane must read back (tenants' registry pull credentials), sealed at
//! rest with AES-256-GCM under a key kept outside the database.
//!
//! A key file holds one `ID:BASE64` line per key (32 random bytes each). The first seals;
//! every one opens, so a key is rotated by putting a new one first and keeping the old
//! ones until every secret was written again. A sealed value is
//! `v1:ID:BASE64(nonce ‖ ciphertext ‖ tag)` and is bound to where it is stored (the
//! additional authenticated data), so a value copied to another row does not open.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};

#[derive(Debug, thiserror::Error)]
pub enum SecretsError {
    #[error("secrets key file, line {line}: {why}")]
    Key { line: usize, why: String },
    #[error("the secrets key file has no key")]
    NoKey,
    #[error("a sealed secret is sealed with key `{0}`, which the secrets key file does not hold")]
    UnknownKey(String),
    #[error("a sealed secret does not open: it was altered, moved, or sealed under another key")]
    Tampered,
    #[error("the operating system's random source failed")]
    Random,
}

/// The keys that seal and open secrets. `Debug` shows only their ids.
pub struct SecretKeys {
    /// (id, key); the first seals.
    keys: Vec<(String, LessSafeKey)>,
    rng: SystemRandom,
}

impl std::fmt::Debug for SecretKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ids: Vec<&str> = self.keys.iter().map(|(id, _)| id.as_str()).collect();
        f.debug_struct("SecretKeys").field("ids", &ids).finish()
    }
}

fn valid_id(id: &str) -> bool {
    (1..=32).contains(&id.len())
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

impl SecretKeys {
    /// Reads a key file's content (blank lines and `#` comments ignored).
    pub fn parse(text: &str) -> Result<Self, SecretsError> {
        let mut keys = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = |why: &str| SecretsError::Key {
                line: i + 1,
                why: why.to_owned(),
            };
            let (id, b64) = line
                .split_once(':')
                .ok_or_else(|| bad("expected ID:BASE64"))?;
            if !valid_id(id) {
                return Err(bad("the id must be 1 to 32 letters, digits, `-` or `_`"));
            }
            if keys.iter().any(|(k, _)| k == id) {
                return Err(bad("the id is used twice"));
            }
            let bytes = B64
                .decode(b64.trim())
                .map_err(|_| bad("the key is not base64"))?;
            if bytes.len() != 32 {
                return Err(bad("the key must be 32 bytes"));
            }
            let key = UnboundKey::new(&AES_256_GCM, &bytes).map_err(|_| bad("unusable key"))?;
            keys.push((id.to_owned(), LessSafeKey::new(key)));
        }
        if keys.is_empty() {
            return Err(SecretsError::NoKey);
        }
        Ok(SecretKeys {
            keys,
            rng: SystemRandom::new(),
        })
    }

    /// A new key file line with id `id`, from the OS random source.
    pub fn generate_line(id: &str) -> Result<String, SecretsError> {
        if !valid_id(id) {
            return Err(SecretsError::Key {
                line: 1,
                why: "the id must be 1 to 32 letters, digits, `-` or `_`".into(),
            });
        }
        let mut key = [0u8; 32];
        SystemRandom::new()
            .fill(&mut key)
            .map_err(|_| SecretsError::Random)?;
        Ok(format!("{id}:{}", B64.encode(key)))
    }

    /// A key that lives as long as the process: what a store gets when none is configured.
    /// Secrets sealed under it do not open after a restart.
    pub fn ephemeral() -> Result<Self, SecretsError> {
        Self::parse(&Self::generate_line("ephemeral")?)
    }

    /// Seals `plaintext`, bound to `context` (where it is stored).
    pub fn seal(&self, context: &[u8], plaintext: &[u8]) -> Result<String, SecretsError> {
        let (id, key) = self.keys.first().ok_or(SecretsError::NoKey)?;
        let mut nonce = [0u8; NONCE_LEN];
        self.rng
            .fill(&mut nonce)
            .map_err(|_| SecretsError::Random)?;
        let mut buf = plaintext.to_vec();
        key.seal_in_place_append_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(context),
            &mut buf,
        )
        .map_err(|_| SecretsError::Random)?;
        let mut out = nonce.to_vec();
        out.extend_from_slice(&buf);
        Ok(format!("v1:{id}:{}", B64.encode(out)))
    }

    /// Opens a value [`seal`](Self::seal)ed with the same `context`.
    pub fn open(&self, context: &[u8], sealed: &str) -> Result<Vec<u8>, SecretsError> {
        let mut parts = sealed.splitn(3, ':');
        let (Some("v1"), Some(id), Some(b64)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(SecretsError::Tampered);
        };
        let (_, key) = self
            .keys
            .iter()
            .find(|(k, _)| k == id)
            .ok_or_else(|| SecretsError::UnknownKey(id.to_owned()))?;
        let bytes = B64.decode(b64).map_err(|_| SecretsError::Tampered)?;
        if bytes.len() < NONCE_LEN {
            return Err(SecretsError::Tampered);
        }
        let (nonce, rest) = bytes.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| SecretsError::Tampered)?;
        let mut buf = rest.to_vec();
        let plain = key
            .open_in_place(nonce, Aad::from(context), &mut buf)
            .map_err(|_| SecretsError::Tampered)?;
        Ok(plain.to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_values_open_only_in_their_place_and_under_their_key() {
        let keys = SecretKeys::ephemeral().expect("key");
        let sealed = keys.seal(b"tenant-1/registry", b"hunter2").expect("seal");
        assert!(!sealed.contains("hunter2"));
        assert_eq!(
            keys.open(b"tenant-1/registry", &sealed).expect("open"),
            b"hunter2"
        );
        // Moved to another row, altered, or under another key: refused.
        assert!(matches!(
            keys.open(b"tenant-2/registry", &sealed),
            Err(SecretsError::Tampered)
        ));
        let mut altered = sealed.clone();
        altered.pop();
        altered.push(if sealed.ends_with('A') { 'B' } else { 'A' });
        assert!(keys.open(b"tenant-1/registry", &altered).is_err());
        let other = SecretKeys::ephemeral().expect("key");
        assert!(other.open(b"tenant-1/registry", &sealed).is_err());
        // Two seals of one value differ (a fresh nonce each time).
        assert_ne!(
            sealed,
            keys.seal(b"tenant-1/registry", b"hunter2").expect("seal")
        );
    }

    #[test]
    fn a_rotated_key_file_opens_old_values_and_seals_with_the_first() {
        let old = SecretKeys::generate_line("k1").expect("line");
        let new = SecretKeys::generate_line("k2").expect("line");
        let before = SecretKeys::parse(&old).expect("parse");
        let sealed = before.seal(b"c", b"v").expect("seal");
        let after = SecretKeys::parse(&format!("{new}\n# old\n{old}\n")).expect("parse");
        assert_eq!(after.open(b"c", &sealed).expect("open"), b"v");
        assert!(after.seal(b"c", b"v").expect("seal").starts_with("v1:k2:"));
        assert!(format!("{after:?}").contains("k2") && !format!("{after:?}").contains(&new[3..]));
    }

    #[test]
    fn bad_key_files_name_their_line() {
        for (text, line) in [("k1", 1), ("\nk1:AAAA", 2), ("bad id:AAAA", 1)] {
            match SecretKeys::parse(text) {
                Err(SecretsError::Key { line: l, .. }) => assert_eq!(l, line, "{text}"),
                other => panic!("{text}: {other:?}"),
            }
        }
        assert!(matches!(
            SecretKeys::parse("# none\n"),
            Err(SecretsError::NoKey)
        ));
    }
}
