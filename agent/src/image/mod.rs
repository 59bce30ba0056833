//! Container images: pulled from OCI distribution registries, checked blob by blob against
//! their digests and declared sizes, kept in a content-addressed cache under
//! `<data dir>/images/`, and unpacked into a read-only root file system per image.
//!
//! - `blobs/sha256/<hex>`: layers, each written only after its digest checked out.
//! - `manifests/<hex>.json`: what the agent knows of an image by its manifest digest (its
//!   layers, configuration, unpacked size, and the tenants that may use it: see [`cache`]).
//! - `rootfs/<hex>/`: the unpacked root file system (see [`unpack`]). Containers never run
//!   on it directly: each gets an overlay of its own on top (`runtime::oci::rootfs`), so
//!   the cache is 0700 throughout and no other user of the host reads it.
//!
//! A tag is resolved to a manifest digest at an attempt's first pull; the agent reports the
//! digest with the job's start, the control plane keeps it, and every later attempt on any
//! node names the image by that digest.
//!
//! Every pull, even one the cache serves, asks the registry for the manifest with the job's
//! own credentials first; and a tenant uses a cached image only once its own registry
//! served it every blob of it (see [`cache`]), so one tenant's cached private image is
//! never another's without the registry's say-so, whatever a manifest names. What a
//! registry sends is held to what its manifest declares as it streams (a blob longer than
//! its declared size stops there), and the cache's caps (its size, an image's, a tenant's
//! share) hold while layers download and unpack, not after.

pub mod cache;
pub mod inroot;
pub mod local;
mod pull;
pub mod unpack;
pub mod user;

use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::manifest::{OciDescriptor, OciImageManifest};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::io::AsyncWrite;

use self::cache::{Caps, Change, Index, Record};
use self::pull::*;
use crate::runtime::PullCredentials;

/// Largest image configuration blob accepted.
pub const MAX_CONFIG_BYTES: u64 = 4 << 20;
/// What an unpack reserves of the cache at a time, as the root grows.
const RESERVE_STEP: u64 = 64 << 20;

#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("`{0}` is not an image reference (REGISTRY/REPOSITORY:TAG or …@sha256:…): {1}")]
    Reference(String, String),
    #[error("image {image}: {message}")]
    Registry { image: String, message: String },
    #[error("image {image} not found in its registry (no such repository, tag or digest)")]
    NotFound { image: String },
    #[error("image {image}: the registry refused the credentials (or gave none access)")]
    Unauthorized { image: String },
    #[error(
        "image {image}: layer {layer} does not match its digest (the registry sent content hashing to {actual})"
    )]
    LayerDigest {
        image: String,
        layer: String,
        actual: String,
    },
    #[error(
        "image {image}: blob {blob} is larger than the {declared} bytes its manifest declares \
         (the registry sent more; stopped there)"
    )]
    BlobTooLarge {
        image: String,
        blob: String,
        declared: u64,
    },
    #[error("image {image}: blob {blob} is {sent} bytes, not the {declared} its manifest declares")]
    BlobSize {
        image: String,
        blob: String,
        declared: u64,
        sent: u64,
    },
    #[error("image {image}: its manifest does not match the digest {expected} it was named by")]
    ManifestDigest { image: String, expected: String },
    #[error("image {image}: layer {layer}: {source}")]
    Unpack {
        image: String,
        layer: String,
        source: unpack::UnpackError,
    },
    #[error("image {image}: {message}")]
    Unsupported { image: String, message: String },
    #[error("image {image}: {source}")]
    Full { image: String, source: cache::Full },
    #[error("image cache: {0}")]
    Io(#[from] std::io::Error),
}

/// The parts of an image's configuration a container starts from.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageConfig {
    pub env: Vec<String>,
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    pub working_dir: Option<String>,
    pub user: Option<String>,
}

/// An image ready to run: held in the cache (not evicted) while this lives.
#[derive(Debug)]
pub struct Image {
    /// `sha256:…` of its manifest.
    pub digest: String,
    /// The reference pinned to that digest (`REGISTRY/REPOSITORY@sha256:…`).
    pub pinned: String,
    /// Its unpacked root in the cache: shared, read-only, never a container's root itself.
    pub rootfs: PathBuf,
    pub config: ImageConfig,
    _hold: Hold,
}

