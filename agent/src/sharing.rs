//! GPU sharing on this node: the limits region each job on shares of GPUs gets, the shim
//! (`liballot_shim.so`) preloaded into it, and the checks that back the shim up.
//!
//! - Before a shared job starts, the agent creates its region (memory limit, compute share
//!   and mode per GPU, sealed against the job) and has the job inherit it.
//! - While it runs, the agent tells each job's shim whether another job on the same GPU is
//!   launching work (what elastic jobs yield to), returns the budget of processes that died,
//!   and applies resizes.
//! - Second line of defence: the agent compares the GPU memory the driver says each
//!   process holds with its job's limit, and kills a job that is over it (a statically
//!   linked binary, a process that dropped `LD_PRELOAD`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use allot_shim_core::{ComputeMode, GpuGrant, JobRegion};

use crate::gpu::GpuInfo;
use crate::runtime::Tracker;

/// The shim's file name.
pub const SHIM_FILE: &str = "liballot_shim.so";

/// How this node enforces GPU sharing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharingConfig {
    /// The shim preloaded into shared jobs; `None`: jobs get their limits region but run
    /// without the shim (simulated GPUs, where nothing would call CUDA).
    pub shim_library: Option<PathBuf>,
    /// GPU memory charged for each process's CUDA context on each GPU it uses.
    pub context_reserve_bytes: u64,
    /// Refuse shared jobs when there is no shim (real GPUs: a share nobody enforces is no
    /// share).
    pub require_shim: bool,
}

impl Default for SharingConfig {
    fn default() -> Self {
        SharingConfig {
            shim_library: None,
            context_reserve_bytes: 512 << 20,
            require_shim: false,
        }
    }
}

impl SharingConfig {
    /// Where the shim is installed: next to the agent's executable, else the packaged
    /// location.
    pub fn discover_shim() -> Option<PathBuf> {
        let beside = std::env::current_exe()
            .ok()
            .and_then(|exe| exe.parent().map(|d| d.join(SHIM_FILE)));
        beside
            .into_iter()
            .chain([
                PathBuf::from("/usr/lib/allot").join(SHIM_FILE),
                PathBuf::from("/usr/local/lib/allot").join(SHIM_FILE),
            ])
            .find(|p| p.is_file())
    }
}

/// What a job on shares of GPUs runs under.
#[derive(Debug)]
pub struct JobSharing {
    pub region: JobRegion,
    /// The job's GPUs, in the region's order.
    pub gpus: Vec<String>,
    /// Each GPU's memory, to turn a share into bytes on resize.
    totals: Vec<u64>,
    pub preload: Option<PathBuf>,
    /// The shim's counts when last read.
    counts: std::sync::Mutex<Option<Counts>>,
    /// Best-effort work: paced, while others launch, to what they leave of each GPU.
    pub best_effort: bool,
    /// Its kernels' busy time on each GPU when contention was last set, and when.
    own_busy: std::sync::Mutex<Option<(u64, Vec<u64>)>>,
}

/// The shim's counts of a job (ns, all its GPUs together), and when they were read.
#[derive(Debug, Clone, Copy)]
struct Counts {
    busy: u64,
    measured: u64,
    held: u64,
    at: std::time::Instant,
}

/// A job's share of its GPUs, as the launch (or a resize) gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Share {
    /// Of each GPU, in milli.
    pub gpu_milli: u32,
    /// Held on each GPU; 0: the share of the GPU's memory.
    pub gpu_memory_bytes: u64,
}

impl Share {
    /// What it holds of a GPU of `total` bytes (never more than the GPU has).
    fn memory_on(self, total: u64) -> u64 {
        allot_domain::Share {
            gpu_milli: self.gpu_milli.min(1000),
            gpu_memory_bytes: self.gpu_memory_bytes,
        }
        .memory_on(total)
        .min(total)
    }
}

