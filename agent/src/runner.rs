//! Runs one job as an OS process in its own process group, with its output captured to a
//! log file, and stops the whole group on cancel or shutdown.

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Mutex;
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio_util::sync::CancellationToken;

/// How much of the end of a job's log is sent back with its final status.
pub const LOG_TAIL_BYTES: u64 = 64 * 1024;

/// Why a job is being stopped from outside.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    Cancelled,
    AgentShutdown,
    /// The agent could not renew its lease: kill at once, the attempt is being requeued.
    LeaseLost,
    /// The job's GPU faulted through no fault of the job (XID): kill at once, requeue.
    DeviceFault,
    /// The job's work on its GPU failed (an application XID): kill at once, it failed.
    ApplicationFault,
    /// The job holds more GPU memory than its limit by the driver's count: kill at once,
    /// it failed.
    OverLimit,
}

/// Tells a running job to stop, and why.
#[derive(Debug, Default)]
pub struct StopSignal {
    token: CancellationToken,
    reason: Mutex<Option<StopReason>>,
    /// What happened, for the report (e.g. which XID).
    note: Mutex<Option<String>>,
    /// The grace the stop asked for, instead of the agent's own.
    grace: Mutex<Option<Duration>>,
}

impl StopSignal {
    pub fn stop(&self, reason: StopReason) {
        let mut r = self.reason.lock().unwrap_or_else(|e| e.into_inner());
        r.get_or_insert(reason);
        self.token.cancel();
    }

    /// Stops with a note saying what happened (the first stop's reason and note win).
    pub fn stop_with(&self, reason: StopReason, note: String) {
        {
            let r = self.reason.lock().unwrap_or_else(|e| e.into_inner());
            if r.is_none() {
                self.note
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get_or_insert(note);
            }
        }
        self.stop(reason);
    }

    /// Stops with this long between the termination signal and the kill (a preemption's
    /// grace, for the job to checkpoint). The first stop's grace wins.
    pub fn stop_within(&self, reason: StopReason, grace: Duration) {
        {
            let r = self.reason.lock().unwrap_or_else(|e| e.into_inner());
            if r.is_none() {
                self.grace
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get_or_insert(grace);
            }
        }
        self.stop(reason);
    }

    fn grace(&self) -> Option<Duration> {
        *self.grace.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn note(&self) -> Option<String> {
        self.note.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn reason(&self) -> Option<StopReason> {
        *self.reason.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct LaunchSpec {
    pub job_id: String,
    pub job_name: String,
    pub tenant: String,
    pub node_name: String,
    pub command: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub workdir: Option<String>,
    pub gpu_uuids: Vec<String>,
    /// Which run of the job this is.
    pub attempt: u32,
    /// The share of each GPU the job holds (1000: whole GPUs) and the GPU memory it asked
    /// for on each (0: not asked): what the GPU-sharing limits enforce.
    pub gpu_milli: u32,
    pub gpu_memory_bytes: u64,
    /// Where the job writes checkpoints, if it does.
    pub checkpoint_dir: Option<PathBuf>,
    /// Descriptors the job inherits (its GPU-sharing limits region).
    pub inherit_fds: Vec<i32>,
}

/// How a job ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Succeeded,
    Failed {
        exit_code: Option<i32>,
        message: String,
    },
    Cancelled {
        message: String,
    },
    /// Killed because the node lost its lease.
    Lost {
        message: String,
    },
    /// Killed because its GPU faulted (not the job's doing).
    DeviceFault {
        message: String,
    },
}

#[derive(Debug, Clone)]
pub struct Finished {
    pub outcome: Outcome,
    pub log_tail: String,
}

/// The environment every job starts from: nothing of the agent's own but a PATH, a locale and
/// the time zone, so agent secrets never leak into jobs.
fn base_env(job_dir: &Path) -> Vec<(String, String)> {
    let mut env = vec![
        (
            "PATH".to_owned(),
            std::env::var("PATH").unwrap_or_else(|_| "/usr/local/bin:/usr/bin:/bin".into()),
        ),
        ("HOME".to_owned(), job_dir.display().to_string()),
    ];
    for key in ["LANG", "TZ"] {
        if let Ok(v) = std::env::var(key) {
            env.push((key.to_owned(), v));
        }
    }
    env
}

/// The last [`LOG_TAIL_BYTES`] of a file, as text.
pub fn log_tail(path: &Path) -> String {
    let read = || -> std::io::Result<String> {
        let mut f = std::fs::File::open(path)?;
        let len = f.metadata()?.len();
        f.seek(SeekFrom::Start(len.saturating_sub(LOG_TAIL_BYTES)))?;
        let mut buf = Vec::new();
        f.read_to_end(&mut buf)?;
        Ok(String::from_utf8_lossy(&buf).into_owned())
    };
    read().unwrap_or_default()
}

fn signal_group(pid: u32, signal: Signal) {
    if let Ok(raw) = i32::try_from(pid) {
        // ESRCH (the group is gone already) is the expected case after a clean exit.
        let _ = killpg(Pid::from_raw(raw), signal);
    }
}

/// Whether any live (non-zombie) process remains in process group `pgid`, read from
/// `/proc`. A zombie has exited and only waits to be reaped, so it does not count.
pub fn process_group_alive(pgid: u32) -> bool {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return false;
    };
    entries.flatten().any(|e| {
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            return false;
        };
        // After the parenthesised command name: state, ppid, pgrp, …
        let Some((_, rest)) = stat.rsplit_once(')') else {
            return false;
        };
        let mut fields = rest.split_whitespace();
        let state = fields.next();
        let pgrp = fields.nth(1).and_then(|p| p.parse::<u32>().ok());
        pgrp == Some(pgid) && state != Some("Z")
    })
}

/// Makes the job's process die with the agent (Linux `PR_SET_PDEATHSIG`): an agent killed
/// outright takes its jobs' leaders along, so an attempt the control plane requeues does
/// not keep running here. (What a job forks itself is reaped by the service manager's
/// kill of the agent's cgroup, and by [`kill_orphans`] when the agent starts again.)
#[allow(unsafe_code)]
fn die_with_agent(cmd: &mut tokio::process::Command) {
    // SAFETY: the closure runs in the forked child before exec. It only calls prctl(2),
    // which is async-signal-safe, and allocates nothing.
    unsafe {
        cmd.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)
        });
    }
}

