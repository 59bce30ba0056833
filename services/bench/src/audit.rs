//! `allot bench audit`: the audit log on PostgreSQL.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use allot_audit::bundle::{Bundle, Checks, Export, Line, verify, verify_with};
use allot_audit::{Checkpoint, Signer, TrustedKeys};
use allot_domain::{AuditContext, AuditEvent, SystemClock};
use allot_store::{AuditBatcher, AuditRepo, Store};

use anyhow::bail;
use clap::Args;
use serde_json::json;

use crate::harness::percentile;

#[derive(Debug, Args)]
pub struct AuditBench {
    /// PostgreSQL to use (a database of its own: the benchmark writes to it); a throwaway
    /// cluster is started when absent.
    #[arg(long, env = "DATABASE_URL")]
    database_url: Option<String>,
    /// Concurrent writers for the throughput run.
    #[arg(long, default_value_t = 8)]
    writers: usize,
    /// Entries per append transaction in the throughput run.
    #[arg(long, default_value_t = 200)]
    batch: usize,
    /// Seconds of each timed run.
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// Entries in the export + verify run.
    #[arg(long, default_value_t = 1_000_000)]
    entries: u64,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

fn event(log: &str, i: u64) -> AuditEvent {
    AuditEvent::success(
        log,
        "job.transition",
        format!("job/{:032x}", u128::from(i) * 0x9e37_79b9),
    )
    .before(json!({ "state": "running" }))
    .after(json!({ "state": "succeeded", "exit_code": 0, "node_id": "node-0001" }))
}

/// When event `i` of a stream of one per `interval` from `start` is due: its latency is
/// timed from here, not from when the sender got round to it, so a sender that falls
/// behind shows in the figures (no coordinated omission).
fn scheduled_at(start: Instant, interval: Duration, i: u64) -> Instant {
    start + interval * u32::try_from(i).unwrap_or(u32::MAX)
}

/// Appends one event per millisecond for `seconds`, each timed from its scheduled start
/// (`start + i ms`) to its commit; returns the latencies in milliseconds, sorted.
async fn latency(
    store: &Store,
    ctx: &AuditContext,
    log: &str,
    seconds: u64,
    batcher: Option<&AuditBatcher>,
) -> anyhow::Result<Vec<f64>> {
    let interval = Duration::from_millis(1);
    let mut pending = tokio::task::JoinSet::new();
    let total = seconds * 1000;
    let start = Instant::now();
    for i in 0..total {
        let scheduled = scheduled_at(start, interval, i);
        tokio::time::sleep_until(scheduled.into()).await;
        let (store, ctx, log, batcher) =
            (store.clone(), ctx.clone(), log.to_owned(), batcher.cloned());
        pending.spawn(async move {
            let e = event(&log, i);
            match batcher {
                Some(b) => b.record(ctx, e).await?,
                None => store.record_event(&ctx, e).await?,
            };
            anyhow::Ok(scheduled.elapsed().as_secs_f64() * 1000.0)
        });
    }
    let mut latencies = Vec::with_capacity(total as usize);
    while let Some(r) = pending.join_next().await {
        latencies.push(r??);
    }
    latencies.sort_by(f64::total_cmp);
    Ok(latencies)
}

pub async fn run(args: AuditBench) -> anyhow::Result<()> {
    let (_pg, url) = match &args.database_url {
        Some(u) => (None, u.clone()),
        None => {
            eprintln!("starting a throwaway PostgreSQL");
            let (pg, url) = crate::harness::postgres::Throwaway::start()?;
            (Some(pg), url)
        }
    };
    let store = Store::connect(&url, Arc::new(SystemClock)).await?;
    let ctx = AuditContext::system("bench");
    let run_id = uuid::Uuid::new_v4().simple().to_string();
    let log = |name: &str| format!("bench-{name}-{}", &run_id[..8]);

    // 1. Throughput: concurrent writers appending batches to one log.
    let throughput_log = log("tp");
    let appended = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(args.seconds);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..args.writers {
        let (store, ctx, appended, log) = (
            store.clone(),
            ctx.clone(),
            appended.clone(),
            throughput_log.clone(),
        );
        let batch = args.batch as u64;
        tasks.push(tokio::spawn(async move {
            let mut i = 0;
            while Instant::now() < deadline {
                let events = (i..i + batch).map(|n| event(&log, n)).collect();
                store.record_events(&ctx, &log, events).await?;
                appended.fetch_add(batch, Ordering::Relaxed);
                i += batch;
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let appends_per_s = appended.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64();

    // 2. Latency at a fixed 1,000 appends per second (open loop): through the group-commit
    //    batcher, as standalone events are meant to be written, and one transaction each.
    let (batcher, batcher_task) = AuditBatcher::start(store.clone(), 1000);
    let batched = latency(
        &store,
        &ctx,
        &log("lat-batched"),
        args.seconds,
        Some(&batcher),
    )
    .await?;
    drop(batcher);
    batcher_task.await?;
    let unbatched = latency(&store, &ctx, &log("lat-single"), args.seconds, None).await?;

    // 3. Export and verify a large log.
    let export_log = log("export");
    let fill_started = Instant::now();
    let mut written = 0;
    while written < args.entries {
        let n = 5000.min(args.entries - written);
        let events = (written..written + n)
            .map(|i| event(&export_log, i))
            .collect();
        store.record_events(&ctx, &export_log, events).await?;
        written += n;
    }
    let fill_s = fill_started.elapsed().as_secs_f64();
    let signer = Signer::generate_system("bench.allot.local")?;
    let head = store.audit_head(&export_log).await?;
    let origin = format!("bench.allot.local/{export_log}");
    let cp = Checkpoint {
        origin: origin.clone(),
        size: head.size,
        root: head.root,
        extensions: vec![],
    };
    let note = signer.sign(&cp.body())?;

    let export_started = Instant::now();
    let mut lines = Vec::with_capacity(args.entries as usize);
    while (lines.len() as u64) < head.size {
        let page = store
            .audit_entries(&export_log, lines.len() as u64, 10_000)
            .await?;
        if page.is_empty() {
            break;
        }
        lines.extend(page.into_iter().map(|e| match e.body {
            Some(body) => Line::Entry(body),
            None => Line::Pruned {
                seq: e.seq,
                leaf_hash: e.leaf_hash,
            },
        }));
    }
    let fetch_s = export_started.elapsed().as_secs_f64();
    let keys = TrustedKeys::from(signer.verifier());
    let exported_at = allot_domain::AuditEntry::format_time(chrono::Utc::now());
    let export = Export {
        log: &export_log,
        origin: &origin,
        exported_at: &exported_at,
        checkpoints: vec![(head.size, note)],
        keys: &keys,
    };
    let bundle = Bundle::full(&signer, export, &lines)?;
    drop(lines);
    let tar = bundle.to_tar()?;
    drop(bundle);
    let export_s = export_started.elapsed().as_secs_f64();
    // The log's integrity alone (signatures, hashes, continuity, checkpoints), one core;
    // then everything `allot audit verify` checks, renderings included, from the tar file.
    let read = Bundle::from_tar(&tar)?;
    let integrity_started = Instant::now();
    let report = verify_with(&read, Some(&keys), &[], Checks { renderings: false });
    let integrity_s = integrity_started.elapsed().as_secs_f64();
    drop(read);
    let verify_started = Instant::now();
    let read = Bundle::from_tar(&tar)?;
    let full = verify(&read, Some(&keys), &[]);
    let verify_s = verify_started.elapsed().as_secs_f64();
    for r in [&report, &full] {
        if !r.ok() || r.entries != args.entries {
            bail!(
                "the benchmark's own bundle did not verify: {:?}",
                r.problems
            );
        }
    }

    let mut out = json!({
        "backend": "postgres",
        "writers": args.writers,
        "batch": args.batch,
        "appends_per_s": appends_per_s.round(),
        "p50_append_ms_at_1000_per_s": percentile(&batched, 0.50),
        "p99_append_ms_at_1000_per_s": percentile(&batched, 0.99),
        "p50_append_ms_at_1000_per_s_one_txn_each": percentile(&unbatched, 0.50),
        "p99_append_ms_at_1000_per_s_one_txn_each": percentile(&unbatched, 0.99),
        "verify_entries_per_s": (args.entries as f64 / integrity_s).round(),
        "verify_full_entries_per_s": (args.entries as f64 / verify_s).round(),
        "export_entries": args.entries,
        "export_s": export_s,
        "export_fetch_s": fetch_s,
        "verify_s": verify_s,
        "fill_s": fill_s,
        "bundle_bytes": tar.len(),
    });
    let key = if args.entries == 1_000_000 {
        "export_verify_1m_s"
    } else {
        "export_verify_s"
    };
    out[key] = json!(export_s + verify_s);
    crate::harness::print(&out, args.json)?;
    store.close().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_timed_from_their_schedule_not_from_when_they_were_sent() {
        let start = Instant::now();
        let ms = Duration::from_millis(1);
        assert_eq!(scheduled_at(start, ms, 0), start);
        assert_eq!(
            scheduled_at(start, ms, 1500),
            start + Duration::from_millis(1500)
        );
    }
}
