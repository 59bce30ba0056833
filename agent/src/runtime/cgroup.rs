//! The cgroups of an agent's containers: which hierarchy the host has (the unified v2 one,
//! or v1 controllers, as on hybrid hosts), the parent cgroup every container of the agent
//! is made under and what all of them together may use (memory less what is reserved for
//! the agent and the system, as kubelet's system-reserved; a pids limit below the kernel's
//! `pid_max`), a container's CPU weight from its CPU request (as Kubernetes and runc convert
//! it), a container's CPU and memory use and OOM kills, and which container a process
//! belongs to. The runtime (`runc`) creates, limits and removes each container's cgroup;
//! the agent limits the parent, reads the rest, and on start kills what is left in the ones
//! an earlier run of it left behind.

use std::path::{Path, PathBuf};

/// The cgroup layout of this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hierarchy {
    /// cgroup v2 with its controllers, mounted here (usually `/sys/fs/cgroup`).
    Unified(PathBuf),
    /// cgroup v1: each controller's mount (`/sys/fs/cgroup/<controller>`); a v2 mount
    /// without controllers beside them (hybrid) is ignored.
    Legacy(PathBuf),
}

impl Hierarchy {
    /// The host's layout, read from `/sys/fs/cgroup`.
    pub fn detect() -> Self {
        Self::detect_at(Path::new("/sys/fs/cgroup"))
    }

    pub fn detect_at(root: &Path) -> Self {
        let controllers = std::fs::read_to_string(root.join("cgroup.controllers"))
            .unwrap_or_default()
            .split_whitespace()
            .map(str::to_owned)
            .collect::<Vec<_>>();
        if controllers.iter().any(|c| c == "memory") {
            Hierarchy::Unified(root.to_owned())
        } else {
            Hierarchy::Legacy(root.to_owned())
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Hierarchy::Unified(_) => "v2",
            Hierarchy::Legacy(_) => "v1",
        }
    }

    /// The directory of cgroup `path` (relative to the hierarchy's root) for `controller`.
    fn dir(&self, controller: &str, path: &str) -> PathBuf {
        let rel = path.trim_start_matches('/');
        match self {
            Hierarchy::Unified(root) => root.join(rel),
            Hierarchy::Legacy(root) => root.join(controller).join(rel),
        }
    }

    /// How many times the OOM killer killed a process of this cgroup.
    pub fn oom_kills(&self, path: &str) -> u64 {
        let (file, key) = match self {
            Hierarchy::Unified(_) => ("memory.events", "oom_kill"),
            Hierarchy::Legacy(_) => ("memory.oom_control", "oom_kill"),
        };
        read_key(&self.dir("memory", path).join(file), key).unwrap_or(0)
    }

    /// CPU time its processes used, in nanoseconds.
    pub fn cpu_usage_ns(&self, path: &str) -> Option<u64> {
        match self {
            Hierarchy::Unified(_) => {
                read_key(&self.dir("cpu", path).join("cpu.stat"), "usage_usec").map(|u| u * 1000)
            }
            Hierarchy::Legacy(_) => read_number(&self.dir("cpuacct", path).join("cpuacct.usage")),
        }
    }

    /// Memory its processes hold now, in bytes.
    pub fn memory_bytes(&self, path: &str) -> Option<u64> {
        let file = match self {
            Hierarchy::Unified(_) => "memory.current",
            Hierarchy::Legacy(_) => "memory.usage_in_bytes",
        };
        read_number(&self.dir("memory", path).join(file))
    }

    /// The memory limit set on it, in bytes (`None`: none).
    pub fn memory_limit(&self, path: &str) -> Option<u64> {
        let file = match self {
            Hierarchy::Unified(_) => "memory.max",
            Hierarchy::Legacy(_) => "memory.limit_in_bytes",
        };
        // v1 reports "no limit" as a huge page-rounded number.
        read_number(&self.dir("memory", path).join(file)).filter(|l| *l < (1 << 62))
    }

    /// The pids of its processes (of its whole subtree).
    pub fn pids(&self, path: &str) -> Vec<u32> {
        let mut out = Vec::new();
        collect_pids(&self.dir("pids", path), &mut out);
        out
    }

    /// The cgroups directly below `parent` (their paths).
    pub fn children(&self, parent: &str) -> Vec<String> {
        let dir = self.dir("pids", parent);
        let Ok(entries) = std::fs::read_dir(dir) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .filter_map(|e| e.file_name().to_str().map(|n| format!("{parent}/{n}")))
            .collect()
    }

