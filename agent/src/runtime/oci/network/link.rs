//! The links, addresses and routes of job networks, through netlink (`rtnetlink`): the
//! host's side on the agent's own connection, asynchronously; a job namespace's side on a
//! thread of its own that enters the namespace (a netlink socket speaks for the namespace
//! it was made in), so no worker of the agent's runtime ever changes namespace.

use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use futures_util::TryStreamExt;
use ipnet::Ipv4Net;
use netlink_packet_route::address::AddressAttribute;
use netlink_packet_route::link::{InfoData, InfoKind, InfoVeth, LinkAttribute};
use netlink_packet_route::route::{RouteAddress, RouteAttribute, RouteScope, RouteType};
use rtnetlink::{Handle, LinkMessageBuilder, LinkUnspec, LinkVeth, RouteMessageBuilder};

/// The name of a job's interface inside its namespace.
pub const JOB_INTERFACE: &str = "eth0";

fn err(what: &str) -> impl Fn(rtnetlink::Error) -> String + '_ {
    move |e| format!("{what}: {e}")
}

/// A netlink connection in the agent's (the host's) network namespace, driven on the
/// agent's runtime.
pub fn host_handle() -> Result<Handle, String> {
    let (conn, handle, _) =
        rtnetlink::new_connection().map_err(|e| format!("cannot open netlink: {e}"))?;
    tokio::spawn(conn);
    Ok(handle)
}

/// The index of the link named `name`, if there is one.
pub async fn index_of(h: &Handle, name: &str) -> Result<Option<u32>, String> {
    let mut links = h.link().get().match_name(name.to_owned()).execute();
    match links.try_next().await {
        Ok(Some(l)) => Ok(Some(l.header.index)),
        Ok(None) => Ok(None),
        // No such device.
        Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::ENODEV => Ok(None),
        Err(e) => Err(format!("link {name}: {e}")),
    }
}

/// The names of every link whose name starts with `prefix`.
pub async fn links_named(h: &Handle, prefix: &str) -> Result<Vec<(u32, String)>, String> {
    let mut out = Vec::new();
    let mut links = h.link().get().execute();
    while let Some(l) = links.try_next().await.map_err(err("listing links"))? {
        for a in &l.attributes {
            if let LinkAttribute::IfName(n) = a
                && n.starts_with(prefix)
            {
                out.push((l.header.index, n.clone()));
            }
        }
    }
    Ok(out)
}

pub async fn delete_link(h: &Handle, index: u32) -> Result<(), String> {
    match h.link().del(index).execute().await {
        Ok(()) => Ok(()),
        Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::ENODEV => Ok(()),
        Err(e) => Err(format!("deleting link {index}: {e}")),
    }
}

/// Every IPv4 network the host routes or has an address in: what an agent's subnet must
/// not overlap.
pub async fn taken_networks(h: &Handle) -> Result<Vec<Ipv4Net>, String> {
    let mut taken = Vec::new();
    let mut routes = h
        .route()
        .get(RouteMessageBuilder::<Ipv4Addr>::new().build())
        .execute();
    while let Some(r) = routes.try_next().await.map_err(err("listing routes"))? {
        let len = r.header.destination_prefix_length;
        let dest = r.attributes.iter().find_map(|a| match a {
            RouteAttribute::Destination(RouteAddress::Inet(d)) => Some(*d),
            _ => None,
        });
        if let Some(d) = dest
            && let Ok(net) = Ipv4Net::new(d, len)
        {
            taken.push(net.trunc());
        }
    }
    let mut addrs = h.address().get().execute();
    while let Some(a) = addrs.try_next().await.map_err(err("listing addresses"))? {
        for attr in &a.attributes {
            if let AddressAttribute::Address(IpAddr::V4(ip)) = attr
                && let Ok(net) = Ipv4Net::new(*ip, a.header.prefix_len)
            {
                taken.push(net.trunc());
            }
        }
    }
    Ok(taken)
}

fn unreachable_route(subnet: Ipv4Net) -> netlink_packet_route::route::RouteMessage {
    RouteMessageBuilder::<Ipv4Addr>::new()
        .destination_prefix(subnet.network(), subnet.prefix_len())
        .kind(RouteType::Unreachable)
        .build()
}

