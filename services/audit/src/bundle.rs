//! The auditor's export bundle and its offline verification.
//!
//! A bundle is a tar file holding:
//! - `manifest.json`: what was exported (log, origin, the query, counts, sequence and time
//!   range, the checkpoint sizes included, the SHA-256 of every other file);
//! - `manifest.note`: a signed note over the manifest's SHA-256, by the key in force;
//! - `entries.jsonl`: the entries, one per line, exactly the bytes that were hashed. A whole
//!   log export has every position from 0; a pruned entry is the line
//!   `{"log":…,"seq":N,"pruned":"<hex leaf hash>"}`, which keeps the tree checkable;
//! - `proofs.jsonl` (filtered exports): each entry's inclusion proof in the covering
//!   checkpoint, line for line;
//! - `consistency.jsonl` (whole-log exports): RFC 9162 consistency proofs between each pair
//!   of consecutive checkpoints;
//! - `entries.csv` and `entries.ocsf.jsonl`: the same entries for spreadsheets and SIEMs
//!   (OCSF 1.3). They are a pure function of the hashed lines, so they are not signed on
//!   their own: the verifier re-derives them and reports any difference;
//! - `checkpoints/<size>.note`: signed checkpoints;
//! - `keys.txt`: the verifier keys with their validity periods (use `--trusted-key` to not
//!   rely on them).
//!
//! A whole-log bundle proves completeness: every position up to the largest checkpoint is
//! there. A filtered bundle proves that each entry it holds is in the log at its position,
//! not that it holds every match: completeness needs the whole log.

mod render;
mod verify;

use std::collections::BTreeMap;
use std::io::Read;

use ring::digest::{SHA256, digest};
use serde::{Deserialize, Serialize};

use crate::keys::TrustedKeys;
use crate::merkle::Hash;
use crate::note::{NoteError, NoteSigner};

pub use render::{ocsf, renderings};
pub use verify::{Checks, Problem, Report, verify, verify_with};

pub const FORMAT: &str = "allot-audit-bundle/2";
const MANIFEST_NOTE_HEADER: &str = "allot audit bundle manifest";

/// What a filtered export selected. Times are in the entries' own format (RFC 3339, UTC,
/// microseconds), so they compare as strings; `since` is inclusive, `until` exclusive.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Query {
    pub since: Option<String>,
    pub until: Option<String>,
    /// `<kind>:<id>`, or a bare id of any kind.
    pub actor: Option<String>,
    /// An exact action, or a prefix ending in `.*`.
    pub action: Option<String>,
    pub target: Option<String>,
    /// `success`, `denied` or `failed`.
    pub outcome: Option<String>,
}

impl Query {
    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }

    /// Whether the entry (parsed JSON) matches every condition.
    pub fn matches(&self, entry: &serde_json::Value) -> bool {
        let field = |name: &str| entry.get(name).and_then(|v| v.as_str());
        let time = field("time").unwrap_or("");
        let actor_kind = entry.pointer("/actor/kind").and_then(|v| v.as_str());
        let actor_id = entry.pointer("/actor/id").and_then(|v| v.as_str());
        self.since.as_deref().is_none_or(|s| time >= s)
            && self.until.as_deref().is_none_or(|u| time < u)
            && self
                .actor
                .as_deref()
                .is_none_or(|a| match a.split_once(':') {
                    Some((kind, id)) => actor_kind == Some(kind) && actor_id == Some(id),
                    None => actor_id == Some(a),
                })
            && self.action.as_deref().is_none_or(|a| {
                let action = field("action").unwrap_or("");
                match a.strip_suffix('*') {
                    Some(prefix) => action.starts_with(prefix),
                    None => action == a,
                }
            })
            && self
                .target
                .as_deref()
                .is_none_or(|t| field("target") == Some(t))
            && self
                .outcome
                .as_deref()
                .is_none_or(|o| field("outcome") == Some(o))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub format: String,
    pub log: String,
    /// The origin line of this log's checkpoints.
    pub origin: String,
    /// The filter of a filtered export; `None` for the whole log.
    pub query: Option<Query>,
    /// The tree size the bundle is checked against: every position for a whole-log export,
    /// the covering checkpoint's size for a filtered one.
    pub size: u64,
    /// Lines in `entries.jsonl`, of which `pruned` are pruned stubs.
    pub entries: u64,
    pub pruned: u64,
    pub first_seq: Option<u64>,
    pub last_seq: Option<u64>,
    pub first_time: Option<String>,
    pub last_time: Option<String>,
    /// Sizes of the checkpoints included.
    pub checkpoints: Vec<u64>,
    pub exported_at: String,
    /// Hex SHA-256 of the entries, proofs and keys files, by name.
    pub files: BTreeMap<String, String>,
}

