//! The agent's nftables table (`inet allot-<agent>`), as `nft --json` takes it, from what
//! runs here: made whole each time a job network comes or goes, and replaced in one
//! transaction (connections already made keep their conntrack entries).
//!
//! What it holds, for the job interfaces of this agent (`allot<agent>v*`):
//! - `input`: nothing from a job reaches the node itself (any of its addresses, the
//!   gateway's included, any service on them) but replies to what the node sent it;
//! - `forward` → `egress`: a job's new connections go through its own chain, found by its
//!   source address (any other source is refused): its gang's rendezvous first, then what
//!   is never reachable (another destination rewritten by NAT, another job's interface on
//!   this host, the never-reachable networks: `0.0.0.0/8`, loopback, link-local, multicast
//!   and above, the agent's own subnet), then its tenant's egress (anywhere, or only the
//!   rules listed);
//! - `postrouting` (filtering, after source NAT): nothing new reaches a job but its gang's
//!   rendezvous, on replica 0's port, from its replicas' nodes;
//! - NAT: the node's address and a gang's rendezvous port forwarded to replica 0 (from
//!   outside and from the node itself); a replica's rendezvous traffic leaving from its
//!   node's address; everything else from jobs masqueraded as it leaves the node.
//!
//! Refusals of a job's own connections are rejected (admin-prohibited), so they fail at
//! once; connections towards a job are dropped.

use std::net::Ipv4Addr;

use allot_domain::EgressRule;
use ipnet::Ipv4Net;
use serde_json::{Value, json};

use super::plan::JOB_INTERFACES;

/// Networks no job reaches, whatever its tenant's policy (its own subnet is added).
pub const NEVER: [&str; 4] = ["0.0.0.0/8", "127.0.0.0/8", "169.254.0.0/16", "224.0.0.0/3"];

/// Chain priorities (nftables' standard names).
const FILTER: i32 = 0;
const DSTNAT: i32 = -100;
const SRCNAT: i32 = 100;
/// Filtering towards jobs, after source NAT: a replica's rendezvous traffic is seen from its
/// node's address.
const AFTER_SRCNAT: i32 = SRCNAT + 10;

/// A gang's rendezvous as one replica sees it: the first replica's node address and port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendezvous {
    pub node: Ipv4Addr,
    pub port: u16,
}

/// One job network, as its rules need it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobRules {
    /// Its slot: its chain is `job-<slot>`.
    pub slot: u8,
    pub address: Ipv4Addr,
    /// Its tenant's egress: None anywhere, else only these (empty: nowhere).
    pub egress: Option<Vec<EgressRule>>,
    /// For a replica of a gang: where the gang meets, and this node's address to leave
    /// from (none: the address of the interface it leaves by).
    pub rendezvous: Option<(Rendezvous, Option<Ipv4Addr>)>,
    /// For the first replica of a gang: the node addresses its replicas reach it from.
    pub serves: Option<(Rendezvous, Vec<Ipv4Addr>)>,
}

/// What the table is made from.
#[derive(Debug, Clone)]
pub struct Table<'a> {
    pub name: &'a str,
    /// This agent's job interfaces' prefix.
    pub interfaces: &'a str,
    pub subnet: Ipv4Net,
    pub jobs: &'a [JobRules],
}

/// Matches `left OP right`.
fn m(op: &str, left: Value, right: Value) -> Value {
    json!({ "match": { "op": op, "left": left, "right": right } })
}

fn meta(key: &str) -> Value {
    json!({ "meta": { "key": key } })
}

fn ip(field: &str) -> Value {
    json!({ "payload": { "protocol": "ip", "field": field } })
}

fn tcp_dport() -> Value {
    json!({ "payload": { "protocol": "tcp", "field": "dport" } })
}

fn prefix(net: Ipv4Net) -> Value {
    if net.prefix_len() == 32 {
        json!(net.addr().to_string())
    } else {
        json!({ "prefix": { "addr": net.network().to_string(), "len": net.prefix_len() } })
    }
}

fn addr_set(addrs: &[Ipv4Addr]) -> Value {
    json!({ "set": addrs.iter().map(|a| a.to_string()).collect::<Vec<_>>() })
}

fn ct_state(states: &[&str]) -> Value {
    m("in", json!({ "ct": { "key": "state" } }), json!(states))
}

fn dnat_status() -> Value {
    m("in", json!({ "ct": { "key": "status" } }), json!("dnat"))
}

fn accept() -> Value {
    json!({ "accept": null })
}

