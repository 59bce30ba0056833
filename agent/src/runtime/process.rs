//! The `process` runtime: each attempt is an OS process of the agent's own user in its own
//! process group, working in `<data dir>/jobs/<job id>`. Nothing confines it: it is for
//! `allot dev` (which runs without root) and for hosts whose operator explicitly accepts
//! unconfined jobs (`--runtime process`).

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use super::{
    Attempt, BoxFuture, Ending, JobRuntime, LaunchSpec, RuntimeKind, Started, Tracker, volumes,
};

pub struct ProcessRuntime {
    /// `<data dir>/jobs`: one working directory per job.
    jobs_dir: PathBuf,
}

impl ProcessRuntime {
    pub fn new(data_dir: &Path) -> Self {
        ProcessRuntime {
            jobs_dir: data_dir.join("jobs"),
        }
    }
}

/// The job's working directory: `<data_dir>/jobs/<job id>`.
pub fn job_dir(data_dir: &Path, job_id: &str) -> PathBuf {
    data_dir.join("jobs").join(job_id)
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

/// `ALLOT_CHECKPOINT_DIR` (created if missing), and from the second attempt on
/// `ALLOT_RESTORE_FROM` when there is a checkpoint to restore: host paths, since a process
/// sees the node's file system.
fn checkpoint_env(spec: &LaunchSpec) -> Result<Vec<(&'static str, PathBuf)>, String> {
    let prepared = volumes::prepare(
        &spec.volumes,
        &spec.tenant,
        spec.checkpoint_dir.as_deref(),
        None,
    )?;
    let Some(dir) = &spec.checkpoint_dir else {
        return Ok(Vec::new());
    };
    let host = volumes::host_path(&prepared, dir)
        .ok_or_else(|| format!("checkpoint_dir `{dir}` lies in none of the job's volumes"))?;
    // The job may create it itself; failing here must not fail the launch.
    let _ = std::fs::create_dir_all(&host);
    let mut env = vec![("ALLOT_CHECKPOINT_DIR", host.clone())];
    if spec.attempt > 1
        && let Some(latest) = volumes::latest_checkpoint(&prepared, dir)
        && let Some(path) = volumes::host_path(&prepared, &latest)
    {
        env.push(("ALLOT_RESTORE_FROM", path));
    }
    Ok(env)
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

/// Makes the child die with the agent (Linux `PR_SET_PDEATHSIG`): an agent killed outright
/// takes its jobs' leaders (and the container runtimes it started) along, so an attempt the
/// control plane requeues does not keep running here.
#[allow(unsafe_code)]
pub(crate) fn die_with_agent(cmd: &mut tokio::process::Command) {
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

struct ProcessAttempt {
    child: tokio::process::Child,
    pid: u32,
    /// Its file secrets, removed when it ends.
    secrets_dir: Option<PathBuf>,
    /// Its own temporary directory (`TMPDIR`), removed when it ends.
    tmp_dir: PathBuf,
}

impl Attempt for ProcessAttempt {
    fn started(&self) -> Started {
        Started {
            pid: self.pid,
            tracker: Tracker::Group(self.pid),
            image_digest: None,
        }
    }

    fn wait(&mut self) -> BoxFuture<'_, std::io::Result<ExitStatus>> {
        Box::pin(self.child.wait())
    }

    fn signal(&self, signal: Signal) {
        signal_group(self.pid, signal);
    }

    fn finish(self: Box<Self>) -> BoxFuture<'static, Ending> {
        signal_group(self.pid, Signal::SIGKILL);
        if let Some(d) = &self.secrets_dir {
            let _ = std::fs::remove_dir_all(d);
        }
        let _ = std::fs::remove_dir_all(&self.tmp_dir);
        Box::pin(async { Ending::default() })
    }
}

impl JobRuntime for ProcessRuntime {
    fn kind(&self) -> RuntimeKind {
        RuntimeKind::Process
    }

    fn start<'a>(
        &'a self,
        spec: &'a LaunchSpec,
        log: std::fs::File,
    ) -> BoxFuture<'a, Result<Box<dyn Attempt>, String>> {
        Box::pin(async move {
            let Some(program) = spec.command.first() else {
                return Err("the job has no command".into());
            };
            if spec.image.is_some() {
                return Err(
                    "this node runs jobs as processes (--runtime process), not container images"
                        .into(),
                );
            }
            let dir = self.jobs_dir.join(&spec.job_id);
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&dir)
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
            // A temporary directory of the attempt's own, as a container's /tmp is: what it
            // leaves there (a batch script's file, after a SIGKILL) goes when it ends.
            let tmp_dir = dir.join("tmp");
            let _ = std::fs::remove_dir_all(&tmp_dir);
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(&tmp_dir)
                .map_err(|e| format!("cannot create {}: {e}", tmp_dir.display()))?;
            let checkpoints = checkpoint_env(spec)?;
            let secret_env = super::secrets::env(&spec.secrets)?;
            let secrets_dir =
                super::secrets::write_files(&spec.secrets, &dir.join("secrets"), None)?;
            let err = log
                .try_clone()
                .map_err(|e| format!("cannot share the job's log: {e}"))?;
            let mut cmd = tokio::process::Command::new(program);
            cmd.args(&spec.command[1..])
                .env_clear()
                .envs(base_env(&dir))
                .env("TMPDIR", &tmp_dir)
                .envs(&spec.env)
                .envs(spec.allot_env(&dir.display().to_string()))
                .envs(checkpoints)
                .envs(secret_env)
                .envs(
                    secrets_dir
                        .iter()
                        .map(|d| (super::secrets::DIR_ENV, d.display().to_string())),
                )
                .current_dir(spec.workdir.as_deref().map_or(dir.as_path(), Path::new))
                .stdin(Stdio::null())
                .stdout(log)
                .stderr(err)
                .process_group(0);
            die_with_agent(&mut cmd);
            inherit(&mut cmd, spec.inherit_fds.clone());
            let remove_secrets = || {
                if let Some(d) = &secrets_dir {
                    let _ = std::fs::remove_dir_all(d);
                }
            };
            let child = cmd.spawn().map_err(|e| {
                remove_secrets();
                format!("could not start `{program}`: {e}")
            })?;
            let Some(pid) = child.id() else {
                remove_secrets();
                return Err("the process exited before it could be watched".to_owned());
            };
            Ok(Box::new(ProcessAttempt {
                child,
                pid,
                secrets_dir,
                tmp_dir,
            }) as Box<dyn Attempt>)
        })
    }

    fn remove_leftovers(&self) -> usize {
        kill_orphans(&self.jobs_dir)
    }
}
