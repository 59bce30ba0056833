//! Every kind of tampering an attacker with database access could try, applied to a
//! bundle in memory, must be reported and the first bad entry named.

use super::verify::EntryHead;
use super::*;
use crate::Signer;
use crate::checkpoint::Checkpoint;
use crate::merkle::{CompactRange, leaf_hash};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;

const LOG: &str = "tenant-1";
const ORIGIN: &str = "audit.test/tenant-1";

/// Entry bodies as the store writes them: each commits to the root before it.
fn entries_with(payloads: &[String]) -> Vec<String> {
    let mut range = CompactRange::new();
    payloads
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let body = serde_json::json!({
                "log": LOG, "seq": i, "time": format!("2026-11-29T12:00:{i:02}.000000Z"),
                "prev_root": B64.encode(range.root()), "action": "job.submit", "target": p,
            })
            .to_string();
            range.append(leaf_hash(body.as_bytes()));
            body
        })
        .collect()
}

fn entries(n: usize) -> Vec<String> {
    entries_with(&(0..n).map(|i| format!("job/{i}")).collect::<Vec<_>>())
}

fn checkpoint(signer: &Signer, entries: &[String], size: usize) -> (u64, String) {
    let leaves: Vec<Hash> = entries[..size]
        .iter()
        .map(|e| leaf_hash(e.as_bytes()))
        .collect();
    let cp = Checkpoint {
        origin: ORIGIN.into(),
        size: size as u64,
        root: crate::merkle::root(&leaves),
        extensions: vec![],
    };
    (size as u64, signer.sign(&cp.body()).expect("sign"))
}

struct Fixture {
    signer: Signer,
    entries: Vec<String>,
    checkpoints: Vec<(u64, String)>,
}

fn fixture() -> Fixture {
    let signer = Signer::generate_system("audit.test").expect("key");
    let entries = entries(20);
    let checkpoints = [5, 10, 15, 20]
        .iter()
        .map(|&s| checkpoint(&signer, &entries, s))
        .collect();
    Fixture {
        signer,
        entries,
        checkpoints,
    }
}

fn trusted(f: &Fixture) -> TrustedKeys {
    TrustedKeys::from(f.signer.verifier())
}

fn export<'a>(keys: &'a TrustedKeys, checkpoints: Vec<(u64, String)>) -> Export<'a> {
    Export {
        log: LOG,
        origin: ORIGIN,
        exported_at: "2026-11-29T13:00:00Z",
        checkpoints,
        keys,
    }
}

fn bundle(f: &Fixture, entries: &[String], checkpoints: Vec<(u64, String)>) -> Bundle {
    let lines: Vec<Line> = entries.iter().cloned().map(Line::Entry).collect();
    Bundle::full(&f.signer, export(&trusted(f), checkpoints), &lines).expect("bundle")
}

fn check(f: &Fixture, b: &Bundle, external: &[(u64, String)]) -> Report {
    // Through the tar format, as an auditor receives it.
    let read = Bundle::from_tar(&b.to_tar().expect("tar")).expect("untar");
    assert_eq!(&read, b);
    verify(&read, Some(&trusted(f)), external)
}

#[test]
fn an_untouched_bundle_verifies() {
    let f = fixture();
    let b = bundle(&f, &f.entries, f.checkpoints.clone());
    let r = check(&f, &b, &f.checkpoints);
    assert!(r.ok(), "{:?}", r.problems);
    assert_eq!(r.entries, 20);
    assert_eq!(r.checkpoints_verified, 8);
    assert!(r.key_trusted);
    let untrusted = verify(&b, None, &[]);
    assert!(untrusted.ok() && !untrusted.key_trusted);
}

#[test]
fn a_modified_payload_is_named() {
    let f = fixture();
    let mut e = f.entries.clone();
    e[7] = e[7].replace("job/7", "job/x");
    let r = check(&f, &bundle(&f, &e, f.checkpoints.clone()), &[]);
    assert_eq!(r.first_bad_entry, Some(7), "{:?}", r.problems);
    assert!(r.problems.iter().any(|p| p.subject == "entry 7"));
}

