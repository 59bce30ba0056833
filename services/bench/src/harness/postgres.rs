//! A throwaway PostgreSQL cluster for the benchmarks that need one and are given none.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, bail};

/// A PostgreSQL cluster in a temporary directory, stopped on drop.
pub(crate) struct Throwaway {
    pg_ctl: PathBuf,
    data: PathBuf,
    as_postgres: bool,
    _dir: tempfile::TempDir,
}

impl Throwaway {
    pub(crate) fn start() -> anyhow::Result<(Self, String)> {
        let bin = allot_store::postgres_server_bindir().context(
            "no PostgreSQL found under /usr/lib/postgresql: install the postgresql package or set DATABASE_URL",
        )?;
        let dir = tempfile::tempdir()?;
        let data = dir.path().join("data");
        let port = allot_server::ports::stable_loopback_addr()?.port();
        let as_postgres = nix::unistd::Uid::effective().is_root();
        let run = |program: PathBuf, args: &[&str]| -> anyhow::Result<()> {
            let mut cmd = if as_postgres {
                let mut c = Command::new("runuser");
                c.args(["-u", "postgres", "--"]).arg(&program);
                c
            } else {
                Command::new(&program)
            };
            let out = cmd.args(args).output()?;
            if !out.status.success() {
                bail!(
                    "{} failed: {}",
                    program.display(),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            Ok(())
        };
        if as_postgres {
            let status = Command::new("chown")
                .arg("postgres")
                .arg(dir.path())
                .status()?;
            if !status.success() {
                bail!("cannot hand {} to the postgres user", dir.path().display());
            }
        }
        let data_s = data.display().to_string();
        run(
            bin.join("initdb"),
            &[
                "-D",
                &data_s,
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-locale",
            ],
        )?;
        let opts = format!(
            "-p {port} -k {} -c listen_addresses=127.0.0.1 -c max_connections=100 -c shared_buffers=256MB",
            dir.path().display()
        );
        let log = dir.path().join("server.log").display().to_string();
        run(
            bin.join("pg_ctl"),
            &["-D", &data_s, "-l", &log, "-w", "-o", &opts, "start"],
        )?;
        let url = format!("postgres://postgres@127.0.0.1:{port}/postgres");
        Ok((
            Self {
                pg_ctl: bin.join("pg_ctl"),
                data,
                as_postgres,
                _dir: dir,
            },
            url,
        ))
    }
}

impl Drop for Throwaway {
    fn drop(&mut self) {
        let mut cmd = if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&self.pg_ctl);
            c
        } else {
            Command::new(&self.pg_ctl)
        };
        let _ = cmd
            .arg("-D")
            .arg(&self.data)
            .args(["-m", "immediate", "-w", "stop"])
            .output();
    }
}
