//! Hierarchical quotas: tenants and their teams, each with a guaranteed amount, an optional
//! hard limit and an over-quota weight per resource. Pure arithmetic over usage; the
//! scheduling pass ([`crate::engine`]) decides with it.

use std::collections::HashMap;
use std::fmt;

/// The resources a quota speaks of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resource {
    /// GPU compute in exact parts ([`allot_domain::GpuParts`], 7,000 to a GPU), so that
    /// shares in milli and MIG instances in sevenths of a GPU add up.
    Gpu,
    CpuMilli,
    MemoryMib,
    /// GPU memory asked for (per GPU, times the GPUs).
    GpuMemoryMib,
}

impl Resource {
    pub const ALL: [Resource; 4] = [
        Resource::Gpu,
        Resource::CpuMilli,
        Resource::MemoryMib,
        Resource::GpuMemoryMib,
    ];

    fn index(self) -> usize {
        self as usize
    }

    /// `amount` in the resource's unit, exactly for CPUs and GPUs in milli ("7.5", "16",
    /// "0.25", "1.25": a share is never rounded into another; a MIG slice to a thousandth of
    /// a GPU, "0.143"), memory in GiB to a hundredth ("33", "1.5", "0.1"; "0.01" at least
    /// when not nothing).
    pub fn number(self, amount: u64) -> String {
        match self {
            Resource::Gpu => allot_domain::GpuParts(amount).to_string(),
            Resource::CpuMilli => allot_domain::format_milli(amount),
            Resource::MemoryMib | Resource::GpuMemoryMib => {
                let hundredths = (amount * 100 + 512) / 1024;
                let hundredths = if amount > 0 { hundredths.max(1) } else { 0 };
                allot_domain::format_milli(hundredths * 10)
            }
        }
    }

    pub fn unit(self) -> &'static str {
        match self {
            Resource::Gpu => "GPUs",
            Resource::CpuMilli => "CPUs",
            Resource::MemoryMib => "GiB",
            Resource::GpuMemoryMib => "GiB of GPU memory",
        }
    }

    /// `amount` as people read it: "7.5 GPUs", "16 CPUs", "48 GiB", "1 GPU".
    pub fn show(self, amount: u64) -> String {
        let number = self.number(amount);
        let unit = match (self, number.as_str()) {
            (Resource::Gpu, "1") => "GPU",
            (Resource::CpuMilli, "1") => "CPU",
            _ => self.unit(),
        };
        format!("{number} {unit}")
    }
}

/// An amount of each resource.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Amounts(pub [u64; 4]);

impl Amounts {
    /// GPU share (in milli, counted in parts), CPU and memory; no GPU memory (see
    /// [`Amounts::with_gpu_memory`]).
    pub fn new(gpu_milli: u64, cpu_milli: u64, memory_mib: u64) -> Self {
        Self([
            allot_domain::GpuParts::milli(gpu_milli).0,
            cpu_milli,
            memory_mib,
            0,
        ])
    }

    /// GPU compute in parts (a MIG instance's slices), CPU and memory.
    pub fn of_parts(gpu: allot_domain::GpuParts, cpu_milli: u64, memory_mib: u64) -> Self {
        Self([gpu.0, cpu_milli, memory_mib, 0])
    }

    pub fn with_gpu_memory(mut self, gpu_memory_mib: u64) -> Self {
        self.0[Resource::GpuMemoryMib.index()] = gpu_memory_mib;
        self
    }

    pub fn get(&self, r: Resource) -> u64 {
        self.0[r.index()]
    }

    pub fn add(&mut self, other: &Amounts) {
        for (a, b) in self.0.iter_mut().zip(other.0) {
            *a += b;
        }
    }

    pub fn sub(&mut self, other: &Amounts) {
        for (a, b) in self.0.iter_mut().zip(other.0) {
            *a = a.saturating_sub(b);
        }
    }

    pub fn plus(&self, other: &Amounts) -> Amounts {
        let mut sum = *self;
        sum.add(other);
        sum
    }

