//! GPU samples, downsampled on write into 10-second buckets (kept a day) and 5-minute
//! buckets (kept 90 days).

use allot_domain::GpuSample;
use chrono::{DateTime, Duration, Utc};
use sea_orm::sea_query::{Expr, ExprTrait, OnConflict};
use sea_orm::{ActiveValue::Set, ColumnTrait, EntityTrait, QueryFilter, QueryOrder};

use crate::convert::chunks;
use crate::entities::{gpu_samples, job_samples};
use crate::{Store, StoreError};

/// The resolutions samples are kept at, and for how long.
pub const RESOLUTIONS: [(i64, Duration); 2] = [(10, Duration::days(1)), (300, Duration::days(90))];

/// A bucket's averages (throttle reasons: every one seen in the bucket; ECC: the last
/// counts).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct SamplePoint {
    pub gpu_uuid: String,
    pub at: DateTime<Utc>,
    pub utilization: f64,
    pub memory_used_bytes: u64,
    pub power_watts: f64,
    pub temperature_c: f64,
    pub pcie_rx_bytes_per_s: f64,
    pub pcie_tx_bytes_per_s: f64,
    pub nvlink_rx_bytes_per_s: f64,
    pub nvlink_tx_bytes_per_s: f64,
    pub throttle_mask: u32,
    pub ecc_corrected: u64,
    pub ecc_uncorrected: u64,
}

/// One measurement of one job: its share of its GPUs' time (0 to 1, averaged over its GPUs)
/// and the GPU memory it holds (all its GPUs).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct JobSample {
    pub utilization: f64,
    pub memory_used_bytes: u64,
}

/// A job's bucket averages.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct JobSamplePoint {
    pub job_id: String,
    pub at: DateTime<Utc>,
    pub utilization: f64,
    pub memory_used_bytes: u64,
}

/// A resolution as the tables store it.
fn resolution_column(secs: i64) -> i32 {
    i32::try_from(secs).unwrap_or(i32::MAX)
}

fn bucket(at: DateTime<Utc>, secs: i64) -> DateTime<Utc> {
    let t = at.timestamp();
    DateTime::from_timestamp(t - t.rem_euclid(secs), 0).unwrap_or(at)
}

/// One node's GPU samples taken at one time: the node, the time, each GPU's sample.
pub(crate) type NodeSamples<'a> = (&'a str, DateTime<Utc>, &'a [(String, GpuSample)]);

