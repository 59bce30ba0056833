//! First fit: the first node, in snapshot order, with enough free GPUs that meet the memory
//! requirement; its lowest-indexed such GPUs. A placeholder the scheduler issue replaces.

use allot_domain::{PendingReason, format_bytes};

use crate::{FreeGpus, Placed, Placement, Request};

#[derive(Debug, Default, Clone, Copy)]
pub struct FirstFit;

impl Placement for FirstFit {
    fn place(&self, req: &Request, free: &FreeGpus<'_>) -> Result<Placed, PendingReason> {
        let mut best_free = 0usize;
        let mut any_node = false;
        for (node, gpus) in free.nodes() {
            any_node = true;
            let fitting: Vec<_> = gpus
                .into_iter()
                .filter(|g| req.gpu_memory_bytes.is_none_or(|m| g.memory_bytes >= m))
                .collect();
            best_free = best_free.max(fitting.len());
            if fitting.len() >= req.gpus as usize {
                return Ok(Placed {
                    node_id: node.id.clone(),
                    gpu_uuids: fitting
                        .iter()
                        .take(req.gpus as usize)
                        .map(|g| g.uuid.clone())
                        .collect(),
                });
            }
        }
        let what = match req.gpu_memory_bytes {
            Some(m) => format!("GPUs with at least {} memory", format_bytes(m)),
            None => "GPUs".to_owned(),
        };
        Err(if any_node {
            PendingReason {
                code: "InsufficientGpus".into(),
                message: format!(
                    "no ready node has {} free {what}; the most free on one node is {best_free}",
                    req.gpus
                ),
            }
        } else {
            PendingReason {
                code: "NoReadyNodes".into(),
                message: "no node is ready (none registered, or all leases expired)".into(),
            }
        })
    }
}
