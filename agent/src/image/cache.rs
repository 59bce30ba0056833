//! What the image cache holds and whose it is: a record per image (its layers, its
//! configuration, the size of its unpacked root) with the tenants that may use it, and the
//! accounting that keeps the cache under its caps.
//!
//! - **A tenant may use a cached image only after its own registry served it every blob of
//!   it** (the configuration and each layer, downloaded with the tenant's credentials and
//!   checked against its digest and declared size). The blobs stay on disk once (content
//!   addressed, shared), but the right to use them is per tenant: knowing a digest is not
//!   having the bytes, and a registry a tenant runs itself can claim to hold any digest, so
//!   only the bytes themselves prove it. A tenant is served a blob when an image it may use
//!   holds it.
//! - **Caps hold as bytes are written, not after**: a pull reserves what it is about to
//!   write (each blob's declared size before it streams, an unpacked root as it grows), and
//!   a reservation that would pass a cap first makes room by evicting images not in use,
//!   least recently used first, or fails. Three caps: the cache's size, an image's
//!   footprint (its layers and its unpacked root), and each tenant's share (the images it
//!   may use, each blob counted once, and what its pulls under way reserved). Past its
//!   share, a tenant's own least recently used images stop counting as its (it must be
//!   served them again to use them); past the cache's size, images go whole.
//!
//! Pure bookkeeping: what to change on disk is returned as [`Change`]s for the caller.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::{Deserialize, Serialize};

use super::ImageConfig;

/// The caps the cache holds to, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    /// All images together.
    pub cache: u64,
    /// One image: its layers and its unpacked root file system.
    pub image: u64,
    /// What one tenant's images take.
    pub tenant: u64,
}

/// What the cache keeps of one image (`manifests/<hex>.json`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// sha256:… of each layer, in order, with its size.
    pub layers: Vec<(String, u64)>,
    /// sha256:… of its configuration blob (empty in records from before it was kept:
    /// then no tenant may use it before being served the configuration).
    #[serde(default)]
    pub config_digest: String,
    pub config: ImageConfig,
    /// Bytes its unpacked root file system was charged (see `unpack::ENTRY_BYTES`).
    pub unpacked_bytes: u64,
    /// The tenants that may use it, each with when it last did (the cache's use counter).
    #[serde(default)]
    pub tenants: BTreeMap<String, u64>,
}

impl Record {
    pub fn layer_bytes(&self) -> u64 {
        self.layers.iter().map(|(_, s)| s).sum()
    }

    /// What it takes of the cache: its layers and its unpacked root.
    pub fn footprint(&self) -> u64 {
        self.layer_bytes().saturating_add(self.unpacked_bytes)
    }

    /// When any tenant last used it (0: none may).
    fn last_used(&self) -> u64 {
        self.tenants.values().copied().max().unwrap_or(0)
    }
}

/// What to change on disk after the bookkeeping changed.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Change {
    /// Remove an image's record and unpacked root (by manifest digest).
    RemoveImage(String),
    /// Remove a layer blob no image holds any more.
    RemoveBlob(String),
    /// Write an image's record again (a tenant may no longer use it).
    Rewrite(String),
}

/// Which cap a reservation would pass.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Full {
    #[error(
        "the tenant's share of the node's image cache ({cap} bytes) is taken by images in use \
         or being pulled ({used} bytes; {wanted} more wanted)"
    )]
    Tenant { cap: u64, used: u64, wanted: u64 },
    #[error(
        "the node's image cache ({cap} bytes) is full of images in use or being pulled \
         ({used} bytes; {wanted} more wanted)"
    )]
    Cache { cap: u64, used: u64, wanted: u64 },
}

