//! `allot usage`: GPU-hours per tenant, day or job.

use allot_api::views::UsageReport;
use clap::Args;

use crate::client::Client;
use crate::output::{Format, print, table};

#[derive(Debug, Args)]
pub struct UsageArgs {
    /// First UTC day, YYYY-MM-DD (default: a week before --to).
    #[arg(long)]
    from: Option<chrono::NaiveDate>,
    /// The day after the last, YYYY-MM-DD (default: tomorrow).
    #[arg(long)]
    to: Option<chrono::NaiveDate>,
    /// tenant, day (per tenant and day), job, or job,day.
    #[arg(long, default_value = "tenant")]
    by: String,
    #[arg(long)]
    tenant: Option<String>,
    /// Print CSV (for spreadsheets and billing) instead.
    #[arg(long, conflicts_with = "output")]
    csv: bool,
    #[arg(short, long, value_enum, default_value_t)]
    output: Format,
}

pub async fn run(client: &Client, args: UsageArgs) -> anyhow::Result<()> {
    let mut query = vec![("by", args.by.clone())];
    if let Some(f) = args.from {
        query.push(("from", f.to_string()));
    }
    if let Some(t) = args.to {
        query.push(("to", t.to_string()));
    }
    if let Some(t) = &args.tenant {
        query.push(("tenant", t.clone()));
    }
    if args.csv {
        query.push(("format", "csv".to_owned()));
        let bytes = client.get_bytes("/api/v1/usage", &query).await?;
        // A name in it (a job's, a token's) acts on no terminal.
        print!(
            "{}",
            crate::output::terminal_safe(&String::from_utf8_lossy(&bytes))
        );
        return Ok(());
    }
    let r: UsageReport = client.get("/api/v1/usage", &query).await?;
    if args.by == "job" {
        // As sacct shows jobs: name, state, who, how long, and what they used.
        return print(args.output, &r, |r| {
            let rows: Vec<Vec<String>> = r
                .rows
                .iter()
                .map(|row| {
                    vec![
                        row.job_id
                            .as_deref()
                            .map_or("-", allot_domain::job::short_id)
                            .to_owned(),
                        row.name.clone().unwrap_or_else(|| "-".into()),
                        row.tenant.clone(),
                        row.user.clone().unwrap_or_else(|| "-".into()),
                        row.state.map_or_else(|| "-".into(), |s| s.to_string()),
                        row.elapsed_secs
                            .map_or_else(|| "-".into(), allot_domain::format_clock),
                        format!("{:.3}", row.gpu_hours),
                        format!("{:.1}", row.gpu_memory_gib_hours),
                    ]
                })
                .collect();
            format!(
                "{}\n{} to {}: {:.3} GPU-hours",
                table(
                    &[
                        "JOB",
                        "NAME",
                        "TENANT",
                        "USER",
                        "STATE",
                        "ELAPSED",
                        "GPU-HOURS",
                        "GPU-MEM GIB-H"
                    ],
                    &rows
                ),
                r.from,
                r.to,
                r.total_gpu_hours
            )
        });
    }
    print(args.output, &r, |r| {
        let rows: Vec<Vec<String>> = r
            .rows
            .iter()
            .map(|row| {
                vec![
                    row.tenant.clone(),
                    row.job_id
                        .as_deref()
                        .map_or("-", allot_domain::job::short_id)
                        .to_owned(),
                    row.day.map_or_else(|| "-".into(), |d| d.to_string()),
                    format!("{:.3}", row.gpu_hours),
                    format!("{:.1}", row.gpu_memory_gib_hours),
                    format!("{:.2}", row.mig_slice_hours),
                ]
            })
            .collect();
        format!(
            "{}\n{} to {}: {:.3} GPU-hours",
            table(
                &[
                    "TENANT",
                    "JOB",
                    "DAY",
                    "GPU-HOURS",
                    "GPU-MEM GIB-H",
                    "MIG SLICE-H"
                ],
                &rows
            ),
            r.from,
            r.to,
            r.total_gpu_hours
        )
    })
}
