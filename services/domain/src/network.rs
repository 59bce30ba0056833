//! What a tenant's jobs may reach over the network: its network policy, as a platform admin
//! sets it (as Kubernetes' `NetworkPolicy` egress rules do for a namespace).
//!
//! A job with a network of its own ([`crate::JobNetwork::Private`], the default) reaches,
//! whatever the policy says, none of what is never reachable: the node's own addresses and
//! services, link-local addresses (`169.254.0.0/16`, cloud metadata services), and other
//! jobs. Beyond that its connections go where its tenant's egress allows: anywhere (the
//! default, "the outside world"), or only to the destinations an admin listed (an empty
//! list: nowhere). Whether its jobs may share the node's own network instead
//! (`--network host`) is the policy's say too.
//!
//! Jobs' networks are IPv4: an IPv6 destination is refused where it is written, rather
//! than accepted and never reached.

use std::fmt;
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::{ValidationError, Violations};

/// The most egress rules a policy lists.
pub const MAX_EGRESS_RULES: usize = 64;
/// The most port ranges one rule lists.
pub const MAX_PORT_RANGES: usize = 32;

/// Destination ports `first..=last` (TCP and UDP).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PortRange {
    pub first: u16,
    pub last: u16,
}

impl fmt::Display for PortRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.first == self.last {
            write!(f, "{}", self.first)
        } else {
            write!(f, "{}-{}", self.first, self.last)
        }
    }
}

/// Parses `443`, `8000-8100` or a comma-separated list of them.
pub fn parse_ports(raw: &str) -> Result<Vec<PortRange>, String> {
    let port = |p: &str| -> Result<u16, String> {
        match p.trim().parse::<u16>() {
            Ok(0) | Err(_) => Err(format!("`{p}` is not a port (1 to 65535)")),
            Ok(n) => Ok(n),
        }
    };
    let mut ranges = Vec::new();
    for part in raw.split(',') {
        let (first, last) = match part.split_once('-') {
            Some((a, b)) => (port(a)?, port(b)?),
            None => {
                let p = port(part)?;
                (p, p)
            }
        };
        if first > last {
            return Err(format!("`{part}`: the first port is above the last"));
        }
        ranges.push(PortRange { first, last });
    }
    if ranges.len() > MAX_PORT_RANGES {
        return Err(format!("at most {MAX_PORT_RANGES} ports or port ranges"));
    }
    ranges.sort();
    ranges.dedup();
    Ok(ranges)
}

/// Where a job's connections may go: an IPv4 network, and its ports (none: every port and
/// protocol).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EgressRule {
    pub cidr: Ipv4Net,
    pub ports: Vec<PortRange>,
}

/// Parses an IPv4 network (`203.0.113.0/24`, or an address alone for itself), refusing
/// IPv6 and host bits below the prefix (a typo as often as not).
pub fn parse_cidr(raw: &str) -> Result<Ipv4Net, String> {
    let raw = raw.trim();
    if raw.contains(':') {
        return Err(format!(
            "`{raw}`: IPv6 is not supported (jobs' networks are IPv4)"
        ));
    }
    let net = match raw.parse::<Ipv4Net>() {
        Ok(n) => n,
        Err(_) => raw
            .parse::<Ipv4Addr>()
            .map(Ipv4Net::from)
            .map_err(|_| format!("`{raw}` is not an IPv4 network (ADDRESS/PREFIX)"))?,
    };
    if net.trunc() != net {
        return Err(format!(
            "`{raw}` has bits set below its prefix (did you mean {}?)",
            net.trunc()
        ));
    }
    Ok(net)
}

impl EgressRule {
    /// Parses `CIDR[:PORTS]` (the CLI's `--allow-egress`), e.g. `10.20.0.0/16:443,8000-8100`.
    pub fn parse(raw: &str) -> Result<Self, String> {
        // An IPv6 network has colons of its own: refused whole, not split.
        let (cidr, ports) = match raw.split_once(':') {
            Some((c, p)) if !p.contains(':') => (c, Some(p)),
            _ => (raw, None),
        };
        Ok(EgressRule {
            cidr: parse_cidr(cidr)?,
            ports: match ports {
                Some(p) => parse_ports(p)?,
                None => Vec::new(),
            },
        })
    }