    /// Kills every process in cgroup `path` and removes it (in each v1 controller).
    /// Returns how many processes it killed.
    pub fn kill_and_remove(&self, path: &str) -> usize {
        let mut killed = 0;
        for _ in 0..50 {
            let pids = self.pids(path);
            if pids.is_empty() {
                break;
            }
            for pid in pids {
                if let Ok(raw) = i32::try_from(pid) {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(raw),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                    killed += 1;
                }
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let dirs: Vec<PathBuf> = match self {
            Hierarchy::Unified(_) => vec![self.dir("", path)],
            Hierarchy::Legacy(root) => std::fs::read_dir(root)
                .map(|entries| {
                    entries
                        .flatten()
                        .map(|e| e.path().join(path.trim_start_matches('/')))
                        .collect()
                })
                .unwrap_or_default(),
        };
        for dir in dirs {
            remove_tree(&dir);
        }
        killed
    }
}

/// The smallest and largest CPU shares cgroup v1 takes (`cpu.shares`).
pub const MIN_SHARES: u64 = 2;
pub const MAX_SHARES: u64 = 262_144;

/// A job's CPU weight on cgroup v1 (`cpu.shares`) from its CPU request: 1024 per CPU, at
/// least 2 (what a job reserving no CPU gets), as Kubernetes' `MilliCPUToShares`.
pub fn cpu_shares(cpu_milli: u32) -> u64 {
    (u64::from(cpu_milli) * 1024 / 1000).clamp(MIN_SHARES, MAX_SHARES)
}

/// The cgroup v2 `cpu.weight` (1 to 10000) of v1 shares, as runc and Kubernetes convert
/// them: 2 shares is weight 1, 262144 is 10000, 1024 (one CPU) is 39.
pub fn cpu_weight(shares: u64) -> u64 {
    let shares = shares.clamp(MIN_SHARES, MAX_SHARES);
    1 + (shares - 2) * 9999 / 262_142
}

/// The kernel's most process ids (`/proc/sys/kernel/pid_max`).
pub fn pid_max() -> Option<i64> {
    std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The processes all of an agent's jobs together may have when the operator sets no
/// number: `pid_max` less an eighth of it (at least 1024) for the agent and the system.
pub fn default_jobs_pids(pid_max: i64) -> i64 {
    pid_max - (pid_max / 8).max(1024).min(pid_max / 2)
}

/// What all of an agent's containers together may use: the limits of their parent cgroup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParentLimits {
    /// The node's memory less what is reserved for the agent and the system.
    pub memory_bytes: u64,
    /// Processes and threads of every job together, below `pid_max`.
    pub pids: i64,
}

impl Hierarchy {
    /// Creates cgroup `path` (the parent of an agent's containers) with `limits` on it, in
    /// the memory and pids controllers (v1), or with those controllers enabled for the
    /// levels down to it and below it (v2).
    pub fn limit_parent(&self, path: &str, limits: &ParentLimits) -> Result<(), String> {
        let rel = path.trim_start_matches('/');
        let write = |file: PathBuf, value: String| {
            std::fs::write(&file, &value)
                .map_err(|e| format!("writing {value} to {}: {e}", file.display()))
        };
        let mkdir = |dir: &Path| {
            std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))
        };
        match self {
            Hierarchy::Legacy(root) => {
                let memory = root.join("memory").join(rel);
                mkdir(&memory)?;
                write(
                    memory.join("memory.limit_in_bytes"),
                    limits.memory_bytes.to_string(),
                )?;
                let pids = root.join("pids").join(rel);
                mkdir(&pids)?;
                write(pids.join("pids.max"), limits.pids.to_string())
            }
            Hierarchy::Unified(root) => {
                // Each level hands the controllers down to the next (a level with
                // processes of its own cannot: the agent's levels have none).
                let mut dir = root.clone();
                let levels: Vec<&str> = rel.split('/').filter(|c| !c.is_empty()).collect();
                for (i, level) in levels.iter().enumerate() {
                    enable_controllers(&dir, i > 0)?;
                    dir = dir.join(level);
                    mkdir(&dir)?;
                }
                enable_controllers(&dir, true)?;
                write(dir.join("memory.max"), limits.memory_bytes.to_string())?;
                write(dir.join("pids.max"), limits.pids.to_string())
            }
        }
    }

    /// The pids limit of cgroup `path` (`None`: none).
    pub fn pids_limit(&self, path: &str) -> Option<u64> {
        read_number(&self.dir("pids", path).join("pids.max"))
    }