/// One position of a whole-log export.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Line {
    /// The entry's bytes, as hashed.
    Entry(String),
    /// A pruned entry: only its leaf hash is left.
    Pruned { seq: u64, leaf_hash: Hash },
}

/// What every bundle carries besides its entries.
#[derive(Debug, Clone)]
pub struct Export<'a> {
    pub log: &'a str,
    pub origin: &'a str,
    /// RFC 3339.
    pub exported_at: &'a str,
    /// (size, signed note), ascending.
    pub checkpoints: Vec<(u64, String)>,
    pub keys: &'a TrustedKeys,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bundle {
    pub manifest_json: String,
    pub manifest_note: String,
    pub entries_jsonl: String,
    /// Filtered exports only.
    pub proofs_jsonl: Option<String>,
    /// Whole-log exports only.
    pub consistency_jsonl: Option<String>,
    pub csv: String,
    pub ocsf_jsonl: String,
    /// (size, signed note), ascending.
    pub checkpoints: Vec<(u64, String)>,
    pub keys: String,
}

#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    #[error("reading the bundle: {0}")]
    Io(#[from] std::io::Error),
    #[error("the bundle lacks {0}")]
    Missing(&'static str),
    #[error("{0}")]
    Malformed(String),
    #[error(transparent)]
    Note(#[from] NoteError),
}

pub(crate) fn sha256_hex(data: &[u8]) -> String {
    hex::encode(digest(&SHA256, data))
}

pub(crate) fn manifest_note_text(manifest_json: &str) -> String {
    format!(
        "{MANIFEST_NOTE_HEADER}\n{}\n",
        sha256_hex(manifest_json.as_bytes())
    )
}

/// The stub line that stands for a pruned entry.
pub fn pruned_line(log: &str, seq: u64, leaf_hash: &Hash) -> String {
    // A struct, not a `json!` map: its field order does not depend on serde_json features.
    #[derive(serde::Serialize)]
    struct Pruned<'a> {
        log: &'a str,
        seq: u64,
        pruned: String,
    }
    serde_json::to_string(&Pruned {
        log,
        seq,
        pruned: hex::encode(leaf_hash),
    })
    .unwrap_or_default()
}

fn b64_all(hashes: &[Hash]) -> Vec<String> {
    hashes
        .iter()
        .map(|h| base64::Engine::encode(&base64::engine::general_purpose::STANDARD, h))
        .collect()
}

fn push_line(out: &mut String, line: &str) -> Result<(), BundleError> {
    if line.contains('\n') {
        return Err(BundleError::Malformed("an entry contains a newline".into()));
    }
    out.push_str(line);
    out.push('\n');
    Ok(())
}

/// Sequence number and time of an entry body, if it has them.
fn seq_and_time(body: &str) -> (Option<u64>, Option<String>) {
    let v: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
    (
        v.get("seq").and_then(serde_json::Value::as_u64),
        v.get("time").and_then(|t| t.as_str()).map(str::to_owned),
    )
}

struct Parts {
    query: Option<Query>,
    size: u64,
    entries_jsonl: String,
    proofs_jsonl: Option<String>,
    consistency_jsonl: Option<String>,
    bodies: Vec<String>,
    lines: u64,
    pruned: u64,
    first_seq: Option<u64>,
    last_seq: Option<u64>,
}

impl Bundle {
    /// A whole-log bundle: every position from 0, pruned ones as stubs.
    pub fn full(
        signer: &dyn NoteSigner,
        export: Export<'_>,
        lines: &[Line],
    ) -> Result<Self, BundleError> {
        let mut entries_jsonl = String::new();
        let mut bodies = Vec::new();
        let mut leaves = Vec::with_capacity(lines.len());
        let mut pruned = 0;
        for line in lines {
            match line {
                Line::Entry(body) => {
                    push_line(&mut entries_jsonl, body)?;
                    leaves.push(crate::merkle::leaf_hash(body.as_bytes()));
                    bodies.push(body.clone());
                }
                Line::Pruned { seq, leaf_hash } => {
                    push_line(
                        &mut entries_jsonl,
                        &pruned_line(export.log, *seq, leaf_hash),
                    )?;
                    leaves.push(*leaf_hash);
                    pruned += 1;
                }
            }
        }
        let n = lines.len() as u64;
        // Proofs that each checkpoint extends the one before it.
        let tree = crate::merkle::Tree::new(leaves);
        let mut consistency_jsonl = String::new();
        let sizes: Vec<u64> = export
            .checkpoints
            .iter()
            .map(|(s, _)| *s)
            .filter(|s| *s <= n)
            .collect();
        for pair in sizes.windows(2) {
            let proof = tree
                .consistency_proof(pair[0], pair[1])
                .map_err(|e| BundleError::Malformed(e.to_string()))?;
            let line =
                serde_json::json!({ "from": pair[0], "to": pair[1], "proof": b64_all(&proof) });
            push_line(&mut consistency_jsonl, &line.to_string())?;
        }
        Self::assemble(
            signer,
            export,
            Parts {
                query: None,
                size: n,
                entries_jsonl,
                proofs_jsonl: None,
                consistency_jsonl: Some(consistency_jsonl),
                bodies,
                lines: n,
                pruned,
                first_seq: (n > 0).then_some(0),
                last_seq: n.checked_sub(1),
            },
        )
    }

    /// A filtered bundle: the entries matching `query`, each with its inclusion proof in the
    /// tree of `size` entries (the covering checkpoint, which must be among the export's).
    pub fn filtered(
        signer: &dyn NoteSigner,
        export: Export<'_>,
        query: Query,
        size: u64,
        entries: &[(String, Vec<Hash>)],
    ) -> Result<Self, BundleError> {
        if !export.checkpoints.iter().any(|(s, _)| *s == size) {
            return Err(BundleError::Malformed(format!(
                "no checkpoint of size {size} in the export"
            )));
        }
        let mut entries_jsonl = String::new();
        let mut proofs_jsonl = String::new();
        let (mut first_seq, mut last_seq) = (None, None);
        for (body, proof) in entries {
            push_line(&mut entries_jsonl, body)?;
            let (seq, _) = seq_and_time(body);
            first_seq = first_seq.or(seq);
            last_seq = seq;
            push_line(
                &mut proofs_jsonl,
                &serde_json::json!({ "seq": seq, "proof": b64_all(proof) }).to_string(),
            )?;
        }
        Self::assemble(
            signer,
            export,
            Parts {
                query: Some(query),
                size,
                entries_jsonl,
                proofs_jsonl: Some(proofs_jsonl),
                consistency_jsonl: None,
                bodies: entries.iter().map(|(b, _)| b.clone()).collect(),
                lines: entries.len() as u64,
                pruned: 0,
                first_seq,
                last_seq,
            },
        )
    }

    fn assemble(
        signer: &dyn NoteSigner,
        export: Export<'_>,
        p: Parts,
    ) -> Result<Self, BundleError> {
        let (csv, ocsf_jsonl) = render::renderings(p.bodies.iter().map(String::as_str))?;
        let keys = export.keys.to_text();
        let mut files = BTreeMap::new();
        files.insert(
            "entries.jsonl".to_owned(),
            sha256_hex(p.entries_jsonl.as_bytes()),
        );
        files.insert("keys.txt".to_owned(), sha256_hex(keys.as_bytes()));
        if let Some(proofs) = &p.proofs_jsonl {
            files.insert("proofs.jsonl".to_owned(), sha256_hex(proofs.as_bytes()));
        }
        if let Some(c) = &p.consistency_jsonl {
            files.insert("consistency.jsonl".to_owned(), sha256_hex(c.as_bytes()));
        }
        let manifest = Manifest {
            format: FORMAT.to_owned(),
            log: export.log.to_owned(),
            origin: export.origin.to_owned(),
            query: p.query,
            size: p.size,
            entries: p.lines,
            pruned: p.pruned,
            first_seq: p.first_seq,
            last_seq: p.last_seq,
            first_time: p.bodies.first().and_then(|b| seq_and_time(b).1),
            last_time: p.bodies.last().and_then(|b| seq_and_time(b).1),
            checkpoints: export.checkpoints.iter().map(|(s, _)| *s).collect(),
            exported_at: export.exported_at.to_owned(),
            files,
        };
        let manifest_json = serde_json::to_string_pretty(&manifest)
            .map_err(|e| BundleError::Malformed(e.to_string()))?;
        let manifest_note = signer.sign_note(&manifest_note_text(&manifest_json))?;
        Ok(Self {
            manifest_json,
            manifest_note,
            entries_jsonl: p.entries_jsonl,
            proofs_jsonl: p.proofs_jsonl,
            consistency_jsonl: p.consistency_jsonl,
            csv,
            ocsf_jsonl,
            checkpoints: export.checkpoints,
            keys,
        })
    }

    /// The bundle as a tar file.
    pub fn to_tar(&self) -> Result<Vec<u8>, BundleError> {
        let mut builder = tar::Builder::new(Vec::new());
        let mut add = |path: &str, data: &[u8]| -> std::io::Result<()> {
            let mut header = tar::Header::new_gnu();
            header.set_size(data.len() as u64);
            header.set_mode(0o644);
            header.set_mtime(0);
            header.set_cksum();
            builder.append_data(&mut header, path, data)
        };
        add("manifest.json", self.manifest_json.as_bytes())?;
        add("manifest.note", self.manifest_note.as_bytes())?;
        add("entries.jsonl", self.entries_jsonl.as_bytes())?;
        if let Some(proofs) = &self.proofs_jsonl {
            add("proofs.jsonl", proofs.as_bytes())?;
        }
        if let Some(c) = &self.consistency_jsonl {
            add("consistency.jsonl", c.as_bytes())?;
        }
        add("entries.csv", self.csv.as_bytes())?;
        add("entries.ocsf.jsonl", self.ocsf_jsonl.as_bytes())?;
        add("keys.txt", self.keys.as_bytes())?;
        for (size, note) in &self.checkpoints {
            add(&format!("checkpoints/{size:020}.note"), note.as_bytes())?;
        }
        Ok(builder.into_inner()?)
    }

    /// Reads a bundle written by [`Bundle::to_tar`].
    pub fn from_tar(bytes: &[u8]) -> Result<Self, BundleError> {
        let mut archive = tar::Archive::new(bytes);
        let mut files: BTreeMap<String, String> = BTreeMap::new();
        let mut checkpoints = Vec::new();
        for file in archive.entries()? {
            let mut file = file?;
            let path = file.path()?.to_string_lossy().into_owned();
            let mut text = String::new();
            file.read_to_string(&mut text)
                .map_err(|e| BundleError::Malformed(format!("{path}: {e}")))?;
            if let Some(name) = path.strip_prefix("checkpoints/") {
                let size = name
                    .strip_suffix(".note")
                    .and_then(|n| n.parse::<u64>().ok())
                    .ok_or_else(|| BundleError::Malformed(format!("unexpected file {path}")))?;
                checkpoints.push((size, text));
            } else if [
                "manifest.json",
                "manifest.note",
                "entries.jsonl",
                "proofs.jsonl",
                "consistency.jsonl",
                "entries.csv",
                "entries.ocsf.jsonl",
                "keys.txt",
            ]
            .contains(&path.as_str())
            {
                files.insert(path, text);
            } else {
                return Err(BundleError::Malformed(format!("unexpected file {path}")));
            }
        }
        checkpoints.sort_by_key(|(s, _)| *s);
        let mut take = |name: &'static str| files.remove(name).ok_or(BundleError::Missing(name));
        Ok(Self {
            manifest_json: take("manifest.json")?,
            manifest_note: take("manifest.note")?,
            entries_jsonl: take("entries.jsonl")?,
            proofs_jsonl: take("proofs.jsonl").ok(),
            consistency_jsonl: take("consistency.jsonl").ok(),
            csv: take("entries.csv")?,
            ocsf_jsonl: take("entries.ocsf.jsonl")?,
            keys: take("keys.txt")?,
            checkpoints,
        })
    }
}

#[cfg(test)]
mod tests;
