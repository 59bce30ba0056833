//! Container images: pulled from OCI distribution registries, checked blob by blob against
//! their digests, kept in a content-addressed cache under `<data dir>/images/`, and unpacked
//! into a read-only root file system per image.
//!
//! - `blobs/sha256/<hex>`: layers, each written only after its digest checked out.
//! - `manifests/<hex>.json`: what the agent knows of an image by its manifest digest (its
//!   layers and configuration), so a by-digest image already here needs no blob fetch.
//! - `rootfs/<hex>/`: the unpacked root file system (see [`unpack`]).
//!
//! A tag is resolved to a manifest digest at an attempt's first pull; the agent reports the
//! digest with the job's start, the control plane keeps it, and every later attempt on any
//! node names the image by that digest. The cache is held under a size cap: images not in use
//! are evicted least recently used first, with the layers no other cached image needs.
//!
//! Every pull, even one the cache serves, asks the registry for the manifest with the job's
//! own credentials first, so one tenant's cached private image is never another's without
//! the registry's say-so.

pub mod local;
pub mod unpack;

use std::collections::HashMap;
use std::io::Read;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::manifest::{OciDescriptor, OciImageManifest};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::runtime::PullCredentials;

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

/// What the cache keeps of one image.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Cached {
    /// sha256:… of each layer, in order, with its size.
    layers: Vec<(String, u64)>,
    config: ImageConfig,
    /// Bytes of the unpacked root file system's files.
    unpacked_bytes: u64,
}

/// An image ready to run: held in the cache (not evicted) while this lives.
#[derive(Debug)]
pub struct Image {
    /// `sha256:…` of its manifest.
    pub digest: String,
    /// The reference pinned to that digest (`REGISTRY/REPOSITORY@sha256:…`).
    pub pinned: String,
    pub rootfs: PathBuf,
    pub config: ImageConfig,
    _hold: Hold,
}

#[derive(Debug)]
struct Hold {
    digest: String,
    in_use: Arc<Mutex<HashMap<String, usize>>>,
}

