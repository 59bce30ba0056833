//! Reading the cgroups the OCI runtime makes for each container: which hierarchy the host
//! has (the unified v2 one, or v1 controllers, as on hybrid hosts), a container's CPU and
//! memory use and OOM kills, and which container a process belongs to. The runtime (`runc`)
//! creates, limits and removes the cgroups; the agent only reads them, and on start kills
//! what is left in the ones an earlier run of it left behind.

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
}