struct Hold {
    digest: String,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Hold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hold")
            .field("digest", &self.digest)
            .finish()
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.shared.index().unhold(&self.digest);
    }
}

/// How the agent reaches registries.
#[derive(Debug, Clone, Default)]
pub struct RegistryConfig {
    /// Registries (`HOST[:PORT]`) spoken to over plain HTTP (a loopback test registry).
    pub insecure: Vec<String>,
    /// Extra CA certificates (PEM) trusted for registries, beside the system's roots.
    pub ca_pem: Option<String>,
}

/// The cache's directory and bookkeeping, shared with what holds and unpacks images.
struct Shared {
    dir: PathBuf,
    index: Mutex<Index>,
}

impl Shared {
    fn index(&self) -> MutexGuard<'_, Index> {
        self.index.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn blob_path(&self, digest: &str) -> Option<PathBuf> {
        Some(self.dir.join("blobs/sha256").join(hex_of(digest)?))
    }

    fn manifest_path(&self, digest: &str) -> Option<PathBuf> {
        Some(
            self.dir
                .join("manifests")
                .join(format!("{}.json", hex_of(digest)?)),
        )
    }

    fn rootfs_path(&self, digest: &str) -> Option<PathBuf> {
        Some(self.dir.join("rootfs").join(hex_of(digest)?))
    }

    /// Writes image `digest`'s record as the index has it (atomically). Blocks.
    fn save(&self, digest: &str) -> std::io::Result<()> {
        let Some(record) = self.index().record(digest).cloned() else {
            return Ok(());
        };
        let Some(path) = self.manifest_path(digest) else {
            return Ok(());
        };
        let json = serde_json::to_vec(&record).map_err(std::io::Error::other)?;
        let tmp = path.with_extension(format!("tmp-{}", uuid::Uuid::new_v4().simple()));
        std::fs::write(&tmp, json)?;
        std::fs::rename(&tmp, &path)
    }

    /// Makes the changes the bookkeeping asks for on disk. Blocks.
    fn apply(&self, changes: Vec<Change>) {
        for change in changes {
            match change {
                Change::RemoveImage(digest) => {
                    if let Some(m) = self.manifest_path(&digest) {
                        let _ = std::fs::remove_file(m);
                    }
                    if let Some(root) = self.rootfs_path(&digest) {
                        let _ = std::fs::remove_dir_all(root);
                    }
                    tracing::info!(image = %digest, "evicted from the image cache");
                }
                Change::RemoveBlob(digest) => {
                    if let Some(p) = self.blob_path(&digest) {
                        let _ = std::fs::remove_file(p);
                    }
                }
                Change::Rewrite(digest) => {
                    if let Err(e) = self.save(&digest) {
                        tracing::warn!(image = %digest, error = %e, "image record not written");
                    }
                }
            }
        }
    }

    /// Reserves room (see [`Index::reserve`]), evicting what it must; given back when
    /// the reservation is dropped. Blocks.
    fn reserve(
        self: &Arc<Self>,
        tenant: &str,
        global: u64,
        tenant_bytes: u64,
    ) -> Result<Reserved, cache::Full> {
        let changes = self.index().reserve(tenant, global, tenant_bytes)?;
        self.apply(changes);
        Ok(Reserved {
            shared: self.clone(),
            tenant: tenant.to_owned(),
            global,
            tenant_bytes,
        })
    }
}

/// Room a pull under way reserved in the cache: given back when dropped (the pull ended,
/// its image recorded or not, or it was abandoned).
struct Reserved {
    shared: Arc<Shared>,
    tenant: String,
    global: u64,
    tenant_bytes: u64,
}

impl Reserved {
    /// Takes over `other`'s room (of the same tenant).
    fn absorb(&mut self, mut other: Reserved) {
        self.global += std::mem::take(&mut other.global);
        self.tenant_bytes += std::mem::take(&mut other.tenant_bytes);
    }
}

impl Drop for Reserved {
    fn drop(&mut self) {
        if self.global > 0 || self.tenant_bytes > 0 {
            self.shared
                .index()
                .release(&self.tenant, self.global, self.tenant_bytes);
        }
    }
}

/// An image and blobs a pull under way needs (none evicted meanwhile): when dropped, what
/// of them no image holds (a failed or abandoned pull's downloads) is removed.
struct Busy {
    shared: Arc<Shared>,
    image: String,
    blobs: Vec<String>,
}