    /// Every resource at most `other`'s.
    pub fn fits_in(&self, other: &Amounts) -> bool {
        self.0.iter().zip(other.0).all(|(a, b)| *a <= b)
    }
}

/// Per-resource hard limits; `None` is unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits(pub [Option<u64>; 4]);

impl Limits {
    /// From a quota's limits: GPUs in milli (counted in parts), CPU in milli, memory and
    /// GPU memory in MiB.
    pub fn new(
        gpu_milli: Option<u64>,
        cpu_milli: Option<u64>,
        memory_mib: Option<u64>,
        gpu_memory_mib: Option<u64>,
    ) -> Self {
        Self([
            gpu_milli.map(|m| allot_domain::GpuParts::milli(m).0),
            cpu_milli,
            memory_mib,
            gpu_memory_mib,
        ])
    }

    pub fn get(&self, r: Resource) -> Option<u64> {
        self.0[r.index()]
    }
}

/// One tenant or team in the quota tree.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueSpec {
    pub id: String,
    pub name: String,
    pub parent: Option<String>,
    /// Held for this queue (and its children) whenever it asks; lent to others while idle.
    pub guaranteed: Amounts,
    /// Never exceeded, borrowing included.
    pub limit: Limits,
    /// Share of spare capacity relative to other queues (dominant-resource fair).
    pub weight: u32,
    /// The least isolation its jobs (and its children's) run at.
    pub min_isolation: allot_domain::Isolation,
}

/// What is wrong with a tree of quotas, naming tenants by name (the first field of each).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum QuotaError {
    #[error("quota `{0}`: the parent `{1}` does not exist")]
    UnknownParent(String, String),
    #[error("quota `{0}` appears twice")]
    Duplicate(String),
    #[error("quota `{0}` is its own ancestor")]
    Cycle(String),
    #[error("quota `{0}`: weight must be at least 1")]
    ZeroWeight(String),
    #[error("quota `{0}`: guaranteed {what} is above its limit {limit}", what = .1, limit = .2)]
    GuaranteeAboveLimit(String, String, String),
    #[error("quota `{0}`: its children are guaranteed {1} in all, more than its own {2}")]
    ChildrenOverGuarantee(String, String, String),
}

/// The validated tree of queues.
#[derive(Debug, Clone)]
pub struct QuotaTree {
    specs: Vec<QueueSpec>,
    index: HashMap<String, usize>,
    parent: Vec<Option<usize>>,
    /// Resources someone is guaranteed; the others are first come, first served and never
    /// make a job borrowed.
    governed: [bool; 4],
}

