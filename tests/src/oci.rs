//! Containers in tests: a real OCI distribution registry (Debian's `docker-registry`, the
//! CNCF distribution registry) on loopback, images built here from a static busybox and
//! pushed to it, and clusters whose agents run jobs through `runc`.
//!
//! Nothing is fetched from outside: every image is made by the test that uses it.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use oci_client::client::{ClientConfig, ClientProtocol, Config, ImageLayer};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use sha2::{Digest, Sha256};

/// What the container tests need on the machine: root, `runc`, `tini-static`, the
/// registry, a static busybox. Missing pieces fail the test, saying what to install
/// (`scripts/test` installs them), unless `ALLOT_SKIP_CONTAINER_TESTS=1` says to skip.
pub fn require_container_support() -> bool {
    let mut missing = Vec::new();
    if !nix::unistd::geteuid().is_root() {
        missing.push("root".to_owned());
    }
    for (bin, package) in [
        ("runc", "runc"),
        ("tini-static", "tini"),
        ("docker-registry", "docker-registry"),
    ] {
        if allot_agent::runtime::oci::find_on_path(bin).is_none() {
            missing.push(format!("{bin} (Debian package {package})"));
        }
    }
    if !Path::new(BUSYBOX).is_file() {
        missing.push(format!("{BUSYBOX} (Debian package busybox-static)"));
    }
    if missing.is_empty() {
        return true;
    }
    if std::env::var("ALLOT_SKIP_CONTAINER_TESTS").as_deref() == Ok("1") {
        eprintln!("skipped: missing {}", missing.join(", "));
        return false;
    }
    panic!(
        "container tests need {} (scripts/test installs them; ALLOT_SKIP_CONTAINER_TESTS=1 skips)",
        missing.join(", ")
    );
}

/// The static busybox images are made of.
pub const BUSYBOX: &str = "/bin/busybox";

/// Busybox applets the test images link.
const APPLETS: &[&str] = &[
    "sh", "cat", "ls", "id", "sleep", "kill", "ps", "echo", "test", "seq", "mknod", "grep", "head",
    "wc", "touch", "rm", "ln", "mkdir", "dd", "setsid", "true", "false", "env", "find", "stat",
    "chmod", "sed", "tr", "printf", "nproc", "mkfifo",
];

/// A registry on loopback, removed (process and storage) when dropped.
pub struct Registry {
    child: Child,
    pub addr: String,
    pub storage: tempfile::TempDir,
    log: PathBuf,
}

impl Registry {
    pub fn start() -> Self {
        let storage = tempfile::tempdir().expect("temp dir");
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            l.local_addr().expect("addr").port()
        };
        let addr = format!("127.0.0.1:{port}");
        let config = storage.path().join("config.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: info\n  formatter: text\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: {addr}\n",
                storage.path().join("data").display()
            ),
        )
        .expect("config");
        let log = storage.path().join("registry.log");
        let out = std::fs::File::create(&log).expect("log");
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("clone"))
            .stderr(out)
            .spawn()
            .expect("docker-registry starts");
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(&addr).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "the registry did not listen on {addr}: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Registry {
            child,
            addr,
            storage,
            log,
        }
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
            .path()
            .join("data/docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }

    fn client(&self) -> Client {
        let _ = rustls::crypto::ring::default_provider().install_default();
        Client::new(ClientConfig {
            protocol: ClientProtocol::HttpsExcept(vec![self.addr.clone()]),
            ..Default::default()
        })
    }

    /// Pushes an image of these layers (each an uncompressed tar, pushed gzipped) with this
    /// image configuration (`config` object), returning its manifest digest.
    pub async fn push(
        &self,
        repo_tag: &str,
        layers: &[Vec<u8>],
        config: serde_json::Value,
    ) -> String {
        let reference: Reference = format!("{}/{repo_tag}", self.addr)
            .parse()
            .expect("reference");
        let mut diff_ids = Vec::new();
        let mut pushed = Vec::new();
        for tar in layers {
            diff_ids.push(format!("sha256:{}", hex::encode(Sha256::digest(tar))));
            let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            gz.write_all(tar).expect("gzip");
            pushed.push(ImageLayer::oci_v1_gzip(gz.finish().expect("gzip"), None));
        }
        let config = serde_json::json!({
            "architecture": match std::env::consts::ARCH { "x86_64" => "amd64", "aarch64" => "arm64", a => a },
            "os": "linux",
            "config": config,
            "rootfs": { "type": "layers", "diff_ids": diff_ids },
        });
        let client = self.client();
        client
            .push(
                &reference,
                &pushed,
                Config::oci_v1(serde_json::to_vec(&config).expect("json"), None),
                &RegistryAuth::Anonymous,
                None,
            )
            .await
            .expect("push");
        client
            .fetch_manifest_digest(&reference, &RegistryAuth::Anonymous)
            .await
            .expect("digest")
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Builds a layer: `build` adds entries to a tar.
pub fn layer(build: impl FnOnce(&mut tar::Builder<Vec<u8>>)) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    b.mode(tar::HeaderMode::Deterministic);
    build(&mut b);
    b.into_inner().expect("tar")
}

/// A directory entry.
pub fn add_dir(b: &mut tar::Builder<Vec<u8>>, path: &str) {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Directory);
    h.set_mode(0o755);
    h.set_size(0);
    raw_name(&mut h, path, None);
    b.append(&h, &[][..]).expect("dir");
}

