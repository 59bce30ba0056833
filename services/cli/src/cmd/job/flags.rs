//! What `job submit`'s flags take: GPUs and their memory, time limits, environment,
//! secrets, volumes and packing, each parsed into the API's request with the flag named
//! in its error.

use allot_domain::parse_memory;
use anyhow::bail;
use serde_json::json;

use crate::cmd::{parse_milli, show_milli};

pub(super) fn parse_env(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .ok_or_else(|| format!("`{s}` is not KEY=VALUE"))
}

/// `logs --since`: a length of time back from now (`10m`, `0s`: from now on) or a time
/// (RFC 3339, e.g. `2026-12-05T12:00:00Z`).
pub(super) fn parse_since(s: &str) -> Result<chrono::DateTime<chrono::Utc>, String> {
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(s.trim()) {
        return Ok(t.with_timezone(&chrono::Utc));
    }
    let secs = match s.trim() {
        "0" | "0s" | "0m" | "0h" => 0,
        other => parse_time_limit(other).map_err(|_| {
            format!("`{s}`: a length of time back from now (10m, 2h, 1d) or a time (RFC 3339, 2026-12-05T12:00:00Z)")
        })?,
    };
    Ok(chrono::Utc::now() - chrono::Duration::seconds(i64::try_from(secs).unwrap_or(i64::MAX)))
}

/// `--cpus`: more than none (leaving the flag out takes the tenant's default).
pub(super) fn parse_cpus(s: &str) -> Result<u64, String> {
    match parse_milli(s)? {
        0 => Err(
            "a job needs some CPU: give more than 0 (or leave --cpus out for the tenant's default)"
                .into(),
        ),
        m => Ok(m),
    }
}

/// `--memory`: more than none (leaving the flag out takes the tenant's default).
pub(super) fn parse_job_memory(s: &str) -> Result<u64, String> {
    match parse_memory(s)? {
        0 => Err("a job needs some memory: give more than 0 (or leave --memory out for the tenant's default)".into()),
        b => Ok(b),
    }
}

/// `--pack`: `rack` (required) or `rack:preferred`.
pub(super) fn parse_pack(s: &str) -> Result<serde_json::Value, String> {
    let (label, required) = match s.split_once(':') {
        None => (s, true),
        Some((l, "preferred")) => (l, false),
        Some((l, "required")) => (l, true),
        Some(_) => return Err("expected LABEL, LABEL:required or LABEL:preferred".into()),
    };
    allot_domain::node::check_label_name(label)?;
    Ok(json!({ "label": label, "required": required }))
}

/// `--time-limit`: `90m`, `2h`, `1d12h`, `45s`, or Slurm's `[D-]HH:MM:SS`, as seconds.
pub(super) fn parse_time_limit(s: &str) -> Result<u64, String> {
    let bad =
        || format!("`{s}` is not a time limit: give units (90m, 2h, 1d12h, 45s) or [D-]HH:MM:SS");
    let s = s.trim();
    let secs = if s.contains(':') {
        let (days, clock) = match s.split_once('-') {
            Some((d, c)) => (d.parse::<u64>().map_err(|_| bad())?, c),
            None => (0, s),
        };
        let parts: Vec<u64> = clock
            .split(':')
            .map(|p| p.parse::<u64>().map_err(|_| bad()))
            .collect::<Result<_, _>>()?;
        let [h, m, sec] = parts[..] else {
            return Err(bad());
        };
        if m >= 60 || sec >= 60 {
            return Err(bad());
        }
        days * 86_400 + h * 3600 + m * 60 + sec
    } else {
        let mut total = 0u64;
        let mut digits = String::new();
        for c in s.chars() {
            if c.is_ascii_digit() {
                digits.push(c);
                continue;
            }
            let unit = match c {
                's' => 1,
                'm' => 60,
                'h' => 3600,
                'd' => 86_400,
                _ => return Err(bad()),
            };
            let n: u64 = digits.parse().map_err(|_| bad())?;
            total = n
                .checked_mul(unit)
                .and_then(|v| total.checked_add(v))
                .ok_or_else(bad)?;
            digits.clear();
        }
        if !digits.is_empty() {
            return Err(bad());
        }
        total
    };
    if secs == 0 {
        return Err(bad());
    }
    Ok(secs)
}

/// `--gpus` as the API's GPU count and per-GPU share.
/// What `--gpus` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gpus {
    /// Thousandths: whole GPUs (multiples of 1000) or a share of one.
    Milli(u64),
    /// A share Allot sizes, up to this many thousandths (a whole GPU when not said).
    Auto(Option<u64>),
}

