//! C2SP signed notes (<https://c2sp.org/signed-note>) with Ed25519 keys.
//!
//! A note is UTF-8 text ending in a newline, a blank line, then one line per signature:
//! `— <key name> <base64(key id || signature)>`. The key id is the first four bytes of
//! `SHA-256(name || "\n" || 0x01 || public key)`. Verifier keys are written
//! `<name>+<key id hex>+<base64(0x01 || public key)>`, signer keys
//! `PRIVATE+KEY+<name>+<key id hex>+<base64(0x01 || seed)>`.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use ring::digest::{Context, SHA256};
use ring::rand::{SecureRandom, SystemRandom};
use ring::signature::{ED25519, Ed25519KeyPair, KeyPair, UnparsedPublicKey};

const ALG_ED25519: u8 = 0x01;
const SIG_PREFIX: &str = "\u{2014} ";
/// More signatures than this on one note is refused, as a bound on work.
pub const MAX_SIGNATURES: usize = 100;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoteError {
    #[error("malformed key: {0}")]
    Key(String),
    #[error("malformed note: {0}")]
    Malformed(String),
    #[error("no signature on the note is by a known key and valid")]
    Unverified,
    #[error("the signature by {name} ({id:08x}) is invalid")]
    BadSignature { name: String, id: u32 },
    #[error("the random source failed")]
    Random,
}

fn valid_name(name: &str) -> bool {
    !name.is_empty() && !name.contains('+') && !name.chars().any(char::is_whitespace)
}