#[test]
fn a_modified_last_entry_is_caught_by_its_checkpoint() {
    let f = fixture();
    let mut e = f.entries.clone();
    e[19] = e[19].replace("job/19", "job/x");
    let r = check(&f, &bundle(&f, &e, f.checkpoints.clone()), &[]);
    assert!(!r.ok());
    assert_eq!(
        r.first_bad_entry,
        Some(15),
        "narrowed to 15..19: {:?}",
        r.problems
    );
}

#[test]
fn a_deleted_entry_is_named() {
    let f = fixture();
    let mut e = f.entries.clone();
    e.remove(12);
    let r = check(&f, &bundle(&f, &e, f.checkpoints.clone()), &[]);
    assert_eq!(r.first_bad_entry, Some(12), "{:?}", r.problems);
}

#[test]
fn reordered_entries_are_named() {
    let f = fixture();
    let mut e = f.entries.clone();
    e.swap(3, 4);
    let r = check(&f, &bundle(&f, &e, f.checkpoints.clone()), &[]);
    assert_eq!(r.first_bad_entry, Some(3), "{:?}", r.problems);
}

#[test]
fn a_forged_entry_is_named() {
    let f = fixture();
    let mut e = f.entries.clone();
    let forged = e[9].replace("job/9", "job/forged");
    e.insert(10, forged);
    let r = check(&f, &bundle(&f, &e, f.checkpoints.clone()), &[]);
    assert_eq!(r.first_bad_entry, Some(10), "{:?}", r.problems);
}

#[test]
fn a_naively_forged_entry_with_a_copied_history_is_named() {
    let f = fixture();
    let mut e = f.entries.clone();
    // Entries from 7 shift up; the forger copies entry 6 with the next sequence number.
    for (i, body) in e.iter_mut().enumerate().skip(7) {
        *body = body.replace(&format!("\"seq\":{i},"), &format!("\"seq\":{},", i + 1));
    }
    let forged = f.entries[6]
        .replace("\"seq\":6,", "\"seq\":7,")
        .replace("job/6", "job/evil");
    e.insert(7, forged);
    let r = check(&f, &bundle(&f, &e, f.checkpoints.clone()), &[]);
    assert_eq!(r.first_bad_entry, Some(7), "{:?}", r.problems);
    assert!(
        r.problems
            .iter()
            .any(|p| p.subject == "entry 7" && p.message.contains("forged"))
    );
}

#[test]
fn a_truncated_tail_is_caught_by_external_checkpoints() {
    let f = fixture();
    let kept = &f.entries[..13];
    // The database's own checkpoints were trimmed to match; the sink still has them all.
    let bundled: Vec<_> = f
        .checkpoints
        .iter()
        .filter(|(s, _)| *s <= 10)
        .cloned()
        .collect();
    let b = bundle(&f, kept, bundled.clone());
    assert!(
        check(&f, &b, &[]).ok(),
        "the bundle alone is self-consistent"
    );
    let r = check(&f, &b, &f.checkpoints);
    assert_eq!(r.first_bad_entry, Some(13), "{:?}", r.problems);
    assert!(r.problems.iter().any(|p| p.message.contains("truncated")));
}

#[test]
fn a_consistent_rewrite_is_caught_by_external_checkpoints() {
    let f = fixture();
    // A superuser rewrites history from entry 11 on and recomputes every hash and root.
    let mut payloads: Vec<String> = (0..20).map(|i| format!("job/{i}")).collect();
    payloads[11] = "job/rewritten".into();
    let rewritten = entries_with(&payloads);
    let forged_cps: Vec<_> = [5, 10]
        .iter()
        .map(|&s| checkpoint(&f.signer, &rewritten, s))
        .collect();
    let b = bundle(&f, &rewritten, forged_cps);
    let r = check(&f, &b, &f.checkpoints);
    assert!(!r.ok());
    assert_eq!(
        r.first_bad_entry,
        Some(10),
        "narrowed to 10..14: {:?}",
        r.problems
    );
}

