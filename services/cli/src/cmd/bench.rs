//! `allot bench …` runs `allot-bench`, the benchmarks' own binary, from beside this one:
//! the `allot` a fleet runs links none of what only benchmarks need.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;

use anyhow::Context;

/// Replaces this process with `allot-bench ARGS` (returns only when it cannot).
pub fn exec(args: Vec<OsString>) -> anyhow::Error {
    let me = match std::env::current_exe().context("locating the allot binary") {
        Ok(p) => p,
        Err(e) => return e,
    };
    let bench = me.with_file_name("allot-bench");
    if !bench.is_file() {
        return anyhow::anyhow!(
            "the benchmarks are a binary of their own, and {} is missing: put allot-bench \
             beside allot (`cargo build --release -p allot-bench` builds it into \
             target/release, `cargo build -p allot-bench` into target/debug)",
            bench.display()
        );
    }
    let err = std::process::Command::new(&bench)
        .args(args)
        .env("ALLOT_BIN", &me)
        .exec();
    anyhow::anyhow!("cannot run {}: {err}", bench.display())
}
