//! The launch pacer: a generic cell-rate algorithm over one shared "theoretical arrival
//! time", so all of a job's processes together launch at most `rate` kernels a second on
//! a GPU. One compare-and-swap per launch; no lock, no thread.

use std::sync::atomic::Ordering;

use crate::region::GpuUsage;

/// How much idle time may be banked as launch credit: a job that was idle may launch this
/// long's worth of work at once, and no more. A tenth of a second, the latency objective
/// of a request to a service: a service at a small share answering a request of several
/// kernels after an idle spell launches them at once (at 0.05 of a GPU, five milliseconds
/// of kernels), as a token bucket as deep as its share over that time lets it, instead of
/// spacing them a share's interval apart and answering late.
pub const BURST_NS: u64 = 100_000_000;

/// Counts a launch on the GPU (every launch is counted, paced or not: the controller's
/// cost model learns from all of them).
pub fn record_launch(usage: &GpuUsage, now_ns: u64) {
    usage.launches.fetch_add(1, Ordering::Relaxed);
    usage.last_launch_ns.store(now_ns, Ordering::Relaxed);
}

/// The launch rate the controller last set (launches per second; `None`: not measured).
pub fn rate(usage: &GpuUsage) -> Option<f64> {
    let r = f64::from_bits(usage.rate_bits.load(Ordering::Relaxed));
    (r.is_finite() && r > 0.0).then_some(r)
}

pub fn set_rate(usage: &GpuUsage, rate: f64) {
    usage.rate_bits.store(rate.to_bits(), Ordering::Relaxed);
}

/// Takes the next launch slot and returns how long (ns) the caller must wait before it
/// launches: 0 when it is on schedule or the rate is not set yet.
pub fn pace(usage: &GpuUsage, now_ns: u64) -> u64 {
    let Some(rate) = rate(usage) else {
        return 0;
    };
    // At least one nanosecond between slots, at most ten seconds.
    let interval = (1e9 / rate).clamp(1.0, 1e10) as u64;
    let earliest = now_ns.saturating_sub(BURST_NS);
    let mut tat = usage.tat_ns.load(Ordering::Relaxed);
    loop {
        let start = tat.max(earliest);
        match usage.tat_ns.compare_exchange_weak(
            tat,
            start + interval,
            Ordering::AcqRel,
            Ordering::Relaxed,
        ) {
            Ok(_) => return start.saturating_sub(now_ns),
            Err(seen) => tat = seen,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::region::{ComputeMode, GpuGrant, JobRegion};

    fn region() -> JobRegion {
        JobRegion::create(
            "job",
            &[GpuGrant {
                uuid: "GPU-a".into(),
                memory_limit: 1 << 30,
                compute_milli: 300,
                mode: ComputeMode::Strict,
            }],
            0,
        )
        .expect("region")
    }

    #[test]
    fn an_unset_rate_never_waits() {
        let r = region();
        let u = r.usage(0).expect("gpu 0");
        assert_eq!(pace(u, 1_000_000_000), 0);
        assert_eq!(pace(u, 1_000_000_000), 0);
    }

    #[test]
    fn launches_are_spaced_at_the_rate_after_the_burst() {
        let r = region();
        let u = r.usage(0).expect("gpu 0");
        set_rate(u, 1000.0); // one launch a millisecond
        let now = 10_000_000_000;
        let waits: Vec<u64> = (0..120).map(|_| pace(u, now)).collect();
        // The first 100 ms are banked credit: no wait; after that each waits 1 ms more.
        assert!(waits[..100].iter().all(|w| *w == 0), "{waits:?}");
        assert_eq!(waits[100], 0);
        assert_eq!(waits[101], 1_000_000);
        assert_eq!(waits[119], 19_000_000);
        // Time passing pays the debt back.
        assert_eq!(pace(u, now + 200_000_000), 0);
    }
}
