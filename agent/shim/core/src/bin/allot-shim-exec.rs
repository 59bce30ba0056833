//! `allot-shim-exec`: runs a command under the GPU-sharing shim with the limits given here,
//! exactly as the agent runs a job on a share of a GPU (a sealed limits region, the shim
//! preloaded). For trying the shim on a machine by hand, and for the GPU checks in
//! `agent/shim/scripts/gpu-check.sh`.
//!
//! ```text
//! allot-shim-exec --gpu GPU-… [--gpu GPU-…] [--memory 10GiB] [--compute 300]
//!                 [--mode strict|elastic] [--context-reserve 512MiB] [--shim PATH]
//!                 -- COMMAND [ARG…]
//! ```
//!
//! `--compute` is the share in thousandths (1000, the default: not throttled); `--memory`
//! the limit on each GPU (default: no limit below the GPU's own size, given as 1 PiB).

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, ExitCode};

use allot_shim_core::{ComputeMode, GpuGrant, JobRegion};

struct Args {
    gpus: Vec<String>,
    memory: u64,
    compute: u32,
    mode: ComputeMode,
    context_reserve: u64,
    shim: Option<PathBuf>,
    command: Vec<String>,
}

/// `10GiB`, `512MiB`, `1024` (bytes).
fn bytes(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let (number, unit) = t
        .find(|c: char| !c.is_ascii_digit())
        .map_or((t, ""), |i| t.split_at(i));
    let scale: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "TiB" => 1 << 40,
        other => return Err(format!("`{other}` is not a unit (B, KiB, MiB, GiB, TiB)")),
    };
    let n: u64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a size such as 10GiB"))?;
    n.checked_mul(scale)
        .ok_or_else(|| format!("`{text}` is too large"))
}

fn parse(argv: Vec<String>) -> Result<Args, String> {
    let mut args = Args {
        gpus: Vec::new(),
        memory: 1 << 50,
        compute: 1000,
        mode: ComputeMode::Strict,
        context_reserve: 512 << 20,
        shim: None,
        command: Vec::new(),
    };
    let mut it = argv.into_iter();
    while let Some(flag) = it.next() {
        if flag == "--" {
            args.command = it.collect();
            break;
        }
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--gpu" => args.gpus.push(value()?),
            "--memory" => args.memory = bytes(&value()?).map_err(|e| format!("--memory: {e}"))?,
            "--compute" => {
                args.compute = value()?
                    .parse()
                    .ok()
                    .filter(|c| (1..=1000).contains(c))
                    .ok_or("--compute: a share in thousandths, 1 to 1000")?;
            }
            "--mode" => args.mode = value()?.parse().map_err(|e| format!("--mode: {e}"))?,
            "--context-reserve" => {
                args.context_reserve =
                    bytes(&value()?).map_err(|e| format!("--context-reserve: {e}"))?;
            }
            "--shim" => args.shim = Some(PathBuf::from(value()?)),
            other => return Err(format!("unknown argument `{other}`")),
        }
    }
    if args.gpus.is_empty() {
        return Err("--gpu: name at least one GPU by UUID (nvidia-smi -L)".into());
    }
    if args.command.is_empty() {
        return Err("no command: put it after --".into());
    }
    Ok(args)
}

fn main() -> ExitCode {
    let args = match parse(std::env::args().skip(1).collect()) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("allot-shim-exec: {e}");
            return ExitCode::from(2);
        }
    };
    let shim = args.shim.clone().or_else(|| {
        std::env::current_exe()
            .ok()
            .map(|exe| exe.with_file_name("liballot_shim.so"))
    });
    let Some(shim) = shim.filter(|p| p.is_file()) else {
        eprintln!("allot-shim-exec: liballot_shim.so not found: pass --shim");
        return ExitCode::from(2);
    };
    let grants: Vec<GpuGrant> = args
        .gpus
        .iter()
        .map(|uuid| GpuGrant {
            uuid: uuid.clone(),
            memory_limit: args.memory,
            compute_milli: args.compute,
            mode: args.mode,
        })
        .collect();
    let region = match JobRegion::create("allot-shim-exec", &grants, args.context_reserve) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("allot-shim-exec: {e}");
            return ExitCode::from(1);
        }
    };
    let mut cmd = Command::new(&args.command[0]);
    cmd.args(&args.command[1..])
        .env("LD_PRELOAD", &shim)
        .env("CUDA_VISIBLE_DEVICES", args.gpus.join(","));
    region.pass_to(&mut cmd);
    // The command replaces this process and keeps the region's descriptors; the sealed
    // limits stay as written.
    let err = cmd.exec();
    eprintln!("allot-shim-exec: cannot run {}: {err}", args.command[0]);
    ExitCode::from(127)
}