/// The four-byte id of an Ed25519 key named `name`.
pub fn key_id(name: &str, public_key: &[u8]) -> u32 {
    let mut ctx = Context::new(&SHA256);
    ctx.update(name.as_bytes());
    ctx.update(b"\n");
    ctx.update(&[ALG_ED25519]);
    ctx.update(public_key);
    let d = ctx.finish();
    let b = d.as_ref();
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

/// Splits `<name>+<hex id>+<base64>` and checks the id against the key material.
fn parse_key(s: &str) -> Result<(String, u32, Vec<u8>), NoteError> {
    let mut parts = s.splitn(3, '+');
    let (Some(name), Some(id), Some(data)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(NoteError::Key("expected NAME+ID+KEY".into()));
    };
    if !valid_name(name) {
        return Err(NoteError::Key(format!("invalid key name `{name}`")));
    }
    if id.len() != 8 {
        return Err(NoteError::Key("the key id must be 8 hex digits".into()));
    }
    let id = u32::from_str_radix(id, 16).map_err(|_| NoteError::Key("bad key id".into()))?;
    let data = B64
        .decode(data)
        .map_err(|_| NoteError::Key("the key is not base64".into()))?;
    match data.split_first() {
        Some((&ALG_ED25519, key)) if key.len() == 32 => Ok((name.to_owned(), id, key.to_vec())),
        Some((&ALG_ED25519, _)) => Err(NoteError::Key("an Ed25519 key has 32 bytes".into())),
        _ => Err(NoteError::Key(
            "only Ed25519 keys (type 0x01) are supported".into(),
        )),
    }
}

/// Checks a signature line by the key name and id it claims.
#[derive(Debug, Clone)]
pub struct Verifier {
    name: String,
    id: u32,
    public_key: Vec<u8>,
}

impl Verifier {
    /// From a verifier key string.
    pub fn from_vkey(vkey: &str) -> Result<Self, NoteError> {
        let (name, id, public_key) = parse_key(vkey.trim())?;
        if key_id(&name, &public_key) != id {
            return Err(NoteError::Key("the key id does not match the key".into()));
        }
        Ok(Self {
            name,
            id,
            public_key,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn id(&self) -> u32 {
        self.id
    }

    /// The verifier key string.
    pub fn vkey(&self) -> String {
        let mut data = vec![ALG_ED25519];
        data.extend_from_slice(&self.public_key);
        format!("{}+{:08x}+{}", self.name, self.id, B64.encode(data))
    }

    fn verify(&self, text: &[u8], sig: &[u8]) -> bool {
        UnparsedPublicKey::new(&ED25519, &self.public_key)
            .verify(text, sig)
            .is_ok()
    }
}

/// Whatever signs notes: a key in memory ([`Signer`]), or an HSM or KMS holding an Ed25519
/// key, which only has to produce the 64-byte signature of the note text.
pub trait NoteSigner: Send + Sync + std::fmt::Debug {
    /// The public key, with the name and id that signature lines carry.
    fn verifier(&self) -> Verifier;

    /// The Ed25519 signature of `message`.
    fn sign_bytes(&self, message: &[u8]) -> Result<Vec<u8>, NoteError>;

    /// Signs `text` (which must end with a newline) into a note.
    fn sign_note(&self, text: &str) -> Result<String, NoteError> {
        check_text(text)?;
        let v = self.verifier();
        let sig = self.sign_bytes(text.as_bytes())?;
        if sig.len() != 64 {
            return Err(NoteError::Key(format!(
                "the signer returned {} bytes; an Ed25519 signature has 64",
                sig.len()
            )));
        }
        let mut blob = v.id.to_be_bytes().to_vec();
        blob.extend_from_slice(&sig);
        Ok(format!(
            "{text}\n{SIG_PREFIX}{} {}\n",
            v.name,
            B64.encode(blob)
        ))
    }
}

impl NoteSigner for Signer {
    fn verifier(&self) -> Verifier {
        Signer::verifier(self)
    }

    fn sign_bytes(&self, message: &[u8]) -> Result<Vec<u8>, NoteError> {
        Ok(self.pair.sign(message).as_ref().to_vec())
    }
}

/// Signs notes with an Ed25519 key. The seed never leaves this value but through
/// [`Signer::skey`], for storing outside the database.
pub struct Signer {
    name: String,
    id: u32,
    seed: [u8; 32],
    pair: Ed25519KeyPair,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signer")
            .field("name", &self.name)
            .field("id", &format_args!("{:08x}", self.id))
            .finish_non_exhaustive()
    }
}

impl Signer {
    fn from_seed(name: &str, seed: [u8; 32]) -> Result<Self, NoteError> {
        if !valid_name(name) {
            return Err(NoteError::Key(format!("invalid key name `{name}`")));
        }
        let pair = Ed25519KeyPair::from_seed_unchecked(&seed)
            .map_err(|_| NoteError::Key("invalid Ed25519 seed".into()))?;
        let id = key_id(name, pair.public_key().as_ref());
        Ok(Self {
            name: name.to_owned(),
            id,
            seed,
            pair,
        })
    }

    /// A new random key.
    pub fn generate(name: &str, rng: &dyn SecureRandom) -> Result<Self, NoteError> {
        let mut seed = [0u8; 32];
        rng.fill(&mut seed).map_err(|_| NoteError::Random)?;
        Self::from_seed(name, seed)
    }

    /// A new key from the operating system's random source.
    pub fn generate_system(name: &str) -> Result<Self, NoteError> {
        Self::generate(name, &SystemRandom::new())
    }

    /// From a signer key string (`PRIVATE+KEY+…`).
    pub fn from_skey(skey: &str) -> Result<Self, NoteError> {
        let rest = skey
            .trim()
            .strip_prefix("PRIVATE+KEY+")
            .ok_or_else(|| NoteError::Key("a signer key starts with PRIVATE+KEY+".into()))?;
        let (name, id, seed) = parse_key(rest)?;
        let seed: [u8; 32] = seed
            .try_into()
            .map_err(|_| NoteError::Key("an Ed25519 seed has 32 bytes".into()))?;
        let signer = Self::from_seed(&name, seed)?;
        if signer.id != id {
            return Err(NoteError::Key("the key id does not match the key".into()));
        }
        Ok(signer)
    }

    /// The signer key string; keep it secret.
    pub fn skey(&self) -> String {
        let mut data = vec![ALG_ED25519];
        data.extend_from_slice(&self.seed);
        format!(
            "PRIVATE+KEY+{}+{:08x}+{}",
            self.name,
            self.id,
            B64.encode(data)
        )
    }

    pub fn verifier(&self) -> Verifier {
        Verifier {
            name: self.name.clone(),
            id: self.id,
            public_key: self.pair.public_key().as_ref().to_vec(),
        }
    }

    /// Signs `text` (which must end with a newline) into a note.
    pub fn sign(&self, text: &str) -> Result<String, NoteError> {
        self.sign_note(text)
    }
}

fn check_text(text: &str) -> Result<(), NoteError> {
    if !text.ends_with('\n') {
        return Err(NoteError::Malformed(
            "the text must end with a newline".into(),
        ));
    }
    if text.contains("\n\n") || text.starts_with('\n') {
        return Err(NoteError::Malformed(
            "the text must not contain blank lines".into(),
        ));
    }
    Ok(())
}

/// A note whose signatures were checked: its text and the keys that signed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedNote {
    pub text: String,
    /// (name, key id) of every verified signature.
    pub signers: Vec<(String, u32)>,
}

/// Verifies `note` against `verifiers`: every signature by a known key must be valid, and at
/// least one must be present. Signatures by unknown keys are ignored.
pub fn open(note: &str, verifiers: &[Verifier]) -> Result<VerifiedNote, NoteError> {
    let split = note
        .rfind("\n\n")
        .ok_or_else(|| NoteError::Malformed("no blank line before the signatures".into()))?;
    let (text, sigs) = (&note[..=split], &note[split + 2..]);
    check_text(text)?;
    if !sigs.ends_with('\n') {
        return Err(NoteError::Malformed(
            "the last signature line has no newline".into(),
        ));
    }
    let mut signers = Vec::new();
    for (n, line) in sigs.lines().enumerate() {
        if n >= MAX_SIGNATURES {
            return Err(NoteError::Malformed("too many signatures".into()));
        }
        let rest = line
            .strip_prefix(SIG_PREFIX)
            .ok_or_else(|| NoteError::Malformed(format!("signature line {} lacks `— `", n + 1)))?;
        let (name, blob) = rest
            .split_once(' ')
            .ok_or_else(|| NoteError::Malformed(format!("signature line {} has no name", n + 1)))?;
        let blob = B64
            .decode(blob)
            .map_err(|_| NoteError::Malformed(format!("signature line {} is not base64", n + 1)))?;
        if blob.len() < 5 {
            return Err(NoteError::Malformed(format!(
                "signature line {} is too short",
                n + 1
            )));
        }
        let id = u32::from_be_bytes([blob[0], blob[1], blob[2], blob[3]]);
        let Some(v) = verifiers.iter().find(|v| v.name == name && v.id == id) else {
            continue;
        };
        if !v.verify(text.as_bytes(), &blob[4..]) {
            return Err(NoteError::BadSignature {
                name: name.to_owned(),
                id,
            });
        }
        signers.push((name.to_owned(), id));
    }
    if signers.is_empty() {
        return Err(NoteError::Unverified);
    }
    Ok(VerifiedNote {
        text: text.to_owned(),
        signers,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    // The example of the C2SP signed-note specification.
    const SPEC_VKEY: &str = "example.com/foo+530d903a+AekyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2k";
    const SPEC_NOTE: &str = "This is an example message.\n\n\u{2014} example.com/foo Uw2QOkn8srV1yJGh2VYRlL1Tnagv1YEq6TfXppzi2ONncAlTgK7Ztg1ERYNZXsYjOBH3mFXmRKuwHjG1Yu72IneyaQM=\n";

    // The reference vector of Go's golang.org/x/mod/sumdb/note, with its signer key.
    const GO_SKEY: &str =
        "PRIVATE+KEY+PeterNeumann+c74f20a3+AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz";
    const GO_VKEY: &str = "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW";
    const GO_TEXT: &str = "If you think cryptography is the answer to your problem,\nthen you don't know what your problem is.\n";
    const GO_NOTE: &str = "If you think cryptography is the answer to your problem,\nthen you don't know what your problem is.\n\n\u{2014} PeterNeumann x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2pZSNXgKvqfqdngotpRZb6KE6RyyBwJnAM=\n";

    #[test]
    fn verifies_the_specification_example() {
        let v = Verifier::from_vkey(SPEC_VKEY).expect("vkey");
        assert_eq!(v.id(), 0x530d_903a);
        assert_eq!(v.vkey(), SPEC_VKEY);
        let n = open(SPEC_NOTE, &[v]).expect("verifies");
        assert_eq!(n.text, "This is an example message.\n");
        assert_eq!(n.signers, [("example.com/foo".to_owned(), 0x530d_903a)]);
    }

    #[test]
    fn signs_exactly_like_the_reference_implementation() {
        let s = Signer::from_skey(GO_SKEY).expect("skey");
        assert_eq!(s.skey(), GO_SKEY);
        assert_eq!(s.verifier().vkey(), GO_VKEY);
        assert_eq!(s.sign(GO_TEXT).expect("sign"), GO_NOTE);
        let v = Verifier::from_vkey(GO_VKEY).expect("vkey");
        assert_eq!(open(GO_NOTE, &[v]).expect("open").text, GO_TEXT);
    }

    #[test]
    fn tampering_is_detected() {
        let v = Verifier::from_vkey(GO_VKEY).expect("vkey");
        let altered = GO_NOTE.replace("cryptography", "cryptocurrency");
        assert!(matches!(
            open(&altered, std::slice::from_ref(&v)),
            Err(NoteError::BadSignature { .. })
        ));
        let spec = Verifier::from_vkey(SPEC_VKEY).expect("vkey");
        assert_eq!(
            open(GO_NOTE, &[spec]),
            Err(NoteError::Unverified),
            "unknown key only"
        );
        assert!(open("no signatures\n", std::slice::from_ref(&v)).is_err());
        assert!(open(&GO_NOTE.replace('\u{2014}', "-"), std::slice::from_ref(&v)).is_err());
        assert!(open(GO_NOTE.trim_end(), &[v]).is_err());
    }

    #[test]
    fn keys_round_trip_and_mangled_keys_are_refused() {
        let s = Signer::generate_system("audit.allot.example/system").expect("generate");
        let again = Signer::from_skey(&s.skey()).expect("reload");
        assert_eq!(again.verifier().vkey(), s.verifier().vkey());
        let note = s.sign("hello\n").expect("sign");
        open(&note, &[again.verifier()]).expect("verifies with the reloaded key");
        for bad in [
            "",
            "name+c74f20a3",
            "bad name+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW",
            "PeterNeumann+c74f20a4+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW",
            "PeterNeumann+c74f20a3+AhpcQcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW",
            "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10",
        ] {
            assert!(Verifier::from_vkey(bad).is_err(), "{bad}");
        }
        assert!(Signer::from_skey(GO_VKEY).is_err());
        assert!(s.sign("no newline").is_err());
        assert!(s.sign("blank\n\nline\n").is_err());
    }
}