impl QuotaTree {
    pub fn new(specs: Vec<QueueSpec>) -> Result<Self, QuotaError> {
        let mut index = HashMap::new();
        for (i, s) in specs.iter().enumerate() {
            if index.insert(s.id.clone(), i).is_some() {
                return Err(QuotaError::Duplicate(s.name.clone()));
            }
            if s.weight == 0 {
                return Err(QuotaError::ZeroWeight(s.name.clone()));
            }
            for r in Resource::ALL {
                if let Some(limit) = s.limit.get(r)
                    && s.guaranteed.get(r) > limit
                {
                    return Err(QuotaError::GuaranteeAboveLimit(
                        s.name.clone(),
                        r.show(s.guaranteed.get(r)),
                        r.show(limit),
                    ));
                }
            }
        }
        let parent = specs
            .iter()
            .map(|s| match &s.parent {
                None => Ok(None),
                Some(p) => index
                    .get(p)
                    .map(|&i| Some(i))
                    .ok_or_else(|| QuotaError::UnknownParent(s.name.clone(), p.clone())),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let governed = Resource::ALL.map(|r| specs.iter().any(|s| s.guaranteed.get(r) > 0));
        let tree = Self {
            specs,
            index,
            parent,
            governed,
        };
        for q in 0..tree.specs.len() {
            if tree.ancestors(q).skip(1).any(|a| a == q) {
                return Err(QuotaError::Cycle(tree.specs[q].name.clone()));
            }
        }
        for (q, spec) in tree.specs.iter().enumerate() {
            let mut children = Amounts::default();
            for (c, _) in tree
                .parent
                .iter()
                .enumerate()
                .filter(|(_, p)| **p == Some(q))
            {
                children.add(&tree.specs[c].guaranteed);
            }
            if !children.fits_in(&spec.guaranteed) {
                // Only what the children are guaranteed more of.
                let over: Vec<Resource> = Resource::ALL
                    .into_iter()
                    .filter(|&r| children.get(r) > spec.guaranteed.get(r))
                    .collect();
                let show = |a: &Amounts| {
                    over.iter()
                        .map(|&r| r.show(a.get(r)))
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                return Err(QuotaError::ChildrenOverGuarantee(
                    spec.name.clone(),
                    show(&children),
                    show(&spec.guaranteed),
                ));
            }
        }
        Ok(tree)
    }

    pub fn len(&self) -> usize {
        self.specs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.specs.is_empty()
    }

    /// Whether anyone is guaranteed some of `r`.
    pub fn governs(&self, r: Resource) -> bool {
        self.governed[r.index()]
    }

    pub fn find(&self, id: &str) -> Option<usize> {
        self.index.get(id).copied()
    }

    pub fn spec(&self, q: usize) -> &QueueSpec {
        &self.specs[q]
    }

    /// `q`, its parent, and so on up to the root. Stops after `len()` steps, so even an
    /// unvalidated cycle cannot loop forever.
    pub fn ancestors(&self, q: usize) -> impl Iterator<Item = usize> + '_ {
        std::iter::successors(Some(q), |&q| self.parent[q]).take(self.specs.len() + 1)
    }
}

/// What each queue holds, its descendants included.
#[derive(Debug, Clone)]
pub struct Usage {
    held: Vec<Amounts>,
}

/// Why a request may not go ahead under the quota tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverLimit {
    pub queue: String,
    pub resource: Resource,
    pub used: u64,
    pub limit: u64,
    pub requested: u64,
    /// The request's replicas (a gang's), each asking for `requested / replicas`.
    pub replicas: u32,
}

impl fmt::Display for OverLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = self.resource;
        let request = if self.replicas > 1 {
            format!(
                "{} × {} = {}",
                self.replicas,
                r.number(self.requested / u64::from(self.replicas)),
                r.number(self.requested)
            )
        } else {
            r.number(self.requested)
        };
        write!(
            f,
            "tenant {}: {} of {} in use (limit); request {request}",
            self.queue,
            r.number(self.used),
            r.show(self.limit),
        )
    }
}

impl Usage {
    pub fn new(tree: &QuotaTree) -> Self {
        Self {
            held: vec![Amounts::default(); tree.len()],
        }
    }

    pub fn of(&self, q: usize) -> &Amounts {
        &self.held[q]
    }

    pub fn take(&mut self, tree: &QuotaTree, q: usize, a: &Amounts) {
        for anc in tree.ancestors(q) {
            self.held[anc].add(a);
        }
    }

    pub fn give_back(&mut self, tree: &QuotaTree, q: usize, a: &Amounts) {
        for anc in tree.ancestors(q) {
            self.held[anc].sub(a);
        }
    }

    /// The first hard limit on `q`'s chain that `a` more would break.
    pub fn over_limit(&self, tree: &QuotaTree, q: usize, a: &Amounts) -> Option<OverLimit> {
        for anc in tree.ancestors(q) {
            let spec = tree.spec(anc);
            for r in Resource::ALL {
                if let Some(limit) = spec.limit.get(r)
                    && a.get(r) > 0
                    && self.held[anc].get(r) + a.get(r) > limit
                {
                    return Some(OverLimit {
                        queue: spec.name.clone(),
                        resource: r,
                        used: self.held[anc].get(r),
                        limit,
                        requested: a.get(r),
                        replicas: 1,
                    });
                }
            }
        }
        None
    }