impl Busy {
    fn new(shared: &Arc<Shared>, image: &str, blobs: Vec<String>) -> Self {
        shared.index().busy(image, &blobs);
        Busy {
            shared: shared.clone(),
            image: image.to_owned(),
            blobs,
        }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        let changes = self.shared.index().done(&self.image, &self.blobs);
        if !changes.is_empty() {
            // Off the async workers.
            let shared = self.shared.clone();
            std::thread::spawn(move || shared.apply(changes));
        }
    }
}

pub struct ImageStore {
    shared: Arc<Shared>,
    registries: RegistryConfig,
    /// One pull of an image at a time (by manifest digest).
    pulling: tokio::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Registry clients by the credentials they pull with: a client keeps the first
    /// credentials it is given for a registry (and the tokens they earn), so jobs pulling
    /// with different credentials never share one.
    clients: Mutex<HashMap<String, Client>>,
}

const MANIFEST_TYPES: &[&str] = &[
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
];

fn hex_of(digest: &str) -> Option<&str> {
    let hex = digest.strip_prefix("sha256:")?;
    (hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit())).then_some(hex)
}

fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// A directory only its owner (the agent) reads: made 0700, or made so.
fn private_dir(path: &Path) -> std::io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)?;
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o700))
}

/// Runs blocking work off the async workers.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, ImageError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ImageError::Io(std::io::Error::other(e.to_string())))
}

/// Writes what a registry streams to `inner`, at most `limit` bytes: one byte more fails
/// the write, and with it the download.
struct Capped<W> {
    inner: W,
    limit: u64,
    written: u64,
    over: bool,
}

impl<W> Capped<W> {
    fn new(inner: W, limit: u64) -> Self {
        Capped {
            inner,
            limit,
            written: 0,
            over: false,
        }
    }
}

impl<W: AsyncWrite + Unpin> AsyncWrite for Capped<W> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if self.written.saturating_add(buf.len() as u64) > self.limit {
            self.over = true;
            return Poll::Ready(Err(std::io::Error::other(
                "the registry sent more than the blob's declared size",
            )));
        }
        let this = &mut *self;
        let n = std::task::ready!(Pin::new(&mut this.inner).poll_write(cx, buf))?;
        this.written += n as u64;
        Poll::Ready(Ok(n))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Charges an unpack to the cache: the image's own cap first, then the cache's and the
/// tenant's, reserved a step at a time as the root grows (evicting what must go).
struct UnpackQuota {
    shared: Arc<Shared>,
    tenant: String,
    /// What the image's cap leaves for its root.
    left: u64,
    image_cap: u64,
    /// Reserved and not yet used.
    granted: u64,
    /// Reserved in all (given back once the image is recorded).
    reserved: Reserved,
}

impl unpack::Quota for UnpackQuota {
    fn take(&mut self, bytes: u64) -> Result<(), String> {
        if bytes > self.left {
            return Err(format!(
                "the image is larger than the node's cap on one image ({} bytes, layers and \
                 unpacked root together)",
                self.image_cap
            ));
        }
        self.left -= bytes;
        if self.granted < bytes {
            let ask = (bytes - self.granted) + RESERVE_STEP.min(self.left);
            let more = self
                .shared
                .reserve(&self.tenant, ask, ask)
                .map_err(|e| e.to_string())?;
            self.reserved.absorb(more);
            self.granted += ask;
        }
        self.granted -= bytes;
        Ok(())
    }
}

