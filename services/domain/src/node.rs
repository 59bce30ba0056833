//! Nodes and the GPUs they report.

/// Why a GPU's clocks are held down, as NVML names the reasons (lower case). A sample's
/// reasons travel as names and are stored as a bitmask: bit `i` is `THROTTLE_REASONS[i]`.
pub const THROTTLE_REASONS: [&str; 9] = [
    "gpu_idle",
    "applications_clocks_setting",
    "sw_power_cap",
    "hw_slowdown",
    "sync_boost",
    "sw_thermal_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
    "display_clock_setting",
];

/// The bitmask of these reasons (unknown names are ignored).
pub fn throttle_mask<S: AsRef<str>>(reasons: &[S]) -> u32 {
    reasons
        .iter()
        .filter_map(|r| THROTTLE_REASONS.iter().position(|n| *n == r.as_ref()))
        .fold(0, |mask, bit| mask | (1 << bit))
}

/// The reasons in a bitmask, in table order.
pub fn throttle_names(mask: u32) -> Vec<&'static str> {
    THROTTLE_REASONS
        .iter()
        .enumerate()
        .filter(|(bit, _)| mask & (1 << bit) != 0)
        .map(|(_, n)| *n)
        .collect()
}

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// What a GPU is doing at one moment, as its node samples it (NVML on real GPUs, the
/// simulator elsewhere) and the control plane keeps it: the one sample type, converted to
/// the agent protocol and the API's views at their edges.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct GpuSample {
    /// Busy fraction, 0 to 1.
    pub utilization: f64,
    pub memory_used_bytes: u64,
    pub power_watts: f64,
    pub temperature_c: f64,
    /// PCIe traffic, bytes per second, to (`rx`) and from (`tx`) the GPU.
    pub pcie_rx_bytes_per_s: f64,
    pub pcie_tx_bytes_per_s: f64,
    /// NVLink data traffic, bytes per second, over all links (0 without NVLink).
    pub nvlink_rx_bytes_per_s: f64,
    pub nvlink_tx_bytes_per_s: f64,
    /// Why its clocks are held down: [`THROTTLE_REASONS`] bits ([`throttle_mask`],
    /// [`throttle_names`]).
    pub throttle_mask: u32,
    /// ECC errors since the driver loaded (volatile counters).
    pub ecc_corrected: u64,
    pub ecc_uncorrected: u64,
}

/// One GPU as its node reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuDevice {
    /// Stable identifier, e.g. `GPU-5f1c…`; what `CUDA_VISIBLE_DEVICES` names.
    pub uuid: String,
    /// Index on the node (0-based, as the driver enumerates).
    pub index: u32,
    /// Model name, e.g. `H200`.
    pub model: String,
    pub memory_bytes: u64,
    pub healthy: bool,
    /// Healthy but suspect (an informational XID such as page retirement, or rising ECC
    /// counts): it keeps its jobs and takes no new work.
    pub degraded: bool,
    /// Its MIG instances when the GPU is in MIG mode (which only an administrator changes);
    /// `None` when it is not. A GPU in MIG mode serves MIG jobs only, one per instance.
    pub mig: Option<Vec<MigSlot>>,
    /// How its node holds each job on it to its GPU memory, as the node reports.
    pub memory_enforcement: MemoryEnforcement,
    /// Its NVLink domain on its node: GPUs of one domain talk over NVLink (or NVSwitch),
    /// others over PCIe. None: no NVLink.
    pub nvlink_domain: Option<u32>,
}

/// Checks a bootstrap token's node name or pattern: a node name's characters (letters,
/// digits, `-`, `.`, `_`) and `*` for any run of them, 1 to 253 characters.
pub fn check_node_pattern(field: &str, pattern: &str) -> Result<(), crate::ValidationError> {
    let ok = (1..=253).contains(&pattern.len())
        && pattern
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_' | '*'));
    if ok {
        Ok(())
    } else {
        Err(crate::ValidationError::single(
            field,
            "must be a node name, or a pattern with `*` (e.g. gpu-4*), of letters, digits, \
             `-`, `.` and `_`",
        ))
    }
}

