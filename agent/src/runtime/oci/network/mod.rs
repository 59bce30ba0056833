//! Jobs' own networks (`--network private`, the default under the `oci` runtime).
//!
//! Each attempt gets a network namespace the agent makes (owned by the host's user
//! namespace, so nothing in the container can change its addresses, routes or filters),
//! with its loopback up and one veth link to the host: `eth0` inside with the job's
//! address, `allot<agent>v<slot>` on the host with the gateway's. Every job of an agent
//! routes through the host (no bridge: no frame goes from one job to another without the
//! host's filtering, whatever `br_netfilter` does), so the agent's nftables table
//! ([`rules`]) decides what each may reach: never the node itself, link-local addresses or
//! other jobs; beyond that what its tenant's policy allows, NATed as it leaves the node; a
//! gang's rendezvous forwarded from the node's address to its first replica.
//!
//! Per agent: a /24 of the pool (`--job-subnets`, default [`plan::DEFAULT_POOL`]) that no
//! route or address of the host overlaps, chosen under a host-wide lock and reserved by an
//! `unreachable` route; names carrying six hex digits of the agent's data dir
//! ([`plan::Names`]). The namespace lives as long as the attempt holds its descriptor, so
//! a dead agent's job links go with its containers; what else an earlier run left (its
//! reservation, links, table) is removed at start.

pub mod link;
pub mod plan;
pub mod rules;

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::Arc;

use allot_domain::EgressRule;
use ipnet::Ipv4Net;
use rtnetlink::Handle;

use plan::{Names, Slots};
use rules::{JobRules, Rendezvous};

/// Where the host-wide lock agents choose their subnets under lives.
const LOCK: &str = "/run/allot/job-subnets.lock";
/// Where each agent on the host records what it made (one file per agent, by its id), so
/// that what a dead one left (a test that panicked, a data dir removed with it) is
/// removed by the next to start.
const RECORDS: &str = "/run/allot/job-networks";

/// What an agent made on the host, as it records it.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Record {
    pid: u32,
    /// `ADDRESS/PREFIX`.
    subnet: String,
    table: String,
    interfaces: String,
    /// Its own record of the subnet, in its data dir.
    state_file: PathBuf,
}

impl Record {
    /// Whether the agent that wrote it is gone: its process, or its data dir.
    fn is_stale(&self) -> bool {
        let alive = i32::try_from(self.pid)
            .is_ok_and(|pid| nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok());
        !alive || !self.state_file.exists()
    }
}

/// A gang's rendezvous as a launch tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GangNetwork {
    /// The first replica's node address (an IP address or a name), and the port.
    pub master_addr: String,
    pub master_port: u16,
    /// Whether this is the first replica (the one the rendezvous is forwarded to).
    pub first: bool,
    /// The first replica's only: the addresses of its replicas' nodes.
    pub peers: Vec<String>,
}

/// What one attempt's network is made for.
#[derive(Debug, Clone)]
pub struct Request {
    /// Its tenant's egress (see [`allot_domain::NetworkPolicy::egress`]).
    pub egress: Option<Vec<EgressRule>>,
    pub gang: Option<GangNetwork>,
    /// This node's address as it advertises itself: what a replica's rendezvous traffic
    /// leaves from.
    pub node_address: String,
}

/// An agent's job networks.
pub struct JobNetworks {
    names: Names,
    pool: Ipv4Net,
    /// Where in the pool to start looking (from the agent's data dir).
    start: u32,
    /// The subnet it took, kept so that the next run clears it.
    state_file: PathBuf,
    ready: tokio::sync::OnceCell<Ready>,
}

struct Ready {
    handle: Handle,
    subnet: Ipv4Net,
    runtime: tokio::runtime::Handle,
    state: tokio::sync::Mutex<State>,
}

#[derive(Default)]
struct State {
    slots: Slots,
    jobs: BTreeMap<u8, JobRules>,
}

