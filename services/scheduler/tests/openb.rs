//! The baseline ports against the published results: on the default openb trace, each
//! policy's mean allocation over seeds 42..51 lands within two published standard
//! deviations of the published mean, at 100% and 130% arrival.

use allot_scheduler::openb::{self, BASELINES, Cluster};

const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/openb");

fn read(name: &str) -> String {
    std::fs::read_to_string(format!("{DATA}/{name}")).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// (mean, sd) of the published allocation of `policy` at `arrival` on `trace`.
fn published(trace: &str, policy: &str, arrival: u32) -> (f64, f64) {
    let want = policy.replace('-', "");
    read("published_alloc.csv")
        .lines()
        .skip(1)
        .find_map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            (f[0] == trace && f[1].to_lowercase() == want && f[2] == arrival.to_string())
                .then(|| (f[3].parse().expect("mean"), f[4].parse().expect("sd")))
        })
        .unwrap_or_else(|| panic!("no published figure for {policy} at {arrival}%"))
}

/// The mean allocation at 100% and 130% arrival of `name` over seeds 42..51.
fn mean_alloc(name: &str, cluster: &Cluster, pods: &[openb::Pod]) -> [f64; 2] {
    let mut sums = [0.0; 2];
    for seed in 42..=51 {
        let mut policy = openb::policy(name, cluster, pods).expect("policy");
        let (_, outcome) = openb::run_seed(cluster, pods, 1.3, seed, policy.as_mut());
        for (sum, pct) in sums.iter_mut().zip([100, 130]) {
            *sum += outcome.alloc_at(pct).expect("arrival reached");
        }
    }
    sums.map(|s| s / 10.0)
}

fn default_trace() -> (Cluster, Vec<openb::Pod>) {
    let nodes = openb::parse_nodes(&read("openb_node_list_gpu_node.csv")).expect("nodes");
    let pods = openb::parse_pods(&read("openb_pod_list_default.csv")).expect("pods");
    let cluster = Cluster::new(&nodes);
    assert_eq!((nodes.len(), cluster.capacity), (1213, 6_212_000));
    (cluster, pods)
}

#[test]
fn every_baseline_port_matches_its_published_allocation() {
    let (cluster, pods) = default_trace();
    let results: Vec<(&str, u32, f64, f64, f64)> = std::thread::scope(|scope| {
        let runs: Vec<_> = BASELINES
            .iter()
            .map(|&name| {
                let (cluster, pods) = (&cluster, &pods);
                scope.spawn(move || {
                    let means = mean_alloc(name, cluster, pods);
                    [100, 130]
                        .into_iter()
                        .zip(means)
                        .map(|(pct, mean)| {
                            let (pub_mean, pub_sd) = published("default", name, pct);
                            (name, pct, mean, pub_mean, pub_sd)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        runs.into_iter()
            .flat_map(|r| r.join().expect("run"))
            .collect()
    });
    let off: Vec<String> = results
        .iter()
        .filter(|(_, _, mean, pm, sd)| (mean - pm).abs() > 2.0 * sd)
        .map(|(name, pct, mean, pm, sd)| {
            format!("{name} at {pct}%: {mean:.2} vs published {pm:.2} ± {sd:.2}")
        })
        .collect();
    assert!(
        off.is_empty(),
        "outside two standard deviations: {off:#?}\nall: {results:#?}"
    );
}

#[test]
fn allot_allocates_more_than_published_fgd() {
    let (cluster, pods) = default_trace();
    let means = mean_alloc("allot", &cluster, &pods);
    for (pct, mean) in [100, 130].into_iter().zip(means) {
        let (fgd, _) = published("default", "fgd", pct);
        assert!(mean > fgd, "allot at {pct}%: {mean:.2}, FGD {fgd:.2}");
    }
    assert!(
        means[0] >= 96.0,
        "the target at 100% arrival: {:.2}",
        means[0]
    );
}