/// A regular file (the name is written raw: `..` and all, as a hostile layer would).
pub fn add_file(b: &mut tar::Builder<Vec<u8>>, path: &str, data: &[u8], mode: u32) {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_mode(mode);
    h.set_size(data.len() as u64);
    raw_name(&mut h, path, None);
    b.append(&h, data).expect("file");
}

/// A symbolic or hard link.
pub fn add_link(b: &mut tar::Builder<Vec<u8>>, kind: tar::EntryType, path: &str, target: &str) {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(0o777);
    h.set_size(0);
    raw_name(&mut h, path, Some(target));
    b.append(&h, &[][..]).expect("link");
}

fn raw_name(h: &mut tar::Header, path: &str, link: Option<&str>) {
    let old = h.as_old_mut();
    assert!(
        path.len() < old.name.len(),
        "{path}: name too long for a test header"
    );
    old.name = [0; 100];
    old.name[..path.len()].copy_from_slice(path.as_bytes());
    if let Some(link) = link {
        old.linkname = [0; 100];
        old.linkname[..link.len()].copy_from_slice(link.as_bytes());
    }
    h.set_cksum();
}

/// The base layer of every test image: a static busybox with its applets, and the
/// directories a container needs.
pub fn busybox_layer() -> Vec<u8> {
    let busybox = std::fs::read(BUSYBOX).expect("static busybox");
    layer(|b| {
        for d in ["bin", "etc", "proc", "sys", "dev", "tmp"] {
            add_dir(b, d);
        }
        add_file(b, "bin/busybox", &busybox, 0o755);
        for a in APPLETS {
            add_link(b, tar::EntryType::Symlink, &format!("bin/{a}"), "busybox");
        }
        add_file(
            b,
            "etc/passwd",
            b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/sh\nuser:x:1000:1000:user:/scratch:/bin/sh\n",
            0o644,
        );
        add_file(b, "etc/group", b"root:x:0:\nuser:x:1000:\n", 0o644);
    })
}

/// Pushes the plain busybox image as `repo_tag`; returns its digest.
pub async fn push_busybox(registry: &Registry, repo_tag: &str) -> String {
    registry
        .push(
            repo_tag,
            &[busybox_layer()],
            serde_json::json!({ "Env": ["PATH=/bin"], "Cmd": ["sh"] }),
        )
        .await
}

/// Makes `dir` and its ancestors searchable by other users (a container's user namespace
/// must pass through them to its image).
pub fn searchable(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let mut p = Some(dir);
    while let Some(d) = p {
        if let Ok(m) = std::fs::metadata(d) {
            let mode = m.permissions().mode();
            if mode & 0o001 == 0 {
                let _ = std::fs::set_permissions(d, std::fs::Permissions::from_mode(mode | 0o011));
            }
        }
        p = d.parent();
    }
}

/// Whether any process on the host has exactly this command line.
pub fn process_running(cmdline: &str) -> bool {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return false;
    };
    entries.flatten().any(|e| {
        let Ok(raw) = std::fs::read(e.path().join("cmdline")) else {
            return false;
        };
        let line = raw
            .split(|b| *b == 0)
            .filter(|s| !s.is_empty())
            .map(|s| String::from_utf8_lossy(s).into_owned())
            .collect::<Vec<_>>()
            .join(" ");
        let state = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        let zombie = state
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'));
        line == cmdline && !zombie
    })
}
