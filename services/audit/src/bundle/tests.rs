//! Every kind of tampering an attacker with database access could try, applied to a
//! bundle in memory, must be reported and the first bad entry named.

use super::*;
use crate::checkpoint::Checkpoint;

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

fn bundle(f: &Fixture, entries: &[String], checkpoints: Vec<(u64, String)>) -> Bundle {
    Bundle::build(
        &f.signer,
        LOG,
        ORIGIN,
        entries,
        checkpoints,
        "2026-11-29T13:00:00Z",
    )
    .expect("bundle")
}

fn check(f: &Fixture, b: &Bundle, external: &[(u64, String)]) -> Report {
    // Through the tar format, as an auditor receives it.
    let read = Bundle::from_tar(&b.to_tar().expect("tar")).expect("untar");
    assert_eq!(&read, b);
    verify(&read, Some(&f.signer.verifier()), external)
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
            .any(|p| p.subject == "manifest")
    );
    // A bundle signed by another key fails against the trusted one.
    let other = Fixture {
        signer: Signer::generate_system("audit.test").expect("key"),
        ..fixture()
    };
    let b = bundle(&other, &other.entries, other.checkpoints.clone());
    let r = verify(&b, Some(&f.signer.verifier()), &[]);
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