impl ImageStore {
    /// The cache in `dir` (made 0700 throughout: containers reach images only through
    /// their own overlays), its records read back, what no record names removed, and held
    /// to `caps`. Blocks.
    pub fn new(dir: PathBuf, registries: RegistryConfig, caps: Caps) -> std::io::Result<Self> {
        for d in ["", "blobs", "blobs/sha256", "manifests", "rootfs"] {
            private_dir(&dir.join(d))?;
        }
        let mut records = BTreeMap::new();
        for e in std::fs::read_dir(dir.join("manifests"))?.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let digest = name
                .strip_suffix(".json")
                .map(|h| format!("sha256:{h}"))
                .filter(|d| hex_of(d).is_some());
            let record = digest.as_ref().and_then(|_| {
                serde_json::from_slice::<Record>(&std::fs::read(e.path()).ok()?).ok()
            });
            let unpacked = |d: &str| hex_of(d).is_some_and(|h| dir.join("rootfs").join(h).is_dir());
            match (digest, record) {
                (Some(d), Some(r)) if unpacked(&d) => {
                    records.insert(d, r);
                }
                _ => {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
        // Unpacks and downloads an earlier run left unfinished, and what no record holds.
        for e in std::fs::read_dir(dir.join("rootfs"))?.flatten() {
            let d = format!("sha256:{}", e.file_name().to_string_lossy());
            if !records.contains_key(&d) {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
        for e in std::fs::read_dir(dir.join("blobs/sha256"))?.flatten() {
            let d = format!("sha256:{}", e.file_name().to_string_lossy());
            if !records
                .values()
                .any(|r: &Record| r.layers.iter().any(|(l, _)| *l == d))
            {
                let _ = std::fs::remove_file(e.path());
            }
        }
        let shared = Arc::new(Shared {
            dir,
            index: Mutex::new(Index::new(caps, records)),
        });
        let changes = shared.index().shrink();
        shared.apply(changes);
        Ok(ImageStore {
            shared,
            registries,
            pulling: tokio::sync::Mutex::default(),
            clients: Mutex::default(),
        })
    }

    /// The client for these credentials (made once: building one reads the system's trust
    /// roots, which is slow, so that happens off the async workers).
    async fn client_for(
        &self,
        credentials: Option<&PullCredentials>,
    ) -> Result<Client, ImageError> {
        let key = match credentials {
            None => "anonymous".to_owned(),
            Some(c) => format!(
                "{}:{}",
                c.username,
                hex::encode(Sha256::digest(c.password.as_bytes()))
            ),
        };
        if let Some(c) = self
            .clients
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
        {
            return Ok(c.clone());
        }
        let registries = self.registries.clone();
        let client = blocking(move || Self::client(&registries)).await??;
        self.clients
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, client.clone());
        Ok(client)
    }

    fn client(registries: &RegistryConfig) -> Result<Client, ImageError> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut config = ClientConfig {
            protocol: if registries.insecure.is_empty() {
                ClientProtocol::Https
            } else {
                ClientProtocol::HttpsExcept(registries.insecure.clone())
            },
            platform_resolver: Some(Box::new(oci_client::client::current_platform_resolver)),
            ..Default::default()
        };
        if let Some(pem) = &registries.ca_pem {
            config
                .extra_root_certificates
                .push(oci_client::client::Certificate {
                    encoding: oci_client::client::CertificateEncoding::Pem,
                    data: pem.as_bytes().to_vec(),
                });
        }
        Ok(Client::new(config))
    }

    /// Pulls `reference` for `tenant` (or finds it in the cache, if the tenant may use it
    /// there) and unpacks it, with `credentials` when the registry needs them.
    pub async fn pull(
        &self,
        reference: &str,
        credentials: Option<&PullCredentials>,
        tenant: &str,
    ) -> Result<Image, ImageError> {
        let parsed: Reference = reference.parse().map_err(|e: oci_client::ParseError| {
            ImageError::Reference(reference.to_owned(), e.to_string())
        })?;
        let shown = parsed.whole();
        let auth = match credentials {
            Some(c) => RegistryAuth::Basic(c.username.clone(), c.password.clone()),
            None => RegistryAuth::Anonymous,
        };
        let client = self.client_for(credentials).await?;
        // The manifest, always from the registry (with these credentials).
        let (manifest, digest) = self.manifest(&client, &parsed, &auth, &shown).await?;
        let caps = self.shared.index().caps;
        check_manifest(&manifest, &shown, &caps)?;
        hex_of(&digest).ok_or_else(|| not_sha256(&shown, &digest))?;
        let pinned = Reference::with_digest(
            parsed.registry().to_owned(),
            parsed.repository().to_owned(),
            digest.clone(),
        );
        let lock = {
            let mut pulling = self.pulling.lock().await;
            pulling.entry(digest.clone()).or_default().clone()
        };
        let _one = lock.lock().await;
        let blobs: Vec<String> = layers_of(&manifest).into_iter().map(|(d, _)| d).collect();
        let busy = Busy::new(&self.shared, &digest, blobs);
        let pull = Pull {
            store: self,
            client: &client,
            pinned: &pinned,
            manifest: &manifest,
            digest: &digest,
            shown: &shown,
            tenant,
        };
        // Held before it stops being busy: nothing evicts it in between.
        let held = pull.run().await.map(|config| {
            self.shared.index().hold(&digest);
            let hold = Hold {
                digest: digest.clone(),
                shared: self.shared.clone(),
            };
            (config, hold)
        });
        drop(busy);
        drop(_one);
        drop(lock);
        // An image's lock goes once no pull of it holds or waits on it.
        self.pulling
            .lock()
            .await
            .retain(|_, l| Arc::strong_count(l) > 1);
        let (config, hold) = held?;
        let rootfs = self
            .shared
            .rootfs_path(&digest)
            .ok_or_else(|| not_sha256(&shown, &digest))?;
        Ok(Image {
            pinned: pinned.whole(),
            rootfs,
            config,
            _hold: hold,
            digest,
        })
    }

    /// The image manifest for this platform and its digest (of the bytes the registry
    /// sent, checked against the digest the reference names, if it names one).
    async fn manifest(
        &self,
        client: &Client,
        reference: &Reference,
        auth: &RegistryAuth,
        shown: &str,
    ) -> Result<(OciImageManifest, String), ImageError> {
        let mut reference = reference.clone();
        for _ in 0..2 {
            let (bytes, _) = client
                .pull_manifest_raw(&reference, auth, MANIFEST_TYPES)
                .await
                .map_err(|e| registry_error(shown, e))?;
            let digest = sha256(&bytes);
            if let Some(expected) = reference.digest()
                && expected != digest
            {
                return Err(ImageError::ManifestDigest {
                    image: shown.to_owned(),
                    expected: expected.to_owned(),
                });
            }
            match read_manifest(&bytes, shown)? {
                Manifest::Index(entry) => {
                    reference = Reference::with_digest(
                        reference.registry().to_owned(),
                        reference.repository().to_owned(),
                        entry,
                    );
                    continue;
                }
                Manifest::Image(manifest) => return Ok((*manifest, digest)),
            }
        }
        Err(ImageError::Unsupported {
            image: shown.to_owned(),
            message: "an index inside an index".into(),
        })
    }
}

/// A digest the cache has no place for: only sha256 is content-addressed here.
fn not_sha256(image: &str, digest: &str) -> ImageError {
    ImageError::Unsupported {
        image: image.to_owned(),
        message: format!("digest {digest} is not sha256"),
    }
}

fn platform_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// Digests a registry (or an index it serves) could name: well-formed, wrong length,
    /// other algorithms, paths and query strings.
    fn hostile_digest() -> impl Strategy<Value = String> {
        prop_oneof![
            "[0-9a-f]{64}".prop_map(|h| format!("sha256:{h}")),
            "[0-9a-fA-F]{60,68}".prop_map(|h| format!("sha256:{h}")),
            "sha(256|512):[./a-z0-9?%#-]{0,70}",
            "\\PC{0,80}",
        ]
    }

    #[test]
    fn the_cache_reads_its_records_back_and_drops_what_none_names() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().expect("dir");
        let dir = d.path().join("images");
        let hex = |c: char| c.to_string().repeat(64);
        let (kept, lost, layer, orphan) = (hex('a'), hex('b'), hex('c'), hex('d'));
        for sub in ["blobs/sha256", "manifests", "rootfs"] {
            std::fs::create_dir_all(dir.join(sub)).expect("mkdir");
        }
        // An older run's layout: 0711, a record from before tenants were kept, one whose
        // root is gone, an orphan blob, a part download and an unfinished unpack.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o711)).expect("chmod");
        let old = serde_json::json!({
            "layers": [[format!("sha256:{layer}"), 3]],
            "config": {"env": [], "entrypoint": [], "cmd": [], "working_dir": null, "user": null},
            "unpacked_bytes": 5,
        });
        for h in [&kept, &lost] {
            std::fs::write(dir.join(format!("manifests/{h}.json")), old.to_string())
                .expect("record");
        }
        std::fs::create_dir(dir.join("rootfs").join(&kept)).expect("root");
        std::fs::create_dir(dir.join(format!("rootfs/.{kept}.x"))).expect("tmp");
        for b in [&layer, &orphan, &format!("{layer}.part-1")] {
            std::fs::write(dir.join("blobs/sha256").join(b), b"abc").expect("blob");
        }
        let caps = Caps {
            cache: 1 << 30,
            image: 1 << 30,
            tenant: 1 << 30,
        };
        let store = ImageStore::new(dir.clone(), RegistryConfig::default(), caps).expect("open");
        let left = |sub: &str| -> Vec<String> {
            let mut v: Vec<String> = std::fs::read_dir(dir.join(sub))
                .expect("read")
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            v.sort();
            v
        };
        assert_eq!(left("manifests"), [format!("{kept}.json")]);
        assert_eq!(left("rootfs"), std::slice::from_ref(&kept));
        assert_eq!(left("blobs/sha256"), std::slice::from_ref(&layer));
        for sub in ["", "blobs", "blobs/sha256", "manifests", "rootfs"] {
            let mode = std::fs::metadata(dir.join(sub))
                .expect("dir")
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o700, "{sub}");
        }
        // Read back, and no tenant's until a registry serves it again.
        let ix = store.shared.index();
        let digest = format!("sha256:{kept}");
        assert_eq!(ix.record(&digest).map(|r| r.unpacked_bytes), Some(5));
        assert!(!ix.may_use("team-a", &digest));
        assert_eq!(ix.usage(), 3 + 5);
    }

    proptest! {
        /// Only `sha256:` with 64 hex digits names a blob: nothing else becomes a path
        /// (a layer or manifest digest names a file in the cache).
        #[test]
        fn only_a_sha256_digest_names_a_cache_file(d in hostile_digest()) {
            if let Some(hex) = hex_of(&d) {
                prop_assert_eq!(hex.len(), 64);
                prop_assert!(hex.bytes().all(|b| b.is_ascii_hexdigit()));
                prop_assert_eq!(&d, &format!("sha256:{hex}"));
            }
        }

        /// Whatever a registry sends as a manifest is read without panicking; an index
        /// leads on only by a well-formed digest, and an image manifest's layers and
        /// config reach the cache only through `hex_of`.
        #[test]
        fn manifest_bytes_from_a_registry_are_read_safely(
            raw in proptest::collection::vec(any::<u8>(), 0..512),
            digests in proptest::collection::vec(hostile_digest(), 1..4),
            arch_matches in any::<bool>(),
        ) {
            let _ = read_manifest(&raw, "test");
            let arch = if arch_matches { platform_arch() } else { "s390x-nope" };
            let index = serde_json::json!({
                "schemaVersion": 2,
                "mediaType": "application/vnd.oci.image.index.v1+json",
                "manifests": digests.iter().map(|d| serde_json::json!({
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "digest": d, "size": 1,
                    "platform": { "os": "linux", "architecture": arch },
                })).collect::<Vec<_>>(),
            });
            match read_manifest(index.to_string().as_bytes(), "test") {
                Ok(Manifest::Index(next)) => {
                    prop_assert!(arch_matches);
                    prop_assert_eq!(&next, &digests[0]);
                    prop_assert!(hex_of(&next).is_some());
                }
                Ok(Manifest::Image(_)) => prop_assert!(false, "an index read as an image"),
                Err(_) => prop_assert!(!arch_matches || hex_of(&digests[0]).is_none()),
            }
            let image = serde_json::json!({
                "schemaVersion": 2,
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": { "mediaType": "application/vnd.oci.image.config.v1+json", "digest": digests[0], "size": 2 },
                "layers": digests.iter().map(|d| serde_json::json!({
                    "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": d, "size": 3,
                })).collect::<Vec<_>>(),
            });
            // Read verbatim: the cache's `hex_of` is what refuses a malformed one (as
            // `not_sha256`) before it becomes a path.
            match read_manifest(image.to_string().as_bytes(), "test") {
                Ok(Manifest::Image(m)) => {
                    let read: Vec<&str> = m.layers.iter().map(|l| l.digest.as_str()).collect();
                    prop_assert_eq!(read, digests.iter().map(String::as_str).collect::<Vec<_>>());
                }
                other => prop_assert!(false, "an image manifest read as {other:?}"),
            }
        }

        /// An image configuration is read leniently: any bytes give a configuration.
        #[test]
        fn any_image_configuration_bytes_are_read(raw in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = parse_config(&raw);
        }
    }
}
