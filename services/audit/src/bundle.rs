//! The auditor's export bundle and its offline verification.
//!
//! A bundle is a tar file holding:
//! - `manifest.json`: what was exported (log, origin, counts, sequence and time range, the
//!   SHA-256 of the entries file, the checkpoint sizes included);
//! - `manifest.note`: a signed note over the manifest's SHA-256, by the log's key;
//! - `entries.jsonl`: every entry of the log from sequence 0, one per line, exactly the bytes
//!   that were hashed;
//! - `checkpoints/<size>.note`: the log's signed checkpoints;
//! - `key.vkey`: the verifier key (use `--trusted-key` to not rely on it).
//!
//! [`verify`] needs nothing but the bundle (and, ideally, a trusted key and the external
//! checkpoint copies): it checks signatures, sequence continuity, each entry's commitment to
//! the history before it, and every checkpoint's root, and names the first bad entry.

use std::io::Read;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use ring::digest::{SHA256, digest};
use serde::{Deserialize, Serialize};

use crate::checkpoint::Checkpoint;
use crate::merkle::{CompactRange, Hash, leaf_hash};
use crate::note::{NoteError, Signer, Verifier, open};

pub const FORMAT: &str = "allot-audit-bundle/1";
const MANIFEST_NOTE_HEADER: &str = "allot audit bundle manifest";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub format: String,
    pub log: String,
    /// The origin line of this log's checkpoints.
    pub origin: String,
    /// Entries `0..entries` are in the bundle.
    pub entries: u64,
    pub first_time: Option<String>,
    pub last_time: Option<String>,
    /// Sizes of the checkpoints included.
    pub checkpoints: Vec<u64>,
    pub exported_at: String,
    /// Hex SHA-256 of `entries.jsonl`.
    pub entries_sha256: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bundle {
    pub manifest_json: String,
    pub manifest_note: String,
    pub entries_jsonl: String,
    /// (size, signed note), ascending.
    pub checkpoints: Vec<(u64, String)>,
    pub vkey: String,
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

fn sha256_hex(data: &[u8]) -> String {
    digest(&SHA256, data)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn manifest_note_text(manifest_json: &str) -> String {
    format!(
        "{MANIFEST_NOTE_HEADER}\n{}\n",
        sha256_hex(manifest_json.as_bytes())
    )
}

/// Pulls `time` out of an entry body, if it has one.
fn entry_time(body: &str) -> Option<String> {
    serde_json::from_str::<serde_json::Value>(body)
        .ok()?
        .get("time")?
        .as_str()
        .map(str::to_owned)
}

impl Bundle {
    /// Assembles and signs a bundle of `entries` (bodies, from sequence 0) and checkpoints.
    pub fn build(
        signer: &Signer,
        log: &str,
        origin: &str,
        entries: &[String],
        checkpoints: Vec<(u64, String)>,
        exported_at: &str,
    ) -> Result<Self, BundleError> {
        let mut entries_jsonl = String::new();
        for e in entries {
            if e.contains('\n') {
                return Err(BundleError::Malformed("an entry contains a newline".into()));
            }
            entries_jsonl.push_str(e);
            entries_jsonl.push('\n');
        }
        let manifest = Manifest {
            format: FORMAT.to_owned(),
            log: log.to_owned(),
            origin: origin.to_owned(),
            entries: entries.len() as u64,
            first_time: entries.first().and_then(|e| entry_time(e)),
            last_time: entries.last().and_then(|e| entry_time(e)),
            checkpoints: checkpoints.iter().map(|(s, _)| *s).collect(),
            exported_at: exported_at.to_owned(),
            entries_sha256: sha256_hex(entries_jsonl.as_bytes()),
        };
        let manifest_json = serde_json::to_string_pretty(&manifest)
            .map_err(|e| BundleError::Malformed(e.to_string()))?;
        let manifest_note = signer.sign(&manifest_note_text(&manifest_json))?;
        Ok(Self {
            manifest_json,
            manifest_note,
            entries_jsonl,
            checkpoints,
            vkey: signer.verifier().vkey(),
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
        add("key.vkey", format!("{}\n", self.vkey).as_bytes())?;
        for (size, note) in &self.checkpoints {
            add(&format!("checkpoints/{size:020}.note"), note.as_bytes())?;
        }
        Ok(builder.into_inner()?)
    }

    /// Reads a bundle written by [`Bundle::to_tar`].
    pub fn from_tar(bytes: &[u8]) -> Result<Self, BundleError> {
        let mut archive = tar::Archive::new(bytes);
        let (mut manifest_json, mut manifest_note, mut entries, mut vkey) =
            (None, None, None, None);
        let mut checkpoints = Vec::new();
        for file in archive.entries()? {
            let mut file = file?;
            let path = file.path()?.to_string_lossy().into_owned();
            let mut text = String::new();
            file.read_to_string(&mut text)
                .map_err(|e| BundleError::Malformed(format!("{path}: {e}")))?;
            match path.as_str() {
                "manifest.json" => manifest_json = Some(text),
                "manifest.note" => manifest_note = Some(text),
                "entries.jsonl" => entries = Some(text),
                "key.vkey" => vkey = Some(text.trim().to_owned()),
                p => {
                    let size = p
                        .strip_prefix("checkpoints/")
                        .and_then(|n| n.strip_suffix(".note"))
                        .and_then(|n| n.parse::<u64>().ok())
                        .ok_or_else(|| BundleError::Malformed(format!("unexpected file {p}")))?;
                    checkpoints.push((size, text));
                }
            }
        }
        checkpoints.sort_by_key(|(s, _)| *s);
        Ok(Self {
            manifest_json: manifest_json.ok_or(BundleError::Missing("manifest.json"))?,
            manifest_note: manifest_note.ok_or(BundleError::Missing("manifest.note"))?,
            entries_jsonl: entries.ok_or(BundleError::Missing("entries.jsonl"))?,
            checkpoints,
            vkey: vkey.ok_or(BundleError::Missing("key.vkey"))?,
        })
    }
}

/// One thing wrong, naming what it concerns: `manifest`, `entry 17`, `checkpoint 40`, `key`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub subject: String,
    pub message: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.subject, self.message)
    }
}

#[derive(Debug, Clone, Default)]
pub struct Report {
    pub problems: Vec<Problem>,
    pub entries: u64,
    pub checkpoints_verified: usize,
    /// False when no trusted key was given and the bundle's own key was used.
    pub key_trusted: bool,
    /// The sequence number of the first entry found altered, missing or out of place.
    pub first_bad_entry: Option<u64>,
    /// Entries after the largest valid checkpoint: consistent, but not yet signed.
    pub unsigned_tail: u64,
}

impl Report {
    fn problem(&mut self, subject: impl Into<String>, message: impl Into<String>) {
        self.problems.push(Problem {
            subject: subject.into(),
            message: message.into(),
        });
    }

    fn bad_entry(&mut self, seq: u64) {
        self.first_bad_entry = Some(self.first_bad_entry.map_or(seq, |s| s.min(seq)));
    }

    pub fn ok(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Verifies `bundle` offline. `trusted` is the key to trust (else the bundle's own is used,
/// and the report says so); `external` are checkpoints from outside the database (the sink),
/// which catch truncation and wholesale rewrites that the bundle alone cannot.
pub fn verify(bundle: &Bundle, trusted: Option<&Verifier>, external: &[(u64, String)]) -> Report {
    let mut report = Report::default();
    let bundled_key = Verifier::from_vkey(&bundle.vkey);
    let key = match (trusted, bundled_key) {
        (Some(t), bundled) => {
            report.key_trusted = true;
            if bundled.as_ref().map(Verifier::vkey).ok() != Some(t.vkey()) {
                report.problem(
                    "key",
                    "the bundle names a different key than the trusted one",
                );
            }
            t.clone()
        }
        (None, Ok(k)) => k,
        (None, Err(e)) => {
            report.problem("key", format!("the bundle's key is unusable: {e}"));
            return report;
        }
    };

    // The manifest and its signature.
    let manifest: Option<Manifest> = match serde_json::from_str(&bundle.manifest_json) {
        Ok(m) => Some(m),
        Err(e) => {
            report.problem("manifest", format!("not a valid manifest: {e}"));
            None
        }
    };
    match open(&bundle.manifest_note, std::slice::from_ref(&key)) {
        Ok(n) if n.text == manifest_note_text(&bundle.manifest_json) => {}
        Ok(_) => report.problem("manifest", "the signed digest does not match manifest.json"),
        Err(e) => report.problem("manifest", format!("signature: {e}")),
    }
    let Some(manifest) = manifest else {
        return report;
    };
    if manifest.format != FORMAT {
        report.problem("manifest", format!("unknown format `{}`", manifest.format));
    }
    if sha256_hex(bundle.entries_jsonl.as_bytes()) != manifest.entries_sha256 {
        report.problem(
            "manifest",
            "entries.jsonl differs from the one the manifest signed",
        );
    }

    // Checkpoints first, so the entry pass knows at which sizes to keep a root.
    let mut cps: Vec<(u64, &str, Option<Checkpoint>)> = Vec::new();
    for (claimed, note, source) in bundle
        .checkpoints
        .iter()
        .map(|(s, n)| (*s, n.as_str(), "bundled"))
        .chain(external.iter().map(|(s, n)| (*s, n.as_str(), "external")))
    {
        let subject = format!("checkpoint {claimed} ({source})");
        let cp = match open(note, std::slice::from_ref(&key)) {
            Err(e) => {
                report.problem(&subject, format!("signature does not verify: {e}"));
                None
            }
            Ok(opened) => match Checkpoint::parse(&opened.text) {
                Err(e) => {
                    report.problem(&subject, e.to_string());
                    None
                }
                Ok(cp) if cp.origin != manifest.origin => {
                    report.problem(
                        &subject,
                        format!("is for `{}`, not `{}`", cp.origin, manifest.origin),
                    );
                    None
                }
                Ok(cp) => {
                    if cp.size != claimed {
                        report.problem(
                            &subject,
                            format!("signs size {}, filed as {claimed}", cp.size),
                        );
                    }
                    Some(cp)
                }
            },
        };
        cps.push((claimed, source, cp));
    }
    cps.sort_by_key(|(s, _, _)| *s);
    let wanted: std::collections::BTreeSet<u64> = cps
        .iter()
        .filter_map(|(_, _, cp)| cp.as_ref().map(|c| c.size))
        .collect();

    // Entries: continuity and the log they claim; leaf hashes and the roots checkpoints need.
    let lines: Vec<&str> = bundle.entries_jsonl.lines().collect();
    report.entries = lines.len() as u64;
    if report.entries != manifest.entries {
        report.problem(
            "manifest",
            format!(
                "lists {} entries; the bundle has {}",
                manifest.entries, report.entries
            ),
        );
    }
    let mut heads: Vec<Option<EntryHead<'_>>> = Vec::with_capacity(lines.len());
    let mut leaves: Vec<Hash> = Vec::with_capacity(lines.len());
    let mut range = CompactRange::new();
    let mut roots_at = std::collections::BTreeMap::new();
    if wanted.contains(&0) {
        roots_at.insert(0, range.root());
    }
    // seq - position of the last continuity break reported, to report each break once.
    let mut offset: i128 = 0;
    for (i, line) in lines.iter().enumerate() {
        let pos = i as u64;
        let subject = format!("entry {pos}");
        let head = match EntryHead::parse(line) {
            Err(e) => {
                report.problem(&subject, format!("not JSON: {e}"));
                report.bad_entry(pos);
                None
            }
            Ok(h) => {
                match h.seq {
                    Some(seq) if seq == pos => offset = 0,
                    Some(seq) => {
                        let off = i128::from(seq) - i128::from(pos);
                        if off != offset {
                            report.problem(
                                &subject,
                                format!("has sequence number {seq} at position {pos} (entries missing, reordered or inserted)"),
                            );
                            offset = off;
                        }
                        report.bad_entry(pos);
                    }
                    None => {
                        report.problem(&subject, "has no sequence number");
                        report.bad_entry(pos);
                    }
                }
                if h.log.as_deref() != Some(manifest.log.as_str()) {
                    report.problem(&subject, format!("does not belong to log {}", manifest.log));
                    report.bad_entry(pos);
                }
                Some(h)
            }
        };
        heads.push(head);
        let leaf = leaf_hash(line.as_bytes());
        leaves.push(leaf);
        range.append(leaf);
        if wanted.contains(&range.size()) {
            roots_at.insert(range.size(), range.root());
        }
    }

    // Each checkpoint against the entries.
    let mut last_good = 0u64;
    let mut suspect: Vec<(u64, u64)> = Vec::new();
    for (claimed, source, cp) in &cps {
        let Some(cp) = cp else { continue };
        let subject = format!("checkpoint {claimed} ({source})");
        match roots_at.get(&cp.size) {
            None => {
                report.problem(
                    &subject,
                    format!(
                        "covers {} entries but only {} are present: entries {}..{} were removed (the log was truncated)",
                        cp.size, report.entries, report.entries, cp.size - 1
                    ),
                );
                report.bad_entry(report.entries);
            }
            Some(root) if *root == cp.root => {
                last_good = last_good.max(cp.size);
                report.checkpoints_verified += 1;
            }
            Some(_) => {
                let from = last_good.min(cp.size.saturating_sub(1));
                report.problem(
                    &subject,
                    format!(
                        "root differs from entries 0..{}: the first altered entry is among {from}..{}",
                        cp.size - 1,
                        cp.size - 1
                    ),
                );
                suspect.push((from, cp.size - 1));
            }
        }
    }

    // Each entry's commitment to the history before it: over everything when something is
    // wrong (to name the first bad entry), else only over the part no checkpoint covers.
    let start = if report.problems.is_empty() && suspect.is_empty() {
        usize::try_from(last_good)
            .unwrap_or(usize::MAX)
            .min(lines.len())
    } else {
        0
    };
    let mut range = CompactRange::new();
    for leaf in &leaves[..start] {
        range.append(*leaf);
    }
    let mut seen_roots: std::collections::HashSet<Hash> = std::collections::HashSet::new();
    for (i, head) in heads.iter().enumerate().skip(start) {
        let pos = i as u64;
        let root = range.root();
        seen_roots.insert(root);
        if let Some(h) = head {
            let witnessed: Option<Hash> = h
                .prev_root
                .as_deref()
                .and_then(|w| B64.decode(w).ok())
                .and_then(|w| w.try_into().ok());
            if witnessed != Some(root) {
                let in_place = h.seq == Some(pos);
                // A witnessed root equal to an earlier prefix's is a replayed or copied
                // entry: this one is the intruder. Otherwise the one before it changed.
                let replayed = witnessed.is_some_and(|w| seen_roots.contains(&w));
                match pos.checked_sub(1) {
                    _ if !in_place => {}
                    Some(_) if replayed => {
                        report.problem(
                            format!("entry {pos}"),
                            "forged or out of place: it witnessed an earlier state of the log",
                        );
                        report.bad_entry(pos);
                    }
                    Some(prev) => {
                        report.problem(
                            format!("entry {prev}"),
                            format!("altered: entry {pos} witnessed a different history up to it"),
                        );
                        report.bad_entry(prev);
                    }
                    None => {
                        report.problem(
                            format!("entry {pos}"),
                            "altered: the first entry must witness an empty log",
                        );
                        report.bad_entry(pos);
                    }
                }
                break;
            }
        }
        range.append(leaves[i]);
    }
    for (from, to) in suspect {
        let named_inside = report.first_bad_entry.is_some_and(|b| b <= to);
        if !named_inside {
            report.bad_entry(from);
        }
    }
    report.unsigned_tail = report.entries.saturating_sub(last_good);
    if report.checkpoints_verified == 0 && report.entries > 0 {
        report.problem("checkpoints", "no valid checkpoint covers these entries");
    }
    report
}

/// The fields of an entry the verifier needs; the rest is covered by its hash.
#[derive(Debug, Deserialize)]
struct EntryHead<'a> {
    seq: Option<u64>,
    #[serde(borrow)]
    log: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow)]
    prev_root: Option<std::borrow::Cow<'a, str>>,
}

impl<'a> EntryHead<'a> {
    /// Entries as Allot writes them start `{"log":"…","seq":N,"time":"…","prev_root":"…",`;
    /// those fields are read straight off that prefix (verification is bound by this loop),
    /// anything else goes through the JSON parser.
    fn parse(line: &'a str) -> Result<Self, serde_json::Error> {
        Self::canonical_prefix(line).map_or_else(|| serde_json::from_str(line), Ok)
    }

    fn canonical_prefix(line: &'a str) -> Option<Self> {
        let plain = |s: &str| !s.contains(['\\', '"']);
        let rest = line.strip_prefix(r#"{"log":""#)?;
        let (log, rest) = rest.split_once('"')?;
        let rest = rest.strip_prefix(r#","seq":"#)?;
        let (seq, rest) = rest.split_once(',')?;
        if seq.is_empty() || !seq.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let rest = rest.strip_prefix(r#""time":""#)?;
        let (_, rest) = rest.split_once('"')?;
        let rest = rest.strip_prefix(r#","prev_root":""#)?;
        let (prev_root, rest) = rest.split_once('"')?;
        if !rest.starts_with(',') || !plain(log) || log.ends_with('\\') {
            return None;
        }
        Some(Self {
            seq: seq.parse().ok(),
            log: Some(std::borrow::Cow::Borrowed(log)),
            prev_root: Some(std::borrow::Cow::Borrowed(prev_root)),
        })
    }
}

#[cfg(test)]
mod tests;
