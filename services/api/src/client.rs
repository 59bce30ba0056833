//! Where a request comes from. Normally its peer's address; behind a reverse proxy the
//! operator trusts (`--trusted-proxy CIDR`), the client the proxy forwarded for, read from
//! `Forwarded` (RFC 7239) or else `X-Forwarded-For`. Those headers are read only from a
//! trusted peer, and only as far back as the chain is trusted: the client is the nearest
//! address in it that is not a trusted proxy, so a client cannot name itself someone else by
//! sending the header itself.

use std::net::{IpAddr, SocketAddr};

use actix_web::HttpRequest;
use actix_web::http::header::HeaderMap;
use ipnet::IpNet;

/// The proxies whose forwarding headers are believed.
#[derive(Debug, Clone, Default)]
pub struct TrustedProxies(Vec<IpNet>);

/// A `--trusted-proxy` that is neither an address nor a CIDR block.
#[derive(Debug, thiserror::Error)]
#[error("trusted proxy `{0}` is neither an IP address nor a CIDR block (e.g. 10.0.0.0/8)")]
pub struct BadProxy(String);

impl TrustedProxies {
    /// Parses addresses (`127.0.0.1`, `::1`) and blocks (`10.0.0.0/8`).
    pub fn parse<S: AsRef<str>>(list: &[S]) -> Result<Self, BadProxy> {
        list.iter()
            .map(|s| {
                let s = s.as_ref().trim();
                s.parse::<IpNet>()
                    .or_else(|_| s.parse::<IpAddr>().map(IpNet::from))
                    .map_err(|_| BadProxy(s.to_owned()))
            })
            .collect::<Result<_, _>>()
            .map(Self)
    }

    fn trusts(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        self.0.iter().any(|net| net.contains(&ip))
    }

    /// The client of a request from `peer` with `headers`.
    pub fn client(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        let peer = canonical(peer);
        if !self.trusts(peer) {
            return peer;
        }
        let chain = forwarded_for(headers);
        let mut client = peer;
        for hop in chain.iter().rev() {
            match hop {
                // A hop a proxy could not name (`unknown`, an obfuscated name): nothing
                // before it can be believed; the last proxy that named it is the client.
                None => return client,
                Some(ip) => {
                    client = canonical(*ip);
                    if !self.trusts(client) {
                        return client;
                    }
                }
            }
        }
        client
    }
}

/// IPv4 addresses mapped into IPv6 (`::ffff:10.0.0.1`) are their IPv4 selves.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// The addresses a request was forwarded for, nearest last: `Forwarded`'s `for=` values
/// when it has any, `X-Forwarded-For`'s otherwise. `None` for a hop that names no address.
fn forwarded_for(headers: &HeaderMap) -> Vec<Option<IpAddr>> {
    let values = |name: &str| -> Vec<String> {
        headers
            .get_all(name)
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
            .collect()
    };
    let forwarded: Vec<Option<IpAddr>> = values("forwarded")
        .iter()
        .filter_map(|element| {
            element.split(';').find_map(|pair| {
                let (key, value) = pair.split_once('=')?;
                key.trim()
                    .eq_ignore_ascii_case("for")
                    .then(|| node_address(value))
            })
        })
        .collect();
    if !forwarded.is_empty() {
        return forwarded;
    }
    values("x-forwarded-for")
        .iter()
        .map(|v| node_address(v))
        .collect()
}

/// The address of a node as RFC 7239 writes one: `192.0.2.1`, `"192.0.2.1:80"`,
/// `"[2001:db8::1]:443"`, `2001:db8::1`.
fn node_address(value: &str) -> Option<IpAddr> {
    let v = value.trim().trim_matches('"');
    if let Ok(ip) = v.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Ok(sock) = v.parse::<SocketAddr>() {
        return Some(sock.ip());
    }
    v.strip_prefix('[')
        .and_then(|r| r.split_once(']'))
        .and_then(|(ip, _)| ip.parse().ok())
}

