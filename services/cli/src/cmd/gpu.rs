//! `allot gpu check`: what the agent's NVML backend reads on this machine, changing nothing.

use std::time::Duration;

use allot_agent::gpu::{GpuBackend, MachineReport, NvmlBackend};
use allot_domain::format_bytes;
use anyhow::Context;
use clap::Subcommand;

use crate::output::{Format, print};

#[derive(Debug, Subcommand)]
pub enum GpuCmd {
    /// Read every GPU through NVML (inventory, MIG mode and layout, processes, health
    /// counters) and listen for XID events a while; prints a report. Read-only: it changes
    /// nothing on any GPU. Exits 1 when a GPU is unhealthy or a query failed.
    Check {
        /// Seconds to listen for XID events (0: do not wait).
        #[arg(long, default_value_t = 5)]
        listen_secs: u64,
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
    },
}

pub async fn run(cmd: GpuCmd) -> anyhow::Result<i32> {
    let GpuCmd::Check {
        listen_secs,
        output,
    } = cmd;
    let backend = NvmlBackend::start()
        .context("loading NVML (is the NVIDIA driver installed, and libnvidia-ml.so.1 found?)")?;
    let report = backend.report()?;
    if listen_secs > 0 {
        eprintln!("listening for XID events for {listen_secs} s…");
        tokio::time::sleep(Duration::from_secs(listen_secs)).await;
    }
    let events = backend.take_events();
    let bad = report
        .gpus
        .iter()
        .any(|g| g.health == "unhealthy" || !g.errors.is_empty());
    #[derive(serde::Serialize)]
    struct Out<'a> {
        #[serde(flatten)]
        report: &'a MachineReport,
        xid_events: Vec<String>,
    }
    let out = Out {
        report: &report,
        xid_events: events.iter().map(|e| format!("{e:?}")).collect(),
    };
    print(output, &out, |o| human(o.report, &o.xid_events))?;
    Ok(i32::from(bad))
}

fn human(r: &MachineReport, events: &[String]) -> String {
    let opt = |v: Option<String>| v.unwrap_or_else(|| "n/a".into());
    let mut s = format!(
        "driver {}, NVML {}, CUDA {}; {} GPU(s)\n",
        opt(r.driver_version.clone()),
        opt(r.nvml_version.clone()),
        opt(r
            .cuda_driver_version
            .map(|v| format!("{}.{}", v / 1000, (v % 1000) / 10))),
        r.gpus.len()
    );
    for g in &r.gpus {
        s += &format!(
            "\nGPU {} {} ({})\n  uuid {}  pci {}\n  memory {} of {} used",
            g.index,
            g.name,
            g.health,
            g.uuid,
            g.pci_bus_id,
            format_bytes(g.memory_used_bytes),
            format_bytes(g.memory_total_bytes)
        );
        if let Some(u) = g.utilization {
            s += &format!(
                "; utilization {}% (memory {}%)",
                u.gpu_percent, u.memory_percent
            );
        }
        s += &format!(
            "\n  MIG {}{}\n",
            match g.mig_enabled {
                Some(true) => "enabled",
                Some(false) => "disabled",
                None => "not supported",
            },
            if g.mig_pending != g.mig_enabled && g.mig_pending.is_some() {
                " (changes at the next reset)"
            } else {
                ""
            }
        );
        for i in &g.mig_instances {
            s += &format!(
                "    instance profile {} at slice {}: {}\n",
                i.profile, i.start, i.uuid
            );
        }
        s += &format!(
            "  ECC volatile: corrected {}, uncorrected {}; pages pending retirement: {}\n",
            opt(g.ecc_corrected_volatile.map(|v| v.to_string())),
            opt(g.ecc_uncorrected_volatile.map(|v| v.to_string())),
            opt(g.pages_pending_retirement.map(|v| v.to_string())),
        );
        if let Some(r) = g.remapped_rows {
            s += &format!(
                "  remapped rows: corrected {}, uncorrected {}, pending {}, failed {}\n",
                r.corrected, r.uncorrected, r.pending, r.failed
            );
        }
        s += &format!(
            "  XID events: {}\n  processes: {}\n",
            match g.xid_events_supported {
                Some(true) => "watched",
                Some(false) => "not supported",
                None => "unknown",
            },
            if g.processes.is_empty() {
                "none".to_owned()
            } else {
                g.processes
                    .iter()
                    .map(|p| {
                        format!(
                            "{} ({})",
                            p.pid,
                            p.used_memory_bytes.map_or("?".into(), format_bytes)
                        )
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        );
        for e in &g.errors {
            s += &format!("  error: {e}\n");
        }
    }
    s += &format!(
        "\nXID events while listening: {}\n",
        if events.is_empty() {
            "none".to_owned()
        } else {
            events.join(", ")
        }
    );
    s
}