pub(super) fn parse_gpus(s: &str) -> Result<Gpus, String> {
    match s.trim().strip_prefix("auto") {
        None if s.trim().eq_ignore_ascii_case("auto") => {
            Err(format!("`{s}`: write auto in lowercase"))
        }
        Some("") => Ok(Gpus::Auto(None)),
        Some(rest) => {
            let max = rest.strip_prefix(':').ok_or_else(|| {
                format!("`{s}`: write auto, or auto:MAX with MAX a share like 0.5")
            })?;
            match parse_milli(max)? {
                m @ 20..=1000 => Ok(Gpus::Auto(Some(m))),
                _ => Err(format!(
                    "`{s}`: auto:MAX takes a ceiling from 0.02 (the smallest share Allot sizes \
                     a job to) to 1 (a whole GPU)"
                )),
            }
        }
        None => parse_milli(s).map(Gpus::Milli),
    }
}

/// What `--gpu-memory` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuMemory {
    Bytes(u64),
    Auto,
}

pub(super) fn parse_gpu_memory(s: &str) -> Result<GpuMemory, String> {
    if s.trim() == "auto" {
        Ok(GpuMemory::Auto)
    } else {
        parse_memory(s).map(GpuMemory::Bytes)
    }
}

/// The submit body's `gpus`, `gpu_milli`, `gpu_memory_bytes` and `gpu_sizing`.
pub(super) fn gpu_fields(
    gpus: Gpus,
    memory: Option<GpuMemory>,
) -> anyhow::Result<serde_json::Value> {
    let bytes = match memory {
        Some(GpuMemory::Bytes(b)) => Some(b),
        _ => None,
    };
    let memory_auto = memory == Some(GpuMemory::Auto);
    Ok(match gpus {
        Gpus::Auto(max) => json!({
            "gpus": 1, "gpu_memory_bytes": bytes,
            "gpu_sizing": { "compute": true, "max_milli": max, "memory": memory_auto || bytes.is_none() },
        }),
        Gpus::Milli(milli) => {
            let (gpus, gpu_milli) = gpu_request(milli)?;
            if memory_auto && gpu_milli.is_none() {
                bail!(
                    "--gpu-memory auto sizes the memory of a share of one GPU: ask for --gpus \
                     auto or a share under 1"
                );
            }
            json!({
                "gpus": gpus, "gpu_milli": gpu_milli, "gpu_memory_bytes": bytes,
                "gpu_sizing": memory_auto.then(|| json!({ "memory": true })),
            })
        }
    })
}

pub(super) fn gpu_request(milli: u64) -> anyhow::Result<(u64, Option<u64>)> {
    match milli {
        0 => Ok((0, None)),
        m if m < 1000 => Ok((1, Some(m))),
        m if m % 1000 == 0 => Ok((m / 1000, None)),
        m => bail!(
            "--gpus {}: ask for whole GPUs, or a fraction of one GPU (under 1)",
            show_milli(m)
        ),
    }
}

/// `NAME=VAR` or `NAME=/run/secrets/FILE` as the API's secret use.
pub(super) fn parse_secret(s: &str) -> Result<serde_json::Value, String> {
    match s.split_once('=') {
        Some((secret, to)) if !secret.is_empty() && to.starts_with('/') => {
            Ok(json!({ "secret": secret, "file": to }))
        }
        Some((secret, to)) if !secret.is_empty() && !to.is_empty() => {
            Ok(json!({ "secret": secret, "env": to }))
        }
        _ => Err("expected NAME=VAR or NAME=/run/secrets/FILE".into()),
    }
}

/// `NAME:PATH[:ro]` as the API's volume mount.
pub(super) fn parse_volume(s: &str) -> Result<serde_json::Value, String> {
    let mut parts = s.splitn(3, ':');
    let (Some(volume), Some(path)) = (parts.next(), parts.next()) else {
        return Err("expected NAME:PATH or NAME:PATH:ro".into());
    };
    let read_only = match parts.next() {
        None | Some("rw") => false,
        Some("ro") => true,
        Some(other) => return Err(format!("`{other}`: the mode is ro or rw")),
    };
    if volume.is_empty() || path.is_empty() {
        return Err("expected NAME:PATH or NAME:PATH:ro".into());
    }
    Ok(json!({ "volume": volume, "path": path, "read_only": read_only }))
}