fn drop() -> Value {
    json!({ "drop": null })
}

fn reject() -> Value {
    json!({ "reject": { "type": "icmpx", "expr": "admin-prohibited" } })
}

/// The whole table, as one `nft --json` batch that replaces what was there.
pub fn table(t: &Table<'_>) -> Value {
    let name = t.name;
    let base = |chain: &str, kind: &str, hook: &str, prio: i32| {
        json!({ "add": { "chain": { "family": "inet", "table": name, "name": chain,
            "type": kind, "hook": hook, "prio": prio, "policy": "accept" } } })
    };
    let chain = |chain: &str| json!({ "add": { "chain": { "family": "inet", "table": name, "name": chain } } });
    let rule = |chain: &str, expr: Vec<Value>| json!({ "add": { "rule": { "family": "inet", "table": name, "chain": chain, "expr": expr } } });
    let from_jobs = || m("==", meta("iifname"), json!(format!("{}*", t.interfaces)));
    let to_jobs = || m("==", meta("oifname"), json!(format!("{}*", t.interfaces)));
    let table = json!({ "family": "inet", "name": name });
    let mut never: Vec<Value> = NEVER
        .iter()
        .filter_map(|n| n.parse::<Ipv4Net>().ok())
        .map(prefix)
        .collect();
    never.push(prefix(t.subnet));

    let mut cmds = vec![
        json!({ "add": { "table": table } }),
        json!({ "delete": { "table": table } }),
        json!({ "add": { "table": table } }),
        json!({ "add": { "set": { "family": "inet", "table": name, "name": "never",
            "type": "ipv4_addr", "flags": ["interval"], "elem": never } } }),
        base("input", "filter", "input", FILTER),
        base("forward", "filter", "forward", FILTER),
        chain("egress"),
        base("to-jobs", "filter", "postrouting", AFTER_SRCNAT),
        base("dnat", "nat", "prerouting", DSTNAT),
        base("dnat-local", "nat", "output", DSTNAT),
        base("snat", "nat", "postrouting", SRCNAT),
    ];
    // The node itself: only replies.
    cmds.push(rule(
        "input",
        vec![from_jobs(), ct_state(&["established", "related"]), accept()],
    ));
    cmds.push(rule("input", vec![from_jobs(), reject()]));
    // Through the node: each job's own chain.
    cmds.push(rule(
        "forward",
        vec![from_jobs(), json!({ "jump": { "target": "egress" } })],
    ));
    cmds.push(rule(
        "egress",
        vec![ct_state(&["established", "related"]), accept()],
    ));
    cmds.push(rule("egress", vec![ct_state(&["invalid"]), drop()]));
    for j in t.jobs {
        let own = format!("job-{}", j.slot);
        cmds.push(chain(&own));
        cmds.push(rule(
            "egress",
            vec![
                m("==", ip("saddr"), json!(j.address.to_string())),
                json!({ "jump": { "target": own } }),
            ],
        ));
        if let Some((r, _)) = &j.rendezvous {
            cmds.push(rule(
                &own,
                vec![
                    dnat_status(),
                    m(
                        "==",
                        json!({ "ct": { "key": "ip daddr", "dir": "original" } }),
                        json!(r.node.to_string()),
                    ),
                    m("==", tcp_dport(), json!(r.port)),
                    accept(),
                ],
            ));
        }
        cmds.push(rule(&own, vec![dnat_status(), reject()]));
        cmds.push(rule(
            &own,
            vec![
                m("==", meta("oifname"), json!(format!("{JOB_INTERFACES}*"))),
                reject(),
            ],
        ));
        cmds.push(rule(
            &own,
            vec![m("==", ip("daddr"), json!("@never")), reject()],
        ));
        match &j.egress {
            None => cmds.push(rule(&own, vec![accept()])),
            Some(rules) => {
                for r in rules {
                    let mut expr = vec![m("==", ip("daddr"), prefix(r.cidr))];
                    if !r.ports.is_empty() {
                        let ports: Vec<Value> = r
                            .ports
                            .iter()
                            .map(|p| {
                                if p.first == p.last {
                                    json!(p.first)
                                } else {
                                    json!({ "range": [p.first, p.last] })
                                }
                            })
                            .collect();
                        expr.push(m("==", meta("l4proto"), json!({ "set": ["tcp", "udp"] })));
                        expr.push(m(
                            "==",
                            json!({ "payload": { "protocol": "th", "field": "dport" } }),
                            json!({ "set": ports }),
                        ));
                    }
                    expr.push(accept());
                    cmds.push(rule(&own, expr));
                }
                cmds.push(rule(&own, vec![reject()]));
            }
        }
    }
    // A source that is no job's.
    cmds.push(rule("egress", vec![reject()]));

    // Towards jobs: replies, and each first replica's rendezvous from its gang's nodes.
    cmds.push(rule(
        "to-jobs",
        vec![to_jobs(), ct_state(&["established", "related"]), accept()],
    ));
    for j in t.jobs {
        if let Some((r, peers)) = &j.serves {
            cmds.push(rule(
                "to-jobs",
                vec![
                    to_jobs(),
                    m("==", ip("daddr"), json!(j.address.to_string())),
                    dnat_status(),
                    m("==", tcp_dport(), json!(r.port)),
                    m("==", ip("saddr"), addr_set(peers)),
                    accept(),
                ],
            ));
            for hook in ["dnat", "dnat-local"] {
                cmds.push(rule(
                    hook,
                    vec![
                        m("==", ip("daddr"), json!(r.node.to_string())),
                        m("==", tcp_dport(), json!(r.port)),
                        json!({ "dnat": { "family": "ip", "addr": j.address.to_string() } }),
                    ],
                ));
            }
        }
    }
    cmds.push(rule("to-jobs", vec![to_jobs(), drop()]));

    // Leaving: a replica's rendezvous from its node's address, the rest masqueraded.
    for j in t.jobs {
        if let Some((r, own_node)) = &j.rendezvous {
            let nat = match own_node {
                Some(a) => json!({ "snat": { "family": "ip", "addr": a.to_string() } }),
                None => json!({ "masquerade": null }),
            };
            cmds.push(rule(
                "snat",
                vec![
                    m("==", ip("saddr"), json!(j.address.to_string())),
                    m(
                        "==",
                        json!({ "ct": { "key": "ip daddr", "dir": "original" } }),
                        json!(r.node.to_string()),
                    ),
                    m("==", tcp_dport(), json!(r.port)),
                    nat,
                ],
            ));
        }
    }
    cmds.push(rule(
        "snat",
        vec![
            m("==", ip("saddr"), prefix(t.subnet)),
            m("!=", meta("oifname"), json!(format!("{JOB_INTERFACES}*"))),
            json!({ "masquerade": null }),
        ],
    ));
    json!({ "nftables": cmds })
}

