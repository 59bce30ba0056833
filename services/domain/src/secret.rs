//! Tenant secrets: values a tenant's admins store (sealed at rest by the control plane),
//! which jobs of that tenant reference by name and get as an environment variable or a
//! read-only file. Nothing shows a value again: the API lists names and when they changed,
//! the audit log records that one was set, a job's spec holds only the reference.
//!
//! Plain `env` values are configuration, not secrets, yet people put passwords there: the
//! audit log records their names with the values redacted, and a commitment to each value
//! ([`env_commitment`]) so an auditor shown a value can check it was the one submitted.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::Violations;
use crate::{TenantName, ValidationError};

/// Largest secret value.
pub const MAX_VALUE_BYTES: usize = 64 * 1024;
/// Most secrets one job uses.
pub const MAX_USES: usize = 32;
/// Where file secrets go in a container: below this directory.
pub const FILE_ROOT: &str = "/run/secrets";
/// What stands for a value the audit log does not keep.
pub const REDACTED: &str = "<redacted>";

/// A secret as anyone is shown it: its name and when it was set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TenantSecret {
    pub name: String,
    pub updated_at: DateTime<Utc>,
}

/// A secret a job uses, and how it gets it: exactly one of `env` (a variable of that
/// name) and `file` (a read-only file at that path, below [`FILE_ROOT`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SecretUse {
    /// The tenant secret's name.
    pub secret: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
}

/// A secret's value, opened for one launch. Its `Debug` shows no value.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretValue(pub Vec<u8>);

impl std::fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SecretValue({} bytes)", self.0.len())
    }
}

/// Checks a secret's name: like a tenant's (lowercase letters, digits and `-`).
pub fn check_name(field: &str, name: &str) -> Result<(), ValidationError> {
    TenantName::parse(field, name).map(|_| ())
}

/// Checks a value to store.
pub fn check_value(value: &[u8]) -> Result<(), ValidationError> {
    if value.is_empty() || value.len() > MAX_VALUE_BYTES {
        return Err(ValidationError::single(
            "value",
            format!("must be 1 to {MAX_VALUE_BYTES} bytes"),
        ));
    }
    Ok(())
}

/// Whether `name` is an environment variable name a job may set.
pub fn is_env_name(name: &str) -> bool {
    name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && name.len() <= 255
}

/// Whether `name` is one Allot sets itself.
pub fn is_reserved_env(name: &str) -> bool {
    name.starts_with("ALLOT_") || name == "CUDA_VISIBLE_DEVICES"
}

/// Checks a job's secret uses beside its plain `env`: each names a secret, and gets it
/// either as a variable no other source sets or as a file of its own below
/// [`FILE_ROOT`].
pub fn check_uses(uses: &[SecretUse], env: &BTreeMap<String, String>, v: &mut Violations) {
    v.check(
        uses.len() <= MAX_USES,
        "secrets",
        format!("must use at most {MAX_USES} secrets"),
    );
    let mut vars = BTreeSet::new();
    let mut files = BTreeSet::new();
    for (i, u) in uses.iter().enumerate() {
        let field = format!("secrets[{i}]");
        if let Err(e) = check_name(&format!("{field}.secret"), &u.secret) {
            for f in e.0 {
                v.push(f.field, f.reason);
            }
        }
        match (&u.env, &u.file) {
            (Some(var), None) => {
                let field = format!("{field}.env");
                v.check(
                    is_env_name(var),
                    field.clone(),
                    "names letters, digits and `_`, not starting with a digit",
                );
                v.check(
                    !is_reserved_env(var),
                    field.clone(),
                    "is set by Allot and cannot be overridden",
                );
                v.check(
                    !env.contains_key(var),
                    field.clone(),
                    "is also set in `env`",
                );
                v.check(vars.insert(var.clone()), field, "is set by two secrets");
            }
            (None, Some(path)) => {
                let field = format!("{field}.file");
                let name = path
                    .strip_prefix(FILE_ROOT)
                    .and_then(|p| p.strip_prefix('/'))
                    .unwrap_or_default();
                let plain = !name.is_empty()
                    && name.len() <= 255
                    && name != "."
                    && name != ".."
                    && name
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
                v.check(
                    plain,
                    field.clone(),
                    format!("must be {FILE_ROOT}/NAME, NAME of letters, digits, `.`, `_` and `-`"),
                );
                v.check(
                    files.insert(path.clone()),
                    field,
                    "is written by two secrets",
                );
            }
            _ => v.push(field, "names exactly one of `env` and `file`"),
        }
    }
}

