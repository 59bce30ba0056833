//! Checkpoints in the C2SP tlog-checkpoint format (<https://c2sp.org/tlog-checkpoint>):
//! the body of a signed note naming the log (origin), its size and its root hash.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;

use crate::merkle::Hash;
use crate::note::NoteError;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    /// Unique name of the log, e.g. `audit.allot.example/tenant/team-a`.
    pub origin: String,
    pub size: u64,
    pub root: Hash,
    /// Optional extension lines, in order.
    pub extensions: Vec<String>,
}

/// The extension line that carries when a checkpoint was signed, so that a verifier can
/// check the signing key was valid then: `allot-time <RFC 3339>`.
pub const TIME_EXTENSION: &str = "allot-time ";

impl Checkpoint {
    /// Adds the signing time as an extension line.
    pub fn at(mut self, time: chrono::DateTime<chrono::Utc>) -> Self {
        self.extensions.push(format!(
            "{TIME_EXTENSION}{}",
            time.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
        ));
        self
    }

    /// The signing time, if the checkpoint carries one.
    pub fn time(&self) -> Option<chrono::DateTime<chrono::Utc>> {
        self.extensions
            .iter()
            .find_map(|e| e.strip_prefix(TIME_EXTENSION))
            .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
            .map(|t| t.with_timezone(&chrono::Utc))
    }

    /// The note text: origin, decimal size, base64 root, then extension lines.
    pub fn body(&self) -> String {
        let mut out = format!(
            "{}\n{}\n{}\n",
            self.origin,
            self.size,
            B64.encode(self.root)
        );
        for e in &self.extensions {
            out.push_str(e);
            out.push('\n');
        }
        out
    }

    /// Parses a note text (as returned by [`crate::note::open`]).
    pub fn parse(text: &str) -> Result<Self, NoteError> {
        let bad = |why: &str| NoteError::Malformed(format!("checkpoint: {why}"));
        let body = text
            .strip_suffix('\n')
            .ok_or_else(|| bad("must end with a newline"))?;
        let mut lines = body.split('\n');
        let origin = lines
            .next()
            .filter(|o| !o.is_empty())
            .ok_or_else(|| bad("no origin"))?;
        let size = lines.next().ok_or_else(|| bad("no tree size"))?;
        if size.is_empty() || (size.len() > 1 && size.starts_with('0')) {
            return Err(bad("the tree size must be a decimal without leading zeros"));
        }
        let size: u64 = size
            .parse()
            .map_err(|_| bad("the tree size is not a number"))?;
        let root = lines.next().ok_or_else(|| bad("no root hash"))?;
        let root: Hash = B64
            .decode(root)
            .ok()
            .and_then(|r| r.try_into().ok())
            .ok_or_else(|| bad("the root hash is not 32 bytes of base64"))?;
        let extensions: Vec<String> = lines.map(str::to_owned).collect();
        if extensions.iter().any(String::is_empty) {
            return Err(bad("empty extension line"));
        }
        Ok(Self {
            origin: origin.to_owned(),
            size,
            root,
            extensions,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::merkle::{leaf_hash, root};
    use crate::note::{Signer, open};

    #[test]
    fn signed_checkpoints_round_trip() {
        let signer = Signer::generate_system("audit.allot.example").expect("key");
        let cp = Checkpoint {
            origin: "audit.allot.example/system".into(),
            size: 3,
            root: root(&[leaf_hash(b"a"), leaf_hash(b"b"), leaf_hash(b"c")]),
            extensions: vec!["timestamp 1764417600".into()],
        };
        let note = signer.sign(&cp.body()).expect("sign");
        let verified = open(&note, &[signer.verifier()]).expect("verify");
        assert_eq!(Checkpoint::parse(&verified.text).expect("parse"), cp);
    }

    #[test]
    fn parses_the_specification_shape_and_refuses_malformed_bodies() {
        let text = "example.com/origin\n1234\nHJnVpXrqbc0ewRjpq/P9bMEGbAxxFTjrCbg2JBHxx5s=\n";
        let cp = Checkpoint::parse(text).expect("parse");
        assert_eq!(cp.size, 1234);
        assert_eq!(cp.body(), text);
        for bad in [
            "",
            "origin\n",
            "origin\n01\nHJnVpXrqbc0ewRjpq/P9bMEGbAxxFTjrCbg2JBHxx5s=\n",
            "origin\n-1\nHJnVpXrqbc0ewRjpq/P9bMEGbAxxFTjrCbg2JBHxx5s=\n",
            "origin\n1\nnot-base64\n",
            "origin\n1\nAAAA\n",
            "origin\n1\nHJnVpXrqbc0ewRjpq/P9bMEGbAxxFTjrCbg2JBHxx5s=",
        ] {
            assert!(Checkpoint::parse(bad).is_err(), "{bad:?}");
        }
    }
}
