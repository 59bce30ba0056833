//! The `oci` runtime: each attempt is an OCI container run by an OCI runtime binary on the
//! node (`runc`; `crun` where the host's cgroups suit it), from the job's image.
//!
//! What a container gets (see [`spec`]): its own PID, mount, IPC, UTS, cgroup and user
//! namespaces, the user namespace mapping its root to an unprivileged host range of its
//! tenant's ([`uid_base`]); no capabilities, no new privileges, the default seccomp
//! profile ([`seccomp`]); the image's root file system read-only, with `/scratch`, `/tmp`
//! and `/dev/shm` as size-limited tmpfs; only its own GPUs' device nodes (from the node's
//! CDI specs, [`crate::cdi`]); CPU, memory and pids limits on its cgroup; a network
//! namespace of its own, routed through the node and held to its tenant's network policy
//! ([`network`]; loopback only with `--network none`, the node's own with `--network host`
//! where the tenant's policy allows it). Its first process is `tini` with a parent-death signal, so a
//! container whose agent dies (and with it the runtime process the agent started, by its
//! own parent-death signal) dies too, and everything in its PID namespace with it.
//!
//! State lives under `<data dir>/oci/` (0711): the runtime's state and the bundles (0700),
//! and each container's own root ([`rootfs`]: `roots/`, 0711, each container's 0700 and its
//! own); images under `<data dir>/images/` ([`crate::image`], 0700).

pub mod network;
pub mod rootfs;
pub mod seccomp;
pub mod spec;

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use nix::sys::signal::Signal;

use super::cgroup::{Hierarchy, ParentLimits, default_jobs_pids};
use super::{
    Attempt, BoxFuture, Ending, JobRuntime, LaunchSpec, Network, RuntimeKind, Started, Tracker,
};
use crate::image::{ImageStore, RegistryConfig};

/// How the node runs containers.
#[derive(Debug, Clone)]
pub struct OciConfig {
    /// The OCI runtime binary (`runc`), from `--oci-runtime` or `PATH`.
    pub runtime: PathBuf,
    /// A static init run as each container's first process (`tini-static`).
    pub init: PathBuf,
    /// Where CDI specs are read from.
    pub cdi_dirs: Vec<PathBuf>,
    pub registries: RegistryConfig,
    /// The image cache's size cap.
    pub image_cache_bytes: u64,
    /// The cap on one image (its layers and unpacked root together); none: half the
    /// cache's.
    pub image_max_bytes: Option<u64>,
    /// The cap on one tenant's images in the cache; none: three quarters of the cache's.
    pub image_tenant_bytes: Option<u64>,
    /// Size of each container's `/scratch`, `/tmp` and `/dev/shm`.
    pub scratch_bytes: u64,
    pub tmp_bytes: u64,
    pub shm_bytes: u64,
    /// Processes (threads) one container may have.
    pub pids_limit: i64,
    /// The pool this agent takes its jobs' subnet from (a /24 of it).
    pub job_subnets: ipnet::Ipv4Net,
    /// Memory kept from the jobs for the agent and the system (kubelet's system-reserved):
    /// every container's cgroup is below one parent limited to the node's memory less it.
    pub system_reserved_memory: u64,
    /// Processes (threads) all containers together may have, below the kernel's
    /// `pid_max`; `None`: [`default_jobs_pids`] of it.
    pub jobs_pids_limit: Option<i64>,
}

impl OciConfig {
    /// The image cache's caps, the defaults derived from its size.
    pub fn image_caps(&self) -> crate::image::cache::Caps {
        let cache = self.image_cache_bytes;
        crate::image::cache::Caps {
            cache,
            image: self.image_max_bytes.unwrap_or(cache / 2),
            tenant: self.image_tenant_bytes.unwrap_or(cache / 4 * 3),
        }
    }

