//! Bearer secrets: generated from the OS random source, stored only as SHA-256.

use rand::TryRngCore;
use sha2::{Digest, Sha256};

/// A new secret: `prefix` followed by 32 random bytes in hex (256 bits).
pub fn generate(prefix: &str) -> String {
    let mut bytes = [0u8; 32];
    // The OS random source failing is unrecoverable: no safe secret can be made.
    #[allow(clippy::expect_used)]
    rand::rngs::OsRng
        .try_fill_bytes(&mut bytes)
        .expect("the operating system's random source failed");
    format!("{prefix}{}", hex::encode(bytes))
}

/// The hex SHA-256 of a secret, as stored.
pub fn hash(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn secrets_are_unique_and_hashes_stable() {
        let a = super::generate("allot_");
        let b = super::generate("allot_");
        assert_ne!(a, b);
        assert!(a.starts_with("allot_") && a.len() == 6 + 64);
        assert_eq!(super::hash("x"), super::hash("x"));
        assert_eq!(super::hash("x").len(), 64);
    }
}