    /// The ports as written (`443,8000-8100`), empty for every port.
    pub fn ports_text(&self) -> String {
        self.ports
            .iter()
            .map(PortRange::to_string)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Whether a connection to `addr`, port `port` (none: a protocol without ports), is
    /// allowed by this rule.
    pub fn allows(&self, addr: Ipv4Addr, port: Option<u16>) -> bool {
        self.cidr.contains(&addr)
            && (self.ports.is_empty()
                || port.is_some_and(|p| self.ports.iter().any(|r| (r.first..=r.last).contains(&p))))
    }
}

impl fmt::Display for EgressRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.ports.is_empty() {
            write!(f, "{}", self.cidr)
        } else {
            write!(f, "{}:{}", self.cidr, self.ports_text())
        }
    }
}

/// An egress rule as stored and as the API shows it: `{"cidr": "…", "ports": "…"}`.
#[derive(Serialize, Deserialize)]
struct EgressRuleText {
    cidr: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    ports: String,
}

impl Serialize for EgressRule {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        EgressRuleText {
            cidr: self.cidr.to_string(),
            ports: self.ports_text(),
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for EgressRule {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let t = EgressRuleText::deserialize(d)?;
        let ports = if t.ports.is_empty() {
            Vec::new()
        } else {
            parse_ports(&t.ports).map_err(serde::de::Error::custom)?
        };
        Ok(EgressRule {
            cidr: parse_cidr(&t.cidr).map_err(serde::de::Error::custom)?,
            ports,
        })
    }
}

/// A tenant's network policy.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkPolicy {
    /// Where its jobs' connections may go, besides what is never reachable. `None`: anywhere
    /// else (the default); a list: only there (empty: nowhere).
    #[serde(default)]
    pub egress: Option<Vec<EgressRule>>,
    /// Whether its jobs may share the node's network (`--network host`): they then reach
    /// whatever the node reaches, its own services and other jobs' listeners included.
    #[serde(default)]
    pub allow_host_network: bool,
}

impl NetworkPolicy {
    /// Refuses a job's network the policy does not allow, naming `network`.
    pub fn allows_network(&self, network: crate::JobNetwork) -> Result<(), ValidationError> {
        if network == crate::JobNetwork::Host && !self.allow_host_network {
            return Err(ValidationError::single(
                "network",
                "`host` shares the node's network, which this tenant's policy does not allow \
                 (a platform admin may: allot tenant set-policy --allow-host-network); \
                 `private` (the default) or `none`",
            ));
        }
        Ok(())
    }

    /// Checks its size, naming the field.
    pub fn validate(&self) -> Result<(), ValidationError> {
        let mut v = Violations::default();
        if let Some(rules) = &self.egress {
            v.check(
                rules.len() <= MAX_EGRESS_RULES,
                "egress",
                format!("must list at most {MAX_EGRESS_RULES} rules"),
            );
        }
        v.into_result()
    }

    /// The egress in words, as the CLI shows it.
    pub fn describe_egress(&self) -> String {
        match &self.egress {
            None => "anywhere but the node, link-local addresses and other jobs".into(),
            Some(rules) if rules.is_empty() => "none".into(),
            Some(rules) => rules
                .iter()
                .map(EgressRule::to_string)
                .collect::<Vec<_>>()
                .join(", "),
        }
    }
}