    /// The CPU weight set on cgroup `path`: `cpu.shares` (v1) or `cpu.weight` (v2).
    pub fn cpu_weight(&self, path: &str) -> Option<u64> {
        let file = match self {
            Hierarchy::Unified(_) => "cpu.weight",
            Hierarchy::Legacy(_) => "cpu.shares",
        };
        read_number(&self.dir("cpu", path).join(file))
    }

    /// The CPU quota of cgroup `path` per period, in µs (`None`: unlimited).
    pub fn cpu_quota(&self, path: &str) -> Option<(u64, u64)> {
        match self {
            Hierarchy::Unified(_) => {
                let text = std::fs::read_to_string(self.dir("cpu", path).join("cpu.max")).ok()?;
                let (quota, period) = text.trim().split_once(' ')?;
                Some((quota.parse().ok()?, period.parse().ok()?))
            }
            Hierarchy::Legacy(_) => {
                let dir = self.dir("cpu", path);
                let quota = std::fs::read_to_string(dir.join("cpu.cfs_quota_us")).ok()?;
                let quota: u64 = quota.trim().parse().ok()?;
                Some((quota, read_number(&dir.join("cpu.cfs_period_us"))?))
            }
        }
    }
}

/// Enables the memory, pids and CPU controllers for the cgroups below `dir` (v2), of those
/// it has. At the root a host's manager (systemd) usually did so already; failing there is
/// an error only when memory or pids end up unavailable below.
fn enable_controllers(dir: &Path, required: bool) -> Result<(), String> {
    let have = std::fs::read_to_string(dir.join("cgroup.controllers")).unwrap_or_default();
    let wanted: Vec<String> = ["cpu", "memory", "pids"]
        .into_iter()
        .filter(|c| have.split_whitespace().any(|h| h == *c))
        .map(|c| format!("+{c}"))
        .collect();
    for c in ["memory", "pids"] {
        if required && !have.split_whitespace().any(|h| h == c) {
            return Err(format!(
                "{} lacks the {c} controller (cgroup.controllers: `{}`)",
                dir.display(),
                have.trim()
            ));
        }
    }
    let file = dir.join("cgroup.subtree_control");
    let enabled = std::fs::read_to_string(&file).unwrap_or_default();
    let missing: Vec<&String> = wanted
        .iter()
        .filter(|w| !enabled.split_whitespace().any(|e| e == &w[1..]))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let line = missing
        .iter()
        .map(|m| m.as_str())
        .collect::<Vec<_>>()
        .join(" ");
    match std::fs::write(&file, &line) {
        Ok(()) => Ok(()),
        Err(_) if !required => Ok(()),
        Err(e) => Err(format!("writing `{line}` to {}: {e}", file.display())),
    }
}

/// Whether process `pid` is in cgroup `path` (or below it), in any hierarchy.
pub fn in_cgroup(pid: u32, path: &str) -> bool {
    let want = format!("/{}", path.trim_start_matches('/'));
    cgroup_paths(pid)
        .iter()
        .any(|p| *p == want || p.starts_with(&format!("{want}/")))
}

/// Whether process `pid` runs in a container of an Allot agent.
pub fn in_any_container(pid: u32) -> bool {
    cgroup_paths(pid).iter().any(|p| p.starts_with("/allot/"))
}

/// The cgroup paths of a process (`hierarchy-id:controllers:path` lines).
fn cgroup_paths(pid: u32) -> Vec<String> {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.splitn(3, ':').nth(2).map(str::to_owned))
        .collect()
}

fn collect_pids(dir: &Path, out: &mut Vec<u32>) {
    if let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs")) {
        out.extend(procs.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
    }
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                collect_pids(&e.path(), out);
            }
        }
    }
}

