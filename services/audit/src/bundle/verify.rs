//! Offline verification of a bundle: signatures (and the signing keys' validity periods),
//! file digests, sequence continuity, each entry's commitment to the history before it,
//! checkpoint roots, inclusion proofs of filtered exports, and the CSV and OCSF renderings.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashSet};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use chrono::{DateTime, Utc};
use serde::Deserialize;

use super::{Bundle, FORMAT, Manifest, Query, manifest_note_text, render, sha256_hex};
use crate::checkpoint::Checkpoint;
use crate::keys::TrustedKeys;
use crate::merkle::{CompactRange, Hash, leaf_hash, verify_inclusion};
use crate::note::{Verifier, open};

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
    /// Lines in `entries.jsonl` (pruned stubs included).
    pub entries: u64,
    /// Of which pruned stubs: their payload was removed under the retention policy.
    pub pruned: u64,
    /// Whether this was a filtered export (entries proven by inclusion proofs).
    pub filtered: bool,
    pub checkpoints_verified: usize,
    /// External checkpoints that a filtered bundle cannot check (smaller than its covering
    /// checkpoint; a whole-log export checks them).
    pub external_unchecked: usize,
    /// False when no trusted key was given and the bundle's own keys were used.
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

fn parse_time(t: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(t)
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

/// A checkpoint that passed its signature check, with where it came from.
struct Cp {
    claimed: u64,
    source: &'static str,
    cp: Option<Checkpoint>,
}

/// What to check besides the log's integrity.
#[derive(Debug, Clone, Copy)]
pub struct Checks {
    /// Re-derive the CSV and OCSF renderings (on a second thread) and compare.
    pub renderings: bool,
}

/// Verifies `bundle` offline. `trusted` are the keys to trust (else the bundle's own are
/// used, and the report says so); `external` are checkpoints from outside the database (the
/// sink), which catch truncation and wholesale rewrites that the bundle alone cannot.
pub fn verify(
    bundle: &Bundle,
    trusted: Option<&TrustedKeys>,
    external: &[(u64, String)],
) -> Report {
    verify_with(bundle, trusted, external, Checks { renderings: true })
}

/// [`verify`], choosing whether the renderings are checked too (the integrity of the log
/// itself is always checked).
pub fn verify_with(
    bundle: &Bundle,
    trusted: Option<&TrustedKeys>,
    external: &[(u64, String)],
    checks: Checks,
) -> Report {
    let mut report = Report::default();
    let bundled = TrustedKeys::parse(&bundle.keys);
    let keys = match (trusted, bundled) {
        (Some(t), bundled) => {
            report.key_trusted = true;
            for v in bundled.map(|b| b.verifiers()).unwrap_or_default() {
                if !t.contains(&v) {
                    report.problem(
                        "key",
                        format!("the bundle names key {} that is not trusted", v.vkey()),
                    );
                }
            }
            t.clone()
        }
        (None, Ok(k)) => k,
        (None, Err(e)) => {
            report.problem("key", format!("the bundle's keys are unusable: {e}"));
            return report;
        }
    };
    let verifiers: Vec<Verifier> = keys.verifiers();

    // The manifest and its signature.
    let manifest: Option<Manifest> = match serde_json::from_str(&bundle.manifest_json) {
        Ok(m) => Some(m),
        Err(e) => {
            report.problem("manifest", format!("not a valid manifest: {e}"));
            None
        }
    };
    let exported_at = manifest.as_ref().and_then(|m| parse_time(&m.exported_at));
    match open(&bundle.manifest_note, &verifiers) {
        Ok(n) if n.text == manifest_note_text(&bundle.manifest_json) => {
            if let Some(at) = exported_at
                && let Err(e) = keys.check_period(&n.signers, at)
            {
                report.problem("manifest", e);
            }
        }
        Ok(_) => report.problem("manifest", "the signed digest does not match manifest.json"),
        Err(e) => report.problem("manifest", format!("signature: {e}")),
    }
    let Some(manifest) = manifest else {
        return report;
    };
    if manifest.format != FORMAT {
        report.problem("manifest", format!("unknown format `{}`", manifest.format));
    }
    if exported_at.is_none() {
        report.problem("manifest", "exported_at is not an RFC 3339 time");
    }
    let files = [
        ("entries.jsonl", Some(&bundle.entries_jsonl)),
        ("keys.txt", Some(&bundle.keys)),
        ("proofs.jsonl", bundle.proofs_jsonl.as_ref()),
        ("consistency.jsonl", bundle.consistency_jsonl.as_ref()),
    ];
    report.problems.extend(file_problems(&manifest, &files));

    let cps = open_checkpoints(&mut report, bundle, external, &verifiers, &keys, &manifest);
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
    // The renderings are re-derived on a second thread while the integrity checks run.
    let rendering = std::thread::scope(|scope| {
        let rendering = scope.spawn(|| {
            if !checks.renderings {
                return Vec::new();
            }
            let bodies: Vec<&str> = match &manifest.query {
                None => lines
                    .iter()
                    .copied()
                    .filter(|l| !EntryHead::parse(l).is_ok_and(|h| h.pruned.is_some()))
                    .collect(),
                Some(_) => lines.clone(),
            };
            rendering_problems(bundle, &bodies)
        });
        match &manifest.query {
            None => {
                verify_consistency_proofs(&mut report, bundle, &cps);
                verify_whole_log(&mut report, &manifest, &lines, &cps);
            }
            Some(query) => {
                report.filtered = true;
                verify_filtered(&mut report, bundle, &manifest, query, &lines, &cps);
            }
        }
        rendering.join()
    });
    match rendering {
        Ok(problems) => report.problems.extend(problems),
        Err(_) => report.problem("entries.csv", "re-deriving the renderings failed"),
    }
    if report.pruned != manifest.pruned {
        report.problem(
            "manifest",
            format!(
                "lists {} pruned entries; the bundle has {}",
                manifest.pruned, report.pruned
            ),
        );
    }
    report
}

/// Each file must be the one the manifest signed (by SHA-256).
fn file_problems(manifest: &Manifest, files: &[(&str, Option<&String>)]) -> Vec<Problem> {
    let mut out = Vec::new();
    for (name, content) in files {
        let message = match (manifest.files.get(*name), content) {
            (Some(want), Some(got)) if *want == sha256_hex(got.as_bytes()) => continue,
            (Some(_), Some(_)) => "differs from the one the manifest signed",
            (Some(_), None) => "listed in the manifest but missing",
            (None, Some(_)) => "not listed in the manifest",
            (None, None) => continue,
        };
        out.push(Problem {
            subject: (*name).to_owned(),
            message: message.to_owned(),
        });
    }
    out
}

/// Opens every bundled and external checkpoint, smallest first.
fn open_checkpoints(
    report: &mut Report,
    bundle: &Bundle,
    external: &[(u64, String)],
    verifiers: &[Verifier],
    keys: &TrustedKeys,
    manifest: &Manifest,
) -> Vec<Cp> {
    let mut cps = Vec::new();
    for (claimed, note, source) in bundle
        .checkpoints
        .iter()
        .map(|(s, n)| (*s, n.as_str(), "bundled"))
        .chain(external.iter().map(|(s, n)| (*s, n.as_str(), "external")))
    {
        let subject = format!("checkpoint {claimed} ({source})");
        let cp = match open(note, verifiers) {
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
                    if let Some(at) = cp.time()
                        && let Err(e) = keys.check_period(&opened.signers, at)
                    {
                        report.problem(&subject, e);
                    }
                    Some(cp)
                }
            },
        };
        cps.push(Cp {
            claimed,
            source,
            cp,
        });
    }
    cps.sort_by_key(|c| c.claimed);
    cps
}

