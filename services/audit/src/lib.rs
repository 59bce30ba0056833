//! The tamper-evident audit log's pure core, with no IO: Merkle trees over entries and
//! their inclusion and consistency proofs (RFC 6962 / RFC 9162), and checkpoints signed as
//! C2SP signed notes with Ed25519. Everything here is deterministic and can be checked
//! offline by anyone holding the public key.

pub mod bundle;
pub mod checkpoint;
pub mod keys;
pub mod merkle;
pub mod note;

pub use checkpoint::Checkpoint;
pub use keys::{SigningKeys, TrustedKeys};
pub use merkle::{CompactRange, Hash, ProofError, Tree};
pub use note::{NoteError, NoteSigner, Signer, Verifier};