/// Removes the table (the agent shutting down, or clearing an earlier run's).
pub fn remove(name: &str) -> Value {
    let table = json!({ "family": "inet", "name": name });
    json!({ "nftables": [
        { "add": { "table": table } },
        { "delete": { "table": table } },
    ] })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules_of<'a>(v: &'a Value, chain: &str) -> Vec<&'a Value> {
        v["nftables"]
            .as_array()
            .expect("cmds")
            .iter()
            .filter_map(|c| c["add"].get("rule"))
            .filter(|r| r["chain"] == chain)
            .map(|r| &r["expr"])
            .collect()
    }

    fn text(v: &Value) -> String {
        v.to_string()
    }

    fn job(slot: u8) -> JobRules {
        JobRules {
            slot,
            address: Ipv4Addr::new(10, 222, 7, slot),
            egress: None,
            rendezvous: None,
            serves: None,
        }
    }

    fn table_of(jobs: &[JobRules]) -> Value {
        table(&Table {
            name: "allot-abcdef",
            interfaces: "allotabcdefv",
            subnet: "10.222.7.0/24".parse().expect("net"),
            jobs,
        })
    }

    #[test]
    fn the_node_and_unknown_sources_are_refused() {
        let v = table_of(&[job(2)]);
        let input = rules_of(&v, "input");
        assert_eq!(input.len(), 2);
        assert!(text(input[0]).contains("established"));
        assert!(text(input[1]).contains("reject"), "{}", text(input[1]));
        let egress = rules_of(&v, "egress");
        assert!(
            text(egress.last().expect("last")).contains("reject"),
            "a source no job has is refused"
        );
        let to_jobs = rules_of(&v, "to-jobs");
        assert!(text(to_jobs.last().expect("last")).contains("drop"));
        // The table replaces itself in one batch.
        let cmds = v["nftables"].as_array().expect("cmds");
        assert!(cmds[1]["delete"]["table"]["name"] == "allot-abcdef");
    }

    #[test]
    fn a_job_never_reaches_the_never_reachable_before_its_policy() {
        let mut j = job(2);
        j.egress = Some(vec![
            EgressRule::parse("203.0.113.0/24:443,8000-8100").expect("rule"),
            EgressRule::parse("198.51.100.7").expect("rule"),
        ]);
        let v = table_of(&[j, job(3)]);
        let own = rules_of(&v, "job-2");
        let pos = |needle: &str| own.iter().position(|r| text(r).contains(needle));
        let never = pos("@never").expect("never");
        let other_jobs = pos("\"allot*\"").expect("other jobs");
        let nat = pos("dnat").expect("dnat");
        let allowed = pos("203.0.113.0").expect("rule");
        assert!(nat < never && other_jobs < never && never < allowed);
        assert!(text(own[allowed]).contains(r#"{"range":[8000,8100]}"#));
        assert!(text(own[allowed]).contains("443"));
        assert!(text(own[allowed + 1]).contains(r#""198.51.100.7""#));
        assert!(!text(own[allowed + 1]).contains("dport"), "no ports: all");
        assert!(text(own.last().expect("last")).contains("reject"));
        // The default egress accepts after the never-reachable.
        let open = rules_of(&v, "job-3");
        assert_eq!(text(open.last().expect("last")), r#"[{"accept":null}]"#);
        let set = v["nftables"]
            .as_array()
            .expect("cmds")
            .iter()
            .find_map(|c| c["add"].get("set"))
            .expect("never set");
        let elems = text(&set["elem"]);
        for n in ["169.254.0.0", "127.0.0.0", "10.222.7.0"] {
            assert!(elems.contains(n), "{n} in {elems}");
        }
        // Jobs are masqueraded only as they leave towards something that is not a job.
        let snat = rules_of(&v, "snat");
        assert!(text(snat.last().expect("masquerade")).contains("masquerade"));
        assert!(text(snat.last().expect("masquerade")).contains("!="));
    }

    #[test]
    fn a_gang_meets_on_its_first_replicas_node() {
        let r = Rendezvous {
            node: Ipv4Addr::new(192, 0, 2, 10),
            port: 29_611,
        };
        let mut first = job(2);
        first.rendezvous = Some((r.clone(), Some(r.node)));
        first.serves = Some((r.clone(), vec![r.node, Ipv4Addr::new(192, 0, 2, 11)]));
        let mut other = job(3);
        other.rendezvous = Some((r.clone(), Some(r.node)));
        let v = table_of(&[first, other, job(4)]);
        for hook in ["dnat", "dnat-local"] {
            let dnat = rules_of(&v, hook);
            assert_eq!(dnat.len(), 1, "{hook}");
            assert!(text(dnat[0]).contains(r#""addr":"10.222.7.2""#));
            assert!(text(dnat[0]).contains("29611"));
        }
        let to_jobs = rules_of(&v, "to-jobs");
        assert_eq!(to_jobs.len(), 3);
        assert!(text(to_jobs[1]).contains("192.0.2.11") && text(to_jobs[1]).contains("10.222.7.2"));
        // Each replica may reach the rendezvous, before anything rewritten is refused; the
        // job of another gang (or none) may not.
        for chain in ["job-2", "job-3"] {
            let own = rules_of(&v, chain);
            assert!(text(own[0]).contains("29611") && text(own[0]).contains("accept"));
        }
        assert!(!text(&json!(rules_of(&v, "job-4"))).contains("29611"));
        let snat = rules_of(&v, "snat");
        assert_eq!(snat.len(), 3);
        assert!(text(snat[0]).contains(r#""snat""#));
    }

    /// nftables itself checks the table (`nft --check`, which changes nothing); it needs
    /// root, which the container tests need anyway.
    #[test]
    fn nft_accepts_the_table() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: nft --check needs root");
            return;
        }
        let r = Rendezvous {
            node: Ipv4Addr::new(192, 0, 2, 10),
            port: 29_611,
        };
        let mut first = job(2);
        first.egress = Some(vec![
            EgressRule::parse("203.0.113.0/24:443,8000-8100").expect("rule"),
        ]);
        first.rendezvous = Some((r.clone(), None));
        first.serves = Some((r.clone(), vec![r.node]));
        let v = table_of(&[first, job(3)]);
        let out = std::process::Command::new("nft")
            .args(["--check", "--json", "-f", "-"])
            .stdin(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .and_then(|mut c| {
                use std::io::Write;
                c.stdin
                    .take()
                    .expect("stdin")
                    .write_all(v.to_string().as_bytes())?;
                c.wait_with_output()
            })
            .expect("nft runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
