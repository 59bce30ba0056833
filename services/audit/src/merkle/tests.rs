//! Conformance with the RFC 6962 test vectors (the eight-leaf tree used by Certificate
//! Transparency implementations) and exhaustive agreement between proofs and verifiers.

use super::*;

fn hex(h: &Hash) -> String {
    h.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Hash {
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex");
    }
    out
}

/// The leaves of the RFC 6962 test tree.
fn vector_leaves() -> Vec<Hash> {
    let data: [&[u8]; 8] = [
        b"",
        b"\x00",
        b"\x10",
        b"\x20\x21",
        b"\x30\x31",
        b"\x40\x41\x42\x43",
        b"\x50\x51\x52\x53\x54\x55\x56\x57",
        b"\x60\x61\x62\x63\x64\x65\x66\x67\x68\x69\x6a\x6b\x6c\x6d\x6e\x6f",
    ];
    data.iter().map(|d| leaf_hash(d)).collect()
}

const ROOTS: [&str; 8] = [
    "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
    "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
    "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
    "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
    "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
    "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
    "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
];

#[test]
fn tree_heads_match_the_rfc_vectors() {
    assert_eq!(
        hex(&root(&[])),
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    );
    let leaves = vector_leaves();
    for (n, want) in ROOTS.iter().enumerate() {
        assert_eq!(hex(&root(&leaves[..=n])), *want, "size {}", n + 1);
    }
}

#[test]
fn inclusion_proofs_match_the_rfc_vectors() {
    let leaves = vector_leaves();
    let cases: [(usize, usize, &[&str]); 4] = [
        (0, 1, &[]),
        (
            0,
            8,
            &[
                "96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
                "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
                "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4",
            ],
        ),
        (
            5,
            8,
            &[
                "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
                "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
                "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
            ],
        ),
        (
            2,
            3,
            &["fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125"],
        ),
    ];
    for (index, size, want) in cases {
        let proof = inclusion_proof(&leaves[..size], index).expect("proof");
        let got: Vec<_> = proof.iter().map(hex).collect();
        assert_eq!(got, want, "leaf {index} of {size}");
        verify_inclusion(
            &leaves[index],
            index as u64,
            size as u64,
            &proof,
            &unhex(ROOTS[size - 1]),
        )
        .expect("verifies");
    }
}

#[test]
fn consistency_proofs_match_the_rfc_vectors() {
    let leaves = vector_leaves();
    let cases: [(usize, usize, &[&str]); 4] = [
        (1, 1, &[]),
        (
            1,
            8,
            &[
                "96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
                "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
                "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4",
            ],
        ),
        (
            6,
            8,
            &[
                "0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a",
                "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
                "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
            ],
        ),
        (
            2,
            5,
            &[
                "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
                "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
            ],
        ),
    ];
    for (old, new, want) in cases {
        let proof = consistency_proof(&leaves[..new], old).expect("proof");
        let got: Vec<_> = proof.iter().map(hex).collect();
        assert_eq!(got, want, "{old} -> {new}");
        verify_consistency(
            old as u64,
            new as u64,
            &unhex(ROOTS[old - 1]),
            &unhex(ROOTS[new - 1]),
            &proof,
        )
        .expect("verifies");
    }
}

fn leaves(n: usize) -> Vec<Hash> {
    (0..n)
        .map(|i| leaf_hash(&(i as u64).to_be_bytes()))
        .collect()
}

#[test]
fn every_inclusion_proof_verifies_and_every_tampering_fails() {
    let all = leaves(40);
    for size in 1..=all.len() {
        let tree = &all[..size];
        let head = root(tree);
        for index in 0..size {
            let proof = inclusion_proof(tree, index).expect("proof");
            let (i, s) = (index as u64, size as u64);
            assert_eq!(verify_inclusion(&tree[index], i, s, &proof, &head), Ok(()));
            // Another leaf, another index, a flipped bit, a truncated or padded path: all fail.
            let other = (index + 1) % size;
            if other != index {
                assert!(verify_inclusion(&tree[other], i, s, &proof, &head).is_err());
                assert!(verify_inclusion(&tree[index], other as u64, s, &proof, &head).is_err());
            }
            for k in 0..proof.len() {
                let mut bad = proof.clone();
                bad[k][0] ^= 1;
                assert!(verify_inclusion(&tree[index], i, s, &bad, &head).is_err());
            }
            if !proof.is_empty() {
                let short = &proof[..proof.len() - 1];
                assert!(verify_inclusion(&tree[index], i, s, short, &head).is_err());
            }
            let mut long = proof.clone();
            long.push(head);
            assert!(verify_inclusion(&tree[index], i, s, &long, &head).is_err());
        }
        assert!(inclusion_proof(tree, size).is_err());
        assert!(verify_inclusion(&tree[0], size as u64, size as u64, &[], &head).is_err());
    }
}