/// The cache's bookkeeping.
#[derive(Debug)]
pub struct Index {
    pub caps: Caps,
    images: BTreeMap<String, Record>,
    /// Images held by running containers, with how many hold each.
    in_use: HashMap<String, usize>,
    /// Images and blobs pulls under way need: never evicted meanwhile.
    busy: HashMap<String, usize>,
    /// Bytes reserved by pulls under way: all together, and by tenant.
    reserved: u64,
    reserved_by: HashMap<String, u64>,
    /// The use counter: each use of an image by a tenant takes the next value.
    clock: u64,
}

impl Index {
    pub fn new(caps: Caps, images: BTreeMap<String, Record>) -> Self {
        let clock = images.values().map(Record::last_used).max().unwrap_or(0);
        Index {
            caps,
            images,
            in_use: HashMap::new(),
            busy: HashMap::new(),
            reserved: 0,
            reserved_by: HashMap::new(),
            clock,
        }
    }

    pub fn record(&self, digest: &str) -> Option<&Record> {
        self.images.get(digest)
    }

    pub fn records(&self) -> impl Iterator<Item = (&String, &Record)> {
        self.images.iter()
    }

    /// Whether `tenant` may use image `digest` as it is cached.
    pub fn may_use(&self, tenant: &str, digest: &str) -> bool {
        self.images
            .get(digest)
            .is_some_and(|r| r.tenants.contains_key(tenant))
    }

    /// Whether `tenant`'s registries served it blob `blob` (a layer or a configuration of
    /// an image it may use).
    pub fn served(&self, tenant: &str, blob: &str) -> bool {
        self.images.values().any(|r| {
            r.tenants.contains_key(tenant)
                && (r.config_digest == blob || r.layers.iter().any(|(l, _)| l == blob))
        })
    }

    /// Whether some cached image holds layer `blob`.
    pub fn has_blob(&self, blob: &str) -> bool {
        self.images
            .values()
            .any(|r| r.layers.iter().any(|(l, _)| l == blob))
    }

    /// Bytes held: each blob once, every unpacked root, and what pulls reserved.
    pub fn usage(&self) -> u64 {
        self.bytes_of(self.images.values()) + self.reserved
    }

    /// Bytes `tenant`'s images take (each blob once), and what its pulls reserved.
    pub fn tenant_usage(&self, tenant: &str) -> u64 {
        self.bytes_of(
            self.images
                .values()
                .filter(|r| r.tenants.contains_key(tenant)),
        ) + self.reserved_by.get(tenant).copied().unwrap_or(0)
    }

    /// What `tenant`'s share grows by when it may use image `digest` too.
    pub fn claim_cost(&self, tenant: &str, digest: &str) -> u64 {
        let Some(r) = self.images.get(digest) else {
            return 0;
        };
        let new_layers: u64 = r
            .layers
            .iter()
            .map(|(l, s)| (l.as_str(), *s))
            .collect::<HashMap<&str, u64>>()
            .into_iter()
            .filter(|(l, _)| !self.served(tenant, l))
            .map(|(_, s)| s)
            .sum();
        if r.tenants.contains_key(tenant) {
            0
        } else {
            new_layers.saturating_add(r.unpacked_bytes)
        }
    }

