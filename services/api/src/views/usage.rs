//! Usage and GPU samples.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

#[derive(Debug, Default, Serialize, Deserialize, ToSchema, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct UsageQuery {
    /// First UTC day, `YYYY-MM-DD` (default: six days before `to`'s last day).
    pub from: Option<chrono::NaiveDate>,
    /// The day after the last, `YYYY-MM-DD` (default: tomorrow, so today is included).
    pub to: Option<chrono::NaiveDate>,
    /// `tenant` (default), `day` (per tenant and day), `job`, or `job,day`.
    #[param(pattern = "^(tenant|day|job|job,day)$")]
    pub by: Option<String>,
    /// Only this tenant (and nothing of its teams).
    pub tenant: Option<String>,
    /// `json` (default) or `csv`.
    #[param(pattern = "^(json|csv)$")]
    pub format: Option<String>,
}

/// One row of a usage report.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct UsageRowView {
    pub tenant: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_id: Option<String>,
    /// By job: its name, its state now, who submitted it, and how long its latest attempt
    /// ran (or runs) in seconds, as `sacct` shows them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub state: Option<allot_domain::JobState>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elapsed_secs: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub day: Option<chrono::NaiveDate>,
    /// Whole-GPU hours: a quarter GPU for four hours is one.
    pub gpu_hours: f64,
    /// GPU memory asked for, GiB times hours.
    pub gpu_memory_gib_hours: f64,
    /// MIG compute slices times hours.
    pub mig_slice_hours: f64,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct UsageReport {
    #[schema(value_type = String)]
    pub from: chrono::NaiveDate,
    #[schema(value_type = String)]
    pub to: chrono::NaiveDate,
    pub by: String,
    pub rows: Vec<UsageRowView>,
    pub total_gpu_hours: f64,
}

#[derive(Debug, Deserialize, ToSchema, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct SamplesQuery {
    /// `10s` (kept a day; the default) or `5m` (kept 90 days).
    #[param(pattern = "^(10s|5m)$")]
    pub resolution: Option<String>,
    /// How far back, in minutes (default 60; at most 90 days).
    #[param(minimum = 1, maximum = 129_600)]
    pub minutes: Option<u32>,
}

impl SamplesQuery {
    /// The resolution in seconds and the start of the window, checked.
    pub fn window(&self, now: DateTime<Utc>) -> Result<(i64, DateTime<Utc>), crate::ApiError> {
        let resolution = match self.resolution.as_deref() {
            None | Some("10s") => 10,
            Some("5m") => 300,
            Some(other) => {
                return Err(crate::ApiError::malformed(
                    "resolution",
                    format!("unknown resolution `{other}` (10s or 5m)"),
                ));
            }
        };
        let minutes = self.minutes.unwrap_or(60);
        if !(1..=90 * 24 * 60).contains(&minutes) {
            return Err(crate::ApiError::malformed(
                "minutes",
                "must be from 1 to 129600 (90 days)",
            ));
        }
        Ok((
            resolution,
            now - chrono::Duration::minutes(i64::from(minutes)),
        ))
    }
}

/// A job's averages over one bucket.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct JobSampleView {
    /// The bucket's start.
    pub at: DateTime<Utc>,
    /// The fraction of its GPUs' time the job kept busy, 0 to 1 (averaged over its GPUs).
    pub utilization: f64,
    /// GPU memory it held, all its GPUs together.
    pub memory_used_bytes: u64,
}

/// A GPU's averages over one bucket.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct GpuSampleView {
    /// The bucket's start.
    pub at: DateTime<Utc>,
    /// Busy fraction, 0 to 1.
    pub utilization: f64,
    pub memory_used_bytes: u64,
    pub power_watts: f64,
    pub temperature_c: f64,
    /// PCIe and NVLink data traffic, bytes per second (bucket means).
    pub pcie_rx_bytes_per_s: f64,
    pub pcie_tx_bytes_per_s: f64,
    pub nvlink_rx_bytes_per_s: f64,
    pub nvlink_tx_bytes_per_s: f64,
    /// Every reason the GPU's clocks were held down in the bucket (NVML's names).
    pub throttle_reasons: Vec<String>,
    /// ECC errors since the driver loaded, as last sampled in the bucket.
    pub ecc_corrected: u64,
    pub ecc_uncorrected: u64,
}
