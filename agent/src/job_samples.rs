//! What each running job is doing, from its GPUs' samples: the figures the control plane
//! keeps per job.
//!
//! - Memory: what the shim counts for a job on shares of GPUs (exact, all its processes);
//!   else what the driver reports for the job's processes; else, for a simulated GPU, the
//!   GPU's memory in use split among its jobs by share, and never more than a job on shares
//!   may hold (its limit: the shim refuses it more).
//! - Utilization: the fraction of its GPUs' time the job kept busy, each GPU's busy time
//!   split among its jobs by share (the driver does not say which process kept it busy),
//!   averaged over the job's GPUs.

use std::collections::HashMap;

/// One GPU's measurement.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GpuReading {
    pub utilization: f64,
    pub memory_used_bytes: u64,
}

/// A running job, as far as its samples go.
#[derive(Debug, Clone)]
pub struct JobOnGpus {
    pub id: String,
    /// Physical GPU UUIDs (a MIG instance counts as its GPU).
    pub gpus: Vec<String>,
    /// Its share of each, in milli.
    pub gpu_milli: u32,
    /// Bytes it holds by an exact count (the shim's, or the driver's per process), if known.
    pub memory_counted: Option<u64>,
    /// The most GPU memory it may hold, all its GPUs together, when it holds shares.
    pub memory_limit: Option<u64>,
    /// Its own busy share of its GPUs' time and how long its launches waited for its
    /// share, as its shim counted them (a job on shares whose processes use the shim).
    pub counted: Option<(f64, f64)>,
}

/// What one job did, as its node reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct Attributed {
    pub id: String,
    pub utilization: f64,
    pub memory_used_bytes: u64,
    pub held_back: f64,
}

/// What each job did.
pub fn attribute(readings: &HashMap<String, GpuReading>, jobs: &[JobOnGpus]) -> Vec<Attributed> {
    let mut load: HashMap<&str, f64> = HashMap::new();
    for j in jobs {
        for g in &j.gpus {
            *load.entry(g.as_str()).or_default() += f64::from(j.gpu_milli.min(1000)) / 1000.0;
        }
    }
    jobs.iter()
        .filter_map(|j| {
            let share = f64::from(j.gpu_milli.min(1000)) / 1000.0;
            let mut util = 0.0;
            let mut memory = 0.0;
            let mut seen = 0usize;
            for g in &j.gpus {
                let Some(r) = readings.get(g) else {
                    continue;
                };
                // What the GPU's jobs did, split by what each holds of it.
                let of = load.get(g.as_str()).copied().unwrap_or(share).max(1e-3);
                util += r.utilization * share / of;
                memory += r.memory_used_bytes as f64 * share / of;
                seen += 1;
            }
            if seen == 0 {
                return None;
            }
            // The shim's own count wins over the GPU's busy time split by share (which
            // cannot tell which of a GPU's jobs kept it busy).
            let utilization = j
                .counted
                .map_or(util / seen as f64, |(busy, _)| busy)
                .clamp(0.0, 1.0);
            let split = (memory as u64).min(j.memory_limit.unwrap_or(u64::MAX));
            let memory_used = j.memory_counted.unwrap_or(split);
            Some(Attributed {
                id: j.id.clone(),
                utilization,
                memory_used_bytes: memory_used,
                held_back: j.counted.map_or(0.0, |(_, held)| held),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(u: f64, mem: u64) -> GpuReading {
        GpuReading {
            utilization: u,
            memory_used_bytes: mem,
        }
    }

    #[test]
    fn jobs_split_their_gpus_by_share() {
        let readings = HashMap::from([
            ("GPU-a".to_owned(), reading(0.8, 80)),
            ("GPU-b".to_owned(), reading(0.9, 100)),
        ]);
        let jobs = [
            JobOnGpus {
                id: "half".into(),
                gpus: vec!["GPU-a".into()],
                gpu_milli: 500,
                memory_counted: None,
                memory_limit: None,
                counted: None,
            },
            JobOnGpus {
                id: "other-half".into(),
                gpus: vec!["GPU-a".into()],
                gpu_milli: 500,
                memory_counted: Some(7),
                memory_limit: None,
                counted: None,
            },
            JobOnGpus {
                id: "whole".into(),
                gpus: vec!["GPU-b".into()],
                gpu_milli: 1000,
                memory_counted: None,
                memory_limit: None,
                counted: None,
            },
        ];
        let got = attribute(&readings, &jobs);
        // Each half gets half of GPU-a's busy time: 0.4 of the GPU.
        assert_eq!(got[0].id, "half");
        assert!((got[0].utilization - 0.4).abs() < 1e-9, "{got:?}");
        assert_eq!(got[0].memory_used_bytes, 40);
        // An exact count wins over the split.
        assert_eq!(got[1].memory_used_bytes, 7);
        assert!((got[2].utilization - 0.9).abs() < 1e-9);
        assert_eq!(got[2].memory_used_bytes, 100);
        // A job on GPUs with no reading has no sample.
        // Alone on a GPU, a job is all of what the GPU did.
        let alone = [JobOnGpus {
            id: "alone".into(),
            gpus: vec!["GPU-a".into()],
            gpu_milli: 300,
            memory_counted: None,
            memory_limit: None,
            counted: None,
        }];
        let got = attribute(&readings, &alone);
        assert!((got[0].utilization - 0.8).abs() < 1e-9, "{got:?}");
        assert_eq!(got[0].memory_used_bytes, 80);
        let lost = [JobOnGpus {
            id: "x".into(),
            gpus: vec!["GPU-z".into()],
            gpu_milli: 1000,
            memory_counted: None,
            memory_limit: None,
            counted: None,
        }];
        assert!(attribute(&readings, &lost).is_empty());
    }

    #[test]
    fn a_capped_job_is_never_said_to_hold_more_than_its_limit() {
        // Half a GPU capped at 20 GiB, alone on a GPU whose memory in use is 56 GiB.
        let readings = HashMap::from([("GPU-a".to_owned(), reading(0.5, 56 << 30))]);
        let capped = [JobOnGpus {
            id: "capped".into(),
            gpus: vec!["GPU-a".into()],
            gpu_milli: 500,
            memory_counted: None,
            memory_limit: Some(20 << 30),
            counted: None,
        }];
        assert_eq!(attribute(&readings, &capped)[0].memory_used_bytes, 20 << 30);
    }

    #[test]
    fn the_shims_count_of_busy_time_wins_over_the_split() {
        // Two jobs on one GPU, one busy and one idle: split by share each would get half
        // of the GPU's busy time; the shim's count of each says whose it was.
        let readings = HashMap::from([("GPU-a".to_owned(), reading(0.6, 0))]);
        let job = |id: &str, counted| JobOnGpus {
            id: id.into(),
            gpus: vec!["GPU-a".into()],
            gpu_milli: 500,
            memory_counted: None,
            memory_limit: None,
            counted,
        };
        let got = attribute(
            &readings,
            &[
                job("busy", Some((0.6, 0.25))),
                job("idle", Some((0.0, 0.0))),
            ],
        );
        assert!((got[0].utilization - 0.6).abs() < 1e-9, "{got:?}");
        assert!((got[0].held_back - 0.25).abs() < 1e-9, "{got:?}");
        assert_eq!(got[1].utilization, 0.0);
    }
}
