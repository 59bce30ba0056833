//! Named volumes: host paths an operator declares (shared storage every node mounts at the
//! same place) and the tenants that may mount them. A job never names a host path: it
//! mounts volumes by name at paths inside its container, and its `checkpoint_dir` lies in
//! one of them.
//!
//! Each tenant sees only its own directory of a volume, `<host_path>/<tenant>`, so two
//! tenants allowed on the same storage do not see each other's files.

use std::path::Path;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::error::Violations;
use crate::{TenantName, ValidationError};

/// Most volumes one job mounts.
pub const MAX_MOUNTS: usize = 16;
/// Longest path accepted, on the host or in a container.
pub const MAX_PATH_LEN: usize = 1024;

/// The runtime's own directory in every container: its init is `/.allot/init`. Nothing of
/// a job's (a volume, its working directory) may be there or cover it.
pub const RUNTIME_DIR: &str = "/.allot";

/// Container paths a volume may not cover: the kernel's and the runtime's own, and where
/// the node mounts the GPU-sharing shim.
const RESERVED: &[&str] = &["/proc", "/sys", "/dev", "/usr/lib/allot", RUNTIME_DIR];

/// Whether container path `path` is or lies in the runtime's own directory (by its
/// components, so `/.allot/../x` and `//.allot` count as what they name).
pub fn in_runtime_dir(path: &str) -> bool {
    let mut parts: Vec<&str> = Vec::new();
    for c in path.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            c => parts.push(c),
        }
    }
    parts.first() == Some(&RUNTIME_DIR.trim_start_matches('/'))
}

/// A volume as declared by a platform admin.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Volume {
    pub name: String,
    /// Where it is on every node (absolute).
    pub host_path: String,
    /// Tenants that may mount it.
    pub tenants: Vec<TenantName>,
    /// Jobs may only read it.
    pub read_only: bool,
    pub created_at: DateTime<Utc>,
}

/// A volume a job mounts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeMount {
    /// The volume's name.
    pub volume: String,
    /// Where the job sees it (absolute, inside its container).
    pub path: String,
    #[serde(default)]
    pub read_only: bool,
}

/// Checks a volume name: like a tenant's (lowercase letters, digits and `-`).
pub fn check_name(field: &str, name: &str) -> Result<(), ValidationError> {
    TenantName::parse(field, name).map(|_| ())
}

/// Why `path` is not an absolute, normalised path (no `.`, `..` or empty components).
fn path_problem(path: &str) -> Option<&'static str> {
    if !path.starts_with('/') {
        return Some("must be an absolute path");
    }
    if path.len() > MAX_PATH_LEN {
        return Some("must be at most 1024 characters");
    }
    if path.contains('\0') {
        return Some("must not contain NUL bytes");
    }
    if path == "/" {
        return Some("must not be `/`");
    }
    let normal = path
        .split('/')
        .skip(1)
        .all(|c| !c.is_empty() && c != "." && c != "..");
    if !normal {
        return Some("must be normalised: no `.`, `..`, empty components or trailing `/`");
    }
    None
}

/// Whether `inner` is `outer` or lies below it (both normalised).
pub fn within(inner: &str, outer: &str) -> bool {
    Path::new(inner).starts_with(Path::new(outer))
}

impl Volume {
    pub fn validate(&self) -> Result<(), ValidationError> {
        check_name("name", &self.name)?;
        let mut v = Violations::default();
        if let Some(why) = path_problem(&self.host_path) {
            v.push("host_path", why);
        }
        v.check(
            self.tenants.len() <= 1024,
            "tenants",
            "must list at most 1024 tenants",
        );
        v.into_result()
    }

    pub fn allows(&self, tenant: &TenantName) -> bool {
        self.tenants.contains(tenant)
    }
}

/// The path of `tenant`'s directory of a volume at `host_path`.
pub fn tenant_dir(host_path: &str, tenant: &str) -> String {
    format!("{}/{tenant}", host_path.trim_end_matches('/'))
}

/// Checks a job's mounts and checkpoint directory on their own (without the volumes'
/// declarations): paths absolute and normalised, none reserved, none within another, each
/// volume once, and the checkpoint directory inside a mount the job may write.
pub fn check_mounts(
    mounts: &[VolumeMount],
    checkpoint_dir: Option<&str>,
) -> Result<(), ValidationError> {
    let mut v = Violations::default();
    v.check(
        mounts.len() <= MAX_MOUNTS,
        "volumes",
        format!("must mount at most {MAX_MOUNTS} volumes"),
    );
    for (i, m) in mounts.iter().enumerate() {
        if check_name("", &m.volume).is_err() {
            v.push(
                format!("volumes[{i}].volume"),
                "must be a volume's name (lowercase letters, digits and `-`)",
            );
        }
        let field = format!("volumes[{i}].path");
        if let Some(why) = path_problem(&m.path) {
            v.push(field, why);
            continue;
        }
        if RESERVED
            .iter()
            .any(|r| within(&m.path, r) || within(r, &m.path))
        {
            v.push(
                field.clone(),
                format!("must not be or hold {}", RESERVED.join(", ")),
            );
        }
        for (j, other) in mounts.iter().enumerate().take(i) {
            if other.volume == m.volume {
                v.push(
                    format!("volumes[{i}].volume"),
                    format!("`{}` is mounted twice", m.volume),
                );
            }
            if path_problem(&other.path).is_none()
                && (within(&m.path, &other.path) || within(&other.path, &m.path))
            {
                v.push(
                    field.clone(),
                    format!("overlaps volumes[{j}].path `{}`", other.path),
                );
            }
        }
    }
    if let Some(dir) = checkpoint_dir {
        match path_problem(dir) {
            Some(why) => v.push("checkpoint_dir", why),
            None => {
                let holder = mounts.iter().find(|m| within(dir, &m.path));
                match holder {
                    None => v.push(
                        "checkpoint_dir",
                        "must lie in a volume the job mounts (volumes[].path): host paths \
                         are not accepted",
                    ),
                    Some(m) if m.read_only => v.push(
                        "checkpoint_dir",
                        format!("lies in volume `{}`, mounted read-only", m.volume),
                    ),
                    Some(_) => {}
                }
            }
        }
    }
    v.into_result()
}

