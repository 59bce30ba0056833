//! The store's snapshot in the engine's model (nodes, GPUs, holding jobs, requests), and
//! how to map the engine's decisions back to nodes and GPU UUIDs.

use super::*;

pub(super) fn mib_up(bytes: u64) -> u32 {
    u32::try_from(bytes.div_ceil(MIB)).unwrap_or(u32::MAX)
}

pub(super) fn mib_down(bytes: u64) -> u32 {
    u32::try_from(bytes / MIB).unwrap_or(u32::MAX)
}

pub(super) fn u32_of(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

/// The live cluster in the engine's model, and how to map back.
pub(super) struct Mapped {
    pub(super) cluster: Cluster,
    /// Per engine node: the store's node id and its GPUs' UUIDs by engine index.
    pub(super) nodes: Vec<(String, String, Vec<String>)>,
    pub(super) by_node: HashMap<String, usize>,
    /// Whether each node takes new work (ready, and the index of its offered model).
    pub(super) offers: Vec<bool>,
    /// Per (node, GPU): whether it offers capacity.
    pub(super) usable: HashMap<(usize, u8), bool>,
    /// Per node, each GPU's NVLink domain.
    pub(super) nvlink: Vec<Vec<Option<u32>>>,
}

impl Mapped {
    pub(super) fn new(
        nodes: &[Node],
        holding: &[&StoredJob],
        now: DateTime<Utc>,
        suspect_after: Option<(chrono::Duration, chrono::Duration)>,
        reachable: Option<&std::collections::HashSet<String>>,
    ) -> Self {
        let mut models: Vec<String> = Vec::new();
        let mut model_of = |key: String| -> u8 {
            let i = models.iter().position(|m| *m == key).unwrap_or_else(|| {
                models.push(key);
                models.len() - 1
            });
            u8::try_from(i.min(63)).unwrap_or(63)
        };
        let mut states = Vec::with_capacity(nodes.len());
        let mut names = Vec::with_capacity(nodes.len());
        let mut gpu_memory = Vec::with_capacity(nodes.len());
        let mut ids = Vec::with_capacity(nodes.len());
        let mut offers = Vec::with_capacity(nodes.len());
        let mut usable = HashMap::new();
        let mut nvlink = Vec::with_capacity(nodes.len());
        // What the jobs already hold on each node: CPU, memory, and milli per GPU UUID.
        let mut held: HashMap<&str, (u64, u64, HashMap<&str, u64>)> = HashMap::new();
        for j in holding {
            let Some(node) = j.node_id.as_deref() else {
                continue;
            };
            let h = held.entry(node).or_default();
            h.0 += u64::from(j.spec.cpu_milli);
            h.1 += u64::from(mib_up(j.spec.memory_bytes));
            let milli = u64::from(held_milli(j));
            for g in &j.gpu_uuids {
                *h.2.entry(g.as_str()).or_default() += milli;
            }
        }
        for (i, n) in nodes.iter().enumerate() {
            let ready = node_ready(n, now, suspect_after, reachable);
            let gpus: Vec<_> = n.gpus.iter().take(usize::from(u8::MAX)).collect();
            // The node's model: the most common among its healthy GPUs (first on a tie).
            let mut counts: Vec<(String, usize)> = Vec::new();
            for g in gpus.iter().filter(|g| g.healthy) {
                let key = model_key(&g.model);
                match counts.iter_mut().find(|(m, _)| *m == key) {
                    Some((_, c)) => *c += 1,
                    None => counts.push((key, 1)),
                }
            }
            let chosen = counts
                .iter()
                .enumerate()
                .max_by_key(|(pos, (_, c))| (*c, usize::MAX - pos))
                .map(|(_, (m, _))| m.clone());
            let (cpu_held, mem_held, gpu_held) =
                held.get(n.id.as_str()).cloned().unwrap_or_default();
            let mut gpu_free = Vec::with_capacity(gpus.len());
            for (gi, g) in gpus.iter().enumerate() {
                let offered = ready
                    && gpu_offered(n, g)
                    && g.mig.is_none()
                    && chosen.as_deref() == Some(&*model_key(&g.model));
                let already = gpu_held.get(g.uuid.as_str()).copied().unwrap_or(0);
                let nominal = if offered { u64::from(GPU_MILLI) } else { 0 };
                gpu_free.push(u32_of(nominal.max(already)));
                usable.insert((i, u8::try_from(gi).unwrap_or(u8::MAX)), offered);
            }
            let cpu = match (ready, n.cpu_milli) {
                (false, _) => cpu_held,
                (true, 0) => u64::from(u32::MAX / 2),
                (true, c) => c.max(cpu_held),
            };
            let memory = match (ready, n.memory_bytes) {
                (false, _) => mem_held,
                (true, 0) => u64::from(u32::MAX / 2),
                (true, m) => u64::from(mib_down(m)).max(mem_held),
            };
            let model = chosen.clone().map_or(63, &mut model_of);
            let memory_mib = gpus
                .iter()
                .filter(|g| chosen.as_deref() == Some(&*model_key(&g.model)))
                .map(|g| mib_down(g.memory_bytes))
                .min()
                .unwrap_or(0);
            states.push(NodeState {
                cpu_free: u32_of(cpu),
                memory_free: u32_of(memory),
                gpu_free,
                model,
                kinds: 0,
            });
            names.push(n.name.clone());
            gpu_memory.push(memory_mib);
            ids.push((
                n.id.clone(),
                n.name.clone(),
                gpus.iter().map(|g| g.uuid.clone()).collect(),
            ));
            offers.push(ready);
            nvlink.push(gpus.iter().map(|g| g.nvlink_domain).collect());
        }
        let capacity = states.iter().map(|s| u64::from(s.gpu_free_total())).sum();
        let by_node = ids
            .iter()
            .enumerate()
            .map(|(i, (id, _, _))| (id.clone(), i))
            .collect();
        Self {
            cluster: Cluster {
                rank: (0..states.len() as u32).collect(),
                nodes: states,
                names,
                models,
                capacity,
                gpu_memory_mib: gpu_memory,
            },
            nodes: ids,
            by_node,
            offers,
            usable,
            nvlink,
        }
    }

    /// The engine's choice `c` for `r` in the node's real GPU indices (`perm`: engine index
    /// to real index, per node), moved into one NVLink domain when it asks for several
    /// whole GPUs, spans domains, and some domain has that many free (the one with the
    /// fewest free that fits, keeping larger free domains whole). `perm` then swaps the
    /// GPUs exchanged, so what the engine still thinks free is free.
    pub(super) fn within_nvlink(
        &self,
        perm: &mut [Vec<u8>],
        actual: &[NodeState],
        c: Choice,
        r: &Request,
    ) -> Choice {
        let n = c.node;
        let taken: Vec<u8> = c
            .gpus
            .iter()
            .map(|&g| perm[n].get(usize::from(g)).copied().unwrap_or(g))
            .collect();
        let domains = &self.nvlink[n];
        let domain_of = |g: u8| domains.get(usize::from(g)).copied().flatten();
        let one = taken
            .first()
            .and_then(|&g| domain_of(g))
            .is_some_and(|d| taken.iter().all(|&g| domain_of(g) == Some(d)));
        if taken.len() < 2 || r.gpu_milli < GPU_MILLI || one {
            return Choice {
                node: n,
                gpus: taken,
            };
        }
        // Wholly free, offered GPUs by domain.
        let mut free: HashMap<u32, Vec<u8>> = HashMap::new();
        for (i, &f) in actual[n].gpu_free.iter().enumerate() {
            let Ok(g) = u8::try_from(i) else { break };
            if f >= GPU_MILLI
                && self.usable.get(&(n, g)).copied().unwrap_or(false)
                && let Some(d) = domain_of(g)
            {
                free.entry(d).or_default().push(g);
            }
        }
        let Some(gpus) = free
            .into_iter()
            .filter(|(_, g)| g.len() >= taken.len())
            .min_by_key(|(d, g)| (g.len(), *d))
            .map(|(_, g)| g[..taken.len()].to_vec())
        else {
            return Choice {
                node: n,
                gpus: taken,
            };
        };
        for (&e, &target) in c.gpus.iter().zip(&gpus) {
            let (e, p) = (usize::from(e), &mut perm[n]);
            if let Some(f) = p.iter().position(|&x| x == target)
                && e < p.len()
            {
                p.swap(e, f);
            }
        }
        Choice { node: n, gpus }
    }

    /// The engine's request for what `job` asks (its held share once placed), or why it can
    /// never be placed.
    pub(super) fn request(
        &self,
        job: &StoredJob,
        gpu_milli: u32,
    ) -> Result<Request, PendingReason> {
        let s = &job.spec;
        let num_gpu = u8::try_from(s.gpus).map_err(|_| PendingReason {
            code: "NoRoom".into(),
            message: format!("no node has {} GPUs (a job runs on one node)", s.gpus),
        })?;
        let models = if s.gpu_models.is_empty() {
            u64::MAX
        } else {
            let wanted: Vec<String> = s.gpu_models.iter().map(|m| model_key(m)).collect();
            let mask = self
                .cluster
                .models
                .iter()
                .enumerate()
                .filter(|(_, m)| wanted.contains(m))
                .fold(0u64, |acc, (i, _)| acc | (1 << i.min(63)));
            if mask == 0 {
                let has = if self.cluster.models.is_empty() {
                    "no node has GPUs".to_owned()
                } else {
                    format!("the nodes have {}", self.cluster.models.join(", "))
                };
                return Err(PendingReason {
                    code: "NoRoom".into(),
                    message: format!(
                        "no node has a GPU of model {}; {has}",
                        s.gpu_models.join(" or ")
                    ),
                });
            }
            mask
        };
        Ok(Request {
            cpu_milli: s.cpu_milli,
            memory_mib: mib_up(s.memory_bytes),
            num_gpu,
            gpu_milli: if num_gpu == 0 { 0 } else { gpu_milli },
            models,
        })
    }

    /// Where `job` must not go now: the node it was lost on, or the GPUs it faulted on,
    /// until its anti-affinity expires.
    pub(super) fn avoidance(
        &self,
        job: &StoredJob,
        now: DateTime<Utc>,
    ) -> crate::engine::Avoidance {
        let mut out = crate::engine::Avoidance::default();
        let Some(avoid) = job.avoid.as_ref().filter(|a| a.until > now) else {
            return out;
        };
        if let Some(&n) = avoid.node_id.as_ref().and_then(|id| self.by_node.get(id)) {
            out.nodes.push(n);
        }
        for uuid in &avoid.gpu_uuids {
            for (n, (_, _, uuids)) in self.nodes.iter().enumerate() {
                if let Some(g) = uuids.iter().position(|u| u == uuid)
                    && let Ok(g) = u8::try_from(g)
                {
                    out.gpus.push((n, g));
                }
            }
        }
        out
    }

    pub(super) fn choice(&self, job: &StoredJob) -> Option<Choice> {
        let node = *self.by_node.get(job.node_id.as_deref()?)?;
        let uuids = &self.nodes[node].2;
        let gpus = job
            .gpu_uuids
            .iter()
            .map(|u| {
                uuids
                    .iter()
                    .position(|x| x == u)
                    .and_then(|p| u8::try_from(p).ok())
            })
            .collect::<Option<Vec<u8>>>()?;
        Some(Choice { node, gpus })
    }

    /// The UUIDs of a placement's GPUs.
    pub(super) fn uuids(&self, c: &Choice) -> Vec<String> {
        let uuids = &self.nodes[c.node].2;
        c.gpus
            .iter()
            .filter_map(|&g| uuids.get(usize::from(g)).cloned())
            .collect()
    }

    /// Whether every GPU of the placement offers capacity (a running job there may be
    /// reclaimed without handing out room that is not there).
    pub(super) fn all_usable(&self, c: &Choice) -> bool {
        self.offers[c.node]
            && c.gpus
                .iter()
                .all(|&g| self.usable.get(&(c.node, g)).copied().unwrap_or(false))
    }
}

/// The share of each GPU a holding job holds.
pub(super) fn held_milli(j: &StoredJob) -> u32 {
    if j.spec.gpus == 0 {
        0
    } else {
        j.share().gpu_milli
    }
}

/// `j` as the engine sees it; `whole_gpu_memory_mib`: what each of its whole GPUs holds of
/// GPU memory (all of it).
pub(super) fn engine_job(
    j: &StoredJob,
    request: Request,
    seq: u64,
    whole_gpu_memory_mib: u32,
) -> Job {
    Job {
        whole_gpu_memory_mib,
        id: j.id.clone(),
        queue: j.tenant_id.clone(),
        request,
        replicas: 1,
        priority: j.spec.priority,
        preemptible: j.spec.preemptible,
        seq,
        gpu_memory_mib: j.spec.gpu_memory_bytes.map_or(0, mib_up),
        isolation: j.spec.isolation,
        class: j.spec.class,
        avoid: Default::default(),
        pack: None,
        best_effort: j.spec.is_best_effort(),
        // The live pass gives a sized job its forecast where the sizer has one.
        sizing: j.spec.gpu_sizing.max_milli.map(|_| crate::engine::Sizing {
            wanted_milli: request.gpu_milli,
            settled: false,
        }),
    }
}