/// Reserves `subnet` for this agent in the host's routing table: an `unreachable` route,
/// which every job's own route overrides, so that other agents see it taken and nothing
/// meant for a job that is gone leaves the node.
pub async fn reserve(h: &Handle, subnet: Ipv4Net) -> Result<(), String> {
    h.route()
        .add(unreachable_route(subnet))
        .execute()
        .await
        .map_err(err("reserving the jobs' subnet"))
}

pub async fn unreserve(h: &Handle, subnet: Ipv4Net) {
    if let Err(e) = h.route().del(unreachable_route(subnet)).execute().await {
        tracing::debug!(%subnet, error = %e, "no reservation to remove");
    }
}

/// The gateway's address on the host's loopback too: a host address for as long as the
/// agent runs (what it may advertise itself by when every node is on one machine), whether
/// or not a job runs. (Loopback rather than a dummy link: every kernel has one.)
pub async fn add_gateway(h: &Handle, gateway: Ipv4Addr) -> Result<(), String> {
    let lo = index_of(h, "lo").await?.ok_or("the host has no loopback")?;
    add_address(h, lo, gateway, "the gateway's address").await
}

/// Removes the gateway's address from the host's loopback, if it is there.
pub async fn remove_gateway(h: &Handle, gateway: Ipv4Addr) {
    let Ok(Some(lo)) = index_of(h, "lo").await else {
        return;
    };
    let mut addrs = h.address().get().set_link_index_filter(lo).execute();
    while let Ok(Some(a)) = addrs.try_next().await {
        let ours = a.attributes.iter().any(
            |attr| matches!(attr, AddressAttribute::Address(IpAddr::V4(ip)) if *ip == gateway),
        );
        if ours {
            if let Err(e) = h.address().del(a).execute().await {
                tracing::debug!(%gateway, error = %e, "cannot remove the gateway's address");
            }
            return;
        }
    }
}

/// Writes a sysctl of the namespace the calling thread is in.
fn sysctl(path: &str, value: &str) -> Result<(), String> {
    std::fs::write(path, value).map_err(|e| format!("{path}: {e}"))
}

/// Turns IPv6 off on an interface (a job's network is IPv4; no link-local address to
/// reach anything by). Without IPv6 in the kernel there is nothing to turn off.
fn no_ipv6(interface: &str) -> Result<(), String> {
    let path = format!("/proc/sys/net/ipv6/conf/{interface}/disable_ipv6");
    if std::path::Path::new("/proc/sys/net/ipv6").exists() {
        sysctl(&path, "1")
    } else {
        Ok(())
    }
}

/// Lets the host route between its interfaces (what NAT for jobs needs; the agent's table
/// decides what jobs may send through).
pub fn enable_forwarding() -> Result<(), String> {
    sysctl("/proc/sys/net/ipv4/ip_forward", "1")
}

/// Runs `work` with a netlink handle inside the network namespace `ns`, on a thread of its
/// own (which alone enters the namespace, and ends with it).
async fn in_namespace<F, Fut, T>(ns: &OwnedFd, work: F) -> Result<T, String>
where
    F: FnOnce(Handle) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<T, String>>,
    T: Send + 'static,
{
    let ns = ns
        .try_clone()
        .map_err(|e| format!("the job's network namespace: {e}"))?;
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("allot-netns".into())
        .spawn(move || {
            let result = (|| {
                nix::sched::setns(ns.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)
                    .map_err(|e| format!("cannot enter the job's network namespace: {e}"))?;
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| format!("cannot start the namespace's runtime: {e}"))?;
                rt.block_on(async move {
                    let (conn, handle, _) = rtnetlink::new_connection()
                        .map_err(|e| format!("cannot open netlink in the namespace: {e}"))?;
                    tokio::spawn(conn);
                    work(handle).await
                })
            })();
            let _ = tx.send(result);
        })
        .map_err(|e| format!("cannot start a thread: {e}"))?;
    rx.await
        .map_err(|_| "the network namespace's thread ended without answering".to_owned())?
}