/// The sharing setup for a job, or `None` when it holds whole GPUs (or a MIG instance,
/// which the hardware isolates).
pub fn prepare(
    cfg: &SharingConfig,
    job_id: &str,
    gpus: &[String],
    share: Share,
    compute: &str,
    inventory: &[GpuInfo],
) -> Result<Option<JobSharing>, String> {
    if share.gpu_milli >= 1000 || gpus.is_empty() || gpus.iter().any(|g| g.starts_with("MIG-")) {
        return Ok(None);
    }
    if cfg.require_shim && cfg.shim_library.is_none() {
        return Err(format!(
            "this node has no {SHIM_FILE} to enforce GPU shares (agent flag --shim-library)"
        ));
    }
    let mode = match compute {
        // A best-effort job holds the least share there is, elastically: on a saturated GPU
        // that others want it is held to that thousandth; otherwise it runs on what is idle.
        "elastic" | "best_effort" => ComputeMode::Elastic,
        "" | "strict" => ComputeMode::Strict,
        other => return Err(format!("unknown GPU compute mode `{other}`")),
    };
    let mut grants = Vec::new();
    let mut totals = Vec::new();
    for uuid in gpus {
        let total = inventory
            .iter()
            .find(|g| &g.uuid == uuid)
            .map(|g| g.memory_bytes)
            .ok_or_else(|| format!("GPU {uuid} is not on this node"))?;
        grants.push(GpuGrant {
            uuid: uuid.clone(),
            memory_limit: share.memory_on(total),
            compute_milli: share.gpu_milli,
            mode,
        });
        totals.push(total);
    }
    let region = JobRegion::create(job_id, &grants, cfg.context_reserve_bytes)
        .map_err(|e| format!("cannot create the job's GPU limits: {e}"))?;
    Ok(Some(JobSharing {
        region,
        gpus: gpus.to_vec(),
        totals,
        preload: cfg.shim_library.clone(),
        counts: std::sync::Mutex::new(None),
        best_effort: compute == "best_effort",
        own_busy: std::sync::Mutex::new(None),
    }))
}

impl JobSharing {
    /// What the job's kernels used of its GPUs' time, and how long its launches waited for
    /// its share, since the last call (each a share of the time since, averaged over its
    /// GPUs), as its shim counted them; `None` the first time. Busy time is over the time
    /// its shim measured it (its control periods, which run while it launches work); a job
    /// that launched nothing since, or never made a CUDA context, used none.
    pub fn busy_and_held_back(&self) -> Option<(f64, f64)> {
        let gpus = 0..self.gpus.len();
        let busy: u64 = gpus.clone().map(|i| self.region.busy_ns(i)).sum();
        let measured: u64 = gpus.clone().map(|i| self.region.measured_ns(i)).sum();
        let held: u64 = gpus.map(|i| self.region.held_back_ns(i)).sum();
        let now = std::time::Instant::now();
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let last = counts.replace(Counts {
            busy,
            measured,
            held,
            at: now,
        });
        let last = last?;
        let over = measured.saturating_sub(last.measured);
        let wall = now.saturating_duration_since(last.at).as_nanos() as f64
            * self.gpus.len().max(1) as f64;
        if wall <= 0.0 {
            return None;
        }
        let busy = if over == 0 {
            0.0
        } else {
            (busy.saturating_sub(last.busy) as f64 / over as f64).clamp(0.0, 1.0)
        };
        let held = (held.saturating_sub(last.held) as f64 / wall).clamp(0.0, 1.0);
        Some((busy, held))
    }

    /// The environment the job starts with: the region's descriptors, and the shim first in
    /// `LD_PRELOAD` (before any of the job's own).
    pub fn env(
        &self,
        job_env: &std::collections::BTreeMap<String, String>,
    ) -> Vec<(String, String)> {
        let mut env: Vec<(String, String)> = self
            .region
            .env()
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect();
        if let Some(shim) = &self.preload {
            let preload = match job_env.get("LD_PRELOAD").filter(|p| !p.is_empty()) {
                Some(theirs) => format!("{}:{theirs}", shim.display()),
                None => shim.display().to_string(),
            };
            env.push(("LD_PRELOAD".to_owned(), preload));
        }
        env
    }

    /// Descriptors the job must inherit.
    pub fn fds(&self) -> [i32; 2] {
        [self.region.limits_fd(), self.region.usage_fd()]
    }