/// A whole-log bundle: every position from 0.
fn verify_whole_log(report: &mut Report, manifest: &Manifest, lines: &[&str], cps: &[Cp]) {
    if manifest.size != report.entries {
        report.problem(
            "manifest",
            format!(
                "covers {} positions; the bundle has {}",
                manifest.size, report.entries
            ),
        );
    }
    let wanted: BTreeSet<u64> = cps
        .iter()
        .filter_map(|c| c.cp.as_ref().map(|c| c.size))
        .collect();
    let mut heads: Vec<Option<EntryHead<'_>>> = Vec::with_capacity(lines.len());
    let mut leaves: Vec<Hash> = Vec::with_capacity(lines.len());
    let mut range = CompactRange::new();
    let mut roots_at = BTreeMap::new();
    if wanted.contains(&0) {
        roots_at.insert(0, range.root());
    }
    // seq - position of the last continuity break reported, to report each break once.
    let mut offset: i128 = 0;
    for (i, line) in lines.iter().enumerate() {
        let pos = i as u64;
        let subject = format!("entry {pos}");
        let mut leaf = None;
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
                if let Some(p) = &h.pruned {
                    report.pruned += 1;
                    match hex_hash(p) {
                        // Only the exact stub: a stub cannot smuggle in other content.
                        Some(hash) if *line == super::pruned_line(&manifest.log, pos, &hash) => {
                            leaf = Some(hash);
                        }
                        _ => {
                            report.problem(&subject, "a malformed pruned-entry stub");
                            report.bad_entry(pos);
                        }
                    }
                }
                Some(h)
            }
        };
        heads.push(head);
        let leaf = leaf.unwrap_or_else(|| leaf_hash(line.as_bytes()));
        leaves.push(leaf);
        range.append(leaf);
        if wanted.contains(&range.size()) {
            roots_at.insert(range.size(), range.root());
        }
    }

    // Each checkpoint against the entries.
    let mut last_good = 0u64;
    let mut suspect: Vec<(u64, u64)> = Vec::new();
    for c in cps {
        let Some(cp) = &c.cp else { continue };
        let subject = format!("checkpoint {} ({})", c.claimed, c.source);
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
    let mut seen_roots: HashSet<Hash> = HashSet::new();
    for (i, head) in heads.iter().enumerate().skip(start) {
        let pos = i as u64;
        let root = range.root();
        seen_roots.insert(root);
        // A pruned entry's witness went with its payload; the next entry's covers it.
        if let Some(h) = head.as_ref().filter(|h| h.pruned.is_none()) {
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
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConsistencyLine {
    from: u64,
    to: u64,
    proof: Vec<String>,
}

fn decode_hashes(hashes: &[String]) -> Option<Vec<Hash>> {
    hashes
        .iter()
        .map(|h| B64.decode(h).ok().and_then(|h| Hash::try_from(h).ok()))
        .collect()
}

/// Each consecutive pair of bundled checkpoints must be consistent (RFC 9162 §2.1.4.2):
/// the larger tree extends the smaller, checkable without the entries.
fn verify_consistency_proofs(report: &mut Report, bundle: &Bundle, cps: &[Cp]) {
    let roots: BTreeMap<u64, Hash> = cps
        .iter()
        .filter(|c| c.source == "bundled")
        .filter_map(|c| c.cp.as_ref().map(|cp| (cp.size, cp.root)))
        .collect();
    let proofs: BTreeMap<(u64, u64), Option<Vec<Hash>>> = bundle
        .consistency_jsonl
        .as_deref()
        .unwrap_or("")
        .lines()
        .filter_map(|l| serde_json::from_str::<ConsistencyLine>(l).ok())
        .map(|c| ((c.from, c.to), decode_hashes(&c.proof)))
        .collect();
    let sizes: Vec<u64> = roots.keys().copied().collect();
    for pair in sizes.windows(2) {
        let (from, to) = (pair[0], pair[1]);
        let subject = format!("checkpoint {to} (bundled)");
        match proofs.get(&(from, to)) {
            Some(Some(proof)) => {
                if let Err(e) =
                    crate::merkle::verify_consistency(from, to, &roots[&from], &roots[&to], proof)
                {
                    report.problem(
                        &subject,
                        format!("is not consistent with checkpoint {from}: {e}"),
                    );
                }
            }
            _ => report.problem(
                &subject,
                format!("no consistency proof from checkpoint {from}"),
            ),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ProofLine {
    seq: Option<u64>,
    proof: Vec<String>,
}

/// A filtered bundle: each entry proven against the covering checkpoint.
fn verify_filtered(
    report: &mut Report,
    bundle: &Bundle,
    manifest: &Manifest,
    query: &Query,
    lines: &[&str],
    cps: &[Cp],
) {
    let size = manifest.size;
    let covering = cps
        .iter()
        .filter(|c| c.source == "bundled")
        .find_map(|c| c.cp.as_ref().filter(|cp| cp.size == size));
    let Some(covering) = covering else {
        report.problem(
            "manifest",
            format!("no valid bundled checkpoint of the covering size {size}"),
        );
        return;
    };
    report.checkpoints_verified = 1;
    for c in cps.iter().filter(|c| c.source == "external") {
        let Some(cp) = &c.cp else { continue };
        let subject = format!("checkpoint {} (external)", c.claimed);
        if cp.size == size && cp.root != covering.root {
            report.problem(
                &subject,
                "the same size as the covering checkpoint, but another root: the log was rewritten",
            );
            report.bad_entry(0);
        } else if cp.size > size {
            report.problem(
                &subject,
                format!("is beyond the export's covering checkpoint {size}: the log was truncated, or the export is older than the sink"),
            );
        } else if cp.size < size {
            report.external_unchecked += 1;
        }
    }
    let proofs: Vec<&str> = bundle
        .proofs_jsonl
        .as_deref()
        .map(|p| p.lines().collect())
        .unwrap_or_default();
    if proofs.len() != lines.len() {
        report.problem(
            "proofs.jsonl",
            format!("has {} proofs for {} entries", proofs.len(), lines.len()),
        );
    }
    let mut previous: Option<u64> = None;
    for (i, line) in lines.iter().enumerate() {
        let value: serde_json::Value = match serde_json::from_str(line) {
            Ok(v) => v,
            Err(e) => {
                report.problem(format!("entry line {}", i + 1), format!("not JSON: {e}"));
                continue;
            }
        };
        let Some(seq) = value.get("seq").and_then(serde_json::Value::as_u64) else {
            report.problem(format!("entry line {}", i + 1), "has no sequence number");
            continue;
        };
        let subject = format!("entry {seq}");
        if value.get("log").and_then(|l| l.as_str()) != Some(manifest.log.as_str()) {
            report.problem(&subject, format!("does not belong to log {}", manifest.log));
            report.bad_entry(seq);
        }
        if previous.is_some_and(|p| p >= seq) || seq >= size {
            report.problem(
                &subject,
                "out of order, repeated, or beyond the covering checkpoint",
            );
            report.bad_entry(seq);
        }
        previous = Some(seq);
        if !query.matches(&value) {
            report.problem(&subject, "does not match the export's query");
            report.bad_entry(seq);
        }
        let proof = proofs
            .get(i)
            .and_then(|p| serde_json::from_str::<ProofLine>(p).ok())
            .filter(|p| p.seq == Some(seq))
            .and_then(|p| decode_hashes(&p.proof));
        match proof {
            None => {
                report.problem(&subject, "has no well-formed inclusion proof");
                report.bad_entry(seq);
            }
            Some(proof) => {
                if let Err(e) = verify_inclusion(
                    &leaf_hash(line.as_bytes()),
                    seq,
                    size,
                    &proof,
                    &covering.root,
                ) {
                    report.problem(
                        &subject,
                        format!("is not in the log at this position (altered or forged): {e}"),
                    );
                    report.bad_entry(seq);
                }
            }
        }
    }
}

/// The CSV and OCSF files must be exactly what the hashed entries render to.
fn rendering_problems(bundle: &Bundle, bodies: &[&str]) -> Vec<Problem> {
    let problem = |subject: &str, message: String| Problem {
        subject: subject.to_owned(),
        message,
    };
    match render::first_differences(bodies.iter().copied(), &bundle.csv, &bundle.ocsf_jsonl) {
        Err(e) => vec![problem("entries.csv", format!("cannot be re-derived: {e}"))],
        Ok((csv, ocsf)) => [("entries.csv", csv), ("entries.ocsf.jsonl", ocsf)]
            .into_iter()
            .filter_map(|(name, line)| {
                line.map(|l| {
                    problem(
                        name,
                        format!("line {l} does not say what the hashed entries say"),
                    )
                })
            })
            .collect(),
    }
}

fn hex_hash(s: &str) -> Option<Hash> {
    hex::decode(s).ok()?.try_into().ok()
}

/// The fields of an entry the verifier needs; the rest is covered by its hash.
#[derive(Debug, Deserialize)]
pub(super) struct EntryHead<'a> {
    pub(super) seq: Option<u64>,
    #[serde(borrow)]
    pub(super) log: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pub(super) prev_root: Option<Cow<'a, str>>,
    /// The leaf hash of a pruned entry's stub.
    #[serde(borrow)]
    pub(super) pruned: Option<Cow<'a, str>>,
}

impl<'a> EntryHead<'a> {
    /// Entries as Allot writes them start `{"log":"…","seq":N,"time":"…","prev_root":"…",`;
    /// those fields are read straight off that prefix (verification is bound by this loop),
    /// anything else goes through the JSON parser.
    pub(super) fn parse(line: &'a str) -> Result<Self, serde_json::Error> {
        Self::canonical_prefix(line).map_or_else(|| serde_json::from_str(line), Ok)
    }

    pub(super) fn canonical_prefix(line: &'a str) -> Option<Self> {
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
            log: Some(Cow::Borrowed(log)),
            prev_root: Some(Cow::Borrowed(prev_root)),
            pruned: None,
        })
    }
}
