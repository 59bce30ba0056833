//! The GPU-sharing shim (`liballot_shim.so`), preloaded into real processes that reach the
//! fake CUDA driver in every way applications do: linked directly, through `dlopen` +
//! `dlsym`, and through `cuGetProcAddress` (both versions, and the per-thread default
//! stream variants).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use allot_shim_core::{ComputeMode, GpuGrant, JobRegion};
use allot_system_tests::shim::{Run, fake_uuid, kit};

const MIB: u64 = 1 << 20;
const MODES: [&str; 5] = ["direct", "dlopen", "procaddr", "procaddr-v1", "ptsz"];
const KINDS: [&str; 9] = [
    "mem", "pitch", "managed", "async", "pool", "create", "array", "array3d", "mipmap",
];

fn region(memory: u64, compute_milli: u32, mode: ComputeMode, context: u64) -> JobRegion {
    JobRegion::create(
        "job-under-test",
        &[GpuGrant {
            uuid: fake_uuid(0),
            memory_limit: memory,
            compute_milli,
            mode,
        }],
        context,
    )
    .expect("region")
}

fn with(region: &JobRegion) -> Run<'_> {
    Run {
        region: Some(region),
        ..Run::default()
    }
}

/// The output line for each command, checked to have run to the end.
fn expect_run(out: &std::process::Output, lines: &[String]) {
    assert!(
        out.status.success(),
        "probe failed ({:?}): {lines:?}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn every_allocation_function_on_every_path_is_held_to_the_limit() {
    // 1 GiB limit; each process's context is charged 64 MiB.
    for mode in MODES {
        let r = region(1024 * MIB, 1000, ComputeMode::Strict, 64 * MIB);
        let big = (800 * MIB).to_string();
        let over = (200 * MIB).to_string();
        let again = (900 * MIB).to_string();
        let mut commands = vec!["ctx:0".to_owned()];
        for (i, kind) in KINDS.iter().enumerate() {
            // Allocation ids count the successful ones: two per kind.
            commands.push(format!("alloc:{kind}:{big}"));
            commands.push(format!("alloc:{kind}:{over}"));
            commands.push(format!("free:{}", 2 * i));
            commands.push(format!("alloc:{kind}:{again}"));
            commands.push(format!("free:{}", 2 * i + 1));
        }
        let commands: Vec<&str> = commands.iter().map(String::as_str).collect();
        let (out, lines) = kit().run(mode, &commands, &with(&r));
        expect_run(&out, &lines);
        for (i, kind) in KINDS.iter().enumerate() {
            let at = 2 + 5 * i;
            let got = &lines[at..at + 5];
            assert_eq!(
                got,
                [
                    format!("alloc {kind} {big} ok {}", 2 * i),
                    // 64 + 800 + 200 MiB is over the 1024 MiB limit: an ordinary OOM (2).
                    format!("alloc {kind} {over} err 2"),
                    format!("free {} 0", 2 * i),
                    // The free gave the 800 MiB back.
                    format!("alloc {kind} {again} ok {}", 2 * i + 1),
                    format!("free {} 0", 2 * i + 1),
                ],
                "{mode}: {kind}"
            );
        }
        // Everything freed: only the context is left.
        assert_eq!(r.used(0), 64 * MIB, "{mode}");
    }
}

#[test]
fn the_job_sees_its_limit_as_the_size_of_the_gpu() {
    for mode in MODES {
        let r = region(1024 * MIB, 1000, ComputeMode::Strict, 64 * MIB);
        let (out, lines) = kit().run(
            mode,
            &[
                "ctx:0",
                "meminfo",
                "alloc:mem:104857600",
                "meminfo",
                "totalmem:0",
                "nvmlinfo:0",
                // A device of the node that is not the job's: no memory at all.
                "totalmem:1",
                "ctx:1",
                "alloc:mem:1048576",
                "meminfo",
                // NVML reports another GPU as it is: 8 GiB, and the driver's own
                // 300 MiB for the context the probe opened there.
                "nvmlinfo:1",
            ],
            &with(&r),
        );
        expect_run(&out, &lines);
        let (limit, ctx, hundred) = (1024 * MIB, 64 * MIB, 100 * MIB);
        assert_eq!(
            lines[2],
            format!("meminfo {} {limit} 0", limit - ctx),
            "{mode}"
        );
        assert_eq!(
            lines[4],
            format!("meminfo {} {limit} 0", limit - ctx - hundred),
            "{mode}"
        );
        assert_eq!(lines[5], format!("totalmem 0 {limit} 0"), "{mode}");
        let used = ctx + hundred;
        let free = limit - used;
        assert_eq!(
            lines[6],
            format!("nvmlinfo 0 {limit} {free} {used} {limit} {free} {used} 0 0"),
            "{mode}"
        );
        assert_eq!(lines[7], "totalmem 1 0 0", "{mode}");
        assert_eq!(lines[9], "alloc mem 1048576 err 2", "{mode}");
        assert_eq!(lines[10], "meminfo 0 0 0", "{mode}");
        let (eight, driver_ctx) = (8u64 << 30, 300 * MIB);
        let left = eight - driver_ctx;
        assert_eq!(
            lines[11],
            format!("nvmlinfo 1 {eight} {left} {driver_ctx} {eight} {left} {driver_ctx} 0 0"),
            "{mode}"
        );
    }
}

fn wait_for(path: &std::path::Path) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn two_processes_of_a_job_share_one_budget() {
    let r = region(1024 * MIB, 1000, ComputeMode::Strict, 64 * MIB);
    let dir = tempfile::tempdir().expect("tempdir");
    let file = |n: &str| dir.path().join(n).display().to_string();
    let (a_ready, b_ready, a_gone) = (file("a-ready"), file("b-ready"), file("a-gone"));
    let six = (600 * MIB).to_string();
    let a = kit()
        .probe(
            "direct",
            &[
                "ctx:0",
                &format!("alloc:mem:{six}"),
                &format!("touch:{a_ready}"),
                &format!("wait:{b_ready}"),
            ],
            &with(&r),
        )
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn a");
    let b = kit()
        .probe(
            "procaddr",
            &[
                &format!("wait:{a_ready}"),
                "ctx:0",
                // A holds 64 + 600; B's context takes 64 more.
                &format!("alloc:mem:{six}"),
                "alloc:mem:209715200",
                "meminfo",
                &format!("touch:{b_ready}"),
                &format!("wait:{a_gone}"),
                // A has exited without freeing: its bytes come back to the job.
                &format!("alloc:mem:{six}"),
            ],
            &with(&r),
        )
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn b");
    let a_out = a.wait_with_output().expect("a");
    assert!(a_out.status.success());
    assert!(String::from_utf8_lossy(&a_out.stdout).contains(&format!("alloc mem {six} ok 0")));
    std::fs::write(&a_gone, "").expect("touch");
    let b_out = b.wait_with_output().expect("b");
    let lines: Vec<String> = String::from_utf8_lossy(&b_out.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    expect_run(&b_out, &lines);
    assert_eq!(
        &lines[2..6],
        [
            format!("alloc mem {six} err 2"),
            "alloc mem 209715200 ok 0".to_owned(),
            // Free is the job's: 1024 - (64 + 600) - (64 + 200).
            format!("meminfo {} {} 0", 96 * MIB, 1024 * MIB),
            format!("alloc mem {six} ok 1"),
        ]
    );
}

#[test]
fn limits_cannot_be_raised_from_inside_the_job() {
    let r = region(256 * MIB, 1000, ComputeMode::Strict, 0);
    // Variables a job might hope the shim reads change nothing.
    let run = Run {
        region: Some(&r),
        env: vec![
            ("ALLOT_GPU_MEMORY_BYTES".into(), (8u64 << 30).to_string()),
            ("ALLOT_GPU_MILLI".into(), "1000".into()),
            ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT".into(), "0=8G".into()),
        ],
        preload: true,
    };
    let (out, lines) = kit().run("direct", &["ctx:0", "alloc:mem:536870912"], &run);
    expect_run(&out, &lines);
    assert_eq!(lines[2], "alloc mem 536870912 err 2");

    // Writing the limits through the inherited descriptor, or a reopened one, fails.
    let mut write = std::process::Command::new("sh");
    write.args([
        "-c",
        r#"printf '\377\377\377\377' 1<> "/proc/self/fd/$ALLOT_SHIM_LIMITS_FD" || exit 7
           printf '\377\377\377\377' >&"$ALLOT_SHIM_LIMITS_FD" || exit 8
           exit 0"#,
    ]);
    r.pass_to(&mut write);
    let status = write.status().expect("sh");
    assert_eq!(status.code(), Some(7), "the job could write its limits");
    assert_eq!(r.limits(0).map(|l| l.memory_limit()), Some(256 * MIB));

    // Pointing the shim elsewhere (another descriptor, nothing at all) refuses the GPU.
    for env in [
        vec![("ALLOT_SHIM_LIMITS_FD".to_owned(), r.usage_fd().to_string())],
        vec![("ALLOT_SHIM_LIMITS_FD".to_owned(), "not-a-number".to_owned())],
    ] {
        let run = Run {
            region: Some(&r),
            env,
            preload: true,
        };
        let (out, lines) = kit().run("direct", &["ctx:0"], &run);
        assert_eq!(lines, ["init 800"], "cuInit must fail closed");
        assert!(String::from_utf8_lossy(&out.stderr).contains("GPU access refused"));
    }
    let (out, lines) = kit().run("dlopen", &["ctx:0"], &Run::default());
    assert_eq!(lines, ["init 800"]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("ALLOT_SHIM_LIMITS_FD is not set"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_limit_resized_while_the_job_runs_applies_at_once() {
    let r = region(512 * MIB, 1000, ComputeMode::Strict, 0);
    let dir = tempfile::tempdir().expect("tempdir");
    let (asked, resized) = (dir.path().join("asked"), dir.path().join("resized"));
    let child = kit()
        .probe(
            "procaddr",
            &[
                "ctx:0",
                "alloc:mem:943718400",
                &format!("touch:{}", asked.display()),
                &format!("wait:{}", resized.display()),
                "alloc:mem:943718400",
                "meminfo",
            ],
            &with(&r),
        )
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    wait_for(&asked);
    assert!(r.resize(0, 2048 * MIB, 1000));
    std::fs::write(&resized, "").expect("touch");
    let out = child.wait_with_output().expect("probe");
    let lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    expect_run(&out, &lines);
    assert_eq!(
        &lines[2..],
        [
            "alloc mem 943718400 err 2",
            "alloc mem 943718400 ok 0",
            &format!("meminfo {} {} 0", 1148 * MIB, 2048 * MIB),
        ]
    );
}

#[test]
fn every_launch_entry_point_passes_the_pacer() {
    for mode in MODES {
        let r = region(1024 * MIB, 500, ComputeMode::Strict, 0);
        let (out, lines) = kit().run(
            mode,
            &[
                "ctx:0",
                "launch:kernel",
                "launch:ex",
                "launch:coop",
                "launch:graph",
            ],
            &with(&r),
        );
        expect_run(&out, &lines);
        assert_eq!(
            &lines[2..],
            [
                "launch kernel 0",
                "launch ex 0",
                "launch coop 0",
                "launch graph 0"
            ],
            "{mode}"
        );
        let launches = r.usage(0).map(|u| u.launches.load(Ordering::Acquire));
        assert_eq!(launches, Some(4), "{mode}: every launch was counted");
    }
}

fn duty(r: &JobRegion, kernel_us: u32) -> f64 {
    let cmd = format!("duty:{kernel_us}:2:3");
    let (out, lines) = kit().run("procaddr", &["ctx:0", &cmd], &with(r));
    expect_run(&out, &lines);
    lines[2]
        .split_whitespace()
        .nth(1)
        .and_then(|d| d.parse().ok())
        .expect("a duty line")
}

#[test]
fn a_busy_loop_gets_its_compute_share() {
    // Strict 30%: long kernels and short ones alike get 30% ± 10% of it.
    for kernel_us in [1000, 200] {
        let r = region(1024 * MIB, 300, ComputeMode::Strict, 0);
        let d = duty(&r, kernel_us);
        assert!((d - 0.3).abs() <= 0.03, "{kernel_us} µs kernels: duty {d}");
    }
    // Elastic 30% runs free while nobody else wants the GPU, and is held to its share when
    // someone does.
    let r = region(1024 * MIB, 300, ComputeMode::Elastic, 0);
    let free = duty(&r, 1000);
    assert!(free > 0.9, "alone, an elastic job is not throttled: {free}");
    r.set_contended(0, true);
    let held = duty(&r, 1000);
    assert!((held - 0.3).abs() <= 0.03, "contended elastic duty {held}");
}

/// The fake GPU contends as a GPU without MPS does: two processes launching back-to-back
/// 1 ms kernels on one simulated GPU take it in turn, each getting about half of it and
/// together about all of it (less the context switches); alone, one gets all of it.
#[test]
fn two_processes_on_one_simulated_gpu_share_it_in_turn() {
    let state = tempfile::tempdir().expect("temp dir");
    let shared = || Run {
        preload: false,
        env: vec![(
            "ALLOT_FAKE_CUDA_SHARED_DIR".to_owned(),
            state.path().to_string_lossy().into_owned(),
        )],
        ..Run::default()
    };
    let duty_of = |out: std::process::Output| -> f64 {
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.lines()
            .find_map(|l| l.strip_prefix("duty "))
            .and_then(|l| l.split_whitespace().next())
            .and_then(|d| d.parse().ok())
            .unwrap_or_else(|| panic!("a duty line: {text}"))
    };
    let both: Vec<_> = (0..2)
        .map(|_| {
            kit()
                .probe("direct", &["ctx:0", "duty:1000:1:4"], &shared())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("probe")
        })
        .collect();
    let duties: Vec<f64> = both
        .into_iter()
        .map(|p| duty_of(p.wait_with_output().expect("probe ends")))
        .collect();
    for d in &duties {
        assert!((d - 0.5).abs() <= 0.1, "each gets about half: {duties:?}");
    }
    // Together about all of it: what context switches and hand-overs leave (about 0.93 on
    // an idle machine; a loaded one wakes the next process later).
    let sum: f64 = duties.iter().sum();
    assert!(
        (0.8..=1.02).contains(&sum),
        "together about all of it: {duties:?}"
    );
    let (out, _) = kit().run("direct", &["ctx:0", "duty:1000:0:2"], &shared());
    let alone = duty_of(out);
    assert!(
        alone > 0.9,
        "alone, a process has the GPU to itself: {alone}"
    );
}