/// Whether node `name` matches `pattern` (`*` matches any run of characters; an empty
/// pattern matches nothing).
pub fn node_pattern_matches(pattern: &str, name: &str) -> bool {
    if pattern.is_empty() {
        return false;
    }
    let parts: Vec<&str> = pattern.split('*').collect();
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if parts.len() == 1 {
        return name == pattern;
    }
    if !name.starts_with(first) || name.len() < first.len() + last.len() || !name.ends_with(last) {
        return false;
    }
    let mut rest = &name[first.len()..name.len() - last.len()];
    for middle in &parts[1..parts.len() - 1] {
        match rest.find(middle) {
            Some(at) => rest = &rest[at + middle.len()..],
            None => return false,
        }
    }
    true
}

/// Orders names as people count: runs of digits compare as numbers (`node-2` before
/// `node-10`, `rack2-gpu9` before `rack10-gpu1`), the rest as text.
pub fn natural_order(a: &str, b: &str) -> std::cmp::Ordering {
    fn runs(s: &str) -> Vec<(bool, &str)> {
        let mut out = Vec::new();
        let mut start = 0;
        let bytes = s.as_bytes();
        for i in 1..=bytes.len() {
            if i == bytes.len() || bytes[i].is_ascii_digit() != bytes[start].is_ascii_digit() {
                out.push((bytes[start].is_ascii_digit(), &s[start..i]));
                start = i;
            }
        }
        out
    }
    let (ra, rb) = (runs(a), runs(b));
    for ((da, x), (db, y)) in ra.iter().zip(&rb) {
        let ord = if *da && *db {
            let (x, y) = (x.trim_start_matches('0'), y.trim_start_matches('0'));
            x.len().cmp(&y.len()).then_with(|| x.cmp(y))
        } else {
            x.cmp(y)
        };
        if ord.is_ne() {
            return ord;
        }
    }
    ra.len().cmp(&rb.len()).then_with(|| a.cmp(b))
}

/// Most labels a node may carry.
pub const MAX_NODE_LABELS: usize = 64;

/// A label's name: 1 to 63 letters, digits, `.`, `_`, `-` and `/`, starting and ending with
/// a letter or digit (as Kubernetes writes `topology.kubernetes.io/zone`).
pub fn check_label_name(name: &str) -> Result<(), String> {
    let ok = (1..=63).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'/'))
        && name
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphanumeric())
        && name
            .bytes()
            .last()
            .is_some_and(|b| b.is_ascii_alphanumeric());
    if ok {
        Ok(())
    } else {
        Err("must be 1 to 63 letters, digits, `.`, `_`, `-` or `/`, starting and ending with a letter or digit".into())
    }
}

/// Label changes as an operator asks them (a value sets, `None` removes), every name and
/// value checked, and the labels the node would then carry counted.
pub fn check_label_changes(
    current: &std::collections::BTreeMap<String, String>,
    changes: &std::collections::BTreeMap<String, Option<String>>,
) -> Result<(), crate::ValidationError> {
    let mut v = crate::error::Violations::default();
    let mut after = current.clone();
    for (k, value) in changes {
        if let Err(why) = check_label_name(k) {
            v.push(format!("labels.{k}"), why);
        }
        match value {
            Some(value) => {
                v.check(
                    value.len() <= 63
                        && value
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')),
                    format!("labels.{k}"),
                    "a value is at most 63 letters, digits, `.`, `_` or `-`",
                );
                after.insert(k.clone(), value.clone());
            }
            None => {
                after.remove(k);
            }
        }
    }
    v.check(
        after.len() <= MAX_NODE_LABELS,
        "labels",
        format!("a node carries at most {MAX_NODE_LABELS} labels"),
    );
    v.into_result()
}

/// Most GPUs one node reports (the largest boards carry 16).
pub const MAX_NODE_GPUS: usize = 32;
/// Most GPU memory one GPU reports: 16 TiB.
pub const MAX_GPU_MEMORY: u64 = 16 << 40;

/// Whether `id` is a GPU or MIG instance id as drivers write them: 1 to 128 printable
/// ASCII characters, no spaces.
fn is_device_id(id: &str) -> bool {
    (1..=128).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_graphic())
}

