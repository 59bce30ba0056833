//! A registry on loopback and images built from local files: what `allot bench launch` and
//! the container tests run, so that nothing is fetched from outside. The registry is
//! Debian's `docker-registry` (the CNCF distribution registry); images are pushed to it with
//! `oci-client`, like any client's.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use oci_client::client::{ClientConfig, ClientProtocol, Config, ImageLayer};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use sha2::{Digest, Sha256};

#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("the registry did not listen on {addr}: {log}")]
    NotListening { addr: String, log: String },
    #[error("registry: {0}")]
    Registry(String),
}

/// The static busybox images are made of (Debian's `busybox-static`).
pub const BUSYBOX: &str = "/bin/busybox";

/// Busybox applets the images link.
pub const APPLETS: &[&str] = &[
    "sh", "cat", "ls", "id", "sleep", "kill", "ps", "echo", "test", "seq", "mknod", "grep", "head",
    "wc", "touch", "rm", "ln", "mkdir", "dd", "setsid", "true", "false", "env", "find", "stat",
    "chmod", "sed", "tr", "printf", "nproc", "mkfifo",
];

/// A registry on loopback, its process ended when dropped (its storage is the caller's).
pub struct LocalRegistry {
    child: Child,
    pub addr: String,
    storage: PathBuf,
    log: PathBuf,
    /// What pushes authenticate with.
    auth: RegistryAuth,
}

impl LocalRegistry {
    /// Starts `docker-registry` on a free loopback port, storing blobs under `storage`.
    pub fn start(storage: &Path) -> Result<Self, LocalError> {
        Self::start_with(storage, None)
    }

    /// [`Self::start`], admitting only `user` with `password` (HTTP basic authentication
    /// against an htpasswd file made by Apache's `htpasswd`).
    pub fn start_private(storage: &Path, user: &str, password: &str) -> Result<Self, LocalError> {
        Self::start_with(storage, Some((user, password)))
    }