impl Drop for Hold {
    fn drop(&mut self) {
        let mut in_use = self.in_use.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = in_use.get_mut(&self.digest) {
            *n -= 1;
            if *n == 0 {
                in_use.remove(&self.digest);
            }
        }
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

pub struct ImageStore {
    dir: PathBuf,
    registries: RegistryConfig,
    cap_bytes: u64,
    in_use: Arc<Mutex<HashMap<String, usize>>>,
    /// One pull of an image at a time (by reference).
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

fn mkdir(path: &Path, mode: u32) -> std::io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(path)
}

impl ImageStore {
    /// A cache in `dir` (created: 0711, so a container's user namespace can reach the root
    /// file systems in it, while nothing in it can be listed).
    pub fn new(dir: PathBuf, registries: RegistryConfig, cap_bytes: u64) -> std::io::Result<Self> {
        mkdir(&dir, 0o711)?;
        mkdir(&dir.join("blobs/sha256"), 0o700)?;
        mkdir(&dir.join("manifests"), 0o700)?;
        mkdir(&dir.join("rootfs"), 0o711)?;
        Ok(ImageStore {
            dir,
            registries,
            cap_bytes,
            in_use: Arc::default(),
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
        let client = tokio::task::spawn_blocking(move || Self::client(&registries))
            .await
            .map_err(|e| ImageError::Io(std::io::Error::other(e.to_string())))??;
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

    /// Pulls `reference` (or finds it in the cache) and unpacks it, with `credentials`
    /// when the registry needs them.
    pub async fn pull(
        &self,
        reference: &str,
        credentials: Option<&PullCredentials>,
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
        let lock = {
            let mut pulling = self.pulling.lock().await;
            pulling.entry(shown.clone()).or_default().clone()
        };
        let _one = lock.lock().await;
        // The manifest, always from the registry (with these credentials).
        let (manifest, digest) = self.manifest(&client, &parsed, &auth, &shown).await?;
        let pinned = Reference::with_digest(
            parsed.registry().to_owned(),
            parsed.repository().to_owned(),
            digest.clone(),
        );
        let manifest_path = self
            .manifest_path(&digest)
            .ok_or_else(|| not_sha256(&shown, &digest))?;
        let rootfs = self
            .rootfs_path(&digest)
            .ok_or_else(|| not_sha256(&shown, &digest))?;
        let cached = std::fs::read(&manifest_path)
            .ok()
            .and_then(|b| serde_json::from_slice::<Cached>(&b).ok())
            .filter(|_| rootfs.is_dir());
        let cached = match cached {
            Some(c) => c,
            None => {
                self.fetch(&client, &pinned, &manifest, &digest, &shown, &rootfs)
                    .await?
            }
        };
        // Used now: the newest for eviction.
        let _ = std::fs::File::options()
            .append(true)
            .open(&manifest_path)
            .and_then(|f| f.set_modified(std::time::SystemTime::now()));
        let hold = {
            let mut in_use = self.in_use.lock().unwrap_or_else(|e| e.into_inner());
            *in_use.entry(digest.clone()).or_default() += 1;
            Hold {
                digest: digest.clone(),
                in_use: self.in_use.clone(),
            }
        };
        self.evict();
        Ok(Image {
            pinned: pinned.whole(),
            digest,
            rootfs,
            config: cached.config,
            _hold: hold,
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

    /// Fetches what the cache lacks of an image (each blob checked against its digest) and
    /// unpacks it into `rootfs`.
    async fn fetch(
        &self,
        client: &Client,
        pinned: &Reference,
        manifest: &OciImageManifest,
        digest: &str,
        shown: &str,
        rootfs: &Path,
    ) -> Result<Cached, ImageError> {
        let mut config_bytes = Vec::new();
        client
            .pull_blob(pinned, &manifest.config, &mut config_bytes)
            .await
            .map_err(|e| blob_error(shown, &manifest.config.digest, e))?;
        let config = parse_config(&config_bytes);
        for layer in &manifest.layers {
            self.fetch_blob(client, pinned, layer, shown).await?;
        }
        // Unpack into a fresh directory, then move it into place.
        let tmp = self.dir.join("rootfs").join(format!(
            ".{}.{}",
            hex_of(digest).unwrap_or("x"),
            uuid::Uuid::new_v4().simple()
        ));
        mkdir(&tmp, 0o755)?;
        let mut unpacked = 0;
        for layer in &manifest.layers {
            let path = self
                .blob_path(&layer.digest)
                .ok_or_else(|| not_sha256(shown, &layer.digest))?;
            let media = layer.media_type.clone();
            let root = tmp.clone();
            let layer_digest = layer.digest.clone();
            let image = shown.to_owned();
            unpacked += tokio::task::spawn_blocking(move || -> Result<u64, ImageError> {
                let file = std::fs::File::open(&path)?;
                let reader: Box<dyn Read> = if media.ends_with("gzip") {
                    Box::new(flate2::read::GzDecoder::new(std::io::BufReader::new(file)))
                } else if media.ends_with(".tar") || media.ends_with("tar") {
                    Box::new(std::io::BufReader::new(file))
                } else {
                    return Err(ImageError::Unsupported {
                        image,
                        message: format!(
                            "layer {layer_digest} has media type {media}, not a tar or gzip tar"
                        ),
                    });
                };
                unpack::apply_layer(&root, reader).map_err(|source| ImageError::Unpack {
                    image,
                    layer: layer_digest,
                    source,
                })
            })
            .await
            .map_err(|e| ImageError::Io(std::io::Error::other(e.to_string())))
            .and_then(|r| r)
            .inspect_err(|_| {
                let _ = std::fs::remove_dir_all(&tmp);
            })?;
        }
        let _ = std::fs::remove_dir_all(rootfs);
        std::fs::rename(&tmp, rootfs)?;
        let cached = Cached {
            layers: manifest
                .layers
                .iter()
                .map(|l| (l.digest.clone(), u64::try_from(l.size).unwrap_or(0)))
                .collect(),
            config,
            unpacked_bytes: unpacked,
        };
        if let Some(path) = self.manifest_path(digest) {
            let json = serde_json::to_vec(&cached).map_err(std::io::Error::other)?;
            std::fs::write(path, json)?;
        }
        Ok(cached)
    }

    async fn fetch_blob(
        &self,
        client: &Client,
        pinned: &Reference,
        layer: &OciDescriptor,
        shown: &str,
    ) -> Result<(), ImageError> {
        let path = self
            .blob_path(&layer.digest)
            .ok_or_else(|| not_sha256(shown, &layer.digest))?;
        if path.is_file() {
            let _ = std::fs::File::options()
                .append(true)
                .open(&path)
                .and_then(|f| f.set_modified(std::time::SystemTime::now()));
            return Ok(());
        }
        let tmp = path.with_extension(format!("part-{}", uuid::Uuid::new_v4().simple()));
        let file = tokio::fs::File::create(&tmp).await?;
        let pulled = client.pull_blob(pinned, layer, file).await;
        if let Err(e) = pulled {
            let _ = std::fs::remove_file(&tmp);
            return Err(blob_error(shown, &layer.digest, e));
        }
        std::fs::rename(&tmp, &path)?;
        Ok(())
    }

    /// Bytes the cache holds (blobs, and unpacked images as their manifests record them).
    fn usage(&self) -> (u64, Vec<(std::time::SystemTime, String, Cached)>) {
        let mut blobs = 0;
        if let Ok(entries) = std::fs::read_dir(self.dir.join("blobs/sha256")) {
            for e in entries.flatten() {
                blobs += e.metadata().map(|m| m.len()).unwrap_or(0);
            }
        }
        let mut images = Vec::new();
        if let Ok(entries) = std::fs::read_dir(self.dir.join("manifests")) {
            for e in entries.flatten() {
                let Some(hex) = e
                    .file_name()
                    .to_str()
                    .and_then(|n| n.strip_suffix(".json"))
                    .map(str::to_owned)
                else {
                    continue;
                };
                let Ok(cached) = std::fs::read(e.path())
                    .map_err(|_| ())
                    .and_then(|b| serde_json::from_slice::<Cached>(&b).map_err(|_| ()))
                else {
                    continue;
                };
                let used = e
                    .metadata()
                    .and_then(|m| m.modified())
                    .unwrap_or(std::time::UNIX_EPOCH);
                images.push((used, format!("sha256:{hex}"), cached));
            }
        }
        let unpacked: u64 = images.iter().map(|(_, _, c)| c.unpacked_bytes).sum();
        (blobs + unpacked, images)
    }

    /// Evicts images not in use, least recently used first, until the cache is under its
    /// cap; with each goes every layer no remaining image needs.
    pub fn evict(&self) {
        let (mut total, mut images) = self.usage();
        if total <= self.cap_bytes {
            return;
        }
        images.sort_by_key(|a| a.0);
        let in_use = self
            .in_use
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let mut kept: Vec<(String, Cached)> = images
            .iter()
            .map(|(_, d, c)| (d.clone(), c.clone()))
            .collect();
        for (_, digest, cached) in images {
            if total <= self.cap_bytes {
                break;
            }
            if in_use.contains_key(&digest) {
                continue;
            }
            kept.retain(|(d, _)| *d != digest);
            if let Some(root) = self.rootfs_path(&digest) {
                let _ = std::fs::remove_dir_all(root);
            }
            if let Some(m) = self.manifest_path(&digest) {
                let _ = std::fs::remove_file(m);
            }
            total = total.saturating_sub(cached.unpacked_bytes);
            for (layer, size) in &cached.layers {
                let needed = kept
                    .iter()
                    .any(|(_, c)| c.layers.iter().any(|(l, _)| l == layer));
                if !needed
                    && let Some(p) = self.blob_path(layer)
                    && std::fs::remove_file(p).is_ok()
                {
                    total = total.saturating_sub(*size);
                }
            }
            tracing::info!(image = %digest, "evicted from the image cache");
        }
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

/// What a registry's manifest bytes are.
#[derive(Debug)]
enum Manifest {
    /// An image manifest.
    Image(Box<OciImageManifest>),
    /// An index: the digest of its entry for this platform, to fetch next.
    Index(String),
}

/// Reads manifest bytes a registry sent (untrusted): an image manifest, or an index's entry
/// for this platform, whose digest must be a well-formed SHA-256 digest (it goes into the
/// next request's path).
fn read_manifest(bytes: &[u8], shown: &str) -> Result<Manifest, ImageError> {
    let unsupported = |message: String| ImageError::Unsupported {
        image: shown.to_owned(),
        message,
    };
    let value: serde_json::Value = serde_json::from_slice(bytes)
        .map_err(|e| unsupported(format!("its manifest is not JSON: {e}")))?;
    if let Some(list) = value.get("manifests").and_then(|m| m.as_array()) {
        let (os, arch) = ("linux", platform_arch());
        let entry = list
            .iter()
            .find(|m| m["platform"]["os"] == os && m["platform"]["architecture"] == arch)
            .and_then(|m| m["digest"].as_str())
            .ok_or_else(|| unsupported(format!("no {os}/{arch} image in its index")))?;
        if hex_of(entry).is_none() {
            return Err(unsupported(format!(
                "its index names the {os}/{arch} image by `{entry}`, not a sha256 digest"
            )));
        }
        return Ok(Manifest::Index(entry.to_owned()));
    }
    let manifest: OciImageManifest = serde_json::from_value(value)
        .map_err(|e| unsupported(format!("its manifest does not parse: {e}")))?;
    Ok(Manifest::Image(Box::new(manifest)))
}

/// The image configuration's `config` object, leniently (missing fields are empty).
fn parse_config(bytes: &[u8]) -> ImageConfig {
    let v: serde_json::Value = serde_json::from_slice(bytes).unwrap_or_default();
    let c = &v["config"];
    let strings = |k: &str| -> Vec<String> {
        c[k].as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    let text = |k: &str| c[k].as_str().filter(|s| !s.is_empty()).map(str::to_owned);
    ImageConfig {
        env: strings("Env"),
        entrypoint: strings("Entrypoint"),
        cmd: strings("Cmd"),
        working_dir: text("WorkingDir"),
        user: text("User"),
    }
}

fn registry_error(image: &str, e: oci_client::errors::OciDistributionError) -> ImageError {
    use oci_client::errors::{OciDistributionError as E, OciErrorCode};
    let image = image.to_owned();
    match &e {
        E::ImageManifestNotFoundError(_) => ImageError::NotFound { image },
        E::UnauthorizedError { .. } | E::AuthenticationFailure(_) => {
            ImageError::Unauthorized { image }
        }
        E::RegistryError { envelope, .. }
            if envelope.errors.iter().any(|x| {
                matches!(
                    x.code,
                    OciErrorCode::ManifestUnknown
                        | OciErrorCode::NameUnknown
                        | OciErrorCode::NotFound
                )
            }) =>
        {
            ImageError::NotFound { image }
        }
        E::RegistryError { envelope, .. }
            if envelope
                .errors
                .iter()
                .any(|x| matches!(x.code, OciErrorCode::Unauthorized | OciErrorCode::Denied)) =>
        {
            ImageError::Unauthorized { image }
        }
        E::ServerError { code: 404, .. } => ImageError::NotFound { image },
        E::ServerError {
            code: 401 | 403, ..
        } => ImageError::Unauthorized { image },
        _ => ImageError::Registry {
            image,
            message: e.to_string(),
        },
    }
}

fn blob_error(image: &str, layer: &str, e: oci_client::errors::OciDistributionError) -> ImageError {
    use oci_client::errors::OciDistributionError as E;
    match e {
        // "Invalid digest. Expected …, got …"
        E::DigestError(d) => ImageError::LayerDigest {
            image: image.to_owned(),
            layer: layer.to_owned(),
            actual: d
                .to_string()
                .rsplit_once("got ")
                .map_or_else(|| d.to_string(), |(_, a)| a.to_owned()),
        },
        other => match registry_error(image, other) {
            ImageError::Registry { image, message } => ImageError::Registry {
                image,
                message: format!("layer {layer}: {message}"),
            },
            e => e,
        },
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