/// Checks a node's reported inventory, naming the field at fault: at most
/// [`MAX_NODE_GPUS`] GPUs, ids and indexes unique, models short and printable, memory
/// positive and at most [`MAX_GPU_MEMORY`], at most seven MIG instances each. What a node
/// says is input like any other.
pub fn check_inventory(gpus: &[GpuDevice]) -> Result<(), crate::ValidationError> {
    let mut v = crate::error::Violations::default();
    v.check(
        gpus.len() <= MAX_NODE_GPUS,
        "gpus",
        format!("must list at most {MAX_NODE_GPUS} GPUs"),
    );
    for (i, g) in gpus.iter().enumerate().take(MAX_NODE_GPUS) {
        v.check(
            is_device_id(&g.uuid),
            format!("gpus[{i}].uuid"),
            "must be 1 to 128 printable characters without spaces",
        );
        v.check(
            !gpus[..i].iter().any(|o| o.uuid == g.uuid),
            format!("gpus[{i}].uuid"),
            "is listed twice",
        );
        v.check(
            g.index < 64 && !gpus[..i].iter().any(|o| o.index == g.index),
            format!("gpus[{i}].index"),
            "must be below 64 and unique",
        );
        v.check(
            (1..=64).contains(&g.model.chars().count()) && !g.model.chars().any(char::is_control),
            format!("gpus[{i}].model"),
            "must be 1 to 64 characters, none a control character",
        );
        v.check(
            (1..=MAX_GPU_MEMORY).contains(&g.memory_bytes),
            format!("gpus[{i}].memory_bytes"),
            "must be positive and at most 16 TiB",
        );
        if let Some(slots) = &g.mig {
            v.check(
                slots.len() <= 7,
                format!("gpus[{i}].mig_instances"),
                "must list at most 7 instances",
            );
            for (j, m) in slots.iter().enumerate() {
                v.check(
                    is_device_id(&m.uuid) && m.start <= 7,
                    format!("gpus[{i}].mig_instances[{j}]"),
                    "needs an id of 1 to 128 printable characters and a start slice of at most 7",
                );
            }
        }
    }
    v.into_result()
}

/// How a node holds the jobs on a GPU to their GPU memory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MemoryEnforcement {
    /// The agent's check of the driver's per-process count alone: a job found holding more
    /// than its share is killed, but nothing stops its allocations first.
    #[default]
    Check,
    /// The GPU-sharing shim in each job, with the agent's check of the driver's own count
    /// as the backstop.
    Shim,
    /// MIG: each instance's memory is its own, in hardware.
    Mig,
}

impl MemoryEnforcement {
    pub fn as_str(self) -> &'static str {
        match self {
            MemoryEnforcement::Check => "check",
            MemoryEnforcement::Shim => "shim",
            MemoryEnforcement::Mig => "mig",
        }
    }
}

impl std::str::FromStr for MemoryEnforcement {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "check" | "" => Ok(MemoryEnforcement::Check),
            "shim" => Ok(MemoryEnforcement::Shim),
            "mig" => Ok(MemoryEnforcement::Mig),
            other => Err(format!("`{other}` is not check, shim or mig")),
        }
    }
}

/// A MIG instance on a GPU, as its agent reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct MigSlot {
    /// The GPU-instance profile id (see [`crate::mig`]).
    pub profile: u32,
    /// The first memory slice it occupies.
    pub start: u8,
    /// `MIG-…`: what `CUDA_VISIBLE_DEVICES` names for a job on it.
    pub uuid: String,
}

impl GpuDevice {
    /// Whether a placement naming `uuid` is on this GPU: the GPU itself, or one of its MIG
    /// instances.
    pub fn holds(&self, uuid: &str) -> bool {
        self.uuid == uuid || self.mig.iter().flatten().any(|s| s.uuid == uuid)
    }

    /// Its health in one word: `unhealthy` (as its agent reports), `draining` (an operator
    /// drained it), `degraded` (suspect: keeps its jobs) or `healthy`. Only a healthy GPU
    /// takes new work.
    pub fn health(&self, drained: bool) -> &'static str {
        if !self.healthy {
            "unhealthy"
        } else if drained {
            "draining"
        } else if self.degraded {
            "degraded"
        } else {
            "healthy"
        }
    }
}

/// Whether the scheduler may place work on a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NodeStatus {
    /// The lease is current: the agent heartbeated recently.
    Ready,
    /// The lease expired: the agent is gone or cut off.
    NotReady,
}

impl NodeStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            NodeStatus::Ready => "ready",
            NodeStatus::NotReady => "not-ready",
        }
    }
}

