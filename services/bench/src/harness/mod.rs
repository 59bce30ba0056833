//! What the benchmarks share: starting `allot` processes and fleets of them, a PostgreSQL
//! of their own, an open-loop load of submits, the checks of what became of it (histories,
//! job runs, audit logs), and the control plane under faults that `bench crash` and `bench
//! failover` each configure. No benchmark imports another; each takes what it needs here.

pub(crate) mod controls;
pub(crate) mod faults;
pub(crate) mod history;
pub(crate) mod postgres;
pub(crate) mod processes;
pub(crate) mod scenario;
pub(crate) mod submits;

/// A range of whole numbers as `LOW-HIGH` (`1-4`), as flags take them.
pub(crate) fn parse_range(s: &str) -> Result<(u64, u64), String> {
    let (a, b) = s.split_once('-').ok_or("expected LOW-HIGH, e.g. 1-4")?;
    let (a, b): (u64, u64) = (
        a.trim()
            .parse()
            .map_err(|_| format!("`{a}` is not a number"))?,
        b.trim()
            .parse()
            .map_err(|_| format!("`{b}` is not a number"))?,
    );
    if a == 0 || a > b {
        return Err("expected 1 <= LOW <= HIGH".into());
    }
    Ok((a, b))
}

/// Prints a benchmark's result: one line of JSON with `--json`, else indented.
pub(crate) fn print(out: &serde_json::Value, one_line: bool) -> anyhow::Result<()> {
    if one_line {
        println!("{out}");
    } else {
        println!("{}", serde_json::to_string_pretty(out)?);
    }
    Ok(())
}

/// The `p` quantile (0–1) of ascending `sorted`, by nearest rank; 0 when empty.
pub(crate) fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Where a run keeps its files: `keep` (created if need be), else a temporary directory
/// removed when the returned guard drops. The path is canonical.
pub(crate) fn work_dir(
    keep: Option<&std::path::Path>,
) -> anyhow::Result<(tempfile::TempDir, std::path::PathBuf)> {
    use anyhow::Context as _;
    let dir = tempfile::tempdir().context("temporary directory")?;
    let root = match keep {
        Some(keep) => {
            std::fs::create_dir_all(keep)?;
            keep.canonicalize()?
        }
        None => dir.path().canonicalize()?,
    };
    Ok((dir, root))
}

/// Starts a control plane in this process on a fresh database, and a client holding the
/// admin token its first start made.
pub(crate) async fn in_process_server(
    config: allot_server::ServerConfig,
) -> anyhow::Result<(allot_server::RunningServer, allot_client::Client)> {
    use anyhow::Context as _;
    let server =
        allot_server::start(config, std::sync::Arc::new(allot_domain::SystemClock)).await?;
    let token = server
        .bootstrap_admin_token
        .clone()
        .context("a fresh database gives a bootstrap token")?;
    let client = allot_client::Client::new(&server.http_url(), Some(token), None)?;
    Ok((server, client))
}

/// What a benchmark's sleeping job reserves (`cpu_milli`, `memory_bytes`): a shell and a
/// `sleep` need a tenth of a CPU and little memory. Left to the tenant's default (one CPU
/// each), a simulated node of a small host would fit as many jobs as the host has CPUs, not
/// GPUs, and the benchmark would measure the queue that makes instead of what it says.
pub(crate) const SLEEP_JOB_CPU_MILLI: u32 = 100;
pub(crate) const SLEEP_JOB_MEMORY_BYTES: u64 = 64 << 20;

/// Starts one of a benchmark's `allot` child processes quietly (warnings only), its output
/// appended to `log`, killed if the benchmark drops it.
pub(crate) fn spawn_logged(
    cmd: &mut tokio::process::Command,
    log: &std::path::Path,
) -> anyhow::Result<tokio::process::Child> {
    use anyhow::Context as _;
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("opening {}", log.display()))?;
    // Warnings only, unless `ALLOT_BENCH_LOG` says otherwise (to look into a run).
    let level = std::env::var("ALLOT_BENCH_LOG").unwrap_or_else(|_| "warn".to_owned());
    cmd.env("ALLOT_LOG", level)
        .stdin(std::process::Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {:?}", cmd.as_std().get_program()))
}