#[test]
fn a_swapped_checkpoint_signature_is_named() {
    let f = fixture();
    let mut cps = f.checkpoints.clone();
    let other = Signer::generate_system("audit.test").expect("key");
    let (size, note) = cps[1].clone();
    let text = note.split("\n\n").next().expect("text").to_owned() + "\n";
    cps[1] = (size, other.sign(&text).expect("sign"));
    let r = check(&f, &bundle(&f, &f.entries, cps), &[]);
    assert!(
        r.problems
            .iter()
            .any(|p| p.subject == "checkpoint 10 (bundled)" && p.message.contains("signature")),
        "{:?}",
        r.problems
    );
}

#[test]
fn a_tampered_manifest_or_entries_file_is_caught() {
    let f = fixture();
    let mut b = bundle(&f, &f.entries, f.checkpoints.clone());
    b.manifest_json = b
        .manifest_json
        .replace("\"entries\": 20", "\"entries\": 19");
    assert!(
        check(&f, &b, &[])
            .problems
            .iter()
            .any(|p| p.subject == "manifest")
    );
    let mut b = bundle(&f, &f.entries, f.checkpoints.clone());
    b.entries_jsonl.push_str(&f.entries[0]);
    b.entries_jsonl.push('\n');
    assert!(
        check(&f, &b, &[])
            .problems
            .iter()
            .any(|p| p.subject == "entries.jsonl")
    );
    // A bundle signed by another key fails against the trusted one.
    let other = Fixture {
        signer: Signer::generate_system("audit.test").expect("key"),
        ..fixture()
    };
    let b = bundle(&other, &other.entries, other.checkpoints.clone());
    let r = verify(&b, Some(&trusted(&f)), &[]);
    assert!(r.problems.iter().any(|p| p.subject == "key"));
    assert!(r.problems.iter().any(|p| p.subject == "manifest"));
}

#[test]
fn the_canonical_prefix_reader_agrees_with_the_json_parser() {
    let line = r#"{"log":"t1","seq":42,"time":"2026-11-29T12:00:00.000000Z","prev_root":"47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=","action":"x"}"#;
    let fast = EntryHead::canonical_prefix(line).expect("canonical");
    let slow: EntryHead<'_> = serde_json::from_str(line).expect("json");
    assert_eq!(
        (fast.seq, fast.log.clone(), fast.prev_root.clone()),
        (slow.seq, slow.log, slow.prev_root)
    );
    for odd in [
        r#"{"seq":42,"log":"t1"}"#,
        r#"{"log":"t\"1","seq":42,"time":"t","prev_root":"p","a":1}"#,
        r#"{"log":"t1","seq":-1,"time":"t","prev_root":"p","a":1}"#,
        r#"{"log":"t1","seq":4 2,"time":"t","prev_root":"p","a":1}"#,
    ] {
        assert!(EntryHead::canonical_prefix(odd).is_none(), "{odd}");
    }
}

fn pruned(f: &Fixture, upto: usize) -> Vec<Line> {
    f.entries
        .iter()
        .enumerate()
        .map(|(i, e)| {
            if i < upto {
                Line::Pruned {
                    seq: i as u64,
                    leaf_hash: leaf_hash(e.as_bytes()),
                }
            } else {
                Line::Entry(e.clone())
            }
        })
        .collect()
}

