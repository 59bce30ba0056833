//! Where time goes when building and verifying a large bundle: `perf record` this.
use std::time::Instant;

use allot_audit::bundle::{Bundle, Export, Line, verify};
use allot_audit::merkle::leaf_hash;
use allot_audit::{Checkpoint, CompactRange, Signer, TrustedKeys};
use base64::Engine;

fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(200_000);
    let mut range = CompactRange::new();
    let mut lines = Vec::new();
    for i in 0..n {
        let prev = base64::engine::general_purpose::STANDARD.encode(range.root());
        let body = format!(
            r#"{{"log":"t1","seq":{i},"time":"2026-11-29T12:00:00.000000Z","prev_root":"{prev}","actor":{{"kind":"system","id":"bench","tenant_id":null,"auth_method":"internal","source":null}},"action":"bench.append","target":"item/{i}","outcome":"success","reason":null,"request_id":null,"before":null,"after":{{"i":{i}}}}}"#
        );
        range.append(leaf_hash(body.as_bytes()));
        lines.push(Line::Entry(body));
    }
    let signer = Signer::generate_system("bench").expect("key");
    let cp = Checkpoint {
        origin: "bench/t1".into(),
        size: n,
        root: range.root(),
        extensions: vec![],
    };
    let note = signer.sign(&cp.body()).expect("sign");
    let keys = TrustedKeys::from(signer.verifier());
    let t = Instant::now();
    let export = Export {
        log: "t1",
        origin: "bench/t1",
        exported_at: "2026-11-29T13:00:00Z",
        checkpoints: vec![(n, note)],
        keys: &keys,
    };
    let bundle = Bundle::full(&signer, export, &lines).expect("bundle");
    println!("build {:?}", t.elapsed());
    let t = Instant::now();
    let tar = bundle.to_tar().expect("tar");
    println!("tar {:?} {} bytes", t.elapsed(), tar.len());
    let t = Instant::now();
    let read = Bundle::from_tar(&tar).expect("untar");
    println!("untar {:?}", t.elapsed());
    let t = Instant::now();
    let r = verify(&read, Some(&keys), &[]);
    println!("verify {:?} ok={}", t.elapsed(), r.ok());
}
