//! Container images as jobs name them, and the tenant policy on which they may use.
//!
//! A reference is `[REGISTRY/]REPOSITORY[:TAG][@sha256:HEX]`, as the OCI distribution
//! spec and Docker write them. Once a node resolved a tag, the job is pinned to the
//! manifest digest it got: [`pinned`] names the image by that digest for every later
//! attempt, on every node.

use serde::{Deserialize, Serialize};

/// The parts of an image reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageRef {
    /// `HOST[:PORT]`, or `None` for a bare name (Docker Hub's).
    pub registry: Option<String>,
    pub repository: String,
    pub tag: Option<String>,
    /// `sha256:…`
    pub digest: Option<String>,
}

/// The registry of a reference without one.
pub const DOCKER_HUB: &str = "docker.io";

/// Longest reference accepted.
pub const MAX_IMAGE_LEN: usize = 512;

fn is_digest(d: &str) -> bool {
    d.strip_prefix("sha256:")
        .is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

impl ImageRef {
    pub fn parse(s: &str) -> Result<Self, String> {
        if s.is_empty() {
            return Err("must not be empty".into());
        }
        if s.len() > MAX_IMAGE_LEN {
            return Err(format!("must be at most {MAX_IMAGE_LEN} characters"));
        }
        if s.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err("must not contain spaces or control characters".into());
        }
        let (rest, digest) = match s.split_once('@') {
            Some((r, d)) if is_digest(d) => (r, Some(d.to_owned())),
            Some(_) => return Err("a digest must be sha256: and 64 hex digits".into()),
            None => (s, None),
        };
        let (name, tag) = match rest.rsplit_once(':') {
            Some((n, t)) if !t.contains('/') => (n, Some(t.to_owned())),
            _ => (rest, None),
        };
        if let Some(t) = &tag {
            let ok = t.len() <= 128
                && t.chars()
                    .next()
                    .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
                && t.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
            if !ok {
                return Err(format!("`{t}` is not a valid tag"));
            }
        }
        let mut parts: Vec<&str> = name.split('/').collect();
        let registry = match parts.first() {
            Some(first)
                if parts.len() > 1
                    && (first.contains('.') || first.contains(':') || *first == "localhost") =>
            {
                let host = parts.remove(0);
                if !host
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '[' | ']'))
                {
                    return Err(format!("`{host}` is not a registry host"));
                }
                Some(host.to_owned())
            }
            _ => None,
        };
        if parts.is_empty() || parts.iter().any(|p| p.is_empty()) {
            return Err("names no repository".into());
        }
        for p in &parts {
            let ok = p.chars().all(|c| {
                c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '_' | '-')
            }) && p.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
                && *p != ".."
                && *p != ".";
            if !ok {
                return Err(format!(
                    "repository component `{p}` must be lower-case letters, digits, `.`, `_` or `-`"
                ));
            }
        }
        Ok(ImageRef {
            registry,
            repository: parts.join("/"),
            tag,
            digest,
        })
    }

    /// The registry it is pulled from: its host, Docker Hub's for a bare name.
    pub fn registry_host(&self) -> &str {
        self.registry.as_deref().unwrap_or(DOCKER_HUB)
    }

    /// `REGISTRY/REPOSITORY` (what a policy entry is a prefix of).
    pub fn name(&self) -> String {
        match &self.registry {
            Some(r) => format!("{r}/{}", self.repository),
            None => self.repository.clone(),
        }
    }
}

/// The image an attempt runs: pinned to `digest` once one is known, else as submitted.
pub fn pinned(image: &str, digest: Option<&str>) -> String {
    match (ImageRef::parse(image), digest) {
        (Ok(r), Some(d)) => format!("{}@{d}", r.name()),
        _ => image.to_owned(),
    }
}

/// What a tenant's jobs may run and where (set by platform admins).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantPolicy {
    /// Image name prefixes (`REGISTRY/` or `REGISTRY/REPOSITORY`) its jobs may use; empty
    /// allows any image.
    pub image_registries: Vec<String>,
    /// Its jobs run only on nodes that confine them (the `oci` runtime).
    pub require_confinement: bool,
    /// What its jobs may reach over the network, and whether they may share the node's.
    #[serde(default)]
    pub network: crate::NetworkPolicy,
}

impl TenantPolicy {
    /// Refuses an image no entry allows, saying which are allowed.
    pub fn allows_image(&self, image: &ImageRef) -> Result<(), String> {
        if self.image_registries.is_empty() {
            return Ok(());
        }
        let name = image.name();
        let allowed = self.image_registries.iter().any(|p| {
            let p = p.trim_end_matches('/');
            name == p || name.starts_with(&format!("{p}/"))
        });
        if allowed {
            Ok(())
        } else {
            Err(format!(
                "`{name}` is not in a registry or repository this tenant may use ({})",
                self.image_registries.join(", ")
            ))
        }
    }

