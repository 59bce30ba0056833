use super::*;

fn grants() -> Vec<GpuGrant> {
    vec![
        GpuGrant {
            uuid: "GPU-aaaa".into(),
            memory_limit: 1000,
            compute_milli: 300,
            mode: ComputeMode::Strict,
        },
        GpuGrant {
            uuid: "GPU-bbbb".into(),
            memory_limit: 5000,
            compute_milli: 1000,
            mode: ComputeMode::Elastic,
        },
    ]
}

fn attach(region: &JobRegion) -> AttachedRegion {
    AttachedRegion::attach(region.limits_fd(), region.usage_fd()).expect("attach")
}

#[test]
fn the_job_sees_what_the_agent_wrote() {
    let region = JobRegion::create("job-1", &grants(), 300).expect("create");
    let job = attach(&region);
    assert_eq!(job.job_id(), "job-1");
    assert_eq!(job.gpu_count(), 2);
    assert_eq!(job.context_reserve_bytes(), 300);
    let a = job.limits(0).expect("gpu 0");
    assert_eq!(
        (a.uuid(), a.memory_limit(), a.compute_milli()),
        ("GPU-aaaa", 1000, 300)
    );
    assert!(a.throttled());
    let b = job.limits(1).expect("gpu 1");
    assert_eq!(b.mode(), ComputeMode::Elastic);
    assert!(!b.throttled(), "a whole share is never throttled");
    assert_eq!(job.gpu_index("GPU-bbbb"), Some(1));
    assert!(job.limits(2).is_none());
}

#[test]
fn processes_of_a_job_share_one_budget() {
    let region = JobRegion::create("job", &grants(), 0).expect("create");
    let (p1, p2) = (attach(&region), attach(&region));
    let s1 = p1.claim_slot(11, |_| true).expect("slot");
    let s2 = p2.claim_slot(22, |_| true).expect("slot");
    assert_ne!(s1, s2);
    assert!(p1.reserve(0, s1, 600));
    assert!(!p2.reserve(0, s2, 401), "600 + 401 is over the 1000 limit");
    assert!(p2.reserve(0, s2, 400));
    assert_eq!(region.used(0), 1000);
    p1.release(0, s1, 600);
    assert!(p2.reserve(0, s2, 500));
    // The other GPU has its own budget.
    assert!(p1.reserve(1, s1, 5000));
}

#[test]
fn a_dead_process_returns_its_bytes() {
    let region = JobRegion::create("job", &grants(), 0).expect("create");
    let job = attach(&region);
    let slot = job.claim_slot(4242, |_| true).expect("slot");
    assert!(job.reserve(0, slot, 900));
    assert_eq!(region.sweep_dead(|_| true), 0);
    assert_eq!(region.sweep_dead(|pid| pid != 4242), 1);
    assert_eq!(region.used(0), 0);
    assert!(region.pids().is_empty());
}

#[test]
fn resizing_applies_to_the_next_allocation() {
    let region = JobRegion::create("job", &grants(), 0).expect("create");
    let job = attach(&region);
    let slot = job.claim_slot(1, |_| true).expect("slot");
    assert!(!job.reserve(0, slot, 2000));
    assert!(region.resize(0, 3000, 500));
    assert!(job.reserve(0, slot, 2000));
    assert_eq!(job.limits(0).map(GpuLimits::compute_milli), Some(500));
    // Shrinking below what is held keeps it, and refuses more.
    assert!(region.resize(0, 1000, 500));
    assert!(!job.reserve(0, slot, 1));
    region.set_contended(1, true);
    assert!(job.limits(1).is_some_and(GpuLimits::contended));
}

#[allow(unsafe_code)]
#[test]
fn the_job_cannot_write_its_limits() {
    let region = JobRegion::create("job", &grants(), 0).expect("create");
    let fd = region.limits_fd();
    // Neither write(2) nor a new writable mapping, through this descriptor or a reopened one.
    let byte = [0xffu8];
    // SAFETY: writes one byte from a live buffer to a descriptor we own.
    let wrote = unsafe { libc::write(fd, byte.as_ptr().cast(), 1) };
    assert_eq!(wrote, -1);
    let reopened = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/proc/self/fd/{fd}"));
    if let Ok(f) = reopened {
        assert!(Mapping::map(f.as_raw_fd(), LIMITS_LEN, true).is_err());
        assert!(std::io::Write::write(&mut &f, &byte).is_err());
    }
    assert!(Mapping::map(fd, LIMITS_LEN, true).is_err());
    // Nor can it be shrunk or grown to break the agent's mapping.
    // SAFETY: ftruncate on a descriptor we own.
    assert_ne!(unsafe { libc::ftruncate(fd, 10) }, 0);
    assert_ne!(unsafe { libc::ftruncate(region.usage_fd(), 10) }, 0);
}

#[test]
fn forged_or_missing_regions_are_refused() {
    let region = JobRegion::create("job", &grants(), 0).expect("create");
    // An unsealed copy of a real limits page, however faithful, is refused.
    let forged = memfd(c"forged", LIMITS_LEN).expect("memfd");
    let page = Mapping::map(forged.as_raw_fd(), LIMITS_LEN, true).expect("map");
    let real = Mapping::map(region.limits_fd(), LIMITS_LEN, false).expect("map");
    #[allow(unsafe_code)]
    // SAFETY: both mappings are LIMITS_LEN bytes and do not overlap.
    unsafe {
        std::ptr::copy_nonoverlapping(
            real.ptr.as_ptr().cast::<u8>(),
            page.ptr.as_ptr().cast::<u8>(),
            LIMITS_LEN,
        );
    }
    assert!(matches!(
        AttachedRegion::attach(forged.as_raw_fd(), region.usage_fd()),
        Err(RegionError::Unsealed)
    ));
    // Another job's usage page does not go with these limits.
    let other = JobRegion::create("other", &grants(), 0).expect("create");
    assert!(matches!(
        AttachedRegion::attach(region.limits_fd(), other.usage_fd()),
        Err(RegionError::Mismatch)
    ));
    // Swapped descriptors are the wrong size.
    assert!(AttachedRegion::attach(region.usage_fd(), region.limits_fd()).is_err());
}
