//! Variants of the openb trace family that are not in the shared sample: pod lists with
//! chosen shares of CPU-only, shared-GPU, multi-GPU and model-constrained pods, drawn from
//! the published pods of each kind (a base trace), so policies are reported on workloads
//! they were not tuned on.
//!
//! A variant of `pods` pods: each is CPU-only with probability `cpu_only`, else a GPU pod
//! that is shared with probability `shared`, else multi-GPU with probability `multi_gpu`,
//! else one whole GPU; its shape (CPU, memory, GPUs, milli) is a uniformly drawn base pod of
//! that kind. A GPU pod is constrained to GPU models with probability `gpu_spec`: to the
//! `gpu_spec` of a uniformly drawn constrained base pod when the base has any, else to one
//! model of the cluster drawn by its share of the GPUs. The protocol then inflates the list
//! to the arrival it replays, as for the published traces.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::OpenbError;
use super::trace::{Node, Pod};

/// The shares a variant is drawn with.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VariantSpec {
    pub pods: usize,
    /// Of all pods.
    pub cpu_only: f64,
    /// Of GPU pods.
    pub shared: f64,
    /// Of GPU pods that are not shared.
    pub multi_gpu: f64,
    /// Of GPU pods.
    pub gpu_spec: f64,
}

impl VariantSpec {
    fn check(&self) -> Result<(), OpenbError> {
        for (name, v) in [
            ("cpu_only", self.cpu_only),
            ("shared", self.shared),
            ("multi_gpu", self.multi_gpu),
            ("gpu_spec", self.gpu_spec),
        ] {
            if !(0.0..=1.0).contains(&v) {
                return Err(OpenbError::Parse(format!(
                    "{name}: {v} is not a share from 0 to 1"
                )));
            }
        }
        if self.pods == 0 {
            return Err(OpenbError::Parse("pods: at least one".into()));
        }
        Ok(())
    }
}

/// Draws a variant of `base` on the cluster `nodes`, from `seed`.
pub fn generate(
    base: &[Pod],
    nodes: &[Node],
    spec: &VariantSpec,
    seed: u64,
) -> Result<Vec<Pod>, OpenbError> {
    spec.check()?;
    let of =
        |keep: &dyn Fn(&Pod) -> bool| -> Vec<&Pod> { base.iter().filter(|p| keep(p)).collect() };
    let cpu: Vec<&Pod> = of(&|p| p.num_gpu == 0);
    let shared: Vec<&Pod> = of(&|p| p.num_gpu == 1 && p.gpu_milli < 1000);
    let whole: Vec<&Pod> = of(&|p| p.num_gpu == 1 && p.gpu_milli >= 1000);
    let multi: Vec<&Pod> = of(&|p| p.num_gpu > 1);
    let specs: Vec<&Vec<String>> = base
        .iter()
        .filter(|p| p.num_gpu > 0 && !p.gpu_spec.is_empty())
        .map(|p| &p.gpu_spec)
        .collect();
    let gpus: u64 = nodes.iter().map(|n| u64::from(n.gpus)).sum();
    if gpus == 0 {
        return Err(OpenbError::Parse("the cluster has no GPUs".into()));
    }
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out = Vec::with_capacity(spec.pods);
    for i in 0..spec.pods {
        // Each kind falls back to the nearest kind the base has.
        let pool: &[&Pod] = if rng.random::<f64>() < spec.cpu_only && !cpu.is_empty() {
            &cpu
        } else if rng.random::<f64>() < spec.shared && !shared.is_empty() {
            &shared
        } else if rng.random::<f64>() < spec.multi_gpu && !multi.is_empty() {
            &multi
        } else if !whole.is_empty() {
            &whole
        } else {
            &shared
        };
        let Some(model) = pool.get(rng.random_range(0..pool.len().max(1))) else {
            return Err(OpenbError::Parse("the base trace has no GPU pods".into()));
        };
        let mut pod = Pod {
            name: format!("variant-pod-{i:05}"),
            gpu_spec: Vec::new(),
            ..(*model).clone()
        };
        if pod.num_gpu > 0 && rng.random::<f64>() < spec.gpu_spec {
            pod.gpu_spec = if specs.is_empty() {
                // One model, by its share of the fleet's GPUs.
                let mut k = rng.random_range(0..gpus);
                let node = nodes.iter().find(|n| {
                    let g = u64::from(n.gpus);
                    if k < g {
                        true
                    } else {
                        k -= g;
                        false
                    }
                });
                node.map(|n| vec![n.model.clone()]).unwrap_or_default()
            } else {
                specs[rng.random_range(0..specs.len())].clone()
            };
        }
        out.push(pod);
    }
    Ok(out)
}