    /// Applies a new share to every GPU of the job, at once.
    pub fn resize(&self, share: Share) {
        for (i, total) in self.totals.iter().enumerate() {
            self.region
                .resize(i, share.memory_on(*total), share.gpu_milli);
        }
    }

    /// The memory limit on `gpu`.
    pub fn limit_on(&self, gpu: &str) -> Option<u64> {
        let i = self.gpus.iter().position(|g| g == gpu)?;
        self.region.limits(i).map(|l| l.memory_limit())
    }

    /// The share of each GPU's time its kernels took since the last call (`now_ns` on the
    /// monotonic clock); `None` the first time.
    fn own_busy_since(&self, now_ns: u64) -> Option<Vec<f64>> {
        let busy: Vec<u64> = (0..self.gpus.len())
            .map(|i| self.region.busy_ns(i))
            .collect();
        let mut last = self.own_busy.lock().unwrap_or_else(|e| e.into_inner());
        let (at, before) = last.replace((now_ns, busy.clone()))?;
        let wall = now_ns.saturating_sub(at);
        (wall > 0).then(|| {
            busy.iter()
                .zip(&before)
                .map(|(b, a)| (b.saturating_sub(*a) as f64 / wall as f64).clamp(0.0, 1.0))
                .collect()
        })
    }

    fn last_launch_ns(&self, gpu: usize) -> u64 {
        self.region.usage(gpu).map_or(0, |u| {
            u.last_launch_ns.load(std::sync::atomic::Ordering::Relaxed)
        })
    }
}

/// Launches this recent (ns) mean a job wants its GPU.
pub const ACTIVE_WITHIN_NS: u64 = 1_000_000_000;

/// A GPU busy this much of the time has nothing idle to lend: elastic jobs on it are held
/// to their shares.
pub const SATURATED: f64 = 0.9;

/// Tells each job whether each of its GPUs is contended: another job holding a share on it
/// is launching work and the GPU is saturated by such jobs (`busy`, by UUID: the share of
/// the last interval it ran kernels, less best-effort work's; a GPU whose business is
/// unknown counts as saturated while others launch). An elastic job is held to its share
/// only then: while the GPU has time that is idle or best-effort work's, using it takes
/// nothing from anyone.
/// What best-effort work is paced to while others launch: this much of the GPU's time, less
/// what they used in the last interval (the rest is left for their next bursts, which the
/// pacing sees a quarter second late). On the efficiency replay (`docs/benchmarks.md`),
/// with services held to strict shares, 0.7 kept their p99.9 at 68 ms and 0.78 took it to
/// 364 ms; with auto-sized services (elastic, and held to their shares only against each
/// other) 0.75 keeps the GPUs hosting them above 70% busy.
pub const BEST_EFFORT_FILL: f64 = 0.75;