    /// The defaults, with the runtime and init found on `PATH` (or `runtime` if given).
    pub fn discover(runtime: Option<PathBuf>) -> Result<Self, String> {
        let runtime = match runtime {
            Some(r) if r.is_file() => r,
            Some(r) => return Err(format!("--oci-runtime {}: no such file", r.display())),
            None => find_on_path("runc")
                .or_else(|| find_on_path("crun"))
                .ok_or_else(|| {
                    "no OCI runtime on PATH (install runc, or pass --oci-runtime)".to_owned()
                })?,
        };
        let init = find_on_path("tini-static")
            .or_else(|| {
                [
                    "/usr/libexec/allot/tini-static",
                    "/usr/local/lib/allot/tini-static",
                ]
                .iter()
                .map(PathBuf::from)
                .find(|p| p.is_file())
            })
            .ok_or_else(|| {
                "no tini-static on PATH: containers need a static init (install tini)".to_owned()
            })?;
        Ok(OciConfig {
            runtime,
            init,
            cdi_dirs: crate::cdi::DEFAULT_DIRS.iter().map(PathBuf::from).collect(),
            registries: RegistryConfig::default(),
            image_cache_bytes: 20 << 30,
            image_max_bytes: None,
            image_tenant_bytes: None,
            scratch_bytes: 10 << 30,
            tmp_bytes: 1 << 30,
            shm_bytes: 1 << 30,
            pids_limit: 4096,
            job_subnets: network::plan::DEFAULT_POOL
                .parse()
                .map_err(|e| format!("the default job subnet pool: {e}"))?,
            system_reserved_memory: DEFAULT_SYSTEM_RESERVED_MEMORY,
            jobs_pids_limit: None,
        })
    }
}

/// Memory kept from the jobs for the agent and the system when the operator says nothing.
pub const DEFAULT_SYSTEM_RESERVED_MEMORY: u64 = 2 << 30;

/// What all of the containers together may use on this node: its memory less what is
/// reserved, and `cfg`'s pids limit (or the default below `pid_max`), refusing a reserve
/// that leaves nothing, a limit that is not below `pid_max`, and a per-job pids limit
/// above the total.
pub fn parent_limits(
    cfg: &OciConfig,
    node_memory: u64,
    pid_max: i64,
) -> Result<ParentLimits, String> {
    let memory_bytes = node_memory
        .checked_sub(cfg.system_reserved_memory)
        .filter(|m| *m > 0)
        .ok_or_else(|| {
            format!(
                "--system-reserved-memory {} leaves the jobs nothing of this node's {}",
                allot_domain::format_bytes(cfg.system_reserved_memory),
                allot_domain::format_bytes(node_memory)
            )
        })?;
    let pids = cfg
        .jobs_pids_limit
        .unwrap_or_else(|| default_jobs_pids(pid_max));
    if !(1..pid_max).contains(&pids) {
        return Err(format!(
            "--jobs-pids-limit {pids} must be from 1 to below the kernel's pid_max ({pid_max}), \
             so the agent and the system keep process ids of their own"
        ));
    }
    if !(1..=pids).contains(&cfg.pids_limit) {
        return Err(format!(
            "--pids-limit {} (each job's) must be from 1 to the jobs' total, {pids}",
            cfg.pids_limit
        ));
    }
    Ok(ParentLimits { memory_bytes, pids })
}

/// Refuses a data dir below a directory that the containers' users (unprivileged host uids
/// of no one's) cannot pass through: their images' root file systems are inside it, and
/// every container would fail to start. Names the directory.
pub fn check_traversable(data_dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let mut dir = std::fs::canonicalize(data_dir)
        .map_err(|e| format!("the data dir {}: {e}", data_dir.display()))?;
    loop {
        let mode = std::fs::metadata(&dir)
            .map_err(|e| format!("{}: {e}", dir.display()))?
            .permissions()
            .mode();
        if mode & 0o001 == 0 {
            return Err(format!(
                "the containers' users cannot pass through {} (mode {:04o}) to their images \
                 in the data dir {}: make it searchable (chmod o+x {}) or choose a data dir \
                 below directories every user may pass through",
                dir.display(),
                mode & 0o7777,
                data_dir.display(),
                dir.display()
            ));
        }
        if !dir.pop() {
            return Ok(());
        }
    }
}