/// Adds nodes' GPU samples (each node's, taken at its time) to their buckets, in one
/// statement per thousand rows.
pub(crate) async fn add_gpu_samples<C: sea_orm::ConnectionTrait>(
    db: &C,
    by_node: &[NodeSamples<'_>],
) -> Result<(), StoreError> {
    use gpu_samples::Column as C;
    let mut rows = Vec::new();
    for (node_id, at, samples) in by_node {
        for (uuid, s) in *samples {
            for (secs, _) in RESOLUTIONS {
                rows.push(gpu_samples::ActiveModel {
                    gpu_uuid: Set(uuid.clone()),
                    resolution_secs: Set(resolution_column(secs)),
                    at: Set(bucket(*at, secs)),
                    node_id: Set((*node_id).to_owned()),
                    utilization_sum: Set(s.utilization),
                    memory_used_sum: Set(s.memory_used_bytes as f64),
                    power_sum: Set(s.power_watts),
                    temperature_sum: Set(s.temperature_c),
                    pcie_rx_sum: Set(s.pcie_rx_bytes_per_s),
                    pcie_tx_sum: Set(s.pcie_tx_bytes_per_s),
                    nvlink_rx_sum: Set(s.nvlink_rx_bytes_per_s),
                    nvlink_tx_sum: Set(s.nvlink_tx_bytes_per_s),
                    throttle_mask: Set(i64::from(s.throttle_mask)),
                    ecc_corrected: Set(i64::try_from(s.ecc_corrected).unwrap_or(i64::MAX)),
                    ecc_uncorrected: Set(i64::try_from(s.ecc_uncorrected).unwrap_or(i64::MAX)),
                    count: Set(1),
                });
            }
        }
    }
    let add = |c: C| {
        Expr::col((gpu_samples::Entity, c))
            .add(Expr::col((sea_orm::sea_query::Alias::new("excluded"), c)))
    };
    for chunk in chunks(rows, 1000) {
        gpu_samples::Entity::insert_many(chunk)
            .on_conflict(
                OnConflict::columns([C::GpuUuid, C::ResolutionSecs, C::At])
                    .value(C::UtilizationSum, add(C::UtilizationSum))
                    .value(C::MemoryUsedSum, add(C::MemoryUsedSum))
                    .value(C::PowerSum, add(C::PowerSum))
                    .value(C::TemperatureSum, add(C::TemperatureSum))
                    .value(C::PcieRxSum, add(C::PcieRxSum))
                    .value(C::PcieTxSum, add(C::PcieTxSum))
                    .value(C::NvlinkRxSum, add(C::NvlinkRxSum))
                    .value(C::NvlinkTxSum, add(C::NvlinkTxSum))
                    .value(
                        C::ThrottleMask,
                        Expr::col((gpu_samples::Entity, C::ThrottleMask)).bit_or(Expr::col((
                            sea_orm::sea_query::Alias::new("excluded"),
                            C::ThrottleMask,
                        ))),
                    )
                    .update_columns([C::EccCorrected, C::EccUncorrected])
                    .value(C::Count, add(C::Count))
                    .to_owned(),
            )
            .exec_without_returning(db)
            .await?;
    }
    Ok(())
}

pub trait SampleRepo {
    /// Adds a node's GPU samples taken at `at` to their buckets.
    fn record_gpu_samples(
        &self,
        node_id: &str,
        at: DateTime<Utc>,
        samples: &[(String, GpuSample)],
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// Bucket averages at `resolution_secs` (10 or 300) since `since`, oldest first, of one
    /// GPU or (`None`) every GPU.
    fn gpu_samples(
        &self,
        gpu_uuid: Option<&str>,
        resolution_secs: i64,
        since: DateTime<Utc>,
    ) -> impl Future<Output = Result<Vec<SamplePoint>, StoreError>> + Send;
    /// Adds jobs' samples taken at `at` to their buckets.
    fn record_job_samples(
        &self,
        at: DateTime<Utc>,
        samples: &[(String, JobSample)],
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// Bucket averages at `resolution_secs` since `since`, oldest first, of one job or
    /// (`None`) every job.
    fn job_samples(
        &self,
        job_id: Option<&str>,
        resolution_secs: i64,
        since: DateTime<Utc>,
    ) -> impl Future<Output = Result<Vec<JobSamplePoint>, StoreError>> + Send;
    /// Drops buckets (of GPUs and of jobs) past their resolution's retention; returns how
    /// many.
    fn prune_gpu_samples(
        &self,
        now: DateTime<Utc>,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;
}

impl SampleRepo for Store {
    async fn record_gpu_samples(
        &self,
        node_id: &str,
        at: DateTime<Utc>,
        samples: &[(String, GpuSample)],
    ) -> Result<(), StoreError> {
        add_gpu_samples(&self.db, &[(node_id, at, samples)]).await
    }

    async fn gpu_samples(
        &self,
        gpu_uuid: Option<&str>,
        resolution_secs: i64,
        since: DateTime<Utc>,
    ) -> Result<Vec<SamplePoint>, StoreError> {
        use gpu_samples::Column as C;
        let mut q = gpu_samples::Entity::find()
            .filter(C::ResolutionSecs.eq(resolution_column(resolution_secs)))
            .filter(C::At.gte(since))
            .order_by_asc(C::At);
        if let Some(uuid) = gpu_uuid {
            q = q.filter(C::GpuUuid.eq(uuid));
        }
        Ok(q.all(&self.db)
            .await?
            .into_iter()
            .map(|m| {
                let n = f64::from(Ord::max(m.count, 1));
                SamplePoint {
                    gpu_uuid: m.gpu_uuid,
                    at: m.at,
                    utilization: m.utilization_sum / n,
                    memory_used_bytes: (m.memory_used_sum / n) as u64,
                    power_watts: m.power_sum / n,
                    temperature_c: m.temperature_sum / n,
                    pcie_rx_bytes_per_s: m.pcie_rx_sum / n,
                    pcie_tx_bytes_per_s: m.pcie_tx_sum / n,
                    nvlink_rx_bytes_per_s: m.nvlink_rx_sum / n,
                    nvlink_tx_bytes_per_s: m.nvlink_tx_sum / n,
                    throttle_mask: u32::try_from(m.throttle_mask).unwrap_or(0),
                    ecc_corrected: u64::try_from(m.ecc_corrected).unwrap_or(0),
                    ecc_uncorrected: u64::try_from(m.ecc_uncorrected).unwrap_or(0),
                }
            })
            .collect())
    }

    async fn record_job_samples(
        &self,
        at: DateTime<Utc>,
        samples: &[(String, JobSample)],
    ) -> Result<(), StoreError> {
        use job_samples::Column as C;
        for (job_id, s) in samples {
            for (secs, _) in RESOLUTIONS {
                let add = |c: C| {
                    Expr::col((job_samples::Entity, c))
                        .add(Expr::col((sea_orm::sea_query::Alias::new("excluded"), c)))
                };
                let row = job_samples::ActiveModel {
                    job_id: Set(job_id.clone()),
                    resolution_secs: Set(resolution_column(secs)),
                    at: Set(bucket(at, secs)),
                    utilization_sum: Set(s.utilization),
                    memory_used_sum: Set(s.memory_used_bytes as f64),
                    count: Set(1),
                };
                job_samples::Entity::insert(row)
                    .on_conflict(
                        OnConflict::columns([C::JobId, C::ResolutionSecs, C::At])
                            .value(C::UtilizationSum, add(C::UtilizationSum))
                            .value(C::MemoryUsedSum, add(C::MemoryUsedSum))
                            .value(C::Count, add(C::Count))
                            .to_owned(),
                    )
                    .exec(&self.db)
                    .await?;
            }
        }
        Ok(())
    }

    async fn job_samples(
        &self,
        job_id: Option<&str>,
        resolution_secs: i64,
        since: DateTime<Utc>,
    ) -> Result<Vec<JobSamplePoint>, StoreError> {
        use job_samples::Column as C;
        let mut q = job_samples::Entity::find()
            .filter(C::ResolutionSecs.eq(resolution_column(resolution_secs)))
            .filter(C::At.gte(since))
            .order_by_asc(C::At);
        if let Some(id) = job_id {
            q = q.filter(C::JobId.eq(id));
        }
        Ok(q.all(&self.db)
            .await?
            .into_iter()
            .map(|m| {
                let n = f64::from(Ord::max(m.count, 1));
                JobSamplePoint {
                    job_id: m.job_id,
                    at: m.at,
                    utilization: m.utilization_sum / n,
                    memory_used_bytes: (m.memory_used_sum / n) as u64,
                }
            })
            .collect())
    }

    async fn prune_gpu_samples(&self, now: DateTime<Utc>) -> Result<u64, StoreError> {
        let mut gone = 0;
        for (secs, keep) in RESOLUTIONS {
            let resolution = resolution_column(secs);
            gone += gpu_samples::Entity::delete_many()
                .filter(gpu_samples::Column::ResolutionSecs.eq(resolution))
                .filter(gpu_samples::Column::At.lt(now - keep))
                .exec(&self.db)
                .await?
                .rows_affected;
            gone += job_samples::Entity::delete_many()
                .filter(job_samples::Column::ResolutionSecs.eq(resolution))
                .filter(job_samples::Column::At.lt(now - keep))
                .exec(&self.db)
                .await?
                .rows_affected;
        }
        Ok(gone)
    }
}