impl std::fmt::Display for NodeStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Node {
    pub id: String,
    pub name: String,
    pub registered_at: DateTime<Utc>,
    pub last_heartbeat_at: DateTime<Utc>,
    pub lease_expires_at: DateTime<Utc>,
    pub agent_version: String,
    pub gpu_backend: String,
    /// What runs its jobs: `oci` (confined containers) or `process` (unconfined); empty
    /// when an older agent did not say.
    pub runtime: String,
    /// CPU the node offers to jobs, in milli; 0 when the agent did not say.
    pub cpu_milli: u64,
    /// Memory the node offers to jobs; 0 when the agent did not say.
    pub memory_bytes: u64,
    pub gpus: Vec<GpuDevice>,
    /// An operator cordoned the node: it takes no new work (what runs there stays).
    pub cordoned: bool,
    /// An operator drained it (a cordon, and its jobs leave): why, and until when its jobs
    /// may finish before they are requeued elsewhere.
    pub drain: Option<Drain>,
    /// GPUs an operator drained: they take no new work until returned to service.
    pub drained_gpus: Vec<String>,
    /// The GPUs (by UUID) the node may report: those it registered with using a bootstrap
    /// token, which an admin made for it. A certificate's holder (the node, or whoever stole
    /// its key) never adds to them. `None`: registered before they were recorded, when the
    /// inventory stored then stands for them.
    pub approved_gpus: Option<Vec<String>>,
    /// The address other nodes reach it at (a gang's rendezvous on its first replica);
    /// empty when its agent did not say.
    pub address: String,
    /// An operator's labels (`rack=r12`, `spine=s3`), as Kubernetes topology labels: what a
    /// gang may ask to be packed within.
    pub labels: std::collections::BTreeMap<String, String>,
    /// Why its agent says it takes no new work (low on disk); empty: it takes work.
    pub unavailable: String,
}

/// Longest reason a node gives for taking no new work.
pub const MAX_UNAVAILABLE_LEN: usize = 512;

/// A node drained by an operator, as `sinfo -R` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Drain {
    /// Why (what the operator said; may be empty).
    pub reason: String,
    /// Its running jobs may finish until then; after it they are requeued elsewhere.
    pub deadline: DateTime<Utc>,
}

/// The longest grace a drain gives its node's jobs: a week.
pub const MAX_DRAIN_GRACE_SECS: u64 = 7 * 86_400;

/// The longest a drain's reason may be.
pub const MAX_DRAIN_REASON_LEN: usize = 512;

/// A node's reason for taking no new work as the control plane keeps it (an agent's
/// words, untrusted): control characters dropped, at most [`MAX_UNAVAILABLE_LEN`] bytes.
pub fn unavailable_reason(said: &str) -> String {
    let mut out = String::new();
    for c in said.trim().chars().filter(|c| !c.is_control()) {
        if out.len() + c.len_utf8() > MAX_UNAVAILABLE_LEN {
            break;
        }
        out.push(c);
    }
    out
}

impl Node {
    /// Whether the scheduler may place new work on it, its lease aside: not cordoned by an
    /// operator, and not unavailable by its agent's word.
    pub fn takes_work(&self) -> bool {
        !self.cordoned && self.unavailable.is_empty()
    }