    /// Whether `q` would stay within its guarantee with `a` more: such a request may
    /// reclaim what others borrowed. (A child's guarantee is carved out of its parent's, so
    /// the child's own is what it is entitled to, whoever borrowed it.)
    /// A request for nothing anyone is guaranteed is never within a guarantee.
    pub fn within_guarantee(&self, tree: &QuotaTree, q: usize, a: &Amounts) -> bool {
        let governed = Resource::ALL
            .iter()
            .any(|&r| tree.governs(r) && a.get(r) > 0);
        governed
            && Resource::ALL.iter().all(|&r| {
                !tree.governs(r)
                    || a.get(r) == 0
                    || self.held[q].get(r) + a.get(r) <= tree.spec(q).guaranteed.get(r)
            })
    }

    /// Whether `q` holds more than its guarantee of some resource that `a` uses: a job using
    /// `a` is then (partly) on borrowed capacity.
    pub fn borrowing(&self, tree: &QuotaTree, q: usize, a: &Amounts) -> bool {
        Resource::ALL.iter().any(|&r| {
            tree.governs(r) && a.get(r) > 0 && self.held[q].get(r) > tree.spec(q).guaranteed.get(r)
        })
    }

    /// Whether giving back `a` so that queue `to` can have it leaves `q` and its
    /// ancestors at or above their guarantee in every resource (or, if they were already
    /// below it in `base`, where they were then: `base` is the usage before a reclaim that
    /// takes several jobs, `self` the usage with those taken so far). Ancestors that `to`
    /// shares with `q` are not checked: the capacity moves between their own members.
    pub fn can_lose(
        &self,
        base: &Usage,
        tree: &QuotaTree,
        q: usize,
        a: &Amounts,
        to: usize,
    ) -> bool {
        let shared: Vec<usize> = tree.ancestors(to).collect();
        tree.ancestors(q)
            .filter(|anc| !shared.contains(anc))
            .all(|anc| {
                Resource::ALL.iter().all(|&r| {
                    let held = self.held[anc].get(r);
                    let floor = base.held[anc].get(r).min(tree.spec(anc).guaranteed.get(r));
                    held.saturating_sub(a.get(r)) >= floor
                })
            })
    }

    /// `q`'s dominant share of `capacity` above its guarantee, divided by its weight: the
    /// queue with the least goes first for spare capacity (dominant-resource fairness).
    pub fn fair_share_key(&self, tree: &QuotaTree, q: usize, capacity: &Amounts) -> f64 {
        let spec = tree.spec(q);
        let dominant = Resource::ALL
            .iter()
            .map(|&r| {
                let over = self.held[q].get(r).saturating_sub(spec.guaranteed.get(r));
                over as f64 / capacity.get(r).max(1) as f64
            })
            .fold(0.0, f64::max);
        dominant / f64::from(spec.weight)
    }
}

/// A queue guaranteed (and limited to) whole GPUs, for tests.
#[cfg(test)]
pub(crate) fn gpu_queue(
    id: &str,
    parent: Option<&str>,
    guaranteed_gpus: u64,
    limit_gpus: Option<u64>,
) -> QueueSpec {
    QueueSpec {
        id: id.into(),
        name: id.into(),
        parent: parent.map(Into::into),
        guaranteed: Amounts::new(guaranteed_gpus * 1000, 0, 0),
        limit: Limits::new(limit_gpus.map(|g| g * 1000), None, None, None),
        weight: 1,
        min_isolation: allot_domain::Isolation::Shared,
    }
}

#[cfg(test)]
mod tests {
    use super::gpu_queue as q;

    #[test]
    fn amounts_are_shown_without_rounding_a_share_into_another() {
        use super::Resource;
        assert_eq!(Resource::Gpu.number(250 * 7), "0.25");
        assert_eq!(Resource::Gpu.number(1250 * 7), "1.25");
        assert_eq!(Resource::Gpu.number(2000 * 7), "2");
        assert_eq!(Resource::Gpu.number(1000), "0.143");
        assert_eq!(Resource::CpuMilli.show(500), "0.5 CPUs");
        assert_eq!(Resource::MemoryMib.show(33 * 1024), "33 GiB");
        assert_eq!(Resource::MemoryMib.number(1536), "1.5");
        assert_eq!(Resource::MemoryMib.number(100), "0.1");
        assert_eq!(Resource::MemoryMib.number(1), "0.01", "not nothing");
        assert_eq!(Resource::MemoryMib.number(0), "0");
    }
    use super::*;