/// Removes a cgroup directory and its children, deepest first (cgroup directories are
/// removed with rmdir, never by deleting their files).
fn remove_tree(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_tree(&e.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

fn read_number(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// `key value` lines (`memory.events`, `memory.oom_control`, `cpu.stat`).
fn read_key(path: &Path, key: &str) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_layouts_are_read() {
        let dir = tempfile::tempdir().expect("temp dir");
        let root = dir.path();
        assert_eq!(Hierarchy::detect_at(root), Hierarchy::Legacy(root.into()));
        std::fs::create_dir_all(root.join("memory/allot/c1")).expect("mkdir");
        std::fs::write(
            root.join("memory/allot/c1/memory.oom_control"),
            "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
        )
        .expect("write");
        let v1 = Hierarchy::detect_at(root);
        assert_eq!(v1.oom_kills("/allot/c1"), 2);
        std::fs::write(root.join("cgroup.controllers"), "cpu io memory pids").expect("write");
        let v2 = Hierarchy::detect_at(root);
        assert_eq!(v2.name(), "v2");
        std::fs::create_dir_all(root.join("allot/c1")).expect("mkdir");
        std::fs::write(
            root.join("allot/c1/memory.events"),
            "low 0\nhigh 0\nmax 4\noom 1\noom_kill 1\n",
        )
        .expect("write");
        std::fs::write(
            root.join("allot/c1/cpu.stat"),
            "usage_usec 1500\nuser_usec 1000\n",
        )
        .expect("write");
        assert_eq!(v2.oom_kills("allot/c1"), 1);
        assert_eq!(v2.cpu_usage_ns("allot/c1"), Some(1_500_000));
    }

    #[test]
    fn cpu_weight_follows_the_request_as_kubernetes_and_runc_convert_it() {
        // (milli, v1 shares, v2 weight)
        for (milli, shares, weight) in [
            (0, 2, 1),
            (1, 2, 1),
            (100, 102, 4),
            (500, 512, 20),
            (1000, 1024, 39),
            (1500, 1536, 59),
            (4000, 4096, 157),
            (256_000, 262_144, 10_000),
            (1_000_000, 262_144, 10_000),
        ] {
            assert_eq!(cpu_shares(milli), shares, "{milli} milli");
            assert_eq!(cpu_weight(shares), weight, "{shares} shares");
        }
        assert!(cpu_weight(cpu_shares(1500)) > cpu_weight(cpu_shares(1000)));
    }

    #[test]
    fn the_jobs_pids_stay_below_pid_max() {
        for pid_max in [4096, 32_768, 4_194_304] {
            let jobs = default_jobs_pids(pid_max);
            assert!(jobs < pid_max && jobs >= pid_max / 2, "{pid_max}: {jobs}");
        }
        assert_eq!(default_jobs_pids(32_768), 28_672);
    }

    /// The v2 parent, on a directory laid out as a v2 hierarchy: the controllers handed
    /// down to each level and the limits written where the kernel reads them.
    #[test]
    fn the_parent_is_limited_on_v2() {
        let dir = tempfile::tempdir().expect("temp dir");
        let root = dir.path();
        let all = "cpuset cpu io memory hugetlb pids";
        std::fs::write(root.join("cgroup.controllers"), all).expect("write");
        std::fs::write(root.join("cgroup.subtree_control"), "memory").expect("write");
        // The kernel fills these in for a new cgroup; a plain directory does not.
        for level in ["allot", "allot/node-1"] {
            std::fs::create_dir_all(root.join(level)).expect("mkdir");
            std::fs::write(root.join(level).join("cgroup.controllers"), all).expect("write");
        }
        let v2 = Hierarchy::detect_at(root);
        let limits = ParentLimits {
            memory_bytes: 30 << 30,
            pids: 28_672,
        };
        v2.limit_parent("/allot/node-1", &limits).expect("limited");
        let read = |p: &str| std::fs::read_to_string(root.join(p)).expect(p);
        assert_eq!(read("cgroup.subtree_control"), "+cpu +pids");
        assert_eq!(read("allot/cgroup.subtree_control"), "+cpu +memory +pids");
        assert_eq!(
            read("allot/node-1/cgroup.subtree_control"),
            "+cpu +memory +pids"
        );
        assert_eq!(read("allot/node-1/memory.max"), (30u64 << 30).to_string());
        assert_eq!(v2.pids_limit("/allot/node-1"), Some(28_672));
        // A level without the memory controller cannot hold the jobs' memory: refused.
        std::fs::write(root.join("allot/cgroup.controllers"), "cpu pids").expect("write");
        let err = v2
            .limit_parent("/allot/node-1", &limits)
            .expect_err("no memory controller");
        assert!(err.contains("memory controller"), "{err}");
    }

    #[test]
    fn the_parent_is_limited_on_v1() {
        let dir = tempfile::tempdir().expect("temp dir");
        let v1 = Hierarchy::detect_at(dir.path());
        let limits = ParentLimits {
            memory_bytes: 1 << 30,
            pids: 1000,
        };
        v1.limit_parent("/allot/node-1", &limits).expect("limited");
        assert_eq!(v1.memory_limit("/allot/node-1"), Some(1 << 30));
        assert_eq!(v1.pids_limit("/allot/node-1"), Some(1000));
    }
}