/// A program on `PATH`.
pub fn find_on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .chain(["/usr/sbin", "/usr/bin", "/sbin", "/bin"].map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// The first host uid of a tenant's range: its container uids 0..65536 map to
/// `Tenant::UID_FIRST + slot × 65536`, a range the control plane gives each tenant alone,
/// the same on every node.
pub fn uid_base(slot: Option<u32>) -> Result<u32, String> {
    use allot_domain::Tenant;
    match slot {
        Some(s) if s < Tenant::UID_SLOTS => Ok(Tenant::UID_FIRST + s * Tenant::UID_RANGE),
        Some(s) => Err(format!("the tenant's uid slot {s} is out of range")),
        None => Err(
            "the control plane gave no host uid range for the job's tenant; a node confining \
             jobs runs none without"
                .into(),
        ),
    }
}

pub struct OciRuntime {
    cfg: OciConfig,
    state: PathBuf,
    bundles: PathBuf,
    /// Each container's own root (see [`rootfs`]).
    roots: PathBuf,
    images: ImageStore,
    hierarchy: Hierarchy,
    /// This agent's cgroups: `/allot/<node>-<hash of its data dir>`.
    cgroup_parent: String,
    networks: std::sync::Arc<network::JobNetworks>,
}

fn mkdir(path: &Path, mode: u32) -> std::io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(path)?;
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(mode))
}

impl OciRuntime {
    /// The runtime of the agent with this data dir and node name. Needs root.
    pub fn new(data_dir: &Path, node_name: &str, cfg: OciConfig) -> Result<Self, String> {
        if !nix::unistd::geteuid().is_root() {
            return Err(
                "--runtime oci needs root (it creates namespaces, cgroups and device nodes); \
                 run the agent as root, or use --runtime process"
                    .into(),
            );
        }
        let oci = data_dir.join("oci");
        let io = |e: std::io::Error| format!("{}: {e}", oci.display());
        // Searchable (not listable): containers' user namespaces pass through to their
        // own roots in `roots/`.
        mkdir(&oci, 0o711).map_err(io)?;
        let state = oci.join("state");
        let bundles = oci.join("bundles");
        let roots = oci.join("roots");
        mkdir(&state, 0o700).map_err(io)?;
        mkdir(&bundles, 0o700).map_err(io)?;
        mkdir(&roots, 0o711).map_err(io)?;
        for dir in [&roots, &data_dir.join("images")] {
            if let Some(why) = rootfs::unfit_path(dir) {
                return Err(format!("--runtime oci: the data dir's path: {why}"));
            }
        }
        rootfs::ContainerRoot::probe(&roots)?;
        let images = ImageStore::new(
            data_dir.join("images"),
            cfg.registries.clone(),
            cfg.image_caps(),
        )
        .map_err(|e| format!("image cache: {e}"))?;
        check_traversable(data_dir)?;
        let canonical = std::fs::canonicalize(data_dir).unwrap_or_else(|_| data_dir.to_owned());
        let digest =
            <sha2::Sha256 as sha2::Digest>::digest(canonical.display().to_string().as_bytes());
        let hash = hex::encode(&digest[..4]);
        let networks = std::sync::Arc::new(network::JobNetworks::new(
            &digest,
            cfg.job_subnets,
            oci.join("network"),
        ));
        let node: String = node_name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .take(48)
            .collect();
        let node_memory = crate::host_memory_bytes()
            .ok_or("cannot read this node's memory (MemTotal in /proc/meminfo)")?;
        let pid_max = super::cgroup::pid_max()
            .ok_or("cannot read the kernel's pid_max (/proc/sys/kernel/pid_max)")?;
        let limits = parent_limits(&cfg, node_memory, pid_max)?;
        let hierarchy = Hierarchy::detect();
        let cgroup_parent = format!("/allot/{node}-{hash}");
        hierarchy
            .limit_parent(&cgroup_parent, &limits)
            .map_err(|e| format!("limiting the jobs' cgroup {cgroup_parent}: {e}"))?;
        tracing::info!(
            cgroup = %cgroup_parent,
            memory = %allot_domain::format_bytes(limits.memory_bytes),
            pids = limits.pids,
            "every job's cgroup is below this agent's, limited to the node's memory less the \
             reserve"
        );
        Ok(OciRuntime {
            state,
            bundles,
            roots,
            images,
            hierarchy,
            cgroup_parent,
            networks,
            cfg,
        })
    }