/// Lets the job inherit these descriptors (the agent opens everything close-on-exec).
#[allow(unsafe_code)]
fn inherit(cmd: &mut tokio::process::Command, fds: Vec<i32>) {
    if fds.is_empty() {
        return;
    }
    // SAFETY: the closure runs in the forked child before exec; it only calls fcntl(2),
    // which is async-signal-safe, and allocates nothing (the Vec was built before fork).
    unsafe {
        cmd.pre_exec(move || {
            for fd in &fds {
                if libc::fcntl(*fd, libc::F_SETFD, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
}

/// Kills every process left from an earlier run of an agent with this jobs directory (its
/// environment names a job directory under `jobs_dir`), before the agent registers again
/// and its jobs are requeued. Returns how many were killed.
pub fn kill_orphans(jobs_dir: &Path) -> usize {
    let marker = format!("ALLOT_JOB_DIR={}/", jobs_dir.display());
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let me = std::process::id();
    let mut killed = 0;
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(environ) = std::fs::read(e.path().join("environ")) else {
            continue;
        };
        let ours = environ
            .split(|b| *b == 0)
            .any(|var| var.starts_with(marker.as_bytes()));
        if ours && let Ok(raw) = i32::try_from(pid) {
            let _ = nix::sys::signal::kill(Pid::from_raw(raw), Signal::SIGKILL);
            killed += 1;
        }
    }
    killed
}

/// The newest entry (by modification time) of a checkpoint directory: what a later attempt
/// restores from.
pub fn latest_checkpoint(dir: &Path) -> Option<PathBuf> {
    std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .max()
        .map(|(_, path)| path)
}

/// `ALLOT_CHECKPOINT_DIR` (created if missing), and from the second attempt on
/// `ALLOT_RESTORE_FROM` when there is a checkpoint to restore.
fn checkpoint_env(spec: &LaunchSpec) -> Vec<(&'static str, PathBuf)> {
    let Some(dir) = &spec.checkpoint_dir else {
        return Vec::new();
    };
    // The job may create it itself; failing here must not fail the launch.
    let _ = std::fs::create_dir_all(dir);
    let mut env = vec![("ALLOT_CHECKPOINT_DIR", dir.clone())];
    if spec.attempt > 1
        && let Some(latest) = latest_checkpoint(dir)
    {
        env.push(("ALLOT_RESTORE_FROM", latest));
    }
    env
}

/// The job's directory: `<data_dir>/jobs/<job id>`, holding `output.log`.
pub fn job_dir(data_dir: &Path, job_id: &str) -> PathBuf {
    data_dir.join("jobs").join(job_id)
}

/// Starts the job, calls `started` with its pid, and supervises it to the end.
pub async fn run(
    spec: LaunchSpec,
    dir: PathBuf,
    stop: &StopSignal,
    grace: Duration,
    started: impl FnOnce(u32),
) -> Finished {
    let log_path = dir.join("output.log");
    let failed = |message: String| Finished {
        outcome: Outcome::Failed {
            exit_code: None,
            message,
        },
        log_tail: String::new(),
    };
    let Some(program) = spec.command.first() else {
        return failed("the job has no command".into());
    };
    let files = std::fs::create_dir_all(&dir).and_then(|()| {
        let out = std::fs::File::create(&log_path)?;
        let err = out.try_clone()?;
        Ok((out, err))
    });
    let (out, err) = match files {
        Ok(f) => f,
        Err(e) => return failed(format!("cannot create {}: {e}", log_path.display())),
    };
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(&spec.command[1..])
        .env_clear()
        .envs(base_env(&dir))
        .envs(&spec.env)
        .env("CUDA_VISIBLE_DEVICES", spec.gpu_uuids.join(","))
        .env("ALLOT_JOB_ID", &spec.job_id)
        .env("ALLOT_JOB_NAME", &spec.job_name)
        .env("ALLOT_TENANT", &spec.tenant)
        .env("ALLOT_NODE", &spec.node_name)
        .env("ALLOT_GPU_UUIDS", spec.gpu_uuids.join(","))
        .env("ALLOT_ATTEMPT", spec.attempt.to_string())
        .env("ALLOT_GPU_MILLI", spec.gpu_milli.to_string())
        .env("ALLOT_GPU_MEMORY_BYTES", spec.gpu_memory_bytes.to_string())
        .env("ALLOT_JOB_DIR", &dir)
        .envs(checkpoint_env(&spec))
        .current_dir(spec.workdir.as_deref().map_or(dir.as_path(), Path::new))
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0);
    die_with_agent(&mut cmd);
    inherit(&mut cmd, spec.inherit_fds.clone());
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return failed(format!("could not start `{program}`: {e}")),
    };
    let Some(pid) = child.id() else {
        return failed("the process exited before it could be watched".into());
    };
    started(pid);
    let status = tokio::select! {
        status = child.wait() => status,
        () = stop.token.cancelled() => {
            // Losing the lease allows no grace (the attempt may start elsewhere any moment),
            // and neither does a faulted GPU.
            let grace = match stop.reason() {
                Some(StopReason::Cancelled | StopReason::AgentShutdown) | None => {
                    stop.grace().unwrap_or(grace)
                }
                Some(
                    StopReason::LeaseLost
                    | StopReason::DeviceFault
                    | StopReason::ApplicationFault
                    | StopReason::OverLimit,
                ) => Duration::ZERO,
            };
            signal_group(pid, Signal::SIGTERM);
            match tokio::time::timeout(grace, child.wait()).await {
                Ok(status) => status,
                Err(_) => {
                    signal_group(pid, Signal::SIGKILL);
                    child.wait().await
                }
            }
        }
    };
    // Whatever the job left behind in its group goes with it.
    signal_group(pid, Signal::SIGKILL);
    let log_tail = log_tail(&log_path);
    let outcome = match (stop.reason(), status) {
        (Some(StopReason::Cancelled), _) => Outcome::Cancelled {
            message: "cancelled on request".into(),
        },
        (Some(StopReason::AgentShutdown), _) => Outcome::Failed {
            exit_code: None,
            message: "stopped because the node agent shut down".into(),
        },
        (Some(StopReason::LeaseLost), _) => Outcome::Lost {
            message: "killed: the node could not renew its lease with the control plane".into(),
        },
        (Some(StopReason::DeviceFault), _) => Outcome::DeviceFault {
            message: stop.note().unwrap_or_else(|| "its GPU faulted".into()),
        },
        (Some(StopReason::ApplicationFault), _) => Outcome::Failed {
            exit_code: None,
            message: format!(
                "{}: the job's work on the GPU failed",
                stop.note().unwrap_or_else(|| "an application XID".into())
            ),
        },
        (Some(StopReason::OverLimit), _) => Outcome::Failed {
            exit_code: None,
            message: stop
                .note()
                .unwrap_or_else(|| "killed: over its GPU memory limit".into()),
        },
        (None, Ok(s)) if s.success() => Outcome::Succeeded,
        (None, Ok(s)) => {
            use std::os::unix::process::ExitStatusExt;
            match (s.code(), s.signal()) {
                (Some(code), _) => Outcome::Failed {
                    exit_code: Some(code),
                    message: format!("exited with status {code}"),
                },
                (None, Some(sig)) => Outcome::Failed {
                    exit_code: None,
                    message: format!("killed by signal {sig}"),
                },
                (None, None) => Outcome::Failed {
                    exit_code: None,
                    message: "ended without an exit status".into(),
                },
            }
        }
        (None, Err(e)) => Outcome::Failed {
            exit_code: None,
            message: format!("lost track of the process: {e}"),
        },
    };
    Finished { outcome, log_tail }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(cmd: &[&str]) -> LaunchSpec {
        LaunchSpec {
            job_id: "j1".into(),
            job_name: "test".into(),
            tenant: "t".into(),
            node_name: "n".into(),
            command: cmd.iter().map(|s| (*s).to_owned()).collect(),
            env: BTreeMap::from([("GREETING".to_owned(), "hi".to_owned())]),
            workdir: None,
            gpu_uuids: vec!["GPU-a".into(), "GPU-b".into()],
            attempt: 1,
            gpu_milli: 1000,
            gpu_memory_bytes: 0,
            checkpoint_dir: None,
            inherit_fds: Vec::new(),
        }
    }

    #[test]
    fn the_newest_checkpoint_is_restored_from() {
        let dir = tempfile::tempdir().expect("temp dir");
        assert_eq!(latest_checkpoint(dir.path()), None);
        std::fs::write(dir.path().join("a"), "1").expect("write");
        std::thread::sleep(Duration::from_millis(20));
        std::fs::write(dir.path().join("b"), "2").expect("write");
        assert_eq!(latest_checkpoint(dir.path()), Some(dir.path().join("b")));
        let mut s = spec(&["true"]);
        s.checkpoint_dir = Some(dir.path().to_owned());
        assert_eq!(
            checkpoint_env(&s).len(),
            1,
            "the first attempt restores nothing"
        );
        s.attempt = 2;
        assert_eq!(
            checkpoint_env(&s)[1],
            ("ALLOT_RESTORE_FROM", dir.path().join("b"))
        );
    }

    #[tokio::test]
    async fn captures_output_and_environment() {
        let dir = tempfile::tempdir().expect("tempdir");
        let stop = StopSignal::default();
        let done = run(
            spec(&[
                "sh",
                "-c",
                "echo $GREETING $CUDA_VISIBLE_DEVICES $ALLOT_JOB_ID; echo err >&2",
            ]),
            dir.path().join("j1"),
            &stop,
            Duration::from_secs(1),
            |_| {},
        )
        .await;
        assert_eq!(done.outcome, Outcome::Succeeded);
        assert_eq!(done.log_tail, "hi GPU-a,GPU-b j1\nerr\n");
    }

    #[tokio::test]
    async fn reports_exit_codes_and_launch_failures() {
        let dir = tempfile::tempdir().expect("tempdir");
        let stop = StopSignal::default();
        let done = run(
            spec(&["sh", "-c", "exit 3"]),
            dir.path().join("a"),
            &stop,
            Duration::from_secs(1),
            |_| {},
        )
        .await;
        assert!(matches!(
            done.outcome,
            Outcome::Failed {
                exit_code: Some(3),
                ..
            }
        ));
        let done = run(
            spec(&["/no/such/program"]),
            dir.path().join("b"),
            &stop,
            Duration::from_secs(1),
            |_| {},
        )
        .await;
        match done.outcome {
            Outcome::Failed {
                exit_code: None,
                message,
            } => assert!(message.contains("could not start"), "{message}"),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn stop_kills_the_whole_group() {
        let dir = tempfile::tempdir().expect("tempdir");
        let stop = std::sync::Arc::new(StopSignal::default());
        let (tx, rx) = tokio::sync::oneshot::channel();
        let s = stop.clone();
        let path = dir.path().join("j");
        let task = tokio::spawn(async move {
            // The shell's child sleeps too: both must go.
            run(
                spec(&["sh", "-c", "sleep 60 & sleep 60"]),
                path,
                &s,
                Duration::from_secs(2),
                |pid| {
                    let _ = tx.send(pid);
                },
            )
            .await
        });
        let pid = rx.await.expect("started");
        stop.stop(StopReason::Cancelled);
        let done = task.await.expect("join");
        assert!(matches!(done.outcome, Outcome::Cancelled { .. }));
        // SIGKILL is delivered asynchronously: give the kernel a moment.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while process_group_alive(pid) {
            assert!(
                std::time::Instant::now() < deadline,
                "process group {pid} survived"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
