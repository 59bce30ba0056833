//! `allot bench efficiency --demand`: a demand file of this repository's own
//! (`tests/fixtures/demand.csv`: two services, one of which steps from 5% to 50% of a GPU
//! for a third of the span) replayed against the real control plane, agents, shim and
//! workloads. The figures are read back from the control plane and the driver, not the
//! bench's constants: the step forces a resize, and it shows up in them.

use std::process::Command;

use allot_system_tests::allot_bin;
use allot_system_tests::shim::kit;

/// Runs `allot bench efficiency` with `args` on one node of two GPUs: its exit code, its
/// report and what it said on stderr.
fn bench(args: &[&str]) -> (Option<i32>, serde_json::Value, String) {
    kit();
    let out = Command::new(allot_bin())
        .args([
            "bench",
            "efficiency",
            "--nodes",
            "1",
            "--gpus-per-node",
            "2",
            "--json",
        ])
        .args(args)
        .env("ALLOT_LOG", "error")
        .output()
        .expect("allot bench efficiency runs");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let report: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("JSON ({e}): {stderr}"));
    (out.status.code(), report, stderr)
}

/// `tests/fixtures/demand-bursty.csv`: two services whose owners asked for a tenth of a GPU
/// (what an auto-sized job starts at by default), one idling at 4% of a GPU and bursting to
/// 45% for one step in three, the other steady at 6%.
const BURSTY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/demand-bursty.csv");

/// The negative control of the density figures: with sizing off, auto-sized services keep
/// the share their owners asked for (a tenth of a GPU here) and are placed as any share:
/// auto reports what static does. The density comes from the sizing, not
/// from the bench.
#[test]
fn with_sizing_off_auto_reports_what_static_reports() {
    let (code, report, stderr) = bench(&[
        "--demand",
        BURSTY,
        "--modes",
        "static,auto",
        "--sizing",
        "off",
        "--secs",
        "20",
    ]);
    assert_eq!(
        code,
        Some(1),
        "auto cannot meet its targets unsized: {report}\n{stderr}"
    );
    assert_eq!(report["sizing"], "off", "{report}");
    let (s, a) = (&report["modes"]["static"], &report["modes"]["auto"]);
    for figure in [
        "gpus_hosting_services_mean",
        "gpus_hosting_services_peak",
        "services_per_gpu",
    ] {
        assert_eq!(s[figure], a[figure], "{figure}: static {s}, auto {a}");
    }
    assert_eq!(a["resizes"], 0, "{a}");
    assert_eq!(a["moves"], 0, "{a}");
    assert_eq!(
        report["targets"]["hosting_gpus_vs_static"]["met"], false,
        "{report}"
    );
}

/// The negative control of the forecast: sized on the last sample alone with no headroom
/// and held to that share (`strict`), a service whose bursts come on top of an idle share
/// is held back at every burst, and the replay misses its objective (99.9% of requests
/// under 100 ms) in every ten seconds a burst falls in.
#[test]
fn sized_on_the_last_sample_without_headroom_bursts_miss_the_latency_objective() {
    let (code, report, stderr) = bursty("last-sample");
    assert_eq!(code, Some(1), "{report}\n{stderr}");
    assert_eq!(report["sizing"], "last-sample", "{report}");
    let auto = &report["modes"]["auto"];
    assert!(auto["resizes"].as_u64().is_some_and(|r| r >= 2), "{auto}");
    assert!(
        auto["over_slo_share"].as_f64().is_some_and(|s| s > 0.001),
        "{auto}"
    );
    assert_eq!(report["targets"]["p999_ms"]["met"], false, "{report}");
    // Not only the first burst: the second and third are held back as much.
    let each = &auto["over_100ms_each_10s"];
    for w in [1, 2] {
        assert!(
            each[w].as_u64().is_some_and(|n| n > 10),
            "window {w}: {auto}"
        );
    }
}

/// Its counterpart, the same replay sized by forecast: the first burst is held back (its
/// share grew only once it was), the ones after it are not, since a share held back is
/// remembered for a while.
#[test]
fn sized_by_forecast_a_bursty_service_is_held_back_at_its_first_burst_only() {
    let (_, report, stderr) = bursty("forecast");
    assert_eq!(report["sizing"], "forecast", "{report}\n{stderr}");
    let auto = &report["modes"]["auto"];
    assert_eq!(auto["lost"], 0, "{auto}");
    assert_eq!(auto["refused"], 0, "{auto}");
    let each = &auto["over_100ms_each_10s"];
    for w in [1, 2] {
        assert!(
            each[w].as_u64().is_some_and(|n| n <= 2),
            "window {w}: {auto}"
        );
    }
}

fn bursty(sizing: &str) -> (Option<i32>, serde_json::Value, String) {
    bench(&[
        "--demand",
        BURSTY,
        "--modes",
        "auto",
        "--sizing",
        sizing,
        "--sized-compute",
        "strict",
        "--secs",
        "30",
    ])
}

#[test]
fn a_replayed_demand_is_sized_by_allot_and_the_figures_say_so() {
    // The shim, the fake driver and the workloads, beside the binary as the bench wants.
    kit();
    let demand = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/demand.csv");
    let out = Command::new(allot_bin())
        .args([
            "bench",
            "efficiency",
            "--demand",
            demand,
            "--modes",
            "auto",
            "--nodes",
            "1",
            "--gpus-per-node",
            "2",
            "--secs",
            "30",
            "--json",
        ])
        .env("ALLOT_LOG", "error")
        .output()
        .expect("allot bench efficiency runs");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let report: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("JSON ({e}): {stderr}"));
    // With auto alone nothing measures it against exclusive or static: targets are missed,
    // and the run says so by its exit status.
    assert_eq!(out.status.code(), Some(1), "{report}\n{stderr}");
    assert_eq!(report["met"], false, "{report}");
    assert!(stderr.contains("auto missed a target"), "{stderr}");
    assert_eq!(
        report["time_scale"], 20.0,
        "600 s of demand in 30 s: {report}"
    );
    let auto = &report["modes"]["auto"];
    assert!(
        auto["resizes"].as_u64().is_some_and(|r| r >= 1),
        "the step to half a GPU is a resize: {auto}"
    );
    assert!(
        auto["requests"].as_u64().is_some_and(|r| r > 1_000),
        "{auto}"
    );
    let mean = auto["gpus_hosting_services_mean"].as_f64().unwrap_or(0.0);
    assert!(
        (1.0..=2.0).contains(&mean),
        "two services on one or two GPUs: {auto}"
    );
    for figure in [
        "gpus_hosting_services_peak",
        "fleet_busy",
        "hosting_busy",
        "services_per_gpu",
        "p50_ms",
        "p99_ms",
        "p999_ms",
        "over_100ms",
        "lost",
        "refused",
        "best_effort_kernel_s_per_s",
        "moves",
    ] {
        assert!(auto[figure].is_number(), "{figure}: {auto}");
    }
    // The GPUs were busy with what was sent (and the training backlog), by the driver's
    // own count.
    assert!(
        auto["fleet_busy"].as_f64().is_some_and(|b| b > 0.05),
        "{auto}"
    );
}
