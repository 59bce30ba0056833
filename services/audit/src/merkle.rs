//! RFC 6962 / RFC 9162 Merkle hash trees: leaf hash `SHA-256(0x00 || entry)`, node hash
//! `SHA-256(0x01 || left || right)`; tree heads, inclusion proofs and consistency proofs,
//! and their verification (RFC 9162 §2.1.3.2 and §2.1.4.2).

use ring::digest::{Context, SHA256, digest};

/// A SHA-256 digest.
pub type Hash = [u8; 32];

fn finish(ctx: Context) -> Hash {
    let mut out = [0u8; 32];
    out.copy_from_slice(ctx.finish().as_ref());
    out
}

/// The hash of an empty tree: SHA-256 of nothing.
pub fn empty_root() -> Hash {
    let mut out = [0u8; 32];
    out.copy_from_slice(digest(&SHA256, b"").as_ref());
    out
}

/// `SHA-256(0x00 || entry)`.
pub fn leaf_hash(entry: &[u8]) -> Hash {
    let mut ctx = Context::new(&SHA256);
    ctx.update(&[0x00]);
    ctx.update(entry);
    finish(ctx)
}

/// `SHA-256(0x01 || left || right)`.
pub fn node_hash(left: &Hash, right: &Hash) -> Hash {
    let mut ctx = Context::new(&SHA256);
    ctx.update(&[0x01]);
    ctx.update(left);
    ctx.update(right);
    finish(ctx)
}

/// The largest power of two smaller than `n` (n >= 2): where RFC 6962 splits a tree.
fn split(n: usize) -> usize {
    debug_assert!(n >= 2);
    let k = n.next_power_of_two();
    if k == n { n / 2 } else { k / 2 }
}

/// The right edge of a tree: the roots of the perfect subtrees its leaves decompose into,
/// largest first. Enough to append a leaf and compute the head in O(log n), so a log's head
/// row can carry it instead of rereading every entry.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CompactRange {
    size: u64,
    /// One hash per set bit of `size`, from the highest bit down.
    frontier: Vec<Hash>,
}

impl CompactRange {
    pub fn new() -> Self {
        Self::default()
    }