/// The client address of `req`, as its audit entries and the failure limiter know it.
pub fn address(req: &HttpRequest) -> Option<String> {
    let peer = req.peer_addr()?.ip();
    let proxies = req
        .app_data::<actix_web::web::Data<crate::AppState>>()
        .map(|s| s.trusted_proxies.clone())
        .unwrap_or_default();
    Some(proxies.client(peer, req.headers()).to_string())
}

#[cfg(test)]
mod tests {
    use actix_web::http::header::{HeaderName, HeaderValue};

    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).expect("name"),
                HeaderValue::from_str(v).expect("value"),
            );
        }
        h
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    #[test]
    fn headers_from_an_untrusted_peer_are_ignored() {
        let none = TrustedProxies::default();
        let h = headers(&[("x-forwarded-for", "198.51.100.7")]);
        assert_eq!(none.client(ip("203.0.113.9"), &h), ip("203.0.113.9"));
        let lo = TrustedProxies::parse(&["127.0.0.1"]).expect("parse");
        assert_eq!(lo.client(ip("203.0.113.9"), &h), ip("203.0.113.9"));
    }

    #[test]
    fn the_client_is_the_nearest_untrusted_hop() {
        let p = TrustedProxies::parse(&["127.0.0.1", "10.0.0.0/8"]).expect("parse");
        // A client that sent its own X-Forwarded-For cannot hide behind it.
        let h = headers(&[("x-forwarded-for", "1.1.1.1, 198.51.100.7, 10.1.2.3")]);
        assert_eq!(p.client(ip("127.0.0.1"), &h), ip("198.51.100.7"));
        let h = headers(&[(
            "forwarded",
            "for=1.1.1.1, for=\"[2001:db8::7]:4711\";proto=https",
        )]);
        assert_eq!(p.client(ip("::ffff:127.0.0.1"), &h), ip("2001:db8::7"));
        // Forwarded wins over X-Forwarded-For.
        let h = headers(&[
            ("forwarded", "for=\"198.51.100.8:80\""),
            ("x-forwarded-for", "198.51.100.9"),
        ]);
        assert_eq!(p.client(ip("127.0.0.1"), &h), ip("198.51.100.8"));
        // No header: the proxy itself.
        assert_eq!(
            p.client(ip("127.0.0.1"), &HeaderMap::new()),
            ip("127.0.0.1")
        );
        // An unnamed hop stops the walk at the proxy that could not name it.
        let h = headers(&[("forwarded", "for=198.51.100.1, for=unknown, for=10.0.0.2")]);
        assert_eq!(p.client(ip("127.0.0.1"), &h), ip("10.0.0.2"));
    }

    proptest::proptest! {
        /// Whatever a client puts in the forwarding headers, the answer is an address it
        /// sent or the proxy's, never a panic; and never anything from an untrusted peer.
        #[test]
        fn forwarding_headers_are_read_or_ignored(forwarded in "\\PC{0,120}", xff in "[0-9a-f.:, \\[\\]]{0,80}") {
            let p = TrustedProxies::parse(&["127.0.0.1"]).expect("parse");
            let mut h = HeaderMap::new();
            if let Ok(v) = HeaderValue::from_str(&forwarded) {
                h.insert(HeaderName::from_static("forwarded"), v);
            }
            if let Ok(v) = HeaderValue::from_str(&xff) {
                h.insert(HeaderName::from_static("x-forwarded-for"), v);
            }
            let _ = p.client(ip("127.0.0.1"), &h);
            proptest::prop_assert_eq!(p.client(ip("203.0.113.1"), &h), ip("203.0.113.1"));
        }
    }

    #[test]
    fn bad_proxies_are_refused_by_name() {
        let e = TrustedProxies::parse(&["10.0.0.0/8", "proxy.example"]).expect_err("bad");
        assert!(e.to_string().contains("proxy.example"), "{e}");
    }
}
