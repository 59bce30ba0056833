//! `allot-workload`: workloads that are programs, for benchmarks of the real system on
//! simulated GPUs (`allot bench efficiency`). Both reach the CUDA driver through
//! `libcuda.so.1`, so a job's shim paces and accounts them as it would any application.
//!
//! ```text
//! allot-workload serve --port-file PATH [--listen 127.0.0.1:0] [--kernels 3]
//!                      [--kernel-us 1000] [--max-batch 1] [--batch-cost 0.25]
//! allot-workload train --progress-dir DIR [--checkpoint-dir DIR] [--kernel-us 2000]
//!                      [--checkpoint-secs 30]
//! ```
//!
//! **serve** answers requests over TCP: a request is 8 bytes (an id, little-endian), its
//! answer the same 8 bytes once its work ran. Requests wait in one queue in arrival order;
//! one GPU thread takes up to `--max-batch` of them at a time and runs `--kernels` kernels
//! for the batch, each of `kernel-us × (1 + batch-cost × (batch − 1))` (a batch costs more
//! than one request and less than its requests one by one), then answers them. The bound
//! port is written to `--port-file` once it listens.
//!
//! **train** launches kernels back to back. It resumes from the checkpoint in
//! `ALLOT_CHECKPOINT_DIR` (else `--checkpoint-dir`), checkpoints every `--checkpoint-secs`
//! and on SIGTERM (then exits 0), and keeps `--progress-dir/<job>-<attempt>` current with
//! the kernel-seconds this attempt ran and what it resumed from, so work lost to a kill is
//! what ran after the last checkpoint.

mod cuda;
mod serve;
mod train;

use std::collections::HashMap;

fn usage() -> ! {
    eprintln!(
        "usage: allot-workload serve --port-file PATH [--listen ADDR] [--kernels N] \
         [--kernel-us US] [--max-batch N] [--batch-cost F]\n       \
         allot-workload train --progress-dir DIR [--checkpoint-dir DIR] [--kernel-us US] \
         [--checkpoint-secs S]"
    );
    std::process::exit(2)
}

/// `--name value` pairs.
pub struct Args(HashMap<String, String>);

impl Args {
    fn parse(rest: &[String]) -> Result<Self, String> {
        let mut map = HashMap::new();
        let mut it = rest.iter();
        while let Some(k) = it.next() {
            let name = k
                .strip_prefix("--")
                .ok_or_else(|| format!("unexpected argument `{k}`"))?;
            let v = it.next().ok_or_else(|| format!("--{name} needs a value"))?;
            map.insert(name.to_owned(), v.clone());
        }
        Ok(Args(map))
    }

    pub fn text(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }

    pub fn num<T: std::str::FromStr>(&self, name: &str, default: T) -> Result<T, String> {
        match self.0.get(name) {
            None => Ok(default),
            Some(v) => v
                .parse()
                .map_err(|_| format!("--{name}: `{v}` is not a valid number")),
        }
    }
}

/// Writes `text` to `path` whole or not at all (a temporary file renamed over it).
pub fn write_atomic(path: &std::path::Path, text: &str) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let Some((cmd, rest)) = argv.split_first() else {
        usage()
    };
    let args = match Args::parse(rest) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("allot-workload: {e}");
            usage()
        }
    };
    let result = match cmd.as_str() {
        "serve" => serve::run(&args),
        "train" => train::run(&args),
        _ => usage(),
    };
    if let Err(e) = result {
        eprintln!("allot-workload {cmd}: {e}");
        std::process::exit(1);
    }
}