#[test]
fn every_consistency_proof_verifies_and_every_tampering_fails() {
    let all = leaves(40);
    for new in 1..=all.len() {
        let new_root = root(&all[..new]);
        for old in 1..=new {
            let old_root = root(&all[..old]);
            let proof = consistency_proof(&all[..new], old).expect("proof");
            let (o, n) = (old as u64, new as u64);
            assert_eq!(
                verify_consistency(o, n, &old_root, &new_root, &proof),
                Ok(()),
                "{old} -> {new}"
            );
            // A rewritten history (another old root) or a forged step is caught.
            let forged_old = root(&leaves(old + 100)[100..]);
            assert!(verify_consistency(o, n, &forged_old, &new_root, &proof).is_err());
            for k in 0..proof.len() {
                let mut bad = proof.clone();
                bad[k][31] ^= 0x80;
                assert!(verify_consistency(o, n, &old_root, &new_root, &bad).is_err());
            }
            if !proof.is_empty() {
                let short = &proof[..proof.len() - 1];
                assert!(verify_consistency(o, n, &old_root, &new_root, short).is_err());
                let mut long = proof.clone();
                long.push(new_root);
                assert!(verify_consistency(o, n, &old_root, &new_root, &long).is_err());
            }
        }
        assert!(consistency_proof(&all[..new], new + 1).is_err());
        assert!(verify_consistency(new as u64 + 1, new as u64, &new_root, &new_root, &[]).is_err());
    }
}

#[test]
fn compact_ranges_agree_with_full_trees_and_rebuild_from_parts() {
    let all = leaves(70);
    let mut range = CompactRange::new();
    assert_eq!(range.root(), empty_root());
    for (n, leaf) in all.iter().enumerate() {
        range.append(*leaf);
        assert_eq!(range.size(), n as u64 + 1);
        assert_eq!(range.frontier().len(), (n + 1).count_ones() as usize);
        let rebuilt =
            CompactRange::from_parts(range.size(), range.frontier().to_vec()).expect("parts");
        assert_eq!(rebuilt.root(), range.root());
    }
    // The full-tree root is built on compact ranges, so check against the vectors too.
    let vectors = vector_leaves();
    let mut r = CompactRange::new();
    for (n, leaf) in vectors.iter().enumerate() {
        r.append(*leaf);
        assert_eq!(hex(&r.root()), ROOTS[n]);
    }
    assert!(CompactRange::from_parts(3, vec![empty_root()]).is_err());
}

#[test]
fn the_prebuilt_tree_gives_the_same_roots_and_proofs() {
    for n in 1..=70 {
        let l = leaves(n);
        let tree = Tree::new(l.clone());
        assert_eq!(tree.root(), root(&l), "root of {n}");
        for i in 0..n {
            assert_eq!(
                tree.inclusion_proof(i as u64).expect("proof"),
                inclusion_proof(&l, i).expect("proof"),
                "leaf {i} of {n}"
            );
        }
        assert!(tree.inclusion_proof(n as u64).is_err());
        for new in (0..=n).filter(|_| n <= 40) {
            for old in 0..=new {
                assert_eq!(
                    tree.consistency_proof(old as u64, new as u64)
                        .expect("proof"),
                    consistency_proof(&l[..new], old).expect("proof"),
                    "{old} -> {new} in a tree of {n}"
                );
            }
        }
        assert!(tree.consistency_proof(2, 1).is_err());
        assert!(tree.consistency_proof(0, n as u64 + 1).is_err());
    }
}