    /// The GPUs of `reported` (an inventory the node sends) that are not among those it was
    /// approved for ([`Node::approved_gpus`]): a node's inventory never grows past what it
    /// registered with, or an admin approved by a bootstrap token since.
    pub fn unapproved<'a>(&self, reported: &'a [GpuDevice]) -> Vec<&'a str> {
        let stored: Vec<&str> = self.gpus.iter().map(|g| g.uuid.as_str()).collect();
        let approved: Vec<&str> = match &self.approved_gpus {
            Some(a) => a.iter().map(String::as_str).collect(),
            None => stored,
        };
        reported
            .iter()
            .map(|g| g.uuid.as_str())
            .filter(|u| !approved.contains(u))
            .collect()
    }

    /// Whether its jobs run confined (what a tenant policy may require).
    pub fn confines_jobs(&self) -> bool {
        self.runtime == "oci"
    }

    /// Whether it can run a job that names an image (`with_image`) or not: a node running
    /// containers runs only jobs from images, one running processes only jobs without.
    pub fn runs(&self, with_image: bool) -> bool {
        self.confines_jobs() == with_image
    }

    pub fn status(&self, now: DateTime<Utc>) -> NodeStatus {
        if now < self.lease_expires_at {
            NodeStatus::Ready
        } else {
            NodeStatus::NotReady
        }
    }

    /// Whether it is lost, and its jobs are to run elsewhere: its lease lapsed and nothing
    /// was heard from it for `tolerance` since its last heartbeat or `since` (when the
    /// control plane that judges took office), whichever is later. A lapsed lease alone
    /// means the node takes no new work; the control plane being unreachable (an upgrade,
    /// a database failover, a network blip) must not cost the fleet its running work, and
    /// the node's agent keeps its jobs for four fifths of the tolerance.
    pub fn lost(
        &self,
        now: DateTime<Utc>,
        tolerance: chrono::Duration,
        since: DateTime<Utc>,
    ) -> bool {
        self.status(now) == NodeStatus::NotReady
            && now - self.last_heartbeat_at.max(since) >= tolerance
    }

    /// Whether it has gone quiet: no heartbeat for longer than `after`, stretched as much
    /// as its last heartbeat's lease was stretched beyond the configured `lease` (a paced
    /// fleet beats less often under a longer lease alike, see [`paced`]).
    pub fn silent(
        &self,
        now: DateTime<Utc>,
        after: chrono::Duration,
        lease: chrono::Duration,
    ) -> bool {
        let granted = (self.lease_expires_at - self.last_heartbeat_at).num_milliseconds();
        let stretch = match lease.num_milliseconds() {
            ms if ms > 0 => (granted as f64 / ms as f64).max(1.0),
            _ => 1.0,
        };
        let quiet = (now - self.last_heartbeat_at).num_milliseconds();
        quiet as f64 > after.num_milliseconds() as f64 * stretch
    }
}