    pub fn hierarchy(&self) -> &Hierarchy {
        &self.hierarchy
    }

    /// The cgroup of an attempt's container.
    pub fn cgroup_of(&self, job_id: &str, attempt: u32) -> String {
        format!("{}/{}", self.cgroup_parent, container_id(job_id, attempt))
    }

    fn runc(&self) -> std::process::Command {
        runc(&self.cfg.runtime, &self.state)
    }
}

/// The OCI runtime binary, on this agent's state directory.
fn runc(runtime: &Path, state: &Path) -> std::process::Command {
    let mut c = std::process::Command::new(runtime);
    c.arg("--root").arg(state);
    c
}

/// `runc delete --force ID`: kills whatever is left of the container and removes it.
fn delete(runtime: &Path, state: &Path, id: &str) -> std::process::Command {
    let mut c = runc(runtime, state);
    c.args(["delete", "--force", id])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    c
}

/// One attempt's container, as the agent tracks it.
#[derive(Clone)]
struct Container {
    runtime: PathBuf,
    state: PathBuf,
    id: String,
    cgroup: String,
    bundle: PathBuf,
    /// Its own root's directory (see [`rootfs`]).
    root: PathBuf,
    hierarchy: Hierarchy,
}

impl Container {
    /// Removes it whole: the runtime's state (killing what is left), any process the
    /// runtime lost track of in its cgroup, its bundle and its own root. Blocks: call it
    /// off the async workers.
    fn remove(&self) {
        let _ = delete(&self.runtime, &self.state, &self.id).status();
        self.hierarchy.kill_and_remove(&self.cgroup);
        let _ = std::fs::remove_dir_all(&self.bundle);
        rootfs::ContainerRoot::remove(&self.root);
    }
}

/// Runs blocking work off the async workers.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, String> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| format!("the agent's worker failed: {e}"))
}

/// An attempt's container id.
pub fn container_id(job_id: &str, attempt: u32) -> String {
    format!("allot-{job_id}-{attempt}")
}

struct OciAttempt {
    child: tokio::process::Child,
    pid: u32,
    container: Container,
    digest: String,
    _image: crate::image::Image,
    /// Its own network, removed once the container is.
    network: Option<network::Attachment>,
}

impl Attempt for OciAttempt {
    fn started(&self) -> Started {
        Started {
            pid: self.pid,
            tracker: Tracker::Cgroup(self.container.cgroup.clone()),
            image_digest: Some(self.digest.clone()),
        }
    }

    fn wait(&mut self) -> BoxFuture<'_, std::io::Result<ExitStatus>> {
        Box::pin(self.child.wait())
    }

    /// Signals every process in the container's cgroup (and its init, which a SIGKILL
    /// takes the whole PID namespace with).
    fn signal(&self, signal: Signal) {
        let mut pids = self.container.hierarchy.pids(&self.container.cgroup);
        if !pids.contains(&self.pid) {
            pids.push(self.pid);
        }
        for pid in pids {
            if let Ok(raw) = i32::try_from(pid) {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(raw), signal);
            }
        }
    }

    fn finish(self: Box<Self>) -> BoxFuture<'static, Ending> {
        Box::pin(async move {
            let c = &self.container;
            // Read before the container (and its cgroup) is removed.
            let out_of_memory = c.hierarchy.oom_kills(&c.cgroup) > 0;
            let container = c.clone();
            let _ = tokio::task::spawn_blocking(move || container.remove()).await;
            if let Some(n) = self.network {
                n.release().await;
            }
            Ending { out_of_memory }
        })
    }
}