/// The pods as a pod-list file (the columns the harness reads).
pub fn to_csv(pods: &[Pod]) -> String {
    let mut out = String::from("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n");
    for p in pods {
        out.push_str(&format!(
            "{},{},{},{},{},{}\n",
            p.name,
            p.cpu_milli,
            p.memory_mib,
            p.num_gpu,
            p.gpu_milli,
            p.gpu_spec.join("|")
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> Vec<Pod> {
        let pod = |name: &str, num_gpu: u8, gpu_milli: u32, spec: &[&str]| Pod {
            name: name.into(),
            cpu_milli: 4000,
            memory_mib: 8192,
            num_gpu,
            gpu_milli,
            gpu_spec: spec.iter().map(|s| (*s).to_owned()).collect(),
        };
        vec![
            pod("cpu", 0, 0, &[]),
            pod("share", 1, 500, &[]),
            pod("whole", 1, 1000, &[]),
            pod("eight", 8, 1000, &[]),
            pod("v100", 1, 1000, &["V100M16", "V100M32"]),
        ]
    }

    fn nodes() -> Vec<Node> {
        vec![Node {
            name: "n".into(),
            cpu_milli: 96_000,
            memory_mib: 786_432,
            gpus: 8,
            model: "V100M32".into(),
            gpu_memory_mib: 0,
        }]
    }

    #[test]
    fn a_variant_has_the_shares_it_was_asked_for_and_is_the_seeds() {
        let spec = VariantSpec {
            pods: 20_000,
            cpu_only: 0.3,
            shared: 0.5,
            multi_gpu: 0.2,
            gpu_spec: 0.4,
        };
        let pods = generate(&base(), &nodes(), &spec, 1).expect("variant");
        assert_eq!(
            pods,
            generate(&base(), &nodes(), &spec, 1).expect("variant")
        );
        assert_ne!(
            pods,
            generate(&base(), &nodes(), &spec, 2).expect("variant")
        );
        let share = |keep: &dyn Fn(&Pod) -> bool, of: &dyn Fn(&Pod) -> bool| {
            let all = pods.iter().filter(|p| of(p)).count() as f64;
            pods.iter().filter(|p| of(p) && keep(p)).count() as f64 / all
        };
        let near = |got: f64, want: f64| assert!((got - want).abs() < 0.02, "{got} vs {want}");
        near(share(&|p| p.num_gpu == 0, &|_| true), 0.3);
        near(share(&|p| p.gpu_milli < 1000, &|p| p.num_gpu > 0), 0.5);
        near(
            share(&|p| p.num_gpu > 1, &|p| {
                p.num_gpu > 0 && p.gpu_milli >= 1000
            }),
            0.2,
        );
        near(share(&|p| !p.gpu_spec.is_empty(), &|p| p.num_gpu > 0), 0.4);
        assert!(
            pods.iter()
                .filter(|p| p.num_gpu == 0)
                .all(|p| p.gpu_spec.is_empty())
        );
        // Constraints come from the base's constrained pods.
        assert!(
            pods.iter()
                .filter(|p| !p.gpu_spec.is_empty())
                .all(|p| p.gpu_spec == ["V100M16", "V100M32"])
        );
        // Written and read back as a pod list.
        let back = super::super::parse_pods(&to_csv(&pods)).expect("a pod list");
        assert_eq!(back, pods);
    }

    #[test]
    fn shares_outside_zero_to_one_are_refused_naming_them() {
        let spec = VariantSpec {
            pods: 10,
            cpu_only: 1.5,
            shared: 0.0,
            multi_gpu: 0.0,
            gpu_spec: 0.0,
        };
        let err = generate(&base(), &nodes(), &spec, 1).expect_err("refused");
        assert!(err.to_string().contains("cpu_only"), "{err}");
    }
}
