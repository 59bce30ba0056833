//! What the GPU-sharing shim's tests run: the shim, the fake CUDA driver and the workload
//! programs (built by the same cargo, in the same profile, as the tests), the driver linked
//! under the names programs load (`libcuda.so.1`, `libnvidia-ml.so.1`), and the C probe that
//! reaches the driver in every way applications do (`agent/shim/probe/probe.c`), compiled
//! with the system C compiler.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use allot_shim_core::JobRegion;

pub struct ShimKit {
    /// `liballot_shim.so`.
    pub shim: PathBuf,
    /// Holds `libcuda.so.1`, `libcuda.so` and `libnvidia-ml.so.1`, all the fake driver.
    pub driver_dir: PathBuf,
    pub probe: PathBuf,
    /// `allot-workload`: the inference service and training loop benchmarks run as jobs.
    pub workload: PathBuf,
}

/// `target/<profile>`: where cargo put this test binary's profile's artifacts.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    // target/<profile>/deps/<test binary>
    exe.parent()
        .and_then(Path::parent)
        .expect("a test binary in target/<profile>/deps")
        .to_owned()
}

/// Builds (or finds fresh) the shim, the fake driver and the probe. Once per test process.
pub fn kit() -> &'static ShimKit {
    static KIT: OnceLock<ShimKit> = OnceLock::new();
    KIT.get_or_init(|| {
        let profile = profile_dir();
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut build = Command::new(cargo);
        build.args([
            "build",
            "--quiet",
            "-p",
            "allot-shim",
            "-p",
            "allot-fake-cuda",
            "-p",
            "allot-workload",
        ]);
        if profile.file_name().is_some_and(|n| n == "release") {
            build.arg("--release");
        }
        let status = build
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .expect("run cargo build");
        assert!(
            status.success(),
            "building the shim, the fake driver and the workloads failed"
        );
        let probe = allot_shim_core::probe::build(
            &profile.join("liballot_fake_cuda.so"),
            &profile.join("shim-kit"),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        ShimKit {
            shim: profile.join("liballot_shim.so"),
            driver_dir: probe.driver_dir,
            probe: probe.program,
            workload: profile.join("allot-workload"),
        }
    })
}

/// How a probe runs.
pub struct Run<'a> {
    /// The job's region; `None` runs with the shim but without limits.
    pub region: Option<&'a JobRegion>,
    /// Whether the shim is preloaded at all.
    pub preload: bool,
    pub env: Vec<(String, String)>,
}

impl Default for Run<'_> {
    fn default() -> Self {
        Run {
            region: None,
            preload: true,
            env: Vec::new(),
        }
    }
}

impl ShimKit {
    /// The probe in `mode` running `commands`, as a command not yet started.
    pub fn probe(&self, mode: &str, commands: &[&str], run: &Run<'_>) -> Command {
        let mut cmd = Command::new(&self.probe);
        cmd.arg(mode)
            .args(commands)
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("LD_LIBRARY_PATH", &self.driver_dir)
            .env("ALLOT_FAKE_CUDA_DEVICES", "2")
            .env("ALLOT_FAKE_CUDA_MEMORY", (8u64 << 30).to_string())
            .env("ALLOT_FAKE_CUDA_CONTEXT_BYTES", (300u64 << 20).to_string());
        if run.preload {
            cmd.env("LD_PRELOAD", &self.shim);
        }
        if let Some(region) = run.region {
            region.pass_to(&mut cmd);
        }
        cmd.envs(run.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        cmd
    }

    /// Runs the probe to the end; its output lines.
    pub fn run(&self, mode: &str, commands: &[&str], run: &Run<'_>) -> (Output, Vec<String>) {
        let out = self
            .probe(mode, commands, run)
            .output()
            .expect("run the probe");
        let lines = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_owned)
            .collect();
        (out, lines)
    }
}

/// The UUID of the fake driver's device `index`.
pub fn fake_uuid(index: u8) -> String {
    format!("GPU-fa000000-0000-0000-0000-0000000000{index:02x}")
}