/// One attempt's network: removed (its link, its rules, its slot) by
/// [`Attachment::release`], or when dropped.
pub struct Attachment {
    nets: Arc<JobNetworks>,
    slot: u8,
    address: Ipv4Addr,
    namespace: Option<OwnedFd>,
}

impl Attachment {
    /// The namespace, as a path the container runtime can open (the agent holds it open).
    pub fn namespace_path(&self) -> PathBuf {
        let fd = self.namespace.as_ref().map_or(-1, |n| n.as_raw_fd());
        PathBuf::from(format!("/proc/{}/fd/{fd}", std::process::id()))
    }

    pub fn address(&self) -> Ipv4Addr {
        self.address
    }

    /// Removes it; the namespace goes once nothing in it is left.
    pub async fn release(mut self) {
        let ns = self.namespace.take();
        self.nets.release(self.slot).await;
        drop(ns);
    }
}

impl Drop for Attachment {
    fn drop(&mut self) {
        let Some(ns) = self.namespace.take() else {
            return;
        };
        let (nets, slot) = (self.nets.clone(), self.slot);
        if let Some(runtime) = nets.ready.get().map(|r| r.runtime.clone()) {
            runtime.spawn(async move {
                nets.release(slot).await;
                drop(ns);
            });
        }
    }
}

/// Removes what agents that are gone left on the host (their records say what). Called
/// under the host-wide lock.
async fn remove_stale(handle: &Handle) {
    let Ok(entries) = std::fs::read_dir(RECORDS) else {
        return;
    };
    for e in entries.flatten() {
        let Some(r) = std::fs::read(e.path())
            .ok()
            .and_then(|b| serde_json::from_slice::<Record>(&b).ok())
        else {
            continue;
        };
        if !r.is_stale() {
            continue;
        }
        tracing::info!(subnet = %r.subnet, table = %r.table, "removing the job network of an agent that is gone");
        if let Err(e) = nft(&rules::remove(&r.table)).await {
            tracing::warn!(table = %r.table, error = %e, "cannot remove a stale table");
        }
        if let Ok(subnet) = r.subnet.parse::<Ipv4Net>() {
            link::unreserve(handle, subnet).await;
            link::remove_gateway(handle, plan::gateway(subnet)).await;
        }
        if let Ok(links) = link::links_named(handle, &r.interfaces).await {
            for (index, _) in links {
                let _ = link::delete_link(handle, index).await;
            }
        }
        let _ = std::fs::remove_file(e.path());
    }
}

/// An IPv4 address of `name` (itself if it is one).
async fn ipv4_of(name: &str) -> Option<Ipv4Addr> {
    if let Ok(ip) = name.parse::<Ipv4Addr>() {
        return Some(ip);
    }
    tokio::net::lookup_host((name, 0))
        .await
        .ok()?
        .find_map(|a| match a.ip() {
            std::net::IpAddr::V4(ip) => Some(ip),
            std::net::IpAddr::V6(_) => None,
        })
}

/// Whether `ip` is one of this host's addresses.
fn is_local(ip: Ipv4Addr) -> bool {
    std::net::UdpSocket::bind((ip, 0)).is_ok()
}