    #[test]
    fn the_tree_is_validated() {
        assert!(QuotaTree::new(vec![q("a", None, 4, Some(8)), q("b", Some("a"), 2, None)]).is_ok());
        let bad = [
            (vec![q("a", Some("x"), 0, None)], "does not exist"),
            (vec![q("a", None, 0, None), q("a", None, 0, None)], "twice"),
            (
                vec![q("a", Some("b"), 0, None), q("b", Some("a"), 0, None)],
                "ancestor",
            ),
            (vec![q("a", None, 9, Some(8))], "above its limit"),
            (
                vec![
                    q("a", None, 4, None),
                    q("b", Some("a"), 3, None),
                    q("c", Some("a"), 2, None),
                ],
                "quota `a`: its children are guaranteed 5 GPUs in all, more than its own 4 GPUs",
            ),
        ];
        for (specs, want) in bad {
            let err = QuotaTree::new(specs).expect_err(want).to_string();
            assert!(err.contains(want), "{err}");
        }
        // Tenants by name, not id; only the resource that does not nest.
        let mut parent = q("0192-id", None, 4, None);
        parent.name = "research".into();
        let err = QuotaTree::new(vec![parent, q("b", Some("0192-id"), 5, None)])
            .expect_err("children over")
            .to_string();
        assert_eq!(
            err,
            "quota `research`: its children are guaranteed 5 GPUs in all, more than its own 4 GPUs"
        );
    }

    #[test]
    fn limits_guarantees_and_borrowing_follow_the_chain() {
        let tree = QuotaTree::new(vec![
            q("org", None, 8, Some(10)),
            q("team-a", Some("org"), 4, None),
            q("team-b", Some("org"), 4, Some(6)),
        ])
        .expect("tree");
        let (org, a, b) = (0, 1, 2);
        let mut usage = Usage::new(&tree);
        let gpus = |n: u64| Amounts::new(n * 500, 0, 0);
        usage.take(&tree, a, &gpus(15));
        assert_eq!(
            usage.of(org).get(Resource::Gpu),
            7500 * 7,
            "children count in the parent"
        );
        let over = usage.over_limit(&tree, b, &gpus(6)).expect("org limit");
        assert_eq!(
            over.to_string(),
            "tenant org: 7.5 of 10 GPUs in use (limit); request 3"
        );
        assert!(usage.over_limit(&tree, b, &gpus(5)).is_none());
        assert!(
            usage.borrowing(&tree, a, &gpus(1)),
            "team-a holds 7.5 of 4 guaranteed"
        );
        assert!(
            usage.within_guarantee(&tree, b, &gpus(8)),
            "team-b's own 4 GPUs"
        );
        assert!(!usage.within_guarantee(&tree, b, &gpus(9)));
        assert!(
            usage.can_lose(&usage, &tree, a, &gpus(7), b),
            "7.5 - 3.5 = 4, the guarantee"
        );
        assert!(
            !usage.can_lose(&usage, &tree, a, &gpus(8), b),
            "below team-a's guarantee"
        );
        assert!(
            !usage.within_guarantee(&tree, b, &Amounts::new(0, 1000, 0)),
            "CPUs are not guaranteed"
        );
        let outsider = QuotaTree::new(vec![
            q("org", None, 8, None),
            q("team-a", Some("org"), 4, None),
            q("other", None, 4, None),
        ])
        .expect("tree");
        let mut usage = Usage::new(&outsider);
        usage.take(&outsider, 1, &gpus(15));
        assert!(
            !usage.can_lose(&usage, &outsider, 1, &gpus(7), 2),
            "org would drop from 7.5 to 4 of its 8 guaranteed for another tenant"
        );
        assert!(usage.fair_share_key(&tree, a, &Amounts::new(16_000, 1, 1)) > 0.0);
        assert_eq!(
            usage.fair_share_key(&tree, b, &Amounts::new(16_000, 1, 1)),
            0.0
        );
    }
}