    fn bytes_of<'a>(&self, records: impl Iterator<Item = &'a Record>) -> u64 {
        let mut blobs: HashMap<&str, u64> = HashMap::new();
        let mut unpacked = 0u64;
        for r in records {
            unpacked = unpacked.saturating_add(r.unpacked_bytes);
            for (l, s) in &r.layers {
                blobs.insert(l, *s);
            }
        }
        blobs.values().sum::<u64>().saturating_add(unpacked)
    }

    fn evictable(&self, digest: &str) -> bool {
        !self.in_use.contains_key(digest) && !self.busy.contains_key(digest)
    }

    /// Reserves `global` bytes of the cache and `tenant_bytes` of `tenant`'s share, first
    /// making room: `tenant`'s least recently used images not in use stop counting as its,
    /// then the cache's least recently used images not in use go. Returns what to change on
    /// disk; nothing changes when it fails.
    pub fn reserve(
        &mut self,
        tenant: &str,
        global: u64,
        tenant_bytes: u64,
    ) -> Result<Vec<Change>, Full> {
        // Decided on a copy, so a reservation that cannot be had changes nothing.
        let mut images = self.images.clone();
        let mut dropped_claims: Vec<String> = Vec::new();
        let share = |images: &BTreeMap<String, Record>| {
            let mine = images.values().filter(|r| r.tenants.contains_key(tenant));
            self.bytes_of(mine) + self.reserved_by.get(tenant).copied().unwrap_or(0)
        };
        while share(&images).saturating_add(tenant_bytes) > self.caps.tenant {
            let oldest = images
                .iter()
                .filter(|(d, r)| r.tenants.contains_key(tenant) && self.evictable(d))
                .min_by_key(|(_, r)| r.tenants.get(tenant).copied().unwrap_or(0))
                .map(|(d, _)| d.clone());
            let Some(digest) = oldest else {
                return Err(Full::Tenant {
                    cap: self.caps.tenant,
                    used: share(&images),
                    wanted: tenant_bytes,
                });
            };
            if let Some(r) = images.get_mut(&digest) {
                r.tenants.remove(tenant);
            }
            dropped_claims.push(digest);
        }
        let total =
            |images: &BTreeMap<String, Record>| self.bytes_of(images.values()) + self.reserved;
        let mut gone: Vec<String> = Vec::new();
        while total(&images).saturating_add(global) > self.caps.cache {
            let oldest = images
                .iter()
                .filter(|(d, _)| self.evictable(d))
                .min_by_key(|(_, r)| r.last_used())
                .map(|(d, _)| d.clone());
            let Some(digest) = oldest else {
                return Err(Full::Cache {
                    cap: self.caps.cache,
                    used: total(&images),
                    wanted: global,
                });
            };
            images.remove(&digest);
            gone.push(digest);
        }
        let mut changes = Vec::new();
        let mut blobs_gone = HashSet::new();
        for digest in &gone {
            if let Some(r) = self.images.get(digest) {
                for (l, _) in &r.layers {
                    let held = images
                        .values()
                        .any(|o| o.layers.iter().any(|(x, _)| x == l));
                    if !held && !self.busy.contains_key(l) && blobs_gone.insert(l.clone()) {
                        changes.push(Change::RemoveBlob(l.clone()));
                    }
                }
            }
            changes.push(Change::RemoveImage(digest.clone()));
        }
        for digest in dropped_claims {
            if !gone.contains(&digest) {
                changes.push(Change::Rewrite(digest));
            }
        }
        self.images = images;
        self.reserved = self.reserved.saturating_add(global);
        if tenant_bytes > 0 {
            *self.reserved_by.entry(tenant.to_owned()).or_default() += tenant_bytes;
        }
        Ok(changes)
    }

    /// Gives back what [`Self::reserve`] took.
    pub fn release(&mut self, tenant: &str, global: u64, tenant_bytes: u64) {
        self.reserved = self.reserved.saturating_sub(global);
        if let Some(r) = self.reserved_by.get_mut(tenant) {
            *r = r.saturating_sub(tenant_bytes);
            if *r == 0 {
                self.reserved_by.remove(tenant);
            }
        }
    }

    /// Records image `digest` (replacing what was known of it) as one `tenant` may use,
    /// used now.
    pub fn insert(&mut self, digest: &str, mut record: Record, tenant: &str) {
        if let Some(old) = self.images.get(digest) {
            for (t, at) in &old.tenants {
                record.tenants.entry(t.clone()).or_insert(*at);
            }
        }
        self.clock += 1;
        record.tenants.insert(tenant.to_owned(), self.clock);
        self.images.insert(digest.to_owned(), record);
    }

    /// `tenant` uses image `digest` now (it may: see [`Self::may_use`] and
    /// [`Self::insert`]).
    pub fn touch(&mut self, digest: &str, tenant: &str) {
        self.clock += 1;
        if let Some(r) = self.images.get_mut(digest) {
            r.tenants.insert(tenant.to_owned(), self.clock);
        }
    }

    pub fn hold(&mut self, digest: &str) {
        *self.in_use.entry(digest.to_owned()).or_default() += 1;
    }

    pub fn unhold(&mut self, digest: &str) {
        decrement(&mut self.in_use, digest);
    }

    /// A pull under way needs its image and these blobs: none is evicted meanwhile.
    pub fn busy(&mut self, image: &str, blobs: &[String]) {
        for d in blobs.iter().map(String::as_str).chain([image]) {
            *self.busy.entry(d.to_owned()).or_default() += 1;
        }
    }

    /// The pull is over: of the blobs it needed, those no image holds and no other pull
    /// needs are returned for removal (what a failed pull downloaded).
    pub fn done(&mut self, image: &str, blobs: &[String]) -> Vec<Change> {
        for d in blobs.iter().map(String::as_str).chain([image]) {
            decrement(&mut self.busy, d);
        }
        let mut seen = HashSet::new();
        blobs
            .iter()
            .filter(|d| !self.busy.contains_key(*d) && !self.has_blob(d) && seen.insert(*d))
            .map(|d| Change::RemoveBlob(d.clone()))
            .collect()
    }

    /// Brings the cache within its caps (smaller caps than it was filled under): images
    /// not in use go, least recently used first.
    pub fn shrink(&mut self) -> Vec<Change> {
        let tenants: HashSet<String> = self
            .images
            .values()
            .flat_map(|r| r.tenants.keys().cloned())
            .collect();
        let mut out = Vec::new();
        for t in tenants {
            out.extend(self.reserve(&t, 0, 0).unwrap_or_default());
        }
        out.extend(self.reserve("", 0, 0).unwrap_or_default());
        out
    }
}