    fn start_with(storage: &Path, login: Option<(&str, &str)>) -> Result<Self, LocalError> {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0")?;
            l.local_addr()?.port()
        };
        let addr = format!("127.0.0.1:{port}");
        std::fs::create_dir_all(storage)?;
        let config = storage.join("config.yml");
        let mut yaml = format!(
            "version: 0.1\nlog:\n  level: info\n  formatter: text\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: {addr}\n",
            storage.join("data").display()
        );
        let mut auth = RegistryAuth::Anonymous;
        if let Some((user, password)) = login {
            let htpasswd = storage.join("htpasswd");
            // `-i` reads the password from standard input, off the command line.
            let mut child = Command::new("htpasswd")
                .args(["-iBc"])
                .arg(&htpasswd)
                .arg(user)
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .spawn()?;
            if let Some(mut stdin) = child.stdin.take() {
                stdin.write_all(password.as_bytes())?;
            }
            if !child.wait()?.success() {
                return Err(LocalError::Registry("htpasswd failed".into()));
            }
            yaml.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: allot-test\n    path: {}\n",
                htpasswd.display()
            ));
            auth = RegistryAuth::Basic(user.to_owned(), password.to_owned());
        }
        std::fs::write(&config, yaml)?;
        let log = storage.join("registry.log");
        let out = std::fs::File::create(&log)?;
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()?;
        let mut registry = LocalRegistry {
            child,
            addr: addr.clone(),
            storage: storage.to_owned(),
            log: log.clone(),
            auth,
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(&addr).is_err() {
            if std::time::Instant::now() > deadline || registry.child.try_wait()?.is_some() {
                return Err(LocalError::NotListening {
                    addr,
                    log: std::fs::read_to_string(&log).unwrap_or_default(),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(registry)
    }

    /// How many times the registry served a blob (`GET …/blobs/sha256:…`) so far.
    pub fn blob_fetches(&self) -> usize {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| {
                l.contains("response completed")
                    && l.contains("http.request.method=GET")
                    && l.contains("/blobs/sha256:")
            })
            .count()
    }

    /// The file the registry keeps a blob's content in.
    pub fn blob_file(&self, digest: &str) -> PathBuf {
        let hex = digest.trim_start_matches("sha256:");
        self.storage
            .join("data/docker/registry/v2/blobs/sha256")
            .join(hex.get(..2).unwrap_or(""))
            .join(hex)
            .join("data")
    }

    /// Stores `manifest` (raw bytes, whatever blobs they name) as `repo:tag` straight into
    /// the registry's storage, unchecked: what a registry its tenant runs itself would
    /// serve. Returns its digest.
    pub fn plant_manifest(
        &self,
        repo: &str,
        tag: &str,
        manifest: &[u8],
    ) -> Result<String, LocalError> {
        let hex = hex::encode(Sha256::digest(manifest));
        let digest = format!("sha256:{hex}");
        let v2 = self.storage.join("data/docker/registry/v2");
        let blob = v2.join("blobs/sha256").join(&hex[..2]).join(&hex);
        std::fs::create_dir_all(&blob)?;
        std::fs::write(blob.join("data"), manifest)?;
        let manifests = v2.join("repositories").join(repo).join("_manifests");
        for link in [
            manifests.join("revisions/sha256").join(&hex),
            manifests.join("tags").join(tag).join("current"),
            manifests
                .join("tags")
                .join(tag)
                .join("index/sha256")
                .join(&hex),
        ] {
            std::fs::create_dir_all(&link)?;
            std::fs::write(link.join("link"), &digest)?;
        }
        Ok(digest)
    }

    /// The manifest of `repo_tag` as the registry serves it (raw bytes).
    pub async fn manifest_bytes(&self, repo_tag: &str) -> Result<Vec<u8>, LocalError> {
        let reference: Reference = format!("{}/{repo_tag}", self.addr)
            .parse()
            .map_err(|e: oci_client::ParseError| LocalError::Registry(e.to_string()))?;
        let (bytes, _) = self
            .client()
            .pull_manifest_raw(
                &reference,
                &self.auth,
                &["application/vnd.oci.image.manifest.v1+json"],
            )
            .await
            .map_err(|e| LocalError::Registry(e.to_string()))?;
        Ok(bytes.to_vec())
    }

    fn client(&self) -> Client {
        let _ = rustls::crypto::ring::default_provider().install_default();
        Client::new(ClientConfig {
            protocol: ClientProtocol::HttpsExcept(vec![self.addr.clone()]),
            ..Default::default()
        })
    }

    /// Pushes an image of these layers (each an uncompressed tar, pushed gzipped) with this
    /// image configuration (its `config` object); returns its manifest digest.
    pub async fn push(
        &self,
        repo_tag: &str,
        layers: &[Vec<u8>],
        config: serde_json::Value,
    ) -> Result<String, LocalError> {
        let reference: Reference = format!("{}/{repo_tag}", self.addr)
            .parse()
            .map_err(|e: oci_client::ParseError| LocalError::Registry(e.to_string()))?;
        let mut diff_ids = Vec::new();
        let mut pushed = Vec::new();
        for tar in layers {
            diff_ids.push(format!("sha256:{}", hex::encode(Sha256::digest(tar))));
            let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            gz.write_all(tar)?;
            pushed.push(ImageLayer::oci_v1_gzip(gz.finish()?, None));
        }
        let arch = match std::env::consts::ARCH {
            "x86_64" => "amd64",
            "aarch64" => "arm64",
            a => a,
        };
        let config = serde_json::json!({
            "architecture": arch,
            "os": "linux",
            "config": config,
            "rootfs": { "type": "layers", "diff_ids": diff_ids },
        });
        let client = self.client();
        let bytes = serde_json::to_vec(&config).map_err(std::io::Error::other)?;
        client
            .push(
                &reference,
                &pushed,
                Config::oci_v1(bytes, None),
                &self.auth,
                None,
            )
            .await
            .map_err(|e| LocalError::Registry(e.to_string()))?;
        client
            .fetch_manifest_digest(&reference, &self.auth)
            .await
            .map_err(|e| LocalError::Registry(e.to_string()))
    }

    /// Pushes a busybox image (`PATH=/bin`, `sh` as its command); returns its digest.
    pub async fn push_busybox(&self, repo_tag: &str) -> Result<String, LocalError> {
        let layer = busybox_layer(Path::new(BUSYBOX))?;
        self.push(
            repo_tag,
            &[layer],
            serde_json::json!({ "Env": ["PATH=/bin"], "Cmd": ["sh"] }),
        )
        .await
    }
}

impl Drop for LocalRegistry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn entry(
    b: &mut tar::Builder<Vec<u8>>,
    kind: tar::EntryType,
    path: &str,
    mode: u32,
    data: &[u8],
    link: Option<&str>,
) -> std::io::Result<()> {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_size(data.len() as u64);
    h.set_path(path)?;
    if let Some(link) = link {
        h.set_link_name(link)?;
    }
    h.set_cksum();
    b.append(&h, data)
}

/// A layer with a static busybox at `/bin/busybox`, its applets linked beside it, the
/// directories a container needs, and users root (0), nobody and user (1000).
pub fn busybox_layer(busybox: &Path) -> std::io::Result<Vec<u8>> {
    let bin = std::fs::read(busybox)?;
    let mut b = tar::Builder::new(Vec::new());
    for d in ["bin", "etc", "proc", "sys", "dev", "tmp"] {
        entry(&mut b, tar::EntryType::Directory, d, 0o755, &[], None)?;
    }
    entry(
        &mut b,
        tar::EntryType::Regular,
        "bin/busybox",
        0o755,
        &bin,
        None,
    )?;
    for a in APPLETS {
        entry(
            &mut b,
            tar::EntryType::Symlink,
            &format!("bin/{a}"),
            0o777,
            &[],
            Some("busybox"),
        )?;
    }
    entry(
        &mut b,
        tar::EntryType::Regular,
        "etc/passwd",
        0o644,
        b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/sh\nuser:x:1000:1000:user:/scratch:/bin/sh\n",
        None,
    )?;
    entry(
        &mut b,
        tar::EntryType::Regular,
        "etc/group",
        0o644,
        b"root:x:0:\nuser:x:1000:\n",
        None,
    )?;
    b.into_inner()
}
