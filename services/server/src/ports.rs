//! Loopback ports for servers that tooling starts again on the same address (benchmarks and
//! tests that kill and restart a replica or a database).
//!
//! A port from binding port 0 comes from the kernel's ephemeral range
//! (`net.ipv4.ip_local_port_range`), the same range every outgoing connection takes its
//! local port from: released for the server to bind, or freed by a killed server, it can
//! be taken by any connection opened meanwhile, and the server's (re)start fails with
//! "address in use". A port below that range is never chosen automatically.

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::sync::atomic::{AtomicU32, Ordering};

/// The kernel's ephemeral range when `/proc` does not say (Linux's default).
const EPHEMERAL_DEFAULT: (u16, u16) = (32768, 60999);
/// The lowest port handed out: above the well-known and most registered services' ports.
const LOWEST: u16 = 10000;

fn ephemeral_range() -> (u16, u16) {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| {
            let mut it = s.split_whitespace().map(str::parse::<u16>);
            Some((it.next()?.ok()?, it.next()?.ok()?))
        })
        .unwrap_or(EPHEMERAL_DEFAULT)
}

/// A loopback address nothing listens on now, on a port outside the ephemeral range (see
/// the module's documentation), so that a server can bind it again after a restart.
/// Processes calling this at once start from different places (their process ids), and
/// calls in one process never repeat a port while others are free.
pub fn stable_loopback_addr() -> std::io::Result<SocketAddr> {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let (lo, hi) = ephemeral_range();
    // Below the ephemeral range, or above it when it starts too low to leave room below.
    let (first, last) = if lo > LOWEST + 1000 {
        (LOWEST, lo - 1)
    } else {
        (hi.saturating_add(1), u16::MAX)
    };
    let span = u32::from(last - first) + 1;
    let start = std::process::id().wrapping_mul(7919) % span;
    for _ in 0..span {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = first + u16::try_from((start + n) % span).unwrap_or(0);
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        if TcpListener::bind(addr).is_ok() {
            return Ok(addr);
        }
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::AddrInUse,
        format!("no free loopback port from {first} to {last}"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_free_distinct_and_outside_the_ephemeral_range() {
        let (lo, hi) = ephemeral_range();
        let mut seen = std::collections::HashSet::new();
        let mut held = Vec::new();
        for _ in 0..50 {
            let addr = stable_loopback_addr().expect("a port");
            assert!(!(lo..=hi).contains(&addr.port()), "{addr} in {lo}-{hi}");
            assert!(seen.insert(addr), "{addr} handed out twice");
            // Taken: the next call must pass it by.
            held.push(TcpListener::bind(addr).expect("free when handed out"));
        }
        // Negative control: a port from bind(0) is in the range this avoids.
        let ephemeral = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("bind 0");
        assert!((lo..=hi).contains(&ephemeral.port()), "{ephemeral}");
    }
}