    /// Checks each entry, naming the bad one.
    pub fn validate(&self) -> Result<(), crate::ValidationError> {
        if self.image_registries.len() > 64 {
            return Err(crate::ValidationError::single(
                "image_registries",
                "must list at most 64 entries",
            ));
        }
        self.network.validate()?;
        for (i, entry) in self.image_registries.iter().enumerate() {
            let trimmed = entry.trim_end_matches('/');
            // A registry alone (`host:port`) or a registry and repository prefix.
            let ok = !trimmed.is_empty()
                && (ImageRef::parse(trimmed).is_ok()
                    || ImageRef::parse(&format!("{trimmed}/x"))
                        .is_ok_and(|r| r.registry.is_some()));
            if !ok || trimmed.contains('@') {
                return Err(crate::ValidationError::single(
                    format!("image_registries[{i}]"),
                    format!("`{entry}` is not REGISTRY or REGISTRY/REPOSITORY"),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_parse_as_registries_write_them() {
        let r = ImageRef::parse("127.0.0.1:5000/team-a/busybox:v1").expect("tag");
        assert_eq!(r.registry.as_deref(), Some("127.0.0.1:5000"));
        assert_eq!(r.repository, "team-a/busybox");
        assert_eq!(r.tag.as_deref(), Some("v1"));
        let d = format!("registry.example.com/x/y@sha256:{}", "a".repeat(64));
        assert!(ImageRef::parse(&d).expect("digest").digest.is_some());
        assert_eq!(ImageRef::parse("busybox").expect("bare").registry, None);
        for bad in [
            "",
            "Upper/Case",
            "a b",
            "x@sha256:short",
            "reg.io/../etc",
            "reg.io//x",
            "reg.io/x:bad tag",
        ] {
            assert!(ImageRef::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_pinned_image_names_its_digest() {
        let digest = format!("sha256:{}", "b".repeat(64));
        assert_eq!(
            pinned("reg.io:5000/a/b:v1", Some(&digest)),
            format!("reg.io:5000/a/b@{digest}")
        );
        assert_eq!(pinned("reg.io:5000/a/b:v1", None), "reg.io:5000/a/b:v1");
    }

    #[test]
    fn the_policy_allows_only_its_prefixes() {
        let p = TenantPolicy {
            image_registries: vec!["127.0.0.1:5000/team-a/".into(), "reg.io".into()],
            ..Default::default()
        };
        let ok = |s: &str| p.allows_image(&ImageRef::parse(s).expect("ref")).is_ok();
        assert!(ok("127.0.0.1:5000/team-a/busybox:1"));
        assert!(ok("reg.io/anything/else:1"));
        assert!(!ok("127.0.0.1:5000/team-b/busybox:1"));
        assert!(
            !ok("127.0.0.1:5000/team-ab/busybox:1"),
            "a prefix is whole components"
        );
        assert!(!ok("evil.io/reg.io/x:1"));
        assert!(p.validate().is_ok());
        let bad = TenantPolicy {
            image_registries: vec!["not a registry".into()],
            ..Default::default()
        };
        assert_eq!(
            bad.validate().expect_err("bad").0[0].field,
            "image_registries[0]"
        );
    }
}

/// A tenant's pull credentials for one registry, as anyone is shown them: which registry,
/// and since when. The secret itself is never shown, logged or audited.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RegistryCredential {
    /// `HOST[:PORT]`, as images name it.
    pub registry: String,
    pub updated_at: chrono::DateTime<chrono::Utc>,
}

/// A user name and password (or token) for a registry. Its `Debug` shows neither.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PullSecret {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for PullSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PullSecret(<redacted>)")
    }
}

impl PullSecret {
    pub fn validate(&self) -> Result<(), crate::ValidationError> {
        let mut v = crate::error::Violations::default();
        for (field, value, max) in [
            ("username", &self.username, 256),
            ("password", &self.password, 8192),
        ] {
            v.check(!value.is_empty(), field, "must not be empty");
            v.check(
                value.len() <= max,
                field,
                format!("must be at most {max} bytes"),
            );
            v.check(
                !value.chars().any(char::is_control),
                field,
                "must not contain control characters",
            );
        }
        v.check(
            !self.username.contains(':'),
            "username",
            "must not contain `:` (it separates user and password in basic authentication)",
        );
        v.into_result()
    }
}

/// Checks a registry as credentials name it: `HOST[:PORT]`, as in image references.
pub fn check_registry(field: &str, registry: &str) -> Result<(), crate::ValidationError> {
    let ok = registry.len() <= 255
        && ImageRef::parse(&format!("{registry}/x"))
            .is_ok_and(|r| r.registry.as_deref() == Some(registry));
    if ok {
        Ok(())
    } else {
        Err(crate::ValidationError::single(
            field,
            format!(
                "`{registry}` is not a registry host (HOST[:PORT], e.g. registry.example.com:5000)"
            ),
        ))
    }
}
