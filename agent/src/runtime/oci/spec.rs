//! The OCI runtime spec (`config.json`) of a job's container, built with `oci-spec`.

use std::path::{Component, Path, PathBuf};

use oci_spec::runtime::{
    Capabilities, HookBuilder, HooksBuilder, LinuxBuilder, LinuxCapabilitiesBuilder,
    LinuxCpuBuilder, LinuxDeviceCgroupBuilder, LinuxDeviceType, LinuxIdMappingBuilder,
    LinuxMemoryBuilder, LinuxNamespaceBuilder, LinuxNamespaceType, LinuxPidsBuilder,
    LinuxResourcesBuilder, Mount, MountBuilder, ProcessBuilder, RootBuilder, Spec, SpecBuilder,
    UserBuilder,
};

use super::OciConfig;
use crate::cdi::Edits;
use crate::image::Image;
use crate::runtime::cgroup::cpu_shares;
use crate::runtime::{LaunchSpec, Network};
use allot_domain::Tenant;

/// Where the container's init is mounted (in the runtime's own directory, see
/// [`super::rootfs`]).
pub const INIT_PATH: &str = "/.allot/init";
/// Where the GPU-sharing shim is mounted.
pub const SHIM_PATH: &str = "/usr/lib/allot/liballot_shim.so";
/// The job's writable scratch directory (its default working directory and `HOME`).
pub const SCRATCH: &str = "/scratch";
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// The CPU period its CPU quota is a share of, in µs.
const CPU_PERIOD_US: u64 = 100_000;

/// What the spec is made from.
pub struct Inputs<'a> {
    pub launch: &'a LaunchSpec,
    pub image: &'a Image,
    /// The container's own root (an overlay of the image's, see [`super::rootfs`]).
    pub rootfs: &'a Path,
    /// The container uid and gid it runs as (the image's user, see
    /// [`crate::image::user`]).
    pub user: (u32, u32),
    pub cfg: &'a OciConfig,
    pub cgroup: &'a str,
    pub uid_base: u32,
    pub edits: &'a Edits,
    /// Its volumes, ready to mount.
    pub volumes: &'a [crate::runtime::volumes::Prepared],
    /// The newest checkpoint, for an attempt after the first (a container path).
    pub restore_from: Option<&'a str>,
    /// The variables its secrets set.
    pub secret_env: &'a [(String, String)],
    /// The directory of its file secrets on the node, if it has any: mounted read-only at
    /// `/run/secrets`.
    pub secrets_dir: Option<&'a Path>,
    /// Its own network, when it has one (`--network private`).
    pub network: Option<OwnNetwork<'a>>,
}

/// A job's own network namespace, made by the agent, and the `/etc` files that go with it
/// (container path, file on the node).
pub struct OwnNetwork<'a> {
    pub namespace: PathBuf,
    pub files: &'a [(String, PathBuf)],
}

/// Every container's host name.
pub const HOSTNAME: &str = "job";

/// A path inside the container: absolute, without `..`.
fn container_path(path: &str, what: &str) -> Result<String, String> {
    let p = Path::new(path);
    if !p.is_absolute() || p.components().any(|c| c == Component::ParentDir) {
        return Err(format!(
            "{what} `{path}` must be an absolute path inside the container, without `..`"
        ));
    }
    Ok(path.to_owned())
}

fn mount(dest: &str, kind: &str, source: impl Into<PathBuf>, options: &[&str]) -> Mount {
    let mut b = MountBuilder::default()
        .destination(dest)
        .typ(kind)
        .source(source.into());
    if !options.is_empty() {
        b = b.options(options.iter().map(|o| (*o).to_owned()).collect::<Vec<_>>());
    }
    // A builder with every field given cannot fail.
    b.build().unwrap_or_default()
}

fn tmpfs(dest: &str, bytes: u64, mode: &str, extra: &[&str]) -> Mount {
    let size = format!("size={bytes}");
    let mode = format!("mode={mode}");
    let mut opts = vec!["nosuid", "nodev", size.as_str(), mode.as_str()];
    opts.extend_from_slice(extra);
    mount(dest, "tmpfs", "tmpfs", &opts)
}

fn join_env(env: &mut Vec<(String, String)>, key: &str, value: String) {
    env.retain(|(k, _)| k != key);
    env.push((key.to_owned(), value));
}