pub fn update_contention(jobs: &[&JobSharing], now_ns: u64, busy: &HashMap<String, f64>) {
    // Jobs launching on each GPU: all of them, and those that are not best-effort.
    let mut active: HashMap<&str, usize> = HashMap::new();
    let mut holding: HashMap<&str, usize> = HashMap::new();
    for job in jobs {
        for (i, gpu) in job.gpus.iter().enumerate() {
            if now_ns.saturating_sub(job.last_launch_ns(i)) < ACTIVE_WITHIN_NS {
                *active.entry(gpu.as_str()).or_default() += 1;
                if !job.best_effort {
                    *holding.entry(gpu.as_str()).or_default() += 1;
                }
            }
        }
    }
    // Best-effort work's own busy share of each of its GPUs in the last interval (read
    // once: reading it moves its mark), and all of it on each GPU.
    let own: Vec<Option<Vec<f64>>> = jobs
        .iter()
        .map(|j| j.best_effort.then(|| j.own_busy_since(now_ns)).flatten())
        .collect();
    let mut best_effort_busy: HashMap<&str, f64> = HashMap::new();
    for (job, own) in jobs.iter().zip(&own) {
        for (gpu, b) in job.gpus.iter().zip(own.iter().flatten()) {
            *best_effort_busy.entry(gpu.as_str()).or_default() += b;
        }
    }
    for job in jobs {
        if job.best_effort {
            continue;
        }
        for (i, gpu) in job.gpus.iter().enumerate() {
            let mine = usize::from(now_ns.saturating_sub(job.last_launch_ns(i)) < ACTIVE_WITHIN_NS);
            // An elastic share is held only against other jobs holding shares, on a GPU
            // they fill: best-effort work has no share to be protected (its time is not
            // counted against the GPU's idle time), and gives way by its own pacing.
            let others = holding.get(gpu.as_str()).copied().unwrap_or(0) - mine;
            let theirs = best_effort_busy.get(gpu.as_str()).copied().unwrap_or(0.0);
            let saturated = busy.get(gpu).is_none_or(|b| b - theirs >= SATURATED);
            job.region.set_contended(i, others > 0 && saturated);
        }
    }
    // Best-effort work runs on what the others leave: while they launch it is paced to
    // BEST_EFFORT_FILL less what they used (the GPU's busy time less its own); alone, or
    // on a GPU whose business is unknown, as before (free while alone, its least share
    // when others launch).
    for (job, own) in jobs.iter().zip(&own).filter(|(j, _)| j.best_effort) {
        for (i, gpu) in job.gpus.iter().enumerate() {
            let mine = usize::from(now_ns.saturating_sub(job.last_launch_ns(i)) < ACTIVE_WITHIN_NS);
            let others = active.get(gpu.as_str()).copied().unwrap_or(0) - mine;
            let Some(limits) = job.region.limits(i) else {
                continue;
            };
            let leave = match (busy.get(gpu), own.as_ref().and_then(|o| o.get(i))) {
                (Some(total), Some(mine)) => {
                    let theirs = (total - mine).max(0.0);
                    ((BEST_EFFORT_FILL - theirs) * 1000.0)
                        .round()
                        .clamp(1.0, 999.0) as u32
                }
                _ => allot_domain::BEST_EFFORT_MILLI,
            };
            if others > 0 {
                job.region.resize(i, limits.memory_limit(), leave);
            }
            job.region.set_contended(i, others > 0);
        }
    }
}

/// The process group of `pid`, from `/proc`.
fn process_group(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(2)?.parse().ok()
}

/// The job a process belongs to. A container's processes are its job's by their cgroup,
/// which nothing inside can leave. An unconfined process's job is the one whose process
/// group it is in or, for a process that left the group, the one its environment names
/// (only among unconfined jobs: a container cannot frame another job by its environment).
pub fn job_of(pid: u32, jobs: &[(String, Tracker)]) -> Option<&str> {
    for (id, tracker) in jobs {
        if let Tracker::Cgroup(path) = tracker
            && crate::runtime::cgroup::in_cgroup(pid, path)
        {
            return Some(id);
        }
    }
    if let Some(pgid) = process_group(pid)
        && let Some((id, _)) = jobs
            .iter()
            .find(|(_, t)| *t == Tracker::Group(pgid) && pgid != 0)
    {
        return Some(id);
    }
    if crate::runtime::cgroup::in_any_container(pid) {
        return None;
    }
    let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    environ.split(|b| *b == 0).find_map(|var| {
        let id = var.strip_prefix(b"ALLOT_JOB_ID=")?;
        jobs.iter()
            .find(|(j, t)| j.as_bytes() == id && matches!(t, Tracker::Group(_)))
            .map(|(j, _)| j.as_str())
    })
}

/// How far over its limit a job may appear before it is killed: the driver counts context
/// memory its own way, so allow 5% of the limit or 256 MiB, whichever is more.
pub fn tolerance(limit: u64) -> u64 {
    (limit / 20).max(256 << 20)
}

/// A job found holding more GPU memory than its limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Breach {
    pub job_id: String,
    pub gpu: String,
    pub used: u64,
    pub limit: u64,
}

impl Breach {
    pub fn message(&self) -> String {
        format!(
            "killed: its processes held {} of GPU memory on {}, over its {} limit (the driver's \
             count; the GPU-sharing shim was bypassed or unloaded)",
            allot_domain::format_bytes(self.used),
            self.gpu,
            allot_domain::format_bytes(self.limit)
        )
    }
}