/// How often agents heartbeat and how long the lease each heartbeat grants, for a fleet of
/// `nodes` whose heartbeats the leader answers at most `max_per_sec` a second: the
/// configured `interval` and `lease` while the fleet stays under that rate, both stretched
/// by the same factor beyond it (as Nomad stretches its heartbeat TTL), so a larger fleet
/// costs the leader no more heartbeats a second, and its nodes are judged lost later.
pub fn paced(
    nodes: usize,
    interval: std::time::Duration,
    lease: std::time::Duration,
    max_per_sec: f64,
) -> (std::time::Duration, std::time::Duration) {
    if !(max_per_sec.is_finite() && max_per_sec > 0.0) || interval.is_zero() {
        return (interval, lease);
    }
    let needed = std::time::Duration::from_secs_f64(nodes as f64 / max_per_sec);
    if needed <= interval {
        return (interval, lease);
    }
    let stretch = needed.as_secs_f64() / interval.as_secs_f64();
    (needed, lease.mul_f64(stretch))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nodes_reason_is_kept_short_and_plain() {
        assert_eq!(unavailable_reason("  low on disk\n"), "low on disk");
        assert_eq!(unavailable_reason("a\u{1b}[31mb"), "a[31mb");
        let long = "é".repeat(MAX_UNAVAILABLE_LEN);
        let kept = unavailable_reason(&long);
        assert!(kept.len() <= MAX_UNAVAILABLE_LEN && kept.chars().all(|c| c == 'é'));
        assert_eq!(unavailable_reason(""), "");
    }

    #[test]
    fn a_gpus_health_in_one_word() {
        let gpu = |healthy, degraded| GpuDevice {
            uuid: "GPU-1".into(),
            index: 0,
            model: "H200".into(),
            memory_bytes: 141 << 30,
            healthy,
            degraded,
            mig: None,
            memory_enforcement: MemoryEnforcement::Shim,
            nvlink_domain: None,
        };
        assert_eq!(gpu(true, false).health(false), "healthy");
        assert_eq!(gpu(true, true).health(false), "degraded");
        assert_eq!(gpu(true, true).health(true), "draining");
        assert_eq!(gpu(false, true).health(true), "unhealthy");
    }

    #[test]
    fn a_large_fleet_heartbeats_less_often_under_a_longer_lease() {
        let s = std::time::Duration::from_secs;
        // 1,500 nodes at 500 a second: every 3 s, as configured.
        assert_eq!(paced(1_500, s(3), s(15), 500.0), (s(3), s(15)));
        assert_eq!(paced(0, s(3), s(15), 500.0), (s(3), s(15)));
        // 5,000: every 10 s, the lease five intervals still.
        assert_eq!(paced(5_000, s(3), s(15), 500.0), (s(10), s(50)));
        // No limit, or a nonsensical one: as configured.
        assert_eq!(paced(5_000, s(3), s(15), 0.0), (s(3), s(15)));
        assert_eq!(paced(5_000, s(3), s(15), f64::NAN), (s(3), s(15)));
    }

    #[test]
    fn a_node_is_silent_after_missing_beats_at_the_pace_it_was_given() {
        let at =
            |secs| DateTime::<Utc>::from_timestamp(1_800_000_000 + secs, 0).expect("a valid time");
        let node = |beat: i64, lease: i64| Node {
            id: "n".into(),
            name: "n".into(),
            registered_at: at(0),
            last_heartbeat_at: at(beat),
            lease_expires_at: at(beat + lease),
            agent_version: String::new(),
            gpu_backend: String::new(),
            runtime: String::new(),
            cpu_milli: 0,
            memory_bytes: 0,
            gpus: Vec::new(),
            cordoned: false,
            drain: None,
            drained_gpus: Vec::new(),
            approved_gpus: None,
            address: String::new(),
            labels: Default::default(),
            unavailable: String::new(),
        };
        let (after, lease) = (
            chrono::Duration::milliseconds(7_500),
            chrono::Duration::seconds(15),
        );
        // The configured 15 s lease: quiet for 8 s is silent.
        assert!(!node(100, 15).silent(at(107), after, lease));
        assert!(node(100, 15).silent(at(108), after, lease));
        // A 50 s lease (a paced fleet, heartbeats every 10 s): 8 s is one late beat, 26 s
        // two and a half.
        assert!(!node(100, 50).silent(at(108), after, lease));
        assert!(!node(100, 50).silent(at(125), after, lease));
        assert!(node(100, 50).silent(at(126), after, lease));
        // Lost only once nothing was heard for the outage tolerance (5 minutes here), its
        // lease long lapsed; counted from a control plane's taking office when later.
        let tolerance = chrono::Duration::minutes(5);
        assert!(
            !node(100, 15).lost(at(120), tolerance, at(0)),
            "lapsed, not lost"
        );
        assert!(!node(100, 15).lost(at(399), tolerance, at(0)));
        assert!(node(100, 15).lost(at(400), tolerance, at(0)));
        assert!(
            !node(100, 15).lost(at(400), tolerance, at(300)),
            "a leader that took office at 300 s waits until 600 s"
        );
        assert!(node(100, 15).lost(at(600), tolerance, at(300)));
        // A tolerance shorter than the lease: the lease still has to lapse.
        assert!(!node(100, 15).lost(at(110), chrono::Duration::seconds(5), at(0)));
    }
}

#[cfg(test)]
mod inventory_tests {
    use super::*;

    fn gpu(i: u32) -> GpuDevice {
        GpuDevice {
            uuid: format!("GPU-{i}"),
            index: i,
            model: "H200".into(),
            memory_bytes: 141 << 30,
            healthy: true,
            degraded: false,
            mig: None,
            memory_enforcement: MemoryEnforcement::Shim,
            nvlink_domain: None,
        }
    }

    fn fields(gpus: &[GpuDevice]) -> Vec<String> {
        check_inventory(gpus)
            .err()
            .map(|e| e.0.into_iter().map(|f| f.field).collect())
            .unwrap_or_default()
    }

    #[test]
    fn names_sort_as_people_count() {
        let mut names = vec![
            "node-10",
            "node-2",
            "node-1",
            "gpu-b",
            "node-02",
            "rack10-gpu1",
            "rack2-gpu9",
            "",
            "gpu-a",
        ];
        names.sort_by(|a, b| natural_order(a, b));
        assert_eq!(
            names,
            [
                "",
                "gpu-a",
                "gpu-b",
                "node-1",
                "node-02",
                "node-2",
                "node-10",
                "rack2-gpu9",
                "rack10-gpu1"
            ]
        );
    }

