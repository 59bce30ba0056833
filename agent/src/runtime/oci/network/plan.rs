//! What a node's job networks are called and numbered, without IO: the agent's names
//! (unique per agent, within the kernel's 15 characters), the subnet it takes from its pool
//! (one no route or address of the host overlaps, so agents on one host never collide), and
//! each job's address in it.

use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

/// Every job interface of every agent on a host starts so (`allot<agent>v<slot>`): a job's
/// traffic towards any of them is traffic between jobs.
pub const JOB_INTERFACES: &str = "allot";
/// Each agent's subnet is a /24: the gateway `.1`, jobs `.2` to `.254`.
pub const SUBNET_PREFIX: u8 = 24;
/// The pool agents take their subnets from unless told otherwise.
pub const DEFAULT_POOL: &str = "10.222.0.0/16";
/// The most a kernel interface name holds (`IFNAMSIZ` less its NUL).
pub const IFNAME_MAX: usize = 15;

/// An agent's names: its nftables table, and its job interfaces' prefix. `id` is six hex
/// digits unique to the agent (from its data dir).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names {
    pub id: String,
}

impl Names {
    /// The names of the agent whose data dir hashes to `digest` (its first three bytes).
    pub fn from_digest(digest: &[u8]) -> Self {
        Names {
            id: hex::encode(&digest[..3.min(digest.len())]),
        }
    }

    /// Its nftables table (`inet` family).
    pub fn table(&self) -> String {
        format!("allot-{}", self.id)
    }

    /// The prefix of its job interfaces' host ends (`allot1a2b3cv`), a wildcard's stem.
    pub fn interface_prefix(&self) -> String {
        format!("{JOB_INTERFACES}{}v", self.id)
    }

    /// The host end of the job interface in `slot` (`allot1a2b3cv17`, at most 15 bytes).
    pub fn host_interface(&self, slot: u8) -> String {
        format!("{}{slot}", self.interface_prefix())
    }
}

/// The gateway of `subnet` (its first address): what every job routes through, on the
/// host end of each job interface.
pub fn gateway(subnet: Ipv4Net) -> Ipv4Addr {
    nth(subnet, 1)
}

/// The address of `slot` in `subnet`.
pub fn address(subnet: Ipv4Net, slot: u8) -> Ipv4Addr {
    nth(subnet, u32::from(slot))
}

fn nth(subnet: Ipv4Net, n: u32) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(subnet.network()).wrapping_add(n))
}

/// The first /24 of `pool`, from the `start`th on (wrapping round), that overlaps none of
/// `taken` (the host's routes and addresses; a default route overlaps nothing). None when
/// every one does.
pub fn choose_subnet(pool: Ipv4Net, start: u32, taken: &[Ipv4Net]) -> Option<Ipv4Net> {
    let candidates: Vec<Ipv4Net> = pool.subnets(SUBNET_PREFIX).ok()?.collect();
    if candidates.is_empty() {
        return None;
    }
    let n = candidates.len();
    let first = usize::try_from(start).unwrap_or(0) % n;
    (0..n).map(|i| candidates[(first + i) % n]).find(|c| {
        !taken
            .iter()
            .filter(|t| t.prefix_len() > 0)
            .any(|t| t.contains(c) || c.contains(t))
    })
}

/// The job addresses of a subnet in use: slot 1 is the gateway, 2 to 254 jobs'.
#[derive(Debug, Default, Clone)]
pub struct Slots {
    used: std::collections::BTreeSet<u8>,
}

impl Slots {
    pub const FIRST: u8 = 2;
    pub const LAST: u8 = 254;

    /// The lowest free slot, now taken; None when all are.
    pub fn take(&mut self) -> Option<u8> {
        let free = (Self::FIRST..=Self::LAST).find(|s| !self.used.contains(s))?;
        self.used.insert(free);
        Some(free)
    }

    pub fn release(&mut self, slot: u8) {
        self.used.remove(&slot);
    }

    pub fn in_use(&self) -> usize {
        self.used.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> Ipv4Net {
        s.parse().expect("net")
    }

    #[test]
    fn names_fit_the_kernel_and_differ_per_agent() {
        let a = Names::from_digest(&[0xde, 0xad, 0xbe, 0xef]);
        assert_eq!(a.id, "deadbe");
        assert_eq!(a.table(), "allot-deadbe");
        assert_eq!(a.host_interface(254), "allotdeadbev254");
        assert!(a.host_interface(Slots::LAST).len() <= IFNAME_MAX);
        let b = Names::from_digest(&[0xde, 0xad, 0xbf]);
        assert_ne!(a.host_interface(2), b.host_interface(2));
        assert!(a.host_interface(2).starts_with(JOB_INTERFACES));
    }

    #[test]
    fn addresses_are_numbered_in_the_subnet() {
        let s = net("10.222.7.0/24");
        assert_eq!(gateway(s), Ipv4Addr::new(10, 222, 7, 1));
        assert_eq!(address(s, 2), Ipv4Addr::new(10, 222, 7, 2));
        assert_eq!(address(s, 254), Ipv4Addr::new(10, 222, 7, 254));
    }

    #[test]
    fn a_subnet_overlaps_no_route_of_the_host() {
        let pool = net("10.222.0.0/16");
        assert_eq!(choose_subnet(pool, 5, &[]), Some(net("10.222.5.0/24")));
        // Another agent's subnet, a wider route and an address are all taken; the default
        // route is not.
        let taken = [
            net("0.0.0.0/0"),
            net("10.222.5.0/24"),
            net("10.222.6.0/23"),
            net("10.222.8.9/32"),
        ];
        assert_eq!(choose_subnet(pool, 5, &taken), Some(net("10.222.9.0/24")));
        // It wraps round the pool.
        assert_eq!(
            choose_subnet(pool, 255, &taken),
            Some(net("10.222.255.0/24"))
        );
        assert_eq!(
            choose_subnet(pool, 255 + 256, &[net("10.222.255.0/24")]),
            Some(net("10.222.0.0/24"))
        );
        // A pool entirely routed elsewhere has none.
        assert_eq!(choose_subnet(pool, 0, &[net("10.0.0.0/8")]), None);
        assert_eq!(
            choose_subnet(net("10.222.3.0/24"), 9, &[]),
            Some(net("10.222.3.0/24"))
        );
        assert_eq!(choose_subnet(net("10.222.3.0/25"), 0, &[]), None);
    }

    #[test]
    fn slots_are_taken_lowest_first_and_given_back() {
        let mut s = Slots::default();
        assert_eq!(s.take(), Some(2));
        assert_eq!(s.take(), Some(3));
        s.release(2);
        assert_eq!(s.take(), Some(2));
        for _ in 4..=254 {
            assert!(s.take().is_some());
        }
        assert_eq!(s.in_use(), 253);
        assert_eq!(
            s.take(),
            None,
            "the gateway and broadcast are never a job's"
        );
    }
}