/// Parses the API's egress rules (`{"cidr", "ports"}` each), naming `egress[i].cidr` or
/// `egress[i].ports` for a bad one.
pub fn parse_egress(
    rules: &[(String, Option<String>)],
) -> Result<Vec<EgressRule>, ValidationError> {
    let mut v = Violations::default();
    let mut out = Vec::with_capacity(rules.len());
    for (i, (cidr, ports)) in rules.iter().enumerate() {
        let cidr = parse_cidr(cidr).map_err(|e| v.push(format!("egress[{i}].cidr"), e));
        let ports = match ports.as_deref().map(str::trim) {
            None | Some("") => Ok(Vec::new()),
            Some(p) => parse_ports(p).map_err(|e| v.push(format!("egress[{i}].ports"), e)),
        };
        if let (Ok(cidr), Ok(ports)) = (cidr, ports) {
            out.push(EgressRule { cidr, ports });
        }
    }
    v.check(
        rules.len() <= MAX_EGRESS_RULES,
        "egress",
        format!("must list at most {MAX_EGRESS_RULES} rules"),
    );
    v.into_result().map(|()| out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::JobNetwork;

    #[test]
    fn egress_rules_parse_as_the_cli_writes_them() {
        let r = EgressRule::parse("10.20.0.0/16:443,8000-8100").expect("rule");
        assert_eq!(r.cidr.to_string(), "10.20.0.0/16");
        assert_eq!(
            r.ports,
            [
                PortRange {
                    first: 443,
                    last: 443
                },
                PortRange {
                    first: 8000,
                    last: 8100
                }
            ]
        );
        assert_eq!(r.to_string(), "10.20.0.0/16:443,8000-8100");
        let any = EgressRule::parse("203.0.113.7").expect("an address alone");
        assert_eq!(any.to_string(), "203.0.113.7/32");
        assert!(any.ports.is_empty());
        for bad in [
            "",
            "10.0.0.0/33",
            "10.0.0.1/8",
            "example.com",
            "10.0.0.0/8:0",
            "10.0.0.0/8:70000",
            "10.0.0.0/8:90-80",
            "10.0.0.0/8:",
            "10.0.0.0/8:https",
            "2001:db8::/32",
            "2001:db8::/32:443",
        ] {
            assert!(EgressRule::parse(bad).is_err(), "{bad:?} parsed");
        }
        let v6 = EgressRule::parse("2001:db8::/32").expect_err("v6");
        assert!(v6.contains("IPv6"), "{v6}");
        let typo = EgressRule::parse("10.1.2.3/16").expect_err("host bits");
        assert!(typo.contains("10.1.0.0/16"), "{typo}");
    }

    #[test]
    fn a_rule_allows_its_network_and_ports_only() {
        let r = EgressRule::parse("10.20.0.0/16:443,8000-8100").expect("rule");
        assert!(r.allows("10.20.3.4".parse().expect("ip"), Some(443)));
        assert!(r.allows("10.20.3.4".parse().expect("ip"), Some(8100)));
        assert!(!r.allows("10.20.3.4".parse().expect("ip"), Some(8101)));
        assert!(!r.allows("10.20.3.4".parse().expect("ip"), None));
        assert!(!r.allows("10.21.0.1".parse().expect("ip"), Some(443)));
        let all = EgressRule::parse("10.20.0.0/16").expect("rule");
        assert!(all.allows("10.20.0.1".parse().expect("ip"), None));
    }

    #[test]
    fn policies_round_trip_through_their_json() {
        let p = NetworkPolicy {
            egress: Some(vec![
                EgressRule::parse("10.0.0.0/8:53").expect("rule"),
                EgressRule::parse("192.0.2.0/24").expect("rule"),
            ]),
            allow_host_network: true,
        };
        let text = serde_json::to_string(&p).expect("json");
        assert!(
            text.contains(r#"{"cidr":"10.0.0.0/8","ports":"53"}"#),
            "{text}"
        );
        assert_eq!(
            serde_json::from_str::<NetworkPolicy>(&text).expect("back"),
            p
        );
        assert_eq!(
            serde_json::from_str::<NetworkPolicy>("{}").expect("empty"),
            NetworkPolicy::default()
        );
        assert!(serde_json::from_str::<EgressRule>(r#"{"cidr":"10.0.0.1/8"}"#).is_err());
    }

    #[test]
    fn host_network_needs_the_policy() {
        let closed = NetworkPolicy::default();
        let err = closed.allows_network(JobNetwork::Host).expect_err("host");
        assert_eq!(err.0[0].field, "network");
        assert!(closed.allows_network(JobNetwork::Private).is_ok());
        assert!(closed.allows_network(JobNetwork::None).is_ok());
        let open = NetworkPolicy {
            allow_host_network: true,
            ..Default::default()
        };
        assert!(open.allows_network(JobNetwork::Host).is_ok());
    }

    #[test]
    fn api_rules_name_the_bad_field() {
        let err = parse_egress(&[
            ("10.0.0.0/8".into(), Some("443".into())),
            ("nope".into(), None),
            ("10.0.0.0/8".into(), Some("0".into())),
        ])
        .expect_err("bad");
        let fields: Vec<&str> = err.0.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(fields, ["egress[1].cidr", "egress[2].ports"]);
        let ok = parse_egress(&[("10.0.0.0/8".into(), Some(" ".into()))]).expect("ok");
        assert!(ok[0].ports.is_empty());
        let many: Vec<(String, Option<String>)> =
            (0..65).map(|i| (format!("10.0.{i}.0/24"), None)).collect();
        assert_eq!(parse_egress(&many).expect_err("many").0[0].field, "egress");
        let mut described = NetworkPolicy::default();
        assert!(described.describe_egress().starts_with("anywhere"));
        described.egress = Some(Vec::new());
        assert_eq!(described.describe_egress(), "none");
    }
}