    /// Rebuilds a range from its size and frontier, checking they fit together.
    pub fn from_parts(size: u64, frontier: Vec<Hash>) -> Result<Self, ProofError> {
        if frontier.len() != size.count_ones() as usize {
            return Err(ProofError::WrongLength {
                got: frontier.len(),
                want: size.count_ones() as usize,
            });
        }
        Ok(Self { size, frontier })
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    pub fn frontier(&self) -> &[Hash] {
        &self.frontier
    }

    /// Appends a leaf hash.
    pub fn append(&mut self, leaf: Hash) {
        let mut hash = leaf;
        // Each trailing one bit of the old size is a perfect subtree the new leaf completes.
        let mut carries = self.size.trailing_ones();
        while carries > 0 {
            let left = self.frontier.pop().unwrap_or(hash);
            hash = node_hash(&left, &hash);
            carries -= 1;
        }
        self.frontier.push(hash);
        self.size += 1;
    }

    /// The tree head.
    pub fn root(&self) -> Hash {
        let mut iter = self.frontier.iter().rev();
        let Some(mut acc) = iter.next().copied() else {
            return empty_root();
        };
        for left in iter {
            acc = node_hash(left, &acc);
        }
        acc
    }
}

/// The tree head over leaf hashes, in O(n) time and O(log n) space.
pub fn root(leaves: &[Hash]) -> Hash {
    let mut range = CompactRange::new();
    for leaf in leaves {
        range.append(*leaf);
    }
    range.root()
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProofError {
    #[error("index {index} is outside a tree of size {size}")]
    IndexOutOfRange { index: u64, size: u64 },
    #[error("a tree of size {old} cannot be a prefix of one of size {new}")]
    SizesOutOfOrder { old: u64, new: u64 },
    #[error("the proof has {got} hashes; a valid one has {want}")]
    WrongLength { got: usize, want: usize },
    #[error("the proof does not lead to the expected root")]
    RootMismatch,
}

/// Every complete, aligned subtree of a tree, built once in O(n): inclusion proofs for
/// many entries (a filtered export) then cost O(log n) each instead of O(n).
#[derive(Debug, Clone)]
pub struct Tree {
    /// `levels[l][i]` is the hash of leaves `i·2^l .. (i+1)·2^l`.
    levels: Vec<Vec<Hash>>,
}

impl Tree {
    pub fn new(leaves: Vec<Hash>) -> Self {
        let mut levels = vec![leaves];
        while let Some(last) = levels.last().filter(|l| l.len() > 1) {
            let next = last
                .chunks_exact(2)
                .map(|p| node_hash(&p[0], &p[1]))
                .collect();
            levels.push(next);
        }
        Self { levels }
    }

    pub fn size(&self) -> u64 {
        self.levels[0].len() as u64
    }

    /// The hash of leaves `start..end`, where `start` is aligned to the largest power of two
    /// not above `end - start` (as every range in a proof is).
    fn range_hash(&self, start: usize, end: usize) -> Hash {
        // Split into complete subtrees, largest first, then fold from the right.
        let mut parts = Vec::new();
        let mut at = start;
        while at < end {
            let level = (usize::BITS - 1 - (end - at).leading_zeros()) as usize;
            parts.push(self.levels[level][at >> level]);
            at += 1 << level;
        }
        let mut acc = parts.pop().unwrap_or_else(empty_root);
        while let Some(left) = parts.pop() {
            acc = node_hash(&left, &acc);
        }
        acc
    }

    pub fn root(&self) -> Hash {
        self.range_hash(0, self.levels[0].len())
    }

    /// The same proof as [`consistency_proof`] between the trees of the first `old` and the
    /// first `new` leaves, in O(log² n).
    pub fn consistency_proof(&self, old: u64, new: u64) -> Result<Vec<Hash>, ProofError> {
        if old > new || new > self.size() {
            return Err(ProofError::SizesOutOfOrder { old, new });
        }
        let (old, new) = (old as usize, new as usize);
        if old == 0 || old == new {
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        // RFC 9162 SUBPROOF over leaves lo..hi, iteratively: the hashes collected on the way
        // down are emitted in reverse, as the recursion would emit them on the way up.
        let (mut m, mut lo, mut hi, mut complete) = (old, 0, new, true);
        let mut pending = Vec::new();
        loop {
            let n = hi - lo;
            if m == n {
                if !complete {
                    out.push(self.range_hash(lo, hi));
                }
                break;
            }
            let k = split(n);
            if m <= k {
                pending.push(self.range_hash(lo + k, hi));
                hi = lo + k;
            } else {
                pending.push(self.range_hash(lo, lo + k));
                lo += k;
                m -= k;
                complete = false;
            }
        }
        out.extend(pending.into_iter().rev());
        Ok(out)
    }

    /// The same proof as [`inclusion_proof`] over the whole tree.
    pub fn inclusion_proof(&self, index: u64) -> Result<Vec<Hash>, ProofError> {
        let n = self.levels[0].len();
        let i = usize::try_from(index).unwrap_or(usize::MAX);
        if i >= n {
            return Err(ProofError::IndexOutOfRange {
                index,
                size: n as u64,
            });
        }
        let mut proof = Vec::new();
        let mut level = 0;
        while (n - 1) >> level > 0 || (i >> level) > 0 {
            let sibling = (i >> level) ^ 1;
            let start = sibling << level;
            if start < n {
                let end = (start + (1 << level)).min(n);
                proof.push(self.range_hash(start, end));
            }
            level += 1;
            if level >= usize::BITS as usize {
                break;
            }
        }
        Ok(proof)
    }
}

/// The audit path for leaf `index` in the tree over `leaves` (RFC 9162 §2.1.3.1).
pub fn inclusion_proof(leaves: &[Hash], index: usize) -> Result<Vec<Hash>, ProofError> {
    if index >= leaves.len() {
        return Err(ProofError::IndexOutOfRange {
            index: index as u64,
            size: leaves.len() as u64,
        });
    }
    let mut proof = Vec::new();
    let (mut lo, mut hi, mut m) = (0, leaves.len(), index);
    // Walk down from the root, collecting siblings; they are needed leaf-first.
    let mut siblings = Vec::new();
    while hi - lo > 1 {
        let k = split(hi - lo);
        if m < k {
            siblings.push(root(&leaves[lo + k..hi]));
            hi = lo + k;
        } else {
            siblings.push(root(&leaves[lo..lo + k]));
            lo += k;
            m -= k;
        }
    }
    proof.extend(siblings.into_iter().rev());
    Ok(proof)
}

/// The consistency proof that the tree over `leaves[..old]` is a prefix of the tree over
/// `leaves` (RFC 9162 §2.1.4.1).
pub fn consistency_proof(leaves: &[Hash], old: usize) -> Result<Vec<Hash>, ProofError> {
    let new = leaves.len();
    if old > new {
        return Err(ProofError::SizesOutOfOrder {
            old: old as u64,
            new: new as u64,
        });
    }
    if old == 0 || old == new {
        return Ok(Vec::new());
    }
    fn subproof(m: usize, d: &[Hash], complete: bool, out: &mut Vec<Hash>) {
        let n = d.len();
        if m == n {
            if !complete {
                out.push(root(d));
            }
            return;
        }
        let k = split(n);
        if m <= k {
            subproof(m, &d[..k], complete, out);
            out.push(root(&d[k..]));
        } else {
            subproof(m - k, &d[k..], false, out);
            out.push(root(&d[..k]));
        }
    }
    let mut out = Vec::new();
    subproof(old, leaves, true, &mut out);
    Ok(out)
}

/// Checks that `leaf` is at `index` in the tree of `size` leaves with head `root`.
pub fn verify_inclusion(
    leaf: &Hash,
    index: u64,
    size: u64,
    proof: &[Hash],
    expected_root: &Hash,
) -> Result<(), ProofError> {
    if index >= size {
        return Err(ProofError::IndexOutOfRange { index, size });
    }
    let (mut fn_, mut sn) = (index, size - 1);
    let mut r = *leaf;
    for p in proof {
        if sn == 0 {
            return Err(ProofError::WrongLength {
                got: proof.len(),
                want: inclusion_len(index, size),
            });
        }
        if fn_ & 1 == 1 || fn_ == sn {
            r = node_hash(p, &r);
            while fn_ & 1 == 0 && fn_ != 0 {
                fn_ >>= 1;
                sn >>= 1;
            }
        } else {
            r = node_hash(&r, p);
        }
        fn_ >>= 1;
        sn >>= 1;
    }
    if sn != 0 {
        return Err(ProofError::WrongLength {
            got: proof.len(),
            want: inclusion_len(index, size),
        });
    }
    if &r == expected_root {
        Ok(())
    } else {
        Err(ProofError::RootMismatch)
    }
}

/// How many hashes a valid inclusion proof for `index` in a tree of `size` has.
fn inclusion_len(index: u64, size: u64) -> usize {
    let (mut fn_, mut sn, mut len) = (index, size - 1, 0);
    while sn != 0 {
        if fn_ & 1 == 1 || fn_ == sn {
            while fn_ & 1 == 0 && fn_ != 0 {
                fn_ >>= 1;
                sn >>= 1;
            }
        }
        fn_ >>= 1;
        sn >>= 1;
        len += 1;
    }
    len
}

/// Checks that the tree of `old_size` with head `old_root` is a prefix of the tree of
/// `new_size` with head `new_root`.
pub fn verify_consistency(
    old_size: u64,
    new_size: u64,
    old_root: &Hash,
    new_root: &Hash,
    proof: &[Hash],
) -> Result<(), ProofError> {
    if old_size > new_size {
        return Err(ProofError::SizesOutOfOrder {
            old: old_size,
            new: new_size,
        });
    }
    if old_size == new_size {
        if !proof.is_empty() {
            return Err(ProofError::WrongLength {
                got: proof.len(),
                want: 0,
            });
        }
        return if old_root == new_root {
            Ok(())
        } else {
            Err(ProofError::RootMismatch)
        };
    }
    if old_size == 0 {
        // Every tree extends the empty tree; there is nothing to prove.
        return if proof.is_empty() {
            Ok(())
        } else {
            Err(ProofError::WrongLength {
                got: proof.len(),
                want: 0,
            })
        };
    }
    if proof.is_empty() {
        return Err(ProofError::WrongLength { got: 0, want: 1 });
    }
    // RFC 9162 §2.1.4.2.
    let mut path: Vec<Hash> = Vec::with_capacity(proof.len() + 1);
    if old_size.is_power_of_two() {
        path.push(*old_root);
    }
    path.extend_from_slice(proof);
    let (mut fn_, mut sn) = (old_size - 1, new_size - 1);
    while fn_ & 1 == 1 {
        fn_ >>= 1;
        sn >>= 1;
    }
    let mut fr = path[0];
    let mut sr = path[0];
    for c in &path[1..] {
        if sn == 0 {
            return Err(ProofError::WrongLength {
                got: proof.len(),
                want: proof.len() - 1,
            });
        }
        if fn_ & 1 == 1 || fn_ == sn {
            fr = node_hash(c, &fr);
            sr = node_hash(c, &sr);
            while fn_ & 1 == 0 && fn_ != 0 {
                fn_ >>= 1;
                sn >>= 1;
            }
        } else {
            sr = node_hash(&sr, c);
        }
        fn_ >>= 1;
        sn >>= 1;
    }
    if sn != 0 {
        return Err(ProofError::WrongLength {
            got: proof.len(),
            want: proof.len() + 1,
        });
    }
    if &fr == old_root && &sr == new_root {
        Ok(())
    } else {
        Err(ProofError::RootMismatch)
    }
}

#[cfg(test)]
mod tests;