fn decrement(map: &mut HashMap<String, usize>, key: &str) {
    if let Some(n) = map.get_mut(key) {
        *n -= 1;
        if *n == 0 {
            map.remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(layers: &[(&str, u64)], unpacked: u64) -> Record {
        Record {
            layers: layers.iter().map(|(l, s)| ((*l).to_owned(), *s)).collect(),
            config_digest: format!("cfg-{}", layers.first().map_or("", |l| l.0)),
            unpacked_bytes: unpacked,
            ..Record::default()
        }
    }

    fn index(cache: u64, tenant: u64) -> Index {
        Index::new(
            Caps {
                cache,
                image: cache,
                tenant,
            },
            BTreeMap::new(),
        )
    }

    #[test]
    fn a_tenant_is_served_only_what_its_own_images_hold() {
        let mut ix = index(1000, 1000);
        ix.insert("img-b", record(&[("base", 10), ("secret", 5)], 20), "b");
        assert!(ix.may_use("b", "img-b"));
        assert!(!ix.may_use("a", "img-b"), "a's manifest naming b's image");
        assert!(!ix.served("a", "secret") && !ix.served("a", "cfg-base"));
        assert!(ix.served("b", "secret") && ix.served("b", "cfg-base"));
        assert!(ix.has_blob("secret"));
        // Once a's registry served the same base, a has it, and only that.
        ix.insert("img-a", record(&[("base", 10)], 15), "a");
        assert!(ix.served("a", "base") && !ix.served("a", "secret"));
        // Counted once for a, each blob once for the cache.
        assert_eq!(ix.tenant_usage("a"), 10 + 15);
        assert_eq!(ix.usage(), 10 + 5 + 20 + 15);
        // What using b's image would add to a's share: the layer a lacks and the root.
        assert_eq!(ix.claim_cost("a", "img-b"), 5 + 20);
        assert_eq!(ix.claim_cost("b", "img-b"), 0);
    }

    #[test]
    fn a_reservation_evicts_least_recently_used_images_not_in_use() {
        let mut ix = index(100, 100);
        ix.insert("old", record(&[("l1", 20)], 20), "a");
        ix.insert("mid", record(&[("l2", 10), ("shared", 10)], 10), "a");
        ix.insert("new", record(&[("shared", 10)], 10), "b");
        assert_eq!(ix.usage(), 40 + 30 + 10);
        ix.hold("old");
        // 30 more: "old" is in use, so "mid" goes, with its own blob but not the shared one.
        let removed = ix.reserve("c", 30, 30).expect("room");
        assert_eq!(
            removed,
            [
                Change::RemoveBlob("l2".into()),
                Change::RemoveImage("mid".into())
            ]
        );
        assert!(ix.record("new").is_some() && ix.record("old").is_some());
        assert_eq!(ix.usage(), 40 + 20 + 30);
        // Nothing more can go: "new" is busy (being pulled again), "old" in use.
        ix.busy("new", &[]);
        let before = ix.usage();
        let e = ix.reserve("c", 20, 20).expect_err("full");
        assert!(matches!(e, Full::Cache { cap: 100, .. }), "{e}");
        assert_eq!(ix.usage(), before, "a failed reservation changes nothing");
        ix.release("c", 30, 30);
        assert_eq!(ix.usage(), 60);
        assert!(ix.done("new", &[]).is_empty());
    }

    #[test]
    fn past_its_share_a_tenant_loses_its_own_oldest_images_not_others() {
        let mut ix = index(1000, 50);
        ix.insert("a1", record(&[("x", 20)], 10), "a");
        ix.insert("a2", record(&[("y", 10)], 5), "a");
        ix.insert("b1", record(&[("z", 30)], 15), "b");
        // 20 more for a: a1 (its oldest) stops counting as a's; the cache keeps it.
        let changed = ix.reserve("a", 20, 20).expect("room");
        assert_eq!(changed, [Change::Rewrite("a1".into())]);
        assert!(!ix.may_use("a", "a1") && ix.record("a1").is_some());
        assert!(ix.may_use("a", "a2") && ix.may_use("b", "b1"));
        assert_eq!(ix.tenant_usage("a"), 15 + 20);
        // A tenant whose images are all in use cannot take more than its share.
        ix.hold("a2");
        let e = ix.reserve("a", 30, 30).expect_err("over the share");
        assert!(matches!(e, Full::Tenant { cap: 50, .. }), "{e}");
        assert_eq!(ix.tenant_usage("b"), 45);
    }

    #[test]
    fn a_failed_pull_leaves_no_blob_behind_that_nothing_holds() {
        let mut ix = index(1000, 1000);
        ix.insert("img", record(&[("kept", 10)], 10), "a");
        let pull = vec!["kept".to_owned(), "fresh".to_owned()];
        ix.busy("new-img", &pull);
        ix.busy("other-img", &["fresh".to_owned()]);
        assert!(
            ix.done("new-img", &pull).is_empty(),
            "another pull still needs `fresh`"
        );
        assert_eq!(
            ix.done("other-img", &["fresh".to_owned()]),
            [Change::RemoveBlob("fresh".into())]
        );
    }

    #[test]
    fn smaller_caps_shrink_the_cache_at_start() {
        let mut images = BTreeMap::new();
        let mut r = record(&[("l1", 50)], 50);
        r.tenants.insert("a".into(), 1);
        images.insert("one".to_owned(), r);
        let mut r = record(&[("l2", 50)], 50);
        r.tenants.insert("a".into(), 2);
        images.insert("two".to_owned(), r);
        let mut ix = Index::new(
            Caps {
                cache: 150,
                image: 150,
                tenant: 1000,
            },
            images,
        );
        let removed = ix.shrink();
        assert_eq!(
            removed,
            [
                Change::RemoveBlob("l1".into()),
                Change::RemoveImage("one".into())
            ]
        );
        assert_eq!(ix.usage(), 100);
        // The use counter goes on from the records'.
        ix.touch("two", "b");
        assert_eq!(ix.record("two").map(|r| r.tenants["b"]), Some(3));
    }
}