/// Applies an `nft --json` batch.
async fn nft(batch: &serde_json::Value) -> Result<(), String> {
    use tokio::io::AsyncWriteExt;
    let mut child = tokio::process::Command::new(
        super::find_on_path("nft").unwrap_or_else(|| PathBuf::from("nft")),
    )
    .args(["--json", "-f", "-"])
    .stdin(std::process::Stdio::piped())
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .map_err(|e| format!("cannot run nft (install nftables): {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(batch.to_string().as_bytes())
            .await
            .map_err(|e| format!("nft: {e}"))?;
    }
    let out = child
        .wait_with_output()
        .await
        .map_err(|e| format!("nft: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "nft refused the job network's rules: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl JobNetworks {
    /// The job networks of the agent whose data dir hashes to `digest`, taking their subnet
    /// from `pool`. Nothing is set up before [`JobNetworks::prepare`].
    pub fn new(digest: &[u8], pool: Ipv4Net, state_file: PathBuf) -> Self {
        let start = digest
            .iter()
            .skip(3)
            .take(4)
            .fold(0u32, |h, b| (h << 8) | u32::from(*b));
        JobNetworks {
            names: Names::from_digest(digest),
            pool,
            start,
            state_file,
            ready: tokio::sync::OnceCell::new(),
        }
    }

    pub fn names(&self) -> &Names {
        &self.names
    }

    /// The subnet taken, once prepared.
    pub fn subnet(&self) -> Option<Ipv4Net> {
        self.ready.get().map(|r| r.subnet)
    }

    /// The gateway every job routes through (a host address while any job runs).
    pub fn gateway(&self) -> Option<Ipv4Addr> {
        self.subnet().map(plan::gateway)
    }

    /// Clears what an earlier run left, takes a subnet and installs the table. Once.
    pub async fn prepare(&self) -> Result<(), String> {
        self.ready
            .get_or_try_init(|| async {
                let handle = link::host_handle()?;
                self.clear(&handle).await;
                let subnet = self.take_subnet(&handle).await?;
                let set_up = async {
                    link::add_gateway(&handle, plan::gateway(subnet)).await?;
                    link::enable_forwarding()?;
                    nft(&self.table(subnet, &BTreeMap::new())).await
                };
                if let Err(e) = set_up.await {
                    // Nothing half made stays behind.
                    self.clear(&handle).await;
                    return Err(e);
                }
                let ready = Ready {
                    handle,
                    subnet,
                    runtime: tokio::runtime::Handle::current(),
                    state: tokio::sync::Mutex::new(State::default()),
                };
                tracing::info!(%subnet, table = %self.names.table(), "jobs get networks of their own");
                Ok(ready)
            })
            .await
            .map(|_| ())
    }

    /// What an earlier run of this agent left (or this one, shutting down): its
    /// reservation, gateway address and links.
    async fn clear(&self, handle: &Handle) {
        if let Some(old) = std::fs::read_to_string(&self.state_file)
            .ok()
            .and_then(|s| s.trim().parse::<Ipv4Net>().ok())
        {
            link::unreserve(handle, old).await;
            link::remove_gateway(handle, plan::gateway(old)).await;
        }
        match link::links_named(handle, &self.names.interface_prefix()).await {
            Ok(links) => {
                for (index, name) in links {
                    tracing::info!(link = %name, "removing a job link left by an earlier run");
                    let _ = link::delete_link(handle, index).await;
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot list links left by an earlier run"),
        }
        let _ = std::fs::remove_file(&self.state_file);
        let _ = std::fs::remove_file(self.record_path());
    }

    /// A subnet of the pool no route or address of the host overlaps, chosen and reserved
    /// under a host-wide lock (other agents on this host choose under it too).
    async fn take_subnet(&self, handle: &Handle) -> Result<Ipv4Net, String> {
        let lock_path = PathBuf::from(LOCK);
        let lock = tokio::task::spawn_blocking(move || {
            if let Some(dir) = lock_path.parent() {
                std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            }
            let file = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&lock_path)
                .map_err(|e| format!("{}: {e}", lock_path.display()))?;
            nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
                .map_err(|(_, e)| format!("{}: {e}", lock_path.display()))
        })
        .await
        .map_err(|e| format!("locking the job subnets: {e}"))??;
        remove_stale(handle).await;
        let taken = link::taken_networks(handle).await?;
        let subnet = plan::choose_subnet(self.pool, self.start, &taken).ok_or_else(|| {
            format!(
                "no /{} of the job subnet pool {} is free of this host's routes and addresses: \
                 pass another pool with --job-subnets",
                plan::SUBNET_PREFIX,
                self.pool
            )
        })?;
        link::reserve(handle, subnet).await?;
        std::fs::write(&self.state_file, subnet.to_string())
            .map_err(|e| format!("{}: {e}", self.state_file.display()))?;
        let record = Record {
            pid: std::process::id(),
            subnet: subnet.to_string(),
            table: self.names.table(),
            interfaces: self.names.interface_prefix(),
            state_file: self.state_file.clone(),
        };
        let path = self.record_path();
        let written = std::fs::create_dir_all(RECORDS)
            .and_then(|()| std::fs::write(&path, serde_json::to_vec(&record).unwrap_or_default()));
        if let Err(e) = written {
            tracing::warn!(path = %path.display(), error = %e, "cannot record the job network");
        }
        drop(lock);
        Ok(subnet)
    }

    fn record_path(&self) -> PathBuf {
        PathBuf::from(RECORDS).join(&self.names.id)
    }

    fn table(&self, subnet: Ipv4Net, jobs: &BTreeMap<u8, JobRules>) -> serde_json::Value {
        let jobs: Vec<JobRules> = jobs.values().cloned().collect();
        rules::table(&rules::Table {
            name: &self.names.table(),
            interfaces: &self.names.interface_prefix(),
            subnet,
            jobs: &jobs,
        })
    }

    /// A network of its own for one attempt.
    pub async fn attach(self: &Arc<Self>, req: Request) -> Result<Attachment, String> {
        let ready = self
            .ready
            .get()
            .ok_or("the agent's job networks are not set up")?;
        let (rendezvous, serves) = match &req.gang {
            None => (None, None),
            Some(g) => {
                let node = ipv4_of(&g.master_addr).await.ok_or_else(|| {
                    format!(
                        "the gang's rendezvous address `{}` is not an IPv4 address or a name \
                         that resolves to one",
                        g.master_addr
                    )
                })?;
                let r = Rendezvous {
                    node,
                    port: g.master_port,
                };
                let own = ipv4_of(&req.node_address).await;
                let serves = if g.first {
                    let mut peers = Vec::new();
                    for p in &g.peers {
                        match ipv4_of(p).await {
                            Some(ip) => peers.push(ip),
                            None => tracing::warn!(peer = %p,
                                "a replica's node address does not resolve; it cannot reach the rendezvous"),
                        }
                    }
                    if !peers.contains(&node) {
                        peers.push(node);
                    }
                    Some((r.clone(), peers))
                } else {
                    None
                };
                (Some((r, own)), serves)
            }
        };
        let namespace = link::new_namespace().await?;
        let slot = {
            let mut st = ready.state.lock().await;
            if let Some((r, _)) = &serves
                && st
                    .jobs
                    .values()
                    .any(|j| j.serves.as_ref().is_some_and(|(s, _)| s == r))
            {
                return Err(format!(
                    "port {} of {} is another gang's rendezvous on this node",
                    r.port, r.node
                ));
            }
            st.slots.take().ok_or_else(|| {
                format!(
                    "this node already runs {} jobs with networks of their own",
                    st.slots.in_use()
                )
            })?
        };
        let address = plan::address(ready.subnet, slot);
        // From here on, a failure removes what was made.
        let attachment = Attachment {
            nets: self.clone(),
            slot,
            address,
            namespace: Some(namespace),
        };
        let host_end = self.names.host_interface(slot);
        if let Some(ns) = &attachment.namespace {
            link::connect(
                &ready.handle,
                ns,
                &link::JobLink {
                    host_end: &host_end,
                    address,
                    gateway: plan::gateway(ready.subnet),
                },
            )
            .await?;
        }
        // Its rendezvous traffic leaves from this node's address where that is one of the
        // host's (else from the address of the link it leaves by).
        let rendezvous = rendezvous.map(|(r, own)| (r, own.filter(|ip| is_local(*ip))));
        let mut st = ready.state.lock().await;
        st.jobs.insert(
            slot,
            JobRules {
                slot,
                address,
                egress: req.egress,
                rendezvous,
                serves,
            },
        );
        nft(&self.table(ready.subnet, &st.jobs)).await?;
        drop(st);
        Ok(attachment)
    }

    async fn release(&self, slot: u8) {
        let Some(ready) = self.ready.get() else {
            return;
        };
        let host_end = self.names.host_interface(slot);
        match link::index_of(&ready.handle, &host_end).await {
            Ok(Some(index)) => {
                if let Err(e) = link::delete_link(&ready.handle, index).await {
                    tracing::warn!(link = %host_end, error = %e, "cannot remove a job's link");
                }
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(link = %host_end, error = %e, "cannot find a job's link"),
        }
        let mut st = ready.state.lock().await;
        st.jobs.remove(&slot);
        st.slots.release(slot);
        if let Err(e) = nft(&self.table(ready.subnet, &st.jobs)).await {
            tracing::warn!(error = %e, "cannot update the job network's rules");
        }
    }

    /// Removes everything: the table, any link left, the reservation.
    pub async fn shut_down(&self) {
        let Some(ready) = self.ready.get() else {
            return;
        };
        if let Err(e) = nft(&rules::remove(&self.names.table())).await {
            tracing::warn!(error = %e, "cannot remove the job network's table");
        }
        self.clear(&ready.handle).await;
    }
}

/// `/etc/resolv.conf` for a job with a network of its own: the host's, without the name
/// servers it cannot reach (loopback, link-local, IPv6: a job's network is IPv4 only).
/// `stub` is the resolver's list of upstream servers where the host's names only a local
/// stub (systemd-resolved's `/run/systemd/resolve/resolv.conf`).
pub fn resolv_conf(host: &str, stub: Option<&str>) -> String {
    let reachable = |line: &str| -> bool {
        let Some(server) = line.trim().strip_prefix("nameserver") else {
            return true;
        };
        match server.trim().parse::<Ipv4Addr>() {
            Ok(ip) => !ip.is_loopback() && !ip.is_link_local() && !ip.is_unspecified(),
            Err(_) => false,
        }
    };
    let servers = |text: &str| {
        text.lines()
            .filter(|l| l.trim_start().starts_with("nameserver") && reachable(l))
            .count()
    };
    let source = match stub {
        Some(s) if servers(host) == 0 && servers(s) > 0 => s,
        _ => host,
    };
    let mut out: String = source
        .lines()
        .filter(|l| reachable(l))
        .map(|l| format!("{l}\n"))
        .collect();
    if servers(source) == 0 {
        out.push_str("# no name server of the node's is reachable from a job's network\n");
    }
    out
}

/// `/etc/hosts` for a job with a network of its own.
pub fn hosts(address: Ipv4Addr, hostname: &str) -> String {
    format!("127.0.0.1\tlocalhost\n::1\tlocalhost\n{address}\t{hostname}\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_gets_only_the_name_servers_it_can_reach() {
        let host = "search corp.example\nnameserver 127.0.0.53\noptions edns0\n";
        let stub = "nameserver 10.0.0.2\nnameserver fe80::1\nnameserver 169.254.169.253\n";
        let out = resolv_conf(host, Some(stub));
        assert_eq!(out, "nameserver 10.0.0.2\n");
        let plain = resolv_conf("nameserver 10.255.255.53\nsearch x\n", None);
        assert_eq!(plain, "nameserver 10.255.255.53\nsearch x\n");
        let none = resolv_conf("nameserver 127.0.0.1\nsearch x\n", None);
        assert!(!none.contains("127.0.0.1"), "{none}");
        assert!(
            none.contains("search x") && none.contains("no name server"),
            "{none}"
        );
    }

    #[test]
    fn hosts_name_the_job() {
        let h = hosts(Ipv4Addr::new(10, 222, 7, 2), "job");
        assert!(h.contains("10.222.7.2\tjob") && h.contains("127.0.0.1\tlocalhost"));
    }
}
