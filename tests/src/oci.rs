//! Containers in tests: a real OCI distribution registry (Debian's `docker-registry`, the
//! CNCF distribution registry) on loopback, images built here from a static busybox and
//! pushed to it, and clusters whose agents run jobs through `runc`.
//!
//! Nothing is fetched from outside: every image is made by the test that uses it.

use std::path::Path;

pub use allot_agent::image::local::{BUSYBOX, LocalRegistry};

/// What the container tests need on the machine: root, `runc`, `tini-static`, `nft` and
/// `ip` (jobs' own networks), the registry, a static busybox. Missing pieces fail the test, saying what to install
/// (`scripts/test` installs them), unless `ALLOT_SKIP_CONTAINER_TESTS=1` says to skip.
pub fn require_container_support() -> bool {
    let mut missing = Vec::new();
    if !nix::unistd::geteuid().is_root() {
        missing.push("root".to_owned());
    }
    for (bin, package) in [
        ("runc", "runc"),
        ("tini-static", "tini"),
        ("nft", "nftables"),
        ("ip", "iproute2"),
        ("docker-registry", "docker-registry"),
        ("htpasswd", "apache2-utils"),
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

/// A registry on loopback with its storage, both gone when dropped.
pub struct Registry {
    pub inner: LocalRegistry,
    pub addr: String,
    _storage: tempfile::TempDir,
}

impl Registry {
    pub fn start() -> Self {
        let storage = tempfile::tempdir().expect("temp dir");
        let inner = LocalRegistry::start(storage.path()).expect("docker-registry starts");
        Registry {
            addr: inner.addr.clone(),
            inner,
            _storage: storage,
        }
    }

    /// A registry admitting only `user` with `password`.
    pub fn start_private(user: &str, password: &str) -> Self {
        let storage = tempfile::tempdir().expect("temp dir");
        let inner = LocalRegistry::start_private(storage.path(), user, password)
            .expect("docker-registry starts");
        Registry {
            addr: inner.addr.clone(),
            inner,
            _storage: storage,
        }
    }

    pub fn blob_fetches(&self) -> usize {
        self.inner.blob_fetches()
    }

    pub fn blob_file(&self, digest: &str) -> std::path::PathBuf {
        self.inner.blob_file(digest)
    }

    pub async fn push(
        &self,
        repo_tag: &str,
        layers: &[Vec<u8>],
        config: serde_json::Value,
    ) -> String {
        self.inner
            .push(repo_tag, layers, config)
            .await
            .expect("push")
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

/// The base layer of every test image (see [`allot_agent::image::local::busybox_layer`]).
pub fn busybox_layer() -> Vec<u8> {
    allot_agent::image::local::busybox_layer(Path::new(BUSYBOX)).expect("static busybox")
}

/// Pushes the plain busybox image as `repo_tag`; returns its digest.
pub async fn push_busybox(registry: &Registry, repo_tag: &str) -> String {
    registry.inner.push_busybox(repo_tag).await.expect("push")
}

/// A cluster of `nodes` nodes (`gpus` each) running jobs in containers that pull from
/// `registry`, with small scratch space and `pids_limit` processes per container.
pub async fn confined_cluster(
    registry: &Registry,
    nodes: usize,
    gpus: &str,
    pids_limit: i64,
) -> crate::TestCluster {
    confined_cluster_with(registry, nodes, gpus, pids_limit, |_| {}).await
}

/// [`confined_cluster`], with the container runtime's configuration changed by `tweak`
/// (more registries, smaller image caches).
pub async fn confined_cluster_with(
    registry: &Registry,
    nodes: usize,
    gpus: &str,
    pids_limit: i64,
    tweak: impl Fn(&mut allot_agent::runtime::oci::OciConfig),
) -> crate::TestCluster {
    let addr = registry.addr.clone();
    crate::spawn_cluster_of(
        crate::Backend::Sqlite,
        nodes,
        gpus,
        |_| {},
        move |cfg| {
            let mut oci =
                allot_agent::runtime::oci::OciConfig::discover(None).expect("runc and tini-static");
            oci.registries.insecure = vec![addr.clone()];
            oci.pids_limit = pids_limit;
            oci.scratch_bytes = 64 << 20;
            oci.tmp_bytes = 64 << 20;
            oci.shm_bytes = 64 << 20;
            tweak(&mut oci);
            cfg.runtime = allot_agent::RuntimeChoice::Oci(oci);
        },
    )
    .await
}

/// A registry holding the busybox image, and a one-node confined cluster of `tenants`
/// pulling from it.
pub struct BusyboxCluster {
    pub registry: Registry,
    pub c: crate::TestCluster,
    /// The image's reference (`ADDR/REPO:TAG`) and digest.
    pub image: String,
    pub digest: String,
}

/// Pushes busybox as `repo_tag` and starts a one-node cluster (`pids_limit` processes per
/// container) with `tenants`.
pub async fn busybox_cluster(repo_tag: &str, pids_limit: i64, tenants: &[&str]) -> BusyboxCluster {
    let registry = Registry::start();
    let digest = push_busybox(&registry, repo_tag).await;
    let c = confined_cluster(&registry, 1, "1xH200", pids_limit).await;
    for t in tenants {
        c.create_tenant(t, None).await;
    }
    BusyboxCluster {
        image: format!("{}/{repo_tag}", registry.addr),
        registry,
        c,
        digest,
    }
}

/// Runs a CPU-only job of `tenant` on `image` to its end: the job and its log.
pub async fn run_image(
    c: &crate::TestCluster,
    tenant: &str,
    image: &str,
    command: &[&str],
) -> (serde_json::Value, String) {
    let id = c
        .submit_with(
            tenant,
            serde_json::json!({ "gpus": 0, "image": image }),
            command,
        )
        .await;
    (c.wait_for_end(&id).await, c.log_of(&id).await)
}

/// A symbolic link entry (a shorthand for [`add_link`]).
pub fn add_symlink(b: &mut tar::Builder<Vec<u8>>, path: &str, target: &str) {
    add_link(b, tar::EntryType::Symlink, path, target);
}

/// Runs `program` with `args` on the host as `uid` (and gid `uid`, no other groups);
/// whether it succeeded, and what it printed on standard error.
pub fn run_as(uid: u32, program: &str, args: &[&str]) -> (bool, String) {
    use std::os::unix::process::CommandExt;
    let out = std::process::Command::new(program)
        .args(args)
        .uid(uid)
        .gid(uid)
        .output()
        .expect("run");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The cgroup (path below the hierarchy) a host process is in: its CPU controller's on
/// cgroup v1, its only one on v2.
pub fn cgroup_of(pid: u64) -> String {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).expect("cgroup");
    text.lines()
        .find_map(|l| {
            let mut f = l.splitn(3, ':');
            let (_, controllers, path) = (f.next(), f.next()?, f.next()?);
            (controllers.split(',').any(|c| c == "cpuacct") || controllers.is_empty())
                .then(|| path.to_owned())
        })
        .expect("a CPU cgroup")
}

/// `tests/fixtures/syscalls.c` built static (it runs in a busybox image as on the host):
/// the system calls of the seccomp table, each made in a child of its own, one
/// `name=OK` or `name=ERRNO` line each. Needs a C compiler with a static C library.
pub fn syscall_probe() -> std::path::PathBuf {
    static BUILT: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let dir = std::env::temp_dir().join(format!("allot-syscalls-{}", std::process::id()));
            std::fs::create_dir_all(&dir).expect("probe dir");
            let out = dir.join("syscalls");
            let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/syscalls.c");
            let built = std::process::Command::new("cc")
                .args(["-static", "-O1", "-Wall", "-o"])
                .arg(&out)
                .arg(&source)
                .arg("-lpthread")
                .output()
                .expect("cc runs (the seccomp table needs a C compiler; Debian: gcc)");
            assert!(
                built.status.success(),
                "building {}: {}",
                source.display(),
                String::from_utf8_lossy(&built.stderr)
            );
            out
        })
        .clone()
}

/// What [`syscall_probe`] printed: each call's outcome by name.
pub fn syscall_outcomes(output: &str) -> std::collections::BTreeMap<String, String> {
    output
        .lines()
        .filter_map(|l| l.trim().split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
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

/// A cluster of confined nodes whose server and agents the caller may configure further
/// (`agent` runs after the container settings).
pub async fn confined_cluster_configured(
    registry: &Registry,
    nodes: usize,
    gpus: &str,
    server: impl FnOnce(&mut allot_server::ServerConfig),
    agent: impl Fn(&mut allot_agent::AgentConfig),
) -> crate::TestCluster {
    let addr = registry.addr.clone();
    crate::spawn_cluster_of(crate::Backend::Sqlite, nodes, gpus, server, move |cfg| {
        let mut oci =
            allot_agent::runtime::oci::OciConfig::discover(None).expect("runc and tini-static");
        oci.registries.insecure = vec![addr.clone()];
        oci.pids_limit = 64;
        oci.scratch_bytes = 64 << 20;
        oci.tmp_bytes = 64 << 20;
        oci.shm_bytes = 64 << 20;
        cfg.runtime = allot_agent::RuntimeChoice::Oci(oci);
        agent(cfg);
    })
    .await
}

fn ip(args: &[&str]) {
    let out = std::process::Command::new("ip")
        .args(args)
        .output()
        .expect("ip (Debian package iproute2)");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A network namespace standing for the world outside the node: made with `ip netns add`,
/// joined to the host by a veth pair (a /30 of the benchmarking range 198.18.0.0/15, which
/// nothing real uses), with a link-local address of its own routed to it (a stand-in for a
/// metadata service). Its listeners answer every connection with a line; all of it goes
/// when dropped.
pub struct Outside {
    pub name: String,
    host_link: String,
    /// The host's end (a node address) and the namespace's.
    pub host_ip: std::net::Ipv4Addr,
    pub ip: std::net::Ipv4Addr,
    /// A link-local address in the namespace, routed to it from the host.
    pub link_local: std::net::Ipv4Addr,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Outside {
    pub fn create() -> Self {
        let n: u32 = rand::random();
        let tag = format!("{:06x}", n & 0xff_ffff);
        let name = format!("allot-test-{tag}");
        let host_link = format!("altst{tag}h");
        let peer = format!("altst{tag}n");
        // 198.18.0.0/15 in /30s: 32768 of them.
        let base = u32::from(std::net::Ipv4Addr::new(198, 18, 0, 0)) + (n % 32768) * 4;
        let host_ip = std::net::Ipv4Addr::from(base + 1);
        let ns_ip = std::net::Ipv4Addr::from(base + 2);
        let link_local = std::net::Ipv4Addr::new(
            169,
            254,
            200 + (n >> 24) as u8 % 50,
            (n >> 16) as u8 % 250 + 2,
        );
        ip(&["netns", "add", &name]);
        let outside = Outside {
            name: name.clone(),
            host_link: host_link.clone(),
            host_ip,
            ip: ns_ip,
            link_local,
            stop: Default::default(),
        };
        ip(&[
            "link", "add", &host_link, "type", "veth", "peer", "name", &peer, "netns", &name,
        ]);
        ip(&["addr", "add", &format!("{host_ip}/30"), "dev", &host_link]);
        ip(&["link", "set", &host_link, "up"]);
        let ns = |args: &[&str]| {
            let mut all = vec!["-n", name.as_str()];
            all.extend_from_slice(args);
            ip(&all);
        };
        ns(&["addr", "add", &format!("{ns_ip}/30"), "dev", &peer]);
        ns(&["addr", "add", &format!("{link_local}/32"), "dev", &peer]);
        ns(&["link", "set", &peer, "up"]);
        ns(&["link", "set", "lo", "up"]);
        ns(&["route", "add", "default", "via", &host_ip.to_string()]);
        ip(&[
            "route",
            "add",
            &format!("{link_local}/32"),
            "via",
            &ns_ip.to_string(),
        ]);
        outside
    }

    /// A listener at `addr` (one of the namespace's) answering `line`; its port.
    pub fn listen(&self, addr: std::net::Ipv4Addr, line: &str) -> u16 {
        let ns = std::fs::File::open(format!("/run/netns/{}", self.name)).expect("netns");
        let (tx, rx) = std::sync::mpsc::channel();
        let (line, stop) = (format!("{line}\n"), self.stop.clone());
        std::thread::spawn(move || {
            use std::os::fd::AsFd;
            nix::sched::setns(ns.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
            let l = std::net::TcpListener::bind((addr, 0)).expect("bind");
            tx.send(l.local_addr().expect("addr").port()).expect("port");
            serve(l, &line, &stop);
        });
        rx.recv().expect("listening")
    }
}

/// A listener on the host at `addr` (port 0: any), answering `line`, until `stop`.
pub fn listen_on_host(
    addr: std::net::SocketAddr,
    line: &str,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> u16 {
    let l = std::net::TcpListener::bind(addr).expect("bind");
    let port = l.local_addr().expect("addr").port();
    let line = format!("{line}\n");
    std::thread::spawn(move || serve(l, &line, &stop));
    port
}

fn serve(l: std::net::TcpListener, line: &str, stop: &std::sync::atomic::AtomicBool) {
    use std::io::Write;
    l.set_nonblocking(true).expect("nonblocking");
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        match l.accept() {
            Ok((mut s, _)) => {
                let _ = s.write_all(line.as_bytes());
            }
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(20)),
        }
    }
}

impl Drop for Outside {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let quiet = |args: &[&str]| {
            let _ = std::process::Command::new("ip").args(args).output();
        };
        quiet(&["route", "del", &format!("{}/32", self.link_local)]);
        quiet(&["link", "del", &self.host_link]);
        quiet(&["netns", "del", &self.name]);
    }
}