/// Adds up, per job, what the driver says each process holds on `gpu`, and returns the
/// jobs over their limit.
pub fn breaches(
    gpu: &str,
    processes: &[(u32, u64)],
    owners: &[(String, Tracker)],
    limits: &HashMap<String, u64>,
) -> Vec<Breach> {
    let mut held: HashMap<&str, u64> = HashMap::new();
    for (pid, bytes) in processes {
        if let Some(job) = job_of(*pid, owners) {
            *held.entry(job).or_default() += bytes;
        }
    }
    let mut out: Vec<Breach> = held
        .into_iter()
        .filter_map(|(job, used)| {
            let limit = *limits.get(job)?;
            (used > limit.saturating_add(tolerance(limit))).then(|| Breach {
                job_id: job.to_owned(),
                gpu: gpu.to_owned(),
                used,
                limit,
            })
        })
        .collect();
    out.sort_by(|a, b| a.job_id.cmp(&b.job_id));
    out
}

/// Whether `path` names a loadable shim (a file).
pub fn check_shim(path: &Path) -> Result<(), String> {
    if path.is_file() {
        Ok(())
    } else {
        Err(format!("{} does not exist", path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(uuid: &str, memory: u64) -> GpuInfo {
        GpuInfo {
            uuid: uuid.into(),
            index: 0,
            model: "H200".into(),
            memory_bytes: memory,
            healthy: true,
            degraded: false,
            nvlink_domain: None,
        }
    }

    /// A job `id` holding `gpu_milli` and `gpu_memory_bytes` of GPU-a (the node's one GPU,
    /// 100 GiB, the default sharing configuration), held as `compute` says.
    fn on_gpu_a(id: &str, gpu_milli: u32, gpu_memory_bytes: u64, compute: &str) -> JobSharing {
        let share = Share {
            gpu_milli,
            gpu_memory_bytes,
        };
        let inv = [gpu("GPU-a", 100 << 30)];
        prepare(
            &SharingConfig::default(),
            id,
            &["GPU-a".to_owned()],
            share,
            compute,
            &inv,
        )
        .expect("ok")
        .expect("shared")
    }

    /// `j` launched a kernel at `at`.
    fn launched(j: &JobSharing, at: u64) {
        if let Some(u) = j.region.usage(0) {
            u.last_launch_ns
                .store(at, std::sync::atomic::Ordering::Relaxed);
        }
    }

    fn contended(j: &JobSharing) -> bool {
        j.region.limits(0).is_some_and(|l| l.contended())
    }

    /// GPU-a busy `b` of the time, as the driver says.
    fn busy(b: f64) -> HashMap<String, f64> {
        HashMap::from([("GPU-a".to_owned(), b)])
    }

    #[test]
    fn an_elastic_job_is_held_to_its_share_only_on_a_saturated_gpu_someone_else_wants() {
        let a = on_gpu_a("a", 300, 0, "elastic");
        let b = on_gpu_a("b", 300, 0, "elastic");
        let now = 10_000_000_000u64;
        // Both launching, the GPU half idle: nobody is held back.
        launched(&a, now - 1_000);
        launched(&b, now - 1_000);
        update_contention(&[&a, &b], now, &busy(0.5));
        assert!(!contended(&a) && !contended(&b));
        // Saturated: both are held to their shares.
        update_contention(&[&a, &b], now, &busy(0.95));
        assert!(contended(&a) && contended(&b));
        // Saturated by one alone (the other idle for over a second): it takes all.
        launched(&b, now - 2 * ACTIVE_WITHIN_NS);
        update_contention(&[&a, &b], now, &busy(1.0));
        assert!(!contended(&a), "nobody else wants the GPU");
        assert!(contended(&b), "b yields to a if it launches again");
        // Where the driver cannot say how busy the GPU is, another's launches are enough.
        launched(&b, now - 1_000);
        update_contention(&[&a, &b], now, &HashMap::new());
        assert!(contended(&a) && contended(&b));
        // Best-effort work launching beside it, the GPU saturated: a holds no share against
        // it (best-effort work gives way by its own pacing); against b it does.
        let be = on_gpu_a("be", allot_domain::BEST_EFFORT_MILLI, 0, "best_effort");
        launched(&be, now - 1_000);
        launched(&b, now - 2 * ACTIVE_WITHIN_NS);
        update_contention(&[&a, &b, &be], now, &busy(1.0));
        assert!(!contended(&a), "only best-effort work beside it");
        launched(&b, now - 1_000);
        update_contention(&[&a, &b, &be], now, &busy(1.0));
        assert!(contended(&a), "b holds a share beside it");
    }

    #[test]
    fn best_effort_work_is_paced_to_what_the_others_leave() {
        use std::sync::atomic::Ordering::Relaxed;
        let service = on_gpu_a("svc", 300, 0, "strict");
        let be = on_gpu_a(
            "be",
            allot_domain::BEST_EFFORT_MILLI,
            8 << 30,
            "best_effort",
        );
        let limits = |j: &JobSharing| {
            j.region
                .limits(0)
                .map(|l| (l.compute_milli(), l.contended()))
        };
        let (s, usage) = (1_000_000_000u64, be.region.usage(0).expect("usage"));
        let mut now = 10 * s;
        // Alone: it runs free.
        usage.last_launch_ns.store(now - 1_000, Relaxed);
        update_contention(&[&service, &be], now, &busy(1.0));
        assert_eq!(limits(&be), Some((1, false)));
        // The service launches; in the last second the GPU was 90% busy, 60% of it the
        // best-effort job's own: it is paced to BEST_EFFORT_FILL less the service's 30%.
        now += s;
        usage.last_launch_ns.store(now - 1_000, Relaxed);
        usage.busy_ns.fetch_add(600_000_000, Relaxed);
        if let Some(u) = service.region.usage(0) {
            u.last_launch_ns.store(now - 1_000, Relaxed);
        }
        update_contention(&[&service, &be], now, &busy(0.9));
        let left = ((BEST_EFFORT_FILL - 0.3) * 1000.0).round() as u32;
        assert_eq!(limits(&be), Some((left, true)));
        // The service bursts to 80%: nothing is left but the least share.
        let launch = |now: u64| {
            for j in [&service, &be] {
                if let Some(u) = j.region.usage(0) {
                    u.last_launch_ns.store(now - 1_000, Relaxed);
                }
            }
        };
        now += s;
        launch(now);
        usage.busy_ns.fetch_add(150_000_000, Relaxed);
        update_contention(&[&service, &be], now, &busy(0.95));
        assert_eq!(limits(&be), Some((1, true)));
        // It calms to 20%: the best-effort job grows back.
        now += s;
        launch(now);
        usage.busy_ns.fetch_add(100_000_000, Relaxed);
        update_contention(&[&service, &be], now, &busy(0.3));
        let left = ((BEST_EFFORT_FILL - 0.2) * 1000.0).round() as u32;
        assert_eq!(limits(&be), Some((left, true)));
        // The service's own limits are not touched (negative control: strict at its share).
        assert_eq!(
            service.region.limits(0).map(|l| l.compute_milli()),
            Some(300)
        );
    }

    #[test]
    fn elastic_shares_hold_against_each_other_not_against_best_effort_time() {
        use std::sync::atomic::Ordering::Relaxed;
        let a = on_gpu_a("a", 300, 0, "elastic");
        let b = on_gpu_a("b", 300, 0, "elastic");
        let be = on_gpu_a("be", allot_domain::BEST_EFFORT_MILLI, 0, "best_effort");
        let s = 1_000_000_000u64;
        let mut now = 10 * s;
        let launch = |now: u64| {
            for j in [&a, &b, &be] {
                if let Some(u) = j.region.usage(0) {
                    u.last_launch_ns.store(now - 1_000, Relaxed);
                }
            }
        };
        launch(now);
        update_contention(&[&a, &b, &be], now, &busy(1.0));
        // The next second: the GPU full, half of it the best-effort job's own kernels.
        now += s;
        launch(now);
        if let Some(u) = be.region.usage(0) {
            u.busy_ns.fetch_add(s / 2, Relaxed);
        }
        update_contention(&[&a, &b, &be], now, &busy(1.0));
        assert!(
            !contended(&a) && !contended(&b),
            "the services fill half of it: nobody holds them to their shares"
        );
        // The next: full, the best-effort job idle: the services fill it.
        now += s;
        launch(now);
        update_contention(&[&a, &b, &be], now, &busy(1.0));
        assert!(contended(&a) && contended(&b));
    }

    #[test]
    fn only_shares_get_a_region_and_limits_follow_the_share() {
        let cfg = SharingConfig::default();
        let inv = [gpu("GPU-a", 100 << 30)];
        let whole = Share {
            gpu_milli: 1000,
            gpu_memory_bytes: 0,
        };
        let gpus = vec!["GPU-a".to_owned()];
        assert!(
            prepare(&cfg, "j", &gpus, whole, "", &inv)
                .expect("ok")
                .is_none()
        );
        let mig = vec!["MIG-x".to_owned()];
        let third = Share {
            gpu_milli: 300,
            gpu_memory_bytes: 0,
        };
        assert!(
            prepare(&cfg, "j", &mig, third, "", &inv)
                .expect("ok")
                .is_none()
        );
        let s = prepare(&cfg, "j", &gpus, third, "elastic", &inv)
            .expect("ok")
            .expect("shared");
        let l = s.region.limits(0).expect("gpu");
        assert_eq!(l.memory_limit(), (100u64 << 30) / 1000 * 300);
        assert_eq!((l.compute_milli(), l.mode()), (300, ComputeMode::Elastic));
        let asked = Share {
            gpu_milli: 300,
            gpu_memory_bytes: 10 << 30,
        };
        let s = prepare(&cfg, "j", &gpus, asked, "", &inv)
            .expect("ok")
            .expect("shared");
        assert_eq!(s.limit_on("GPU-a"), Some(10 << 30));
        s.resize(Share {
            gpu_milli: 500,
            gpu_memory_bytes: 20 << 30,
        });
        assert_eq!(s.limit_on("GPU-a"), Some(20 << 30));
        assert!(prepare(&cfg, "j", &["GPU-zz".to_owned()], third, "", &inv).is_err());
        assert!(prepare(&cfg, "j", &gpus, third, "turbo", &inv).is_err());
    }

    #[test]
    fn the_shim_goes_first_in_ld_preload() {
        let cfg = SharingConfig {
            shim_library: Some("/opt/allot/liballot_shim.so".into()),
            ..SharingConfig::default()
        };
        let s = prepare(
            &cfg,
            "j",
            &["GPU-a".to_owned()],
            Share {
                gpu_milli: 500,
                gpu_memory_bytes: 0,
            },
            "",
            &[gpu("GPU-a", 1 << 30)],
        )
        .expect("ok")
        .expect("shared");
        let job_env = std::collections::BTreeMap::from([(
            "LD_PRELOAD".to_owned(),
            "libtheirs.so".to_owned(),
        )]);
        let env = s.env(&job_env);
        assert!(env.contains(&(
            "LD_PRELOAD".to_owned(),
            "/opt/allot/liballot_shim.so:libtheirs.so".to_owned()
        )));
        assert!(env.iter().any(|(k, _)| k == "ALLOT_SHIM_LIMITS_FD"));
    }

    #[test]
    fn jobs_over_their_limit_by_the_drivers_count_are_found() {
        let me = std::process::id();
        let pgid = process_group(me).expect("own process group");
        let owners = vec![("job-1".to_owned(), Tracker::Group(pgid))];
        let limits = HashMap::from([("job-1".to_owned(), 10u64 << 30)]);
        // Within the tolerance: fine.
        assert!(breaches("GPU-a", &[(me, 10 << 30)], &owners, &limits).is_empty());
        let found = breaches("GPU-a", &[(me, 11 << 30)], &owners, &limits);
        assert_eq!(found.len(), 1);
        assert!(
            found[0].message().contains("11 GiB"),
            "{}",
            found[0].message()
        );
        // A process of nobody's job counts for no job.
        assert!(breaches("GPU-a", &[(u32::MAX - 1, 99 << 30)], &owners, &limits).is_empty());
    }
}