/// The container's spec.
pub fn build(i: &Inputs<'_>) -> Result<Spec, String> {
    let l = i.launch;
    // Program: the job's command, else the image's entrypoint and command.
    let program: Vec<String> = if l.command.is_empty() {
        i.image
            .config
            .entrypoint
            .iter()
            .chain(&i.image.config.cmd)
            .cloned()
            .collect()
    } else {
        l.command.clone()
    };
    if program.is_empty() {
        return Err("the job has no command and its image names none".into());
    }
    let mut args = vec![
        INIT_PATH.to_owned(),
        "-s".into(),
        "-p".into(),
        "SIGKILL".into(),
        "-g".into(),
        "--".into(),
    ];
    args.extend(program);
    let cwd = match l
        .workdir
        .as_deref()
        .or(i.image.config.working_dir.as_deref())
    {
        Some(w) => container_path(w, "workdir")?,
        None => SCRATCH.to_owned(),
    };
    // Environment: the image's, then the job's, then Allot's.
    let mut env: Vec<(String, String)> = i
        .image
        .config
        .env
        .iter()
        .filter_map(|kv| {
            kv.split_once('=')
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
        })
        .collect();
    // tini's warnings (a signal the runtime forwards after the job's exit) are not the
    // job's output; its fatal errors still are.
    join_env(&mut env, "TINI_VERBOSITY", "0".into());
    if !env.iter().any(|(k, _)| k == "PATH") {
        env.push(("PATH".into(), DEFAULT_PATH.into()));
    }
    join_env(&mut env, "HOME", SCRATCH.into());
    for (k, v) in &l.env {
        join_env(&mut env, k, v.clone());
    }
    for (k, v) in i.secret_env {
        join_env(&mut env, k, v.clone());
    }
    if i.secrets_dir.is_some() {
        join_env(
            &mut env,
            crate::runtime::secrets::DIR_ENV,
            crate::runtime::secrets::CONTAINER_DIR.into(),
        );
    }
    for (k, v) in l.allot_env(SCRATCH) {
        join_env(&mut env, &k, v);
    }
    if let Some(dir) = &l.checkpoint_dir {
        let dir = container_path(dir, "checkpoint_dir")?;
        join_env(&mut env, "ALLOT_CHECKPOINT_DIR", dir);
        if let Some(latest) = i.restore_from {
            join_env(&mut env, "ALLOT_RESTORE_FROM", latest.to_owned());
        }
    }
    for kv in &i.edits.env {
        if let Some((k, v)) = kv.split_once('=') {
            join_env(&mut env, k, v.to_owned());
        }
    }
    if !l.inherit_fds.is_empty() {
        join_env(&mut env, allot_shim_core::LIMITS_FD_ENV, "3".into());
        join_env(&mut env, allot_shim_core::USAGE_FD_ENV, "4".into());
    }
    if let Some(shim) = &l.preload {
        // The job's own preloads, without the node's path of the shim.
        let host = shim.display().to_string();
        let theirs: Vec<String> = l
            .env
            .get("LD_PRELOAD")
            .map(|p| {
                p.split(':')
                    .filter(|x| !x.is_empty() && *x != host)
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default();
        let mut preload = vec![SHIM_PATH.to_owned()];
        preload.extend(theirs);
        join_env(&mut env, "LD_PRELOAD", preload.join(":"));
    }
    let (uid, gid) = i.user;
    let none = Capabilities::new();
    let caps = LinuxCapabilitiesBuilder::default()
        .bounding(none.clone())
        .effective(none.clone())
        .inheritable(none.clone())
        .permitted(none.clone())
        .ambient(none)
        .build()
        .map_err(|e| e.to_string())?;
    let process = ProcessBuilder::default()
        .terminal(false)
        .user(
            UserBuilder::default()
                .uid(uid)
                .gid(gid)
                .build()
                .map_err(|e| e.to_string())?,
        )
        .args(args)
        .env(
            env.iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>(),
        )
        .cwd(&cwd)
        .capabilities(caps)
        // Resource limits are the agent's own (a user namespace cannot raise them).
        .no_new_privileges(true)
        .build()
        .map_err(|e| e.to_string())?;

    // Mounts. Everything mounted over must exist in the (read-only) root first.
    let mut mounts = vec![
        mount("/proc", "proc", "proc", &["nosuid", "noexec", "nodev"]),
        mount(
            "/dev",
            "tmpfs",
            "tmpfs",
            &["nosuid", "strictatime", "mode=755", "size=65536k"],
        ),
        mount(
            "/dev/pts",
            "devpts",
            "devpts",
            &[
                "nosuid",
                "noexec",
                "newinstance",
                "ptmxmode=0666",
                "mode=0620",
            ],
        ),
        tmpfs("/dev/shm", i.cfg.shm_bytes, "1777", &["noexec"]),
        mount(
            "/dev/mqueue",
            "mqueue",
            "mqueue",
            &["nosuid", "noexec", "nodev"],
        ),
        // A user namespace may only bind /sys whole (its submounts are locked to it); the
        // host's cgroups below it are masked.
        mount(
            "/sys",
            "bind",
            "/sys",
            &["rbind", "nosuid", "noexec", "nodev", "ro"],
        ),
        tmpfs("/tmp", i.cfg.tmp_bytes, "1777", &[]),
        tmpfs(SCRATCH, i.cfg.scratch_bytes, "1777", &[]),
    ];
    if let Some(own) = &i.network {
        for (dest, file) in own.files {
            mounts.push(mount(
                dest,
                "bind",
                file,
                &["bind", "ro", "nosuid", "nodev", "noexec"],
            ));
        }
    } else if l.network == Network::Host {
        for f in ["/etc/resolv.conf", "/etc/hosts"] {
            if Path::new(f).is_file() {
                mounts.push(mount(
                    f,
                    "bind",
                    f,
                    &["bind", "ro", "nosuid", "nodev", "noexec"],
                ));
            }
        }
    }
    // The tenant's directory of each volume; never setuid programs or devices from there.
    for v in i.volumes {
        let dest = container_path(&v.path, "volume")?;
        let mut opts = vec!["rbind", "nosuid", "nodev"];
        if v.read_only {
            opts.push("ro");
        }
        mounts.push(mount(&dest, "bind", &v.host_dir, &opts));
    }
    if let Some(dir) = i.secrets_dir {
        mounts.push(mount(
            crate::runtime::secrets::CONTAINER_DIR,
            "bind",
            dir,
            &["bind", "ro", "nosuid", "nodev", "noexec"],
        ));
    }
    if let Some(shim) = &l.preload {
        mounts.push(mount(
            SHIM_PATH,
            "bind",
            shim,
            &["bind", "ro", "nosuid", "nodev"],
        ));
    }
    // Each assigned device node, bound from the node (a user namespace cannot make device
    // nodes), and the driver files its CDI spec names.
    for n in &i.edits.nodes {
        let dest = container_path(&n.container_path, "CDI device node")?;
        mounts.push(mount(
            &dest,
            "bind",
            &n.host_path,
            &["bind", "nosuid", "noexec"],
        ));
    }
    for m in &i.edits.mounts {
        let dest = container_path(&m.container_path, "CDI mount")?;
        let mut opts: Vec<&str> = m.options.iter().map(String::as_str).collect();
        if !opts.contains(&"bind") && !opts.contains(&"rbind") {
            opts.push("bind");
        }
        mounts.push(mount(&dest, "bind", &m.host_path, &opts));
    }
    // The init last: nothing of the job's is mounted over it, whatever its paths.
    mounts.push(mount(
        INIT_PATH,
        "bind",
        &i.cfg.init,
        &["bind", "ro", "nosuid", "nodev"],
    ));

    let mut namespaces = vec![
        LinuxNamespaceType::Pid,
        LinuxNamespaceType::Ipc,
        LinuxNamespaceType::Uts,
        LinuxNamespaceType::Mount,
        LinuxNamespaceType::User,
        LinuxNamespaceType::Cgroup,
    ];
    if l.network != Network::Host {
        namespaces.push(LinuxNamespaceType::Network);
    }
    let namespaces = namespaces
        .into_iter()
        .map(|t| {
            let b = LinuxNamespaceBuilder::default().typ(t);
            // Its own network is the namespace the agent made (the host's user namespace
            // owns it: nothing in the container can change it); `none` a new, empty one.
            match (&i.network, t) {
                (Some(own), LinuxNamespaceType::Network) => b.path(own.namespace.clone()),
                _ => b,
            }
            .build()
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    if l.network == Network::Private && i.network.is_none() {
        return Err("the job's own network was not set up".into());
    }
    let mapping = LinuxIdMappingBuilder::default()
        .container_id(0u32)
        .host_id(i.uid_base)
        .size(Tenant::UID_RANGE)
        .build()
        .map_err(|e| e.to_string())?;

    // Devices: none but the defaults the runtime always allows (null, zero, …) and the
    // job's own.
    let mut devices = vec![
        LinuxDeviceCgroupBuilder::default()
            .allow(false)
            .access("rwm")
            .build()
            .map_err(|e| e.to_string())?,
    ];
    for n in &i.edits.nodes {
        devices.push(
            LinuxDeviceCgroupBuilder::default()
                .allow(true)
                .typ(if n.kind == 'b' {
                    LinuxDeviceType::B
                } else {
                    LinuxDeviceType::C
                })
                .major(n.major)
                .minor(n.minor)
                .access(n.access.clone())
                .build()
                .map_err(|e| e.to_string())?,
        );
    }
    let mut resources = LinuxResourcesBuilder::default().devices(devices).pids(
        LinuxPidsBuilder::default()
            .limit(i.cfg.pids_limit)
            .build()
            .map_err(|e| e.to_string())?,
    );
    if l.memory_bytes > 0 {
        let limit = i64::try_from(l.memory_bytes).unwrap_or(i64::MAX);
        resources = resources.memory(
            LinuxMemoryBuilder::default()
                .limit(limit)
                // No swap beyond the limit.
                .swap(limit)
                .build()
                .map_err(|e| e.to_string())?,
        );
    }
    // Its weight under contention follows its request (`cpu.shares`, which the runtime
    // converts to `cpu.weight` on cgroup v2), and its quota caps it at the request.
    let mut cpu = LinuxCpuBuilder::default().shares(cpu_shares(l.cpu_milli));
    if l.cpu_milli > 0 {
        let quota = u64::from(l.cpu_milli) * CPU_PERIOD_US / 1000;
        cpu = cpu
            .quota(i64::try_from(quota.max(1000)).unwrap_or(i64::MAX))
            .period(CPU_PERIOD_US);
    }
    resources = resources.cpu(cpu.build().map_err(|e| e.to_string())?);
    let strings = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    let mut linux = LinuxBuilder::default()
        .namespaces(namespaces)
        .uid_mappings(vec![mapping])
        .gid_mappings(vec![mapping])
        .cgroups_path(PathBuf::from(i.cgroup))
        .resources(resources.build().map_err(|e| e.to_string())?)
        .masked_paths(strings(&[
            "/proc/acpi",
            "/proc/asound",
            "/proc/kcore",
            "/proc/keys",
            "/proc/latency_stats",
            "/proc/timer_list",
            "/proc/timer_stats",
            "/proc/sched_debug",
            "/proc/scsi",
            "/sys/firmware",
            "/sys/devices/virtual/powercap",
            "/sys/fs/cgroup",
        ]))
        .readonly_paths(strings(&[
            "/proc/bus",
            "/proc/fs",
            "/proc/irq",
            "/proc/sys",
            "/proc/sysrq-trigger",
        ]));
    if let Some(profile) = super::seccomp::default_profile() {
        linux = linux.seccomp(profile);
    }
    let mut spec = SpecBuilder::default()
        .version("1.0.2")
        .hostname(HOSTNAME)
        .root(
            RootBuilder::default()
                .path(i.rootfs)
                .readonly(true)
                .build()
                .map_err(|e| e.to_string())?,
        )
        .process(process)
        .mounts(mounts)
        .linux(linux.build().map_err(|e| e.to_string())?);
    if !i.edits.hooks.is_empty() {
        let mut create_runtime = Vec::new();
        let mut create_container = Vec::new();
        let mut start_container = Vec::new();
        let mut poststart = Vec::new();
        let mut poststop = Vec::new();
        for h in &i.edits.hooks {
            let mut b = HookBuilder::default().path(&h.path);
            if !h.args.is_empty() {
                b = b.args(h.args.clone());
            }
            if !h.env.is_empty() {
                b = b.env(h.env.clone());
            }
            if let Some(t) = h.timeout {
                b = b.timeout(t);
            }
            let hook = b.build().map_err(|e| e.to_string())?;
            match h.hook_name.as_str() {
                "prestart" | "createRuntime" => create_runtime.push(hook),
                "createContainer" => create_container.push(hook),
                "startContainer" => start_container.push(hook),
                "poststart" => poststart.push(hook),
                "poststop" => poststop.push(hook),
                other => return Err(format!("CDI hook `{other}` is not an OCI hook")),
            }
        }
        spec = spec.hooks(
            HooksBuilder::default()
                .create_runtime(create_runtime)
                .create_container(create_container)
                .start_container(start_container)
                .poststart(poststart)
                .poststop(poststop)
                .build()
                .map_err(|e| e.to_string())?,
        );
    }
    spec.build().map_err(|e| e.to_string())
}
