//! The openb trace files: GPU nodes and pods, as CSV (no quoting: no field holds a comma).

use super::OpenbError;
/// A GPU node of the trace is a node of the model (GPU memory unknown: the trace does not
/// say).
pub use crate::placement::Node;
use crate::placement::{Cluster, Request};

/// A pod (task) of the trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pod {
    pub name: String,
    pub cpu_milli: u32,
    pub memory_mib: u32,
    /// 0 for a CPU-only pod; k > 1 needs k whole GPUs on one node.
    pub num_gpu: u8,
    /// Per-GPU share: 1000 is a whole GPU, less is a shared GPU (then `num_gpu == 1`).
    pub gpu_milli: u32,
    /// Acceptable GPU models; empty means any.
    pub gpu_spec: Vec<String>,
}

impl Pod {
    /// GPU milli the pod asks for in all.
    pub fn gpu_total(&self) -> u64 {
        u64::from(self.num_gpu) * u64::from(self.gpu_milli)
    }

    pub fn accepts(&self, model: &str) -> bool {
        self.gpu_spec.is_empty() || self.gpu_spec.iter().any(|m| m == model)
    }

    /// The pod as a request on `cluster` (its models resolved to the cluster's).
    pub fn request(&self, cluster: &Cluster) -> Request {
        Request {
            cpu_milli: self.cpu_milli,
            memory_mib: self.memory_mib,
            num_gpu: self.num_gpu,
            gpu_milli: self.gpu_milli,
            models: cluster.model_mask(self.gpu_spec.is_empty(), |m| self.accepts(m)),
        }
    }
}

/// A data row: its line number and fields.
type Row<'a> = (usize, Vec<&'a str>);

/// Splits a CSV file into its header's column indices and the data rows.
fn rows<'a>(
    what: &str,
    text: &'a str,
    want: &[&str],
) -> Result<(Vec<usize>, Vec<Row<'a>>), OpenbError> {
    let mut lines = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty());
    let (_, header) = lines
        .next()
        .ok_or_else(|| OpenbError::Parse(format!("{what}: empty file")))?;
    let columns: Vec<&str> = header.trim().split(',').collect();
    let idx = want
        .iter()
        .map(|w| {
            columns
                .iter()
                .position(|c| c == w)
                .ok_or_else(|| OpenbError::Parse(format!("{what}: no `{w}` column")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((
        idx,
        lines
            .map(|(n, l)| (n + 1, l.trim().split(',').collect()))
            .collect(),
    ))
}

fn field<'a>(what: &str, line: usize, row: &[&'a str], i: usize) -> Result<&'a str, OpenbError> {
    row.get(i)
        .copied()
        .ok_or_else(|| OpenbError::Parse(format!("{what} line {line}: too few columns")))
}

fn number<T: std::str::FromStr>(
    what: &str,
    line: usize,
    name: &str,
    s: &str,
) -> Result<T, OpenbError> {
    s.trim()
        .parse()
        .map_err(|_| OpenbError::Parse(format!("{what} line {line}: {name} `{s}` is not a number")))
}

/// Parses a node list (`sn,cpu_milli,memory_mib,gpu,model`).
pub fn parse_nodes(text: &str) -> Result<Vec<Node>, OpenbError> {
    let what = "node list";
    let (idx, rows) = rows(
        what,
        text,
        &["sn", "cpu_milli", "memory_mib", "gpu", "model"],
    )?;
    rows.into_iter()
        .map(|(line, r)| {
            let f = |i: usize| field(what, line, &r, idx[i]);
            Ok(Node {
                name: f(0)?.to_owned(),
                cpu_milli: number(what, line, "cpu_milli", f(1)?)?,
                memory_mib: number(what, line, "memory_mib", f(2)?)?,
                gpus: number(what, line, "gpu", f(3)?)?,
                model: f(4)?.to_owned(),
                gpu_memory_mib: 0,
            })
        })
        .collect()
}

/// Parses a pod list (`name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec,…]`).
/// `cpu_milli = 0` counts as 100, as in the published experiments.
pub fn parse_pods(text: &str) -> Result<Vec<Pod>, OpenbError> {
    let what = "pod list";
    let (idx, rows) = rows(
        what,
        text,
        &["name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli"],
    )?;
    let spec_col = text
        .lines()
        .next()
        .and_then(|h| h.trim().split(',').position(|c| c == "gpu_spec"));
    rows.into_iter()
        .map(|(line, r)| {
            let f = |i: usize| field(what, line, &r, idx[i]);
            let cpu: u32 = number(what, line, "cpu_milli", f(1)?)?;
            let num_gpu: u8 = number(what, line, "num_gpu", f(3)?)?;
            let gpu_milli: u32 = number(what, line, "gpu_milli", f(4)?)?;
            if gpu_milli > 1000 || (num_gpu > 1 && gpu_milli != 1000) {
                return Err(OpenbError::Parse(format!(
                    "{what} line {line}: gpu_milli {gpu_milli} with num_gpu {num_gpu}"
                )));
            }
            let gpu_spec = spec_col
                .and_then(|c| r.get(c))
                .map(|s| {
                    s.split('|')
                        .filter(|m| !m.is_empty())
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default();
            Ok(Pod {
                name: f(0)?.to_owned(),
                cpu_milli: if cpu == 0 { 100 } else { cpu },
                memory_mib: number(what, line, "memory_mib", f(2)?)?,
                num_gpu,
                gpu_milli: if num_gpu == 0 { 0 } else { gpu_milli },
                gpu_spec,
            })
        })
        .collect()
}
