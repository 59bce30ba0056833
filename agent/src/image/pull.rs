//! One pull of one image: its manifest read and checked against the caps, its layers
//! fetched into the cache under their declared sizes, and unpacked into a root.

use super::*;

/// A blob's declared size, as a manifest states it (untrusted).
pub(super) fn declared(d: &OciDescriptor) -> Option<u64> {
    u64::try_from(d.size).ok()
}

/// Checks what a manifest declares before anything of it is fetched: sha256 digests,
/// sizes that fit the caps, layers of a kind the node unpacks.
pub(super) fn check_manifest(
    m: &OciImageManifest,
    shown: &str,
    caps: &Caps,
) -> Result<(), ImageError> {
    let unsupported = |message: String| ImageError::Unsupported {
        image: shown.to_owned(),
        message,
    };
    if hex_of(&m.config.digest).is_none() {
        return Err(not_sha256(shown, &m.config.digest));
    }
    match declared(&m.config) {
        Some(n) if n <= MAX_CONFIG_BYTES => {}
        _ => {
            return Err(unsupported(format!(
                "its configuration declares {} bytes (at most {MAX_CONFIG_BYTES} are read)",
                m.config.size
            )));
        }
    }
    let mut total = 0u64;
    for l in &m.layers {
        if hex_of(&l.digest).is_none() {
            return Err(not_sha256(shown, &l.digest));
        }
        let size = declared(l)
            .ok_or_else(|| unsupported(format!("layer {} declares a negative size", l.digest)))?;
        total = total.saturating_add(size);
        if layer_reader(&l.media_type).is_none() {
            return Err(unsupported(format!(
                "layer {} has media type {}, not a tar or gzip tar",
                l.digest, l.media_type
            )));
        }
    }
    if total > caps.image {
        return Err(unsupported(format!(
            "its layers declare {total} bytes, more than the node's cap on one image ({} \
             bytes, layers and unpacked root together)",
            caps.image
        )));
    }
    Ok(())
}

/// How a layer of this media type is read: gzip-compressed or plain tar.
pub(super) fn layer_reader(media: &str) -> Option<bool> {
    if media.ends_with("gzip") {
        Some(true)
    } else if media.ends_with("tar") {
        Some(false)
    } else {
        None
    }
}

/// The distinct layer digests of a manifest, in order, with their declared sizes.
pub(super) fn layers_of(m: &OciImageManifest) -> Vec<(String, u64)> {
    let mut out: Vec<(String, u64)> = Vec::new();
    for l in &m.layers {
        if !out.iter().any(|(d, _)| *d == l.digest) {
            out.push((l.digest.clone(), declared(l).unwrap_or(0)));
        }
    }
    out
}

/// One pull of one image for one tenant, under the image's lock.
pub(super) struct Pull<'a> {
    pub(super) store: &'a ImageStore,
    pub(super) client: &'a Client,
    pub(super) pinned: &'a Reference,
    pub(super) manifest: &'a OciImageManifest,
    pub(super) digest: &'a str,
    pub(super) shown: &'a str,
    pub(super) tenant: &'a str,
}