/// A new network namespace, held by the descriptor returned (it lives as long as that or a
/// process in it does). Made on a thread of its own, which `unshare`s into it and ends.
pub async fn new_namespace() -> Result<OwnedFd, String> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("allot-netns".into())
        .spawn(move || {
            let result = nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(|e| format!("cannot make a network namespace: {e}"))
                .and_then(|()| {
                    std::fs::File::open("/proc/thread-self/ns/net")
                        .map(OwnedFd::from)
                        .map_err(|e| format!("cannot open the new network namespace: {e}"))
                });
            let _ = tx.send(result);
        })
        .map_err(|e| format!("cannot start a thread: {e}"))?;
    rx.await
        .map_err(|_| "the network namespace's thread ended without answering".to_owned())?
}

/// Puts `address`/32 on link `index`.
async fn add_address(h: &Handle, index: u32, address: Ipv4Addr, what: &str) -> Result<(), String> {
    h.address()
        .add(index, IpAddr::V4(address), 32)
        .execute()
        .await
        .map_err(err(what))
}

/// Brings link `index` up.
async fn set_up(h: &Handle, index: u32, what: &str) -> Result<(), String> {
    h.link()
        .change(LinkUnspec::new_with_index(index).up().build())
        .execute()
        .await
        .map_err(err(what))
}

/// Adds a route.
async fn add_route(
    h: &Handle,
    route: netlink_packet_route::route::RouteMessage,
    what: &str,
) -> Result<(), String> {
    h.route().add(route).execute().await.map_err(err(what))
}

/// One job's link: its host end's name, the job's address and the gateway.
pub struct JobLink<'a> {
    pub host_end: &'a str,
    pub address: Ipv4Addr,
    pub gateway: Ipv4Addr,
}

/// Connects namespace `ns` to the host: a veth pair whose job end is `eth0` in `ns`, the
/// job's address on it and a default route through the gateway (on the host end, as a
/// /32 on each job's link); on the host a route to the job's address through its link.
pub async fn connect(h: &Handle, ns: &OwnedFd, l: &JobLink<'_>) -> Result<(), String> {
    let peer = LinkMessageBuilder::<LinkUnspec>::new()
        .name(JOB_INTERFACE.to_owned())
        .setns_by_fd(ns.as_raw_fd())
        .build();
    let veth = LinkMessageBuilder::<LinkVeth>::new_with_info_kind(InfoKind::Veth)
        .name(l.host_end.to_owned())
        .set_info_data(InfoData::Veth(InfoVeth::Peer(peer)))
        .build();
    h.link()
        .add(veth)
        .execute()
        .await
        .map_err(err("creating the job's link"))?;
    let index = index_of(h, l.host_end)
        .await?
        .ok_or_else(|| format!("the job's link {} vanished", l.host_end))?;
    no_ipv6(l.host_end)?;
    add_address(h, index, l.gateway, "the gateway's address").await?;
    set_up(h, index, "bringing the job's link up").await?;
    add_route(
        h,
        RouteMessageBuilder::<Ipv4Addr>::new()
            .destination_prefix(l.address, 32)
            .output_interface(index)
            .pref_source(l.gateway)
            .scope(RouteScope::Link)
            .build(),
        "the route to the job",
    )
    .await?;
    let (address, gateway) = (l.address, l.gateway);
    in_namespace(ns, move |h| async move {
        let lo = index_of(&h, "lo")
            .await?
            .ok_or("the namespace has no loopback")?;
        set_up(&h, lo, "bringing loopback up").await?;
        let eth = index_of(&h, JOB_INTERFACE)
            .await?
            .ok_or("the job's link is not in its namespace")?;
        no_ipv6(JOB_INTERFACE)?;
        add_address(&h, eth, address, "the job's address").await?;
        set_up(&h, eth, "bringing the job's link up").await?;
        add_route(
            &h,
            RouteMessageBuilder::<Ipv4Addr>::new()
                .destination_prefix(gateway, 32)
                .output_interface(eth)
                .scope(RouteScope::Link)
                .build(),
            "the route to the gateway",
        )
        .await?;
        add_route(
            &h,
            RouteMessageBuilder::<Ipv4Addr>::new()
                .gateway(gateway)
                .output_interface(eth)
                .build(),
            "the default route",
        )
        .await
    })
    .await
}
