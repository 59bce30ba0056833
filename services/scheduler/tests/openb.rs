//! The baseline ports against the published results: on the default openb trace, each
//! policy's mean allocation over seeds 42..51 lands within two published standard
//! deviations of the published mean, at 100% and 130% arrival.

use allot_scheduler::openb::{self, Cluster, POLICIES};

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

#[test]
fn every_baseline_port_matches_its_published_allocation() {
    let nodes = openb::parse_nodes(&read("openb_node_list_gpu_node.csv")).expect("nodes");
    let pods = openb::parse_pods(&read("openb_pod_list_default.csv")).expect("pods");
    let cluster = Cluster::new(&nodes);
    assert_eq!((nodes.len(), cluster.capacity), (1213, 6_212_000));
    let results: Vec<(String, u32, f64, f64, f64)> = std::thread::scope(|scope| {
        let runs: Vec<_> = POLICIES
            .iter()
            .map(|&name| {
                let (cluster, pods) = (&cluster, &pods);
                scope.spawn(move || {
                    let mut at: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
                    for seed in 42..=51 {
                        let mut policy = openb::policy(name, cluster, pods).expect("policy");
                        let (_, outcome) =
                            openb::run_seed(cluster, pods, 1.3, seed, policy.as_mut());
                        for (i, pct) in [100, 130].into_iter().enumerate() {
                            at[i].push(outcome.alloc_at(pct).expect("arrival reached"));
                        }
                    }
                    [100, 130]
                        .into_iter()
                        .zip(at)
                        .map(|(pct, xs)| {
                            let mean = xs.iter().sum::<f64>() / xs.len() as f64;
                            let (pub_mean, pub_sd) = published("default", name, pct);
                            (name.to_owned(), pct, mean, pub_mean, pub_sd)
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