impl Pull<'_> {
    pub(super) fn shared(&self) -> &Arc<Shared> {
        &self.store.shared
    }

    /// The image's configuration once the tenant may use the image: from the cache if it
    /// already may, after its registry served what it lacks if the image is cached, or
    /// fetched and unpacked whole.
    pub(super) async fn run(&self) -> Result<ImageConfig, ImageError> {
        let (cached, may_use, cost) = {
            let ix = self.shared().index();
            (
                ix.record(self.digest).cloned(),
                ix.may_use(self.tenant, self.digest),
                ix.claim_cost(self.tenant, self.digest),
            )
        };
        let Some(record) = cached else {
            return self.fetch().await;
        };
        if may_use {
            self.shared().index().touch(self.digest, self.tenant);
            let (shared, digest) = (self.shared().clone(), self.digest.to_owned());
            blocking(move || shared.save(&digest)).await??;
            return Ok(record.config);
        }
        // Cached, but not yet served to this tenant: its registry serves every blob it
        // lacks (each checked and dropped, the cache has it) before it may use the image.
        let _reserved = self.reserve(0, cost).await?;
        self.prove().await?;
        let mut record = record;
        record.config_digest = self.manifest.config.digest.clone();
        self.shared()
            .index()
            .insert(self.digest, record.clone(), self.tenant);
        let (shared, digest) = (self.shared().clone(), self.digest.to_owned());
        blocking(move || shared.save(&digest)).await??;
        Ok(record.config)
    }

    pub(super) async fn reserve(
        &self,
        global: u64,
        tenant_bytes: u64,
    ) -> Result<Reserved, ImageError> {
        let (shared, tenant) = (self.shared().clone(), self.tenant.to_owned());
        blocking(move || shared.reserve(&tenant, global, tenant_bytes))
            .await?
            .map_err(|source| ImageError::Full {
                image: self.shown.to_owned(),
                source,
            })
    }

    /// The tenant's registry serves each blob of a cached image the tenant was not yet
    /// served (each checked against its digest and size, and dropped).
    pub(super) async fn prove(&self) -> Result<(), ImageError> {
        let served = |d: &str| self.shared().index().served(self.tenant, d);
        if !served(&self.manifest.config.digest) {
            self.config_bytes().await?;
        }
        for layer in &self.manifest.layers {
            if !served(&layer.digest) {
                self.stream(layer, tokio::io::sink()).await?;
            }
        }
        Ok(())
    }

    /// Streams blob `desc` from the tenant's registry into `out`, held to its declared size
    /// and checked against its digest.
    pub(super) async fn stream<W: AsyncWrite + Unpin>(
        &self,
        desc: &OciDescriptor,
        out: W,
    ) -> Result<W, ImageError> {
        let size = declared(desc).unwrap_or(0);
        let mut capped = Capped::new(out, size);
        let result = self.client.pull_blob(self.pinned, desc, &mut capped).await;
        if capped.over {
            return Err(ImageError::BlobTooLarge {
                image: self.shown.to_owned(),
                blob: desc.digest.clone(),
                declared: size,
            });
        }
        result.map_err(|e| blob_error(self.shown, &desc.digest, e))?;
        if capped.written != size {
            return Err(ImageError::BlobSize {
                image: self.shown.to_owned(),
                blob: desc.digest.clone(),
                declared: size,
                sent: capped.written,
            });
        }
        Ok(capped.inner)
    }

    /// The image's configuration blob, from the tenant's registry.
    pub(super) async fn config_bytes(&self) -> Result<Vec<u8>, ImageError> {
        self.stream(&self.manifest.config, Vec::new()).await
    }

    /// Fetches what the cache lacks of the image (each blob checked against its digest and
    /// size; those on disk but not yet served to the tenant streamed again and dropped),
    /// unpacks it under the caps and records it as the tenant's.
    pub(super) async fn fetch(&self) -> Result<ImageConfig, ImageError> {
        let config = parse_config(&self.config_bytes().await?);
        let layers = layers_of(self.manifest);
        let (on_disk, served): (Vec<bool>, Vec<bool>) = {
            let ix = self.shared().index();
            layers
                .iter()
                .map(|(d, _)| {
                    let on_disk = self.shared().blob_path(d).is_some_and(|p| p.is_file());
                    (on_disk, ix.served(self.tenant, d))
                })
                .unzip()
        };
        let global: u64 = layers
            .iter()
            .zip(&on_disk)
            .filter(|(_, on)| !**on)
            .map(|((_, s), _)| s)
            .sum();
        let tenant_bytes: u64 = layers
            .iter()
            .zip(&served)
            .filter(|(_, s)| !**s)
            .map(|((_, s), _)| s)
            .sum();
        let _reserved = self.reserve(global, tenant_bytes).await?;
        self.fetch_layers(&layers, &on_disk, &served, config).await
    }

    pub(super) async fn fetch_layers(
        &self,
        layers: &[(String, u64)],
        on_disk: &[bool],
        served: &[bool],
        config: ImageConfig,
    ) -> Result<ImageConfig, ImageError> {
        for (((digest, _), on), served) in layers.iter().zip(on_disk).zip(served) {
            let Some(desc) = self.manifest.layers.iter().find(|l| l.digest == *digest) else {
                continue;
            };
            match (on, served) {
                (true, true) => {}
                (true, false) => {
                    self.stream(desc, tokio::io::sink()).await?;
                }
                (false, _) => self.download(desc).await?,
            }
        }
        let layer_bytes: u64 = layers.iter().map(|(_, s)| s).sum();
        let caps = self.shared().index().caps;
        let quota = UnpackQuota {
            shared: self.shared().clone(),
            tenant: self.tenant.to_owned(),
            left: caps.image.saturating_sub(layer_bytes),
            image_cap: caps.image,
            granted: 0,
            reserved: Reserved {
                shared: self.shared().clone(),
                tenant: self.tenant.to_owned(),
                global: 0,
                tenant_bytes: 0,
            },
        };
        let rootfs = self
            .shared()
            .rootfs_path(self.digest)
            .ok_or_else(|| not_sha256(self.shown, self.digest))?;
        let tmp = self.shared().dir.join("rootfs").join(format!(
            ".{}.{}",
            hex_of(self.digest).unwrap_or("x"),
            uuid::Uuid::new_v4().simple()
        ));
        let plan: Vec<(PathBuf, bool, String)> = self
            .manifest
            .layers
            .iter()
            .filter_map(|l| {
                Some((
                    self.shared().blob_path(&l.digest)?,
                    layer_reader(&l.media_type)?,
                    l.digest.clone(),
                ))
            })
            .collect();
        let image = self.shown.to_owned();
        let (quota, unpacked) = blocking(move || {
            let mut quota = quota;
            let unpacked = unpack_into(&tmp, &rootfs, &plan, &image, &mut quota);
            if unpacked.is_err() {
                let _ = std::fs::remove_dir_all(&tmp);
            }
            (quota, unpacked)
        })
        .await?;
        let record = unpacked.map(|unpacked_bytes| Record {
            layers: layers.to_vec(),
            config_digest: self.manifest.config.digest.clone(),
            config: config.clone(),
            unpacked_bytes,
            tenants: BTreeMap::new(),
        });
        if let Ok(record) = &record {
            self.shared()
                .index()
                .insert(self.digest, record.clone(), self.tenant);
        }
        // The record counts what the unpack reserved from now on.
        drop(quota);
        record?;
        let (shared, digest) = (self.shared().clone(), self.digest.to_owned());
        blocking(move || shared.save(&digest)).await??;
        Ok(config)
    }

    /// Downloads layer `desc` into the cache (to a part file, moved into place once its
    /// digest and size checked out).
    pub(super) async fn download(&self, desc: &OciDescriptor) -> Result<(), ImageError> {
        let path = self
            .shared()
            .blob_path(&desc.digest)
            .ok_or_else(|| not_sha256(self.shown, &desc.digest))?;
        let tmp = path.with_extension(format!("part-{}", uuid::Uuid::new_v4().simple()));
        let file = tokio::fs::File::create(&tmp).await?;
        match self.stream(desc, file).await {
            Ok(mut file) => {
                tokio::io::AsyncWriteExt::flush(&mut file).await?;
                drop(file);
                tokio::fs::rename(&tmp, &path).await?;
                Ok(())
            }
            Err(e) => {
                let _ = tokio::fs::remove_file(&tmp).await;
                Err(e)
            }
        }
    }
}