#[test]
fn pruned_entries_keep_the_log_verifiable() {
    let f = fixture();
    let keys = trusted(&f);
    let b = Bundle::full(
        &f.signer,
        export(&keys, f.checkpoints.clone()),
        &pruned(&f, 7),
    )
    .expect("bundle");
    let r = check(&f, &b, &f.checkpoints);
    assert!(r.ok(), "{:?}", r.problems);
    assert_eq!((r.entries, r.pruned), (20, 7));
    assert_eq!(
        b.csv.lines().count(),
        1 + 13,
        "pruned entries have no CSV row"
    );

    // A stub with a wrong leaf hash breaks the next entry's witness and the checkpoint.
    let mut lines = pruned(&f, 4);
    lines[3] = Line::Pruned {
        seq: 3,
        leaf_hash: leaf_hash(b"something else"),
    };
    let b = Bundle::full(&f.signer, export(&keys, f.checkpoints.clone()), &lines).expect("bundle");
    assert_eq!(check(&f, &b, &[]).first_bad_entry, Some(3));

    // A stub that carries more than its hash is refused.
    let mut b = Bundle::full(
        &f.signer,
        export(&keys, f.checkpoints.clone()),
        &pruned(&f, 7),
    )
    .expect("bundle");
    let stub = pruned_line(LOG, 2, &leaf_hash(f.entries[2].as_bytes()));
    b.entries_jsonl = b
        .entries_jsonl
        .replace(&stub, &stub.replace("}", r#","note":"nothing to see"}"#));
    let r = verify(&b, Some(&keys), &[]);
    assert!(
        r.problems.iter().any(|p| p.subject == "entry 2"),
        "{:?}",
        r.problems
    );
}

/// A filtered bundle of the entries whose target is in `targets`, against checkpoint 20.
fn filtered(f: &Fixture, entries: &[String], query: Query, seqs: &[usize]) -> Bundle {
    let tree =
        crate::merkle::Tree::new(f.entries.iter().map(|e| leaf_hash(e.as_bytes())).collect());
    let picked: Vec<(String, Vec<Hash>)> = seqs
        .iter()
        .map(|&i| {
            (
                entries[i].clone(),
                tree.inclusion_proof(i as u64).expect("proof"),
            )
        })
        .collect();
    let keys = trusted(f);
    Bundle::filtered(
        &f.signer,
        export(&keys, vec![f.checkpoints[3].clone()]),
        query,
        20,
        &picked,
    )
    .expect("bundle")
}

fn target_query(t: &str) -> Query {
    Query {
        target: Some(t.into()),
        ..Query::default()
    }
}

#[test]
fn a_filtered_bundle_proves_each_entry() {
    let f = fixture();
    let b = filtered(&f, &f.entries, target_query("job/4"), &[4]);
    let r = check(&f, &b, &f.checkpoints);
    assert!(r.ok(), "{:?}", r.problems);
    assert!(r.filtered);
    assert_eq!(r.external_unchecked, 3, "checkpoints 5, 10 and 15");
    let manifest: Manifest = serde_json::from_str(&b.manifest_json).expect("manifest");
    assert_eq!(
        (manifest.first_seq, manifest.last_seq, manifest.size),
        (Some(4), Some(4), 20)
    );

    // An altered entry fails its proof; an entry outside the query is named.
    let mut altered = f.entries.clone();
    altered[4] = altered[4].replace("job/4", "job/40");
    let r = check(
        &f,
        &filtered(&f, &altered, target_query("job/40"), &[4]),
        &[],
    );
    assert_eq!(r.first_bad_entry, Some(4), "{:?}", r.problems);
    let r = check(
        &f,
        &filtered(&f, &f.entries, target_query("job/4"), &[4, 5]),
        &[],
    );
    assert!(
        r.problems
            .iter()
            .any(|p| p.subject == "entry 5" && p.message.contains("query")),
        "{:?}",
        r.problems
    );
    // A sink that saw the log grow beyond the covering checkpoint reports it.
    let later = checkpoint(&f.signer, &entries(25), 25);
    let r = check(&f, &b, &[later]);
    assert!(
        r.problems
            .iter()
            .any(|p| p.subject == "checkpoint 25 (external)")
    );
}

#[test]
fn renderings_that_disagree_with_the_entries_are_named() {
    let f = fixture();
    let mut b = bundle(&f, &f.entries, f.checkpoints.clone());
    b.csv = b.csv.replace("job/3", "job/33");
    let r = check(&f, &b, &[]);
    assert_eq!(
        r.problems
            .iter()
            .map(|p| (p.subject.as_str(), p.message.as_str()))
            .collect::<Vec<_>>(),
        vec![(
            "entries.csv",
            "line 5 does not say what the hashed entries say"
        )]
    );
}

#[test]
fn a_checkpoint_signed_after_its_key_expired_is_named() {
    let f = fixture();
    let keys = TrustedKeys::parse(&format!(
        "{} not-after=2026-11-29T12:30:00Z\n",
        f.signer.verifier().vkey()
    ))
    .expect("keys");
    let leaves: Vec<Hash> = f.entries.iter().map(|e| leaf_hash(e.as_bytes())).collect();
    let at = |t: &str| {
        chrono::DateTime::parse_from_rfc3339(t)
            .expect("time")
            .with_timezone(&chrono::Utc)
    };
    let cp = |time: &str| {
        let body = Checkpoint {
            origin: ORIGIN.into(),
            size: 20,
            root: crate::merkle::root(&leaves),
            extensions: vec![],
        }
        .at(at(time))
        .body();
        (20, f.signer.sign(&body).expect("sign"))
    };
    let lines: Vec<Line> = f.entries.iter().cloned().map(Line::Entry).collect();
    let in_time = Export {
        exported_at: "2026-11-29T12:10:00Z",
        ..export(&keys, vec![cp("2026-11-29T12:00:00Z")])
    };
    let b = Bundle::full(&f.signer, in_time, &lines).expect("bundle");
    assert!(verify(&b, Some(&keys), &[]).ok());
    let late = Export {
        exported_at: "2026-11-29T12:10:00Z",
        ..export(&keys, vec![cp("2026-11-29T13:00:00Z")])
    };
    let b = Bundle::full(&f.signer, late, &lines).expect("bundle");
    let r = verify(&b, Some(&keys), &[]);
    assert!(
        r.problems
            .iter()
            .any(|p| p.subject == "checkpoint 20 (bundled)"
                && p.message.contains("outside its validity period")),
        "{:?}",
        r.problems
    );
}

#[test]
fn consistency_proofs_link_every_pair_of_checkpoints() {
    let f = fixture();
    let b = bundle(&f, &f.entries, f.checkpoints.clone());
    assert_eq!(
        b.consistency_jsonl.as_deref().map(|c| c.lines().count()),
        Some(3),
        "5→10, 10→15, 15→20"
    );
    assert!(check(&f, &b, &[]).ok());

    // A proof that does not lead from one signed root to the next is named.
    let mut bad = b.clone();
    let lines: Vec<String> = b
        .consistency_jsonl
        .as_deref()
        .unwrap_or("")
        .lines()
        .map(|l| {
            if l.contains(r#""from":10"#) {
                let mut v: serde_json::Value = serde_json::from_str(l).expect("json");
                v["proof"][0] = B64.encode([7u8; 32]).into();
                v.to_string()
            } else {
                l.to_owned()
            }
        })
        .collect();
    bad.consistency_jsonl = Some(lines.join("\n") + "\n");
    let mut manifest: Manifest = serde_json::from_str(&bad.manifest_json).expect("manifest");
    manifest.files.insert(
        "consistency.jsonl".into(),
        sha256_hex(bad.consistency_jsonl.as_deref().unwrap_or("").as_bytes()),
    );
    bad.manifest_json = serde_json::to_string_pretty(&manifest).expect("json");
    bad.manifest_note = f
        .signer
        .sign(&manifest_note_text(&bad.manifest_json))
        .expect("sign");
    let r = check(&f, &bad, &[]);
    assert_eq!(
        r.problems
            .iter()
            .map(|p| p.subject.as_str())
            .collect::<Vec<_>>(),
        ["checkpoint 15 (bundled)"],
        "{:?}",
        r.problems
    );
}