/// Checks the mounts against the declared volumes: each exists, admits `tenant`, and is
/// written only where it allows writes. A volume the tenant may not use is reported as
/// not existing, so tenants learn nothing of others' storage.
pub fn check_against(
    mounts: &[VolumeMount],
    tenant: &TenantName,
    declared: &[Volume],
) -> Result<(), ValidationError> {
    let mut v = Violations::default();
    for (i, m) in mounts.iter().enumerate() {
        match declared
            .iter()
            .find(|d| d.name == m.volume && d.allows(tenant))
        {
            None => v.push(
                format!("volumes[{i}].volume"),
                format!("no volume named `{}` that this tenant may mount", m.volume),
            ),
            Some(d) if d.read_only && !m.read_only => v.push(
                format!("volumes[{i}].read_only"),
                format!("volume `{}` is read-only: mount it read_only", m.volume),
            ),
            Some(_) => {}
        }
    }
    v.into_result()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mount(volume: &str, path: &str, ro: bool) -> VolumeMount {
        VolumeMount {
            volume: volume.into(),
            path: path.into(),
            read_only: ro,
        }
    }

    fn fields(r: Result<(), ValidationError>) -> Vec<String> {
        r.err()
            .map(|e| e.0.into_iter().map(|f| f.field).collect())
            .unwrap_or_default()
    }

    #[test]
    fn host_paths_and_escapes_are_refused_as_checkpoint_dirs() {
        let m = [mount("ckpt", "/ckpt", false)];
        assert!(check_mounts(&m, Some("/ckpt/run-1")).is_ok());
        assert!(check_mounts(&m, Some("/ckpt")).is_ok());
        for bad in [
            "/var/lib/allot",
            "/ckpt/../etc",
            "/ckptx",
            "relative",
            "/ckpt/",
        ] {
            assert_eq!(
                fields(check_mounts(&m, Some(bad))),
                ["checkpoint_dir"],
                "{bad}"
            );
        }
        let ro = [mount("ckpt", "/ckpt", true)];
        assert_eq!(
            fields(check_mounts(&ro, Some("/ckpt/a"))),
            ["checkpoint_dir"]
        );
    }

    #[test]
    fn mounts_must_not_cover_reserved_paths_or_each_other() {
        for bad in [
            "/",
            "/proc",
            "/dev/nvidia0",
            "/sys/fs",
            "/usr/lib/allot",
            "/.allot",
            "/.allot/x",
            "/a/./b",
        ] {
            assert_eq!(
                fields(check_mounts(&[mount("v", bad, false)], None)),
                ["volumes[0].path"],
                "{bad}"
            );
        }
        // Neither the runtime's directory nor anything of it is a volume's; a name that
        // only begins alike is another directory.
        assert!(check_mounts(&[mount("v", "/.allotx", false)], None).is_ok());
        for (path, inside) in [
            ("/.allot", true),
            ("/.allot/init", true),
            ("//.allot/", true),
            ("/x/../.allot", true),
            ("/./.allot", true),
            ("/.allotx", false),
            ("/scratch/.allot", false),
            ("/", false),
        ] {
            assert_eq!(in_runtime_dir(path), inside, "{path}");
        }
        // `/usr` would hide the shim's mount point.
        assert!(check_mounts(&[mount("v", "/usr", false)], None).is_err());
        let nested = [mount("a", "/data", false), mount("b", "/data/x", false)];
        assert_eq!(fields(check_mounts(&nested, None)), ["volumes[1].path"]);
        let twice = [mount("a", "/one", false), mount("a", "/two", false)];
        assert_eq!(fields(check_mounts(&twice, None)), ["volumes[1].volume"]);
    }

    #[test]
    fn only_declared_volumes_the_tenant_may_use() {
        let t = TenantName::parse("t", "team-a").expect("name");
        let other = TenantName::parse("t", "team-b").expect("name");
        let vols = [Volume {
            name: "shared".into(),
            host_path: "/mnt/shared".into(),
            tenants: vec![t.clone()],
            read_only: true,
            created_at: Utc::now(),
        }];
        let ro = [mount("shared", "/data", true)];
        assert!(check_against(&ro, &t, &vols).is_ok());
        assert_eq!(
            fields(check_against(&ro, &other, &vols)),
            ["volumes[0].volume"]
        );
        let rw = [mount("shared", "/data", false)];
        assert_eq!(
            fields(check_against(&rw, &t, &vols)),
            ["volumes[0].read_only"]
        );
    }
}