/// Unpacks `layers` (blob path, gzip-compressed, digest) in order into `tmp`, then moves
/// it to `rootfs`. Returns the bytes charged. Blocks.
pub(super) fn unpack_into(
    tmp: &Path,
    rootfs: &Path,
    layers: &[(PathBuf, bool, String)],
    image: &str,
    quota: &mut dyn unpack::Quota,
) -> Result<u64, ImageError> {
    std::fs::DirBuilder::new().mode(0o755).create(tmp)?;
    let mut unpacked = 0u64;
    for (path, gzip, digest) in layers {
        let file = std::fs::File::open(path)?;
        let reader: Box<dyn Read> = if *gzip {
            Box::new(flate2::read::GzDecoder::new(std::io::BufReader::new(file)))
        } else {
            Box::new(std::io::BufReader::new(file))
        };
        unpacked +=
            unpack::apply_layer(tmp, reader, quota).map_err(|source| ImageError::Unpack {
                image: image.to_owned(),
                layer: digest.clone(),
                source,
            })?;
    }
    // No record names it (the pull holds the image's lock): whatever is there is left
    // from an earlier run.
    let _ = std::fs::remove_dir_all(rootfs);
    std::fs::rename(tmp, rootfs)?;
    Ok(unpacked)
}

/// What a registry's manifest bytes are.
#[derive(Debug)]
pub(super) enum Manifest {
    /// An image manifest.
    Image(Box<OciImageManifest>),
    /// An index: the digest of its entry for this platform, to fetch next.
    Index(String),
}

/// Reads manifest bytes a registry sent (untrusted): an image manifest, or an index's entry
/// for this platform, whose digest must be a well-formed SHA-256 digest (it goes into the
/// next request's path).
pub(super) fn read_manifest(bytes: &[u8], shown: &str) -> Result<Manifest, ImageError> {
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
pub(super) fn parse_config(bytes: &[u8]) -> ImageConfig {
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

pub(super) fn registry_error(
    image: &str,
    e: oci_client::errors::OciDistributionError,
) -> ImageError {
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
                        | OciErrorCode::BlobUnknown
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

pub(super) fn blob_error(
    image: &str,
    layer: &str,
    e: oci_client::errors::OciDistributionError,
) -> ImageError {
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
            // The manifest was there: what is missing is the blob it names.
            ImageError::NotFound { image } => ImageError::Registry {
                image,
                message: format!(
                    "its registry does not serve blob {layer}, which its manifest names"
                ),
            },
            e => e,
        },
    }
}