    #[test]
    fn token_patterns_match_whole_names() {
        for (p, n, ok) in [
            ("gpu-99", "gpu-99", true),
            ("gpu-99", "dev-node-2", false),
            ("gpu-99", "gpu-990", false),
            ("gpu-4*", "gpu-47", true),
            ("gpu-4*", "gpu-5", false),
            ("*", "anything", true),
            ("rack*-gpu*", "rack4-gpu7", true),
            ("rack*-gpu*", "rack4-cpu7", false),
            ("*.b", "a.b", true),
            ("", "x", false),
        ] {
            assert_eq!(node_pattern_matches(p, n), ok, "{p} ~ {n}");
        }
        assert!(check_node_pattern("node_name", "gpu-4*").is_ok());
        assert!(check_node_pattern("node_name", "gpu 4").is_err());
        assert!(check_node_pattern("node_name", "").is_err());
    }

    #[test]
    fn hostile_inventories_are_refused_naming_the_field() {
        assert!(check_inventory(&[gpu(0), gpu(1)]).is_ok());
        let many: Vec<_> = (0..64).map(gpu).collect();
        assert_eq!(fields(&many)[0], "gpus");
        let long = GpuDevice {
            model: "x".repeat(20_000),
            ..gpu(0)
        };
        assert_eq!(fields(&[long]), ["gpus[0].model"]);
        let huge = GpuDevice {
            memory_bytes: 1 << 63,
            ..gpu(0)
        };
        assert_eq!(fields(&[huge]), ["gpus[0].memory_bytes"]);
        let twice = [gpu(0), GpuDevice { index: 1, ..gpu(0) }];
        assert_eq!(fields(&twice), ["gpus[1].uuid"]);
        let odd = GpuDevice {
            uuid: "GPU 1\u{1b}]52;".into(),
            ..gpu(0)
        };
        assert_eq!(fields(&[odd]), ["gpus[0].uuid"]);
    }
}

#[cfg(test)]
mod throttle_tests {
    use super::*;

    #[test]
    fn throttle_reasons_round_trip_through_the_mask() {
        let mask = throttle_mask(&["sw_power_cap", "hw_thermal_slowdown", "not_a_reason"]);
        assert_eq!(mask, (1 << 2) | (1 << 6));
        assert_eq!(
            throttle_names(mask),
            ["sw_power_cap", "hw_thermal_slowdown"]
        );
        assert!(throttle_names(0).is_empty());
    }
}

#[cfg(test)]
mod approval_tests {
    use super::*;

    #[test]
    fn a_nodes_inventory_never_grows_past_what_was_approved() {
        let gpu = |uuid: &str| GpuDevice {
            uuid: uuid.to_owned(),
            index: 0,
            model: "H200".into(),
            memory_bytes: 141 << 30,
            healthy: true,
            degraded: false,
            mig: None,
            memory_enforcement: MemoryEnforcement::default(),
            nvlink_domain: None,
        };
        let at = DateTime::<Utc>::UNIX_EPOCH;
        let mut node = Node {
            id: "n".into(),
            name: "n".into(),
            registered_at: at,
            last_heartbeat_at: at,
            lease_expires_at: at,
            agent_version: String::new(),
            gpu_backend: String::new(),
            runtime: String::new(),
            cpu_milli: 0,
            memory_bytes: 0,
            gpus: vec![gpu("GPU-0")],
            cordoned: false,
            drain: None,
            drained_gpus: Vec::new(),
            approved_gpus: Some(vec!["GPU-0".into(), "GPU-1".into()]),
            unavailable: String::new(),
            address: String::new(),
            labels: Default::default(),
        };
        // Fewer, or those approved: fine. One more: named.
        assert!(node.unapproved(&[]).is_empty());
        assert!(node.unapproved(&[gpu("GPU-1"), gpu("GPU-0")]).is_empty());
        let claimed = [gpu("GPU-0"), gpu("GPU-9"), gpu("GPU-1"), gpu("GPU-8")];
        assert_eq!(node.unapproved(&claimed), ["GPU-9", "GPU-8"]);
        // Registered before approvals were recorded: what it has stored stands for them.
        node.approved_gpus = None;
        assert_eq!(node.unapproved(&[gpu("GPU-0"), gpu("GPU-1")]), ["GPU-1"]);
    }
}