/// A container on its way up: removed whole if dropped before it runs.
struct Starting {
    child: Option<tokio::process::Child>,
    container: Container,
    /// It runs: dropping this leaves it be.
    running: bool,
}

impl Drop for Starting {
    fn drop(&mut self) {
        if self.running {
            return;
        }
        let mut child = self.child.take();
        if let Some(c) = child.as_mut() {
            let _ = c.start_kill();
        }
        // Off the async workers: removing a container takes the runtime a while.
        let container = self.container.clone();
        std::thread::spawn(move || {
            // The runtime's own process first: then nothing of it starts the container.
            if let Some(mut c) = child {
                let _ = c.try_wait();
            }
            container.remove();
        });
    }
}

/// The last error the runtime logged (its `--log` file, JSON lines).
fn runtime_error(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .rev()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["level"] == "error")
        .and_then(|v| v["msg"].as_str().map(str::to_owned))
        .unwrap_or_else(|| "the container runtime failed without saying why".into())
}

/// Hands the job's GPU-sharing descriptors to the runtime as fds 3 and 4 (passed into the
/// container with `--preserve-fds`).
#[allow(unsafe_code)]
fn pass_fds(cmd: &mut tokio::process::Command, fds: Vec<i32>) {
    if fds.is_empty() {
        return;
    }
    // SAFETY: the closure runs in the forked child before exec; it only calls fcntl(2) and
    // dup2(2), which are async-signal-safe, and allocates nothing (the Vec was built before
    // fork).
    unsafe {
        cmd.pre_exec(move || {
            let mut high = [0i32; 8];
            for (i, fd) in fds.iter().enumerate().take(high.len()) {
                high[i] = libc::fcntl(*fd, libc::F_DUPFD_CLOEXEC, 100);
                if high[i] < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            for (i, fd) in high.iter().enumerate().take(fds.len()) {
                if libc::dup2(*fd, 3 + i as i32) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
}

impl OciRuntime {
    /// The job's network namespace, when it is to have one of its own: made and connected,
    /// with the `/etc` files naming it (written into its bundle). None for the node's
    /// network (where the tenant's policy allows it) or none at all. A launch without its
    /// tenant's network policy gets neither.
    async fn network_for(
        &self,
        spec: &LaunchSpec,
        bundle: &Path,
    ) -> Result<Option<(network::Attachment, Vec<(String, PathBuf)>)>, String> {
        let policy = || {
            spec.network_policy.as_ref().ok_or_else(|| {
                "the control plane sent no network policy for the job's tenant; a node confining jobs gives no network without one"
                    .to_owned()
            })
        };
        match spec.network {
            Network::None => Ok(None),
            Network::Host => {
                if policy()?.allow_host_network {
                    Ok(None)
                } else {
                    Err("the job asks for the node's network (--network host), which its tenant's policy does not allow"
                        .into())
                }
            }
            Network::Private => {
                let attachment = self
                    .networks
                    .attach(network::Request {
                        egress: policy()?.egress.clone(),
                        gang: spec.gang.clone(),
                        node_address: spec.node_address.clone(),
                    })
                    .await?;
                let host_resolv = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
                let stub = std::fs::read_to_string("/run/systemd/resolve/resolv.conf").ok();
                let mut files = Vec::new();
                for (dest, name, text) in [
                    (
                        "/etc/resolv.conf",
                        "resolv.conf",
                        network::resolv_conf(&host_resolv, stub.as_deref()),
                    ),
                    (
                        "/etc/hosts",
                        "hosts",
                        network::hosts(attachment.address(), spec::HOSTNAME),
                    ),
                ] {
                    let path = bundle.join(name);
                    std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
                    std::fs::set_permissions(
                        &path,
                        std::os::unix::fs::PermissionsExt::from_mode(0o644),
                    )
                    .map_err(|e| format!("{}: {e}", path.display()))?;
                    files.push((dest.to_owned(), path));
                }
                Ok(Some((attachment, files)))
            }
        }
    }
}

impl JobRuntime for OciRuntime {
    fn kind(&self) -> RuntimeKind {
        RuntimeKind::Oci
    }

    fn start<'a>(
        &'a self,
        spec: &'a LaunchSpec,
        log: std::fs::File,
    ) -> BoxFuture<'a, Result<Box<dyn Attempt>, String>> {
        Box::pin(async move {
            let Some(reference) = &spec.image else {
                return Err(
                    "this node runs jobs in containers (--runtime oci): the job must name an \
                     image (allot job submit --image REGISTRY/REPOSITORY:TAG)"
                        .into(),
                );
            };
            let image = self
                .images
                .pull(reference, spec.pull_credentials.as_ref(), &spec.tenant)
                .await
                .map_err(|e| e.to_string())?;
            let id = container_id(&spec.job_id, spec.attempt);
            let cgroup = self.cgroup_of(&spec.job_id, spec.attempt);
            let bundle = self.bundles.join(&id);
            // A container of this very attempt left by an earlier run (removing leftovers
            // at start missed it): start afresh. Never blocks the agent's async workers.
            if self.state.join(&id).exists() {
                let _ = tokio::process::Command::from(delete(&self.cfg.runtime, &self.state, &id))
                    .status()
                    .await;
            }
            let _ = std::fs::remove_dir_all(&bundle);
            mkdir(&bundle, 0o700).map_err(|e| format!("{}: {e}", bundle.display()))?;
            let uid_base = uid_base(spec.uid_slot)?;
            let volumes = super::volumes::prepare(
                &spec.volumes,
                &spec.tenant,
                spec.checkpoint_dir.as_deref(),
                Some(uid_base),
            )?;
            let restore_from = match &spec.checkpoint_dir {
                Some(dir) if spec.attempt > 1 => super::volumes::latest_checkpoint(&volumes, dir),
                _ => None,
            };
            let edits = if spec.gpus.is_empty() {
                crate::cdi::Edits::default()
            } else {
                let gpus: Vec<(String, u32)> = spec
                    .gpus
                    .iter()
                    .map(|g| (g.uuid.clone(), g.index))
                    .collect();
                crate::cdi::Registry::load(&self.cfg.cdi_dirs)
                    .and_then(|r| r.edits_for(&gpus))
                    .map_err(|e| format!("the job's GPUs: {e}"))?
            };
            // File secrets in the bundle (gone with it), readable by the job's user only.
            let secret_env = super::secrets::env(&spec.secrets)?;
            // The image's user, looked up in its files read as data (off the async workers:
            // an image's file is the tenant's to shape).
            let (image_root, image_user) = (image.rootfs.clone(), image.config.user.clone());
            let (uid, gid) =
                blocking(move || crate::image::user::resolve(&image_root, image_user.as_deref()))
                    .await??;
            let network = self.network_for(spec, &bundle).await?;
            let secrets_dir = super::secrets::write_files(
                &spec.secrets,
                &bundle.join("secrets"),
                Some((uid_base + uid, uid_base + gid)),
            )?;
            let root_dir = self.roots.join(&id);
            let oci = spec::build(&spec::Inputs {
                launch: spec,
                image: &image,
                rootfs: &root_dir.join("rootfs"),
                user: (uid, gid),
                cfg: &self.cfg,
                cgroup: &cgroup,
                uid_base,
                edits: &edits,
                volumes: &volumes,
                restore_from: restore_from.as_deref(),
                secret_env: &secret_env,
                secrets_dir: secrets_dir.as_deref(),
                network: network.as_ref().map(|(n, files)| spec::OwnNetwork {
                    namespace: n.namespace_path(),
                    files,
                }),
            })?;
            // The container's own root, what it mounts over made in it.
            let (image_root, prepared) = (image.rootfs.clone(), oci.clone());
            let root = blocking(move || {
                let root = rootfs::ContainerRoot::mount(&root_dir, &image_root, uid_base)?;
                match root.prepare(&prepared) {
                    Ok(()) => Ok(root),
                    Err(e) => {
                        rootfs::ContainerRoot::remove(root.dir());
                        Err(e)
                    }
                }
            })
            .await??;
            // Removed whole (its root too) if the start fails or is abandoned from here on.
            let mut starting = Starting {
                child: None,
                running: false,
                container: Container {
                    runtime: self.cfg.runtime.clone(),
                    state: self.state.clone(),
                    id: id.clone(),
                    cgroup,
                    bundle: bundle.clone(),
                    root: root.dir().to_owned(),
                    hierarchy: self.hierarchy.clone(),
                },
            };
            oci.save(bundle.join("config.json"))
                .map_err(|e| format!("cannot write the container's config: {e}"))?;
            let pid_file = bundle.join("pid");
            let runtime_log = bundle.join("runtime.log");
            let err = log
                .try_clone()
                .map_err(|e| format!("cannot share the job's log: {e}"))?;
            let mut cmd = tokio::process::Command::new(&self.cfg.runtime);
            cmd.arg("--root")
                .arg(&self.state)
                .arg("--log")
                .arg(&runtime_log)
                .args(["--log-format", "json", "run", "--keep", "--bundle"])
                .arg(&bundle)
                .arg("--pid-file")
                .arg(&pid_file);
            if !spec.inherit_fds.is_empty() {
                cmd.arg("--preserve-fds")
                    .arg(spec.inherit_fds.len().to_string());
            }
            cmd.arg(&id)
                .env_clear()
                .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
                .stdin(Stdio::null())
                .stdout(log)
                .stderr(err);
            super::process::die_with_agent(&mut cmd);
            pass_fds(&mut cmd, spec.inherit_fds.clone());
            let child = cmd
                .spawn()
                .map_err(|e| format!("could not run {}: {e}", self.cfg.runtime.display()))?;
            // Until it runs, a container whose start is abandoned (the attempt was stopped
            // meanwhile, and this future dropped) or fails is removed whole.
            starting.child = Some(child);
            // Running once the runtime wrote the container's pid.
            let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
            let pid = loop {
                if let Some(pid) = std::fs::read_to_string(&pid_file)
                    .ok()
                    .and_then(|p| p.trim().parse::<u32>().ok())
                {
                    break pid;
                }
                if let Some(child) = starting.child.as_mut()
                    && let Ok(Some(_)) = child.try_wait()
                {
                    return Err(format!(
                        "the container did not start: {}",
                        runtime_error(&runtime_log)
                    ));
                }
                if tokio::time::Instant::now() > deadline {
                    return Err("the container did not start within 120 s".into());
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            };
            let Some(child) = starting.child.take() else {
                return Err("the container runtime's process went missing".into());
            };
            starting.running = true;
            Ok(Box::new(OciAttempt {
                child,
                pid,
                container: starting.container.clone(),
                digest: image.digest.clone(),
                _image: image,
                network: network.map(|(n, _)| n),
            }) as Box<dyn Attempt>)
        })
    }

    fn prepare(&self) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async move {
            self.networks
                .prepare()
                .await
                .map_err(|e| format!("jobs' networks: {e}"))
        })
    }

    fn jobs_gateway(&self) -> Option<std::net::Ipv4Addr> {
        self.networks.gateway()
    }

    fn shut_down(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            self.remove_leftovers();
            self.hierarchy.kill_and_remove(&self.cgroup_parent);
            self.networks.shut_down().await;
        })
    }

    fn remove_leftovers(&self) -> usize {
        let mut removed = 0;
        let listed = self
            .runc()
            .args(["list", "--quiet"])
            .stderr(Stdio::null())
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        for id in listed
            .lines()
            .map(str::trim)
            .filter(|l| l.starts_with("allot-"))
        {
            let _ = delete(&self.cfg.runtime, &self.state, id).status();
            removed += 1;
        }
        // Cgroups the runtime lost track of: kill what is in them.
        for cgroup in self.hierarchy.children(&self.cgroup_parent) {
            if self.hierarchy.kill_and_remove(&cgroup) > 0 {
                removed += 1;
            }
        }
        if let Ok(entries) = std::fs::read_dir(&self.bundles) {
            for e in entries.flatten() {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
        if let Ok(entries) = std::fs::read_dir(&self.roots) {
            for e in entries.flatten() {
                rootfs::ContainerRoot::remove(&e.path());
            }
        }
        removed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> OciConfig {
        OciConfig {
            runtime: PathBuf::from("/bin/true"),
            init: PathBuf::from("/bin/true"),
            cdi_dirs: Vec::new(),
            registries: RegistryConfig::default(),
            image_cache_bytes: 1 << 30,
            scratch_bytes: 1 << 20,
            tmp_bytes: 1 << 20,
            shm_bytes: 1 << 20,
            pids_limit: 4096,
            system_reserved_memory: 2 << 30,
            jobs_pids_limit: None,
            image_max_bytes: None,
            image_tenant_bytes: None,
            job_subnets: ipnet::Ipv4Net::new(std::net::Ipv4Addr::new(10, 200, 0, 0), 16)
                .expect("a pool"),
        }
    }

    #[test]
    fn the_jobs_get_the_node_less_the_reserve() {
        let limits = parent_limits(&cfg(), 32 << 30, 32_768).expect("limits");
        assert_eq!(
            limits,
            ParentLimits {
                memory_bytes: 30 << 30,
                pids: 28_672
            }
        );
        let mut c = cfg();
        c.system_reserved_memory = 32 << 30;
        let err = parent_limits(&c, 32 << 30, 32_768).expect_err("nothing left");
        assert!(err.contains("--system-reserved-memory"), "{err}");
        c = cfg();
        c.jobs_pids_limit = Some(32_768);
        let err = parent_limits(&c, 32 << 30, 32_768).expect_err("at pid_max");
        assert!(err.contains("pid_max (32768)"), "{err}");
        c.jobs_pids_limit = Some(1000);
        let err = parent_limits(&c, 32 << 30, 32_768).expect_err("per job above total");
        assert!(err.contains("--pids-limit 4096"), "{err}");
        c.pids_limit = 100;
        assert_eq!(
            parent_limits(&c, 32 << 30, 32_768).map(|l| l.pids),
            Ok(1000)
        );
    }

    #[test]
    fn a_data_dir_behind_a_private_directory_is_named() {
        use std::os::unix::fs::PermissionsExt;
        let top = tempfile::tempdir().expect("temp dir");
        let private = top.path().join("private");
        let data = private.join("data");
        std::fs::create_dir_all(&data).expect("mkdir");
        for d in [top.path(), data.as_path()] {
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o711)).expect("chmod");
        }
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        let err = check_traversable(&data).expect_err("private parent");
        let canonical = std::fs::canonicalize(&private).expect("canonical");
        assert!(
            err.contains(&format!("{} (mode 0700)", canonical.display())),
            "{err}"
        );
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o711)).expect("chmod");
        // Every directory above the temporary one is one the system lets everyone pass.
        assert_eq!(check_traversable(&data), Ok(()));
    }
}