/// A commitment to the value of variable `name` of job `job_id`: hex SHA-256 of a
/// domain tag, the job id, the name and the value. The job id (unique, and in the entry
/// beside it) keeps one commitment from being tested against a table made for another.
pub fn env_commitment(job_id: &str, name: &str, value: &str) -> String {
    let mut h = Sha256::new();
    for part in ["allot-env-v1", job_id, name, value] {
        h.update(part.as_bytes());
        h.update([0u8]);
    }
    hex::encode(h.finalize())
}

/// A job spec as the audit log records it: every `env` value replaced by [`REDACTED`], and
/// `env_sha256` committing to each ([`env_commitment`]).
pub fn audited_spec(job_id: &str, spec: &crate::JobSpec) -> serde_json::Value {
    let mut value = serde_json::to_value(spec).unwrap_or(serde_json::Value::Null);
    if let Some(obj) = value.as_object_mut() {
        let redacted: serde_json::Map<String, serde_json::Value> = spec
            .env
            .keys()
            .map(|k| (k.clone(), REDACTED.into()))
            .collect();
        let commitments: serde_json::Map<String, serde_json::Value> = spec
            .env
            .iter()
            .map(|(k, v)| (k.clone(), env_commitment(job_id, k, v).into()))
            .collect();
        obj.insert("env".into(), redacted.into());
        obj.insert("env_sha256".into(), commitments.into());
    }
    value
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uses(list: &[(&str, Option<&str>, Option<&str>)]) -> Vec<SecretUse> {
        list.iter()
            .map(|(s, e, f)| SecretUse {
                secret: (*s).into(),
                env: e.map(Into::into),
                file: f.map(Into::into),
            })
            .collect()
    }

    fn fields(uses: &[SecretUse], env: &BTreeMap<String, String>) -> Vec<String> {
        let mut v = Violations::default();
        check_uses(uses, env, &mut v);
        v.into_result()
            .err()
            .map(|e| e.0.into_iter().map(|f| f.field).collect())
            .unwrap_or_default()
    }

    #[test]
    fn uses_name_a_secret_and_exactly_one_safe_destination() {
        let env = BTreeMap::from([("PLAIN".to_owned(), "x".to_owned())]);
        let ok = uses(&[
            ("db-pass", Some("DB_PASSWORD"), None),
            ("tls", None, Some("/run/secrets/tls.key")),
        ]);
        assert!(fields(&ok, &env).is_empty());
        let bad = uses(&[
            ("Bad Name", Some("A"), None),
            ("a", None, None),
            ("b", Some("B"), Some("/run/secrets/b")),
            ("c", Some("ALLOT_TOKEN"), None),
            ("d", Some("PLAIN"), None),
            ("e", None, Some("/etc/passwd")),
            ("f", None, Some("/run/secrets/../../etc/shadow")),
            ("g", None, Some("/run/secrets/x/y")),
            ("h", Some("DUP"), None),
            ("i", Some("DUP"), None),
        ]);
        assert_eq!(
            fields(&bad, &env),
            [
                "secrets[0].secret",
                "secrets[1]",
                "secrets[2]",
                "secrets[3].env",
                "secrets[4].env",
                "secrets[5].file",
                "secrets[6].file",
                "secrets[7].file",
                "secrets[9].env",
            ]
        );
    }

    #[test]
    fn the_audit_record_keeps_names_and_commitments_never_values() {
        let mut spec = crate::job::tests::spec();
        spec.env.insert("DB_PASSWORD".into(), "hunter2".into());
        let audited = audited_spec("job-1", &spec);
        let text = audited.to_string();
        assert!(!text.contains("hunter2"), "{text}");
        assert_eq!(audited["env"]["DB_PASSWORD"], REDACTED);
        assert_eq!(
            audited["env_sha256"]["DB_PASSWORD"],
            env_commitment("job-1", "DB_PASSWORD", "hunter2").as_str()
        );
        assert_ne!(
            env_commitment("job-1", "DB_PASSWORD", "hunter2"),
            env_commitment("job-2", "DB_PASSWORD", "hunter2"),
            "each job's commitments are its own"
        );
    }
}
