//! What the audit log records: who did what to which resource, with what outcome.
//!
//! An [`AuditEntry`] is serialized once, deterministically (fields in declaration order,
//! object keys of before/after values sorted), and those exact bytes are what the Merkle tree
//! hashes and what an export carries.

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The log of platform-wide events; every tenant also has its own log, named by tenant id.
pub const SYSTEM_LOG: &str = "system";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ActorKind {
    /// An API token.
    Token,
    /// A person, signed in through the identity provider.
    User,
    /// A node agent, identified by its node certificate (or, registering, its bootstrap
    /// token).
    Node,
    /// The control plane itself (the scheduler, bootstrap).
    System,
}

/// Who acted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Actor {
    pub kind: ActorKind,
    /// Token id, node id, or the component's name.
    pub id: String,
    /// The tenant the actor belongs to, if any.
    pub tenant_id: Option<String>,
    /// `api-token`, `node-secret`, `bootstrap-token`, `internal`.
    pub auth_method: String,
    /// The client's address, when the action came over the network; for the control
    /// plane's own changes made as leader, `leader <replica> epoch <n>` (the term they were
    /// made under).
    pub source: Option<String>,
}

impl Actor {
    /// `<kind>:<id>`, e.g. `token:01…`, `node:01…`, `system:scheduler`.
    pub fn key(&self) -> String {
        let kind = match self.kind {
            ActorKind::Token => "token",
            ActorKind::User => "user",
            ActorKind::Node => "node",
            ActorKind::System => "system",
        };
        format!("{kind}:{}", self.id)
    }

    pub fn system(component: &str) -> Self {
        Self {
            kind: ActorKind::System,
            id: component.to_owned(),
            tenant_id: None,
            auth_method: "internal".to_owned(),
            source: None,
        }
    }
}

/// The actor and request a change belongs to, passed to every audited store operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditContext {
    pub actor: Actor,
    pub request_id: Option<String>,
}

impl AuditContext {
    pub fn system(component: &str) -> Self {
        Self {
            actor: Actor::system(component),
            request_id: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Success,
    Denied,
    Failed,
}

impl Outcome {
    pub const ALL: [Outcome; 3] = [Outcome::Success, Outcome::Denied, Outcome::Failed];

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Success => "success",
            Outcome::Denied => "denied",
            Outcome::Failed => "failed",
        }
    }
}

impl std::str::FromStr for Outcome {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Outcome::ALL
            .into_iter()
            .find(|o| o.as_str() == s)
            .ok_or_else(|| format!("unknown outcome `{s}` (one of success, denied, failed)"))
    }
}

/// A legal hold on one log: while it stands, nothing in that log is pruned.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LegalHold {
    pub log: String,
    pub reason: String,
    /// The actor who set it, as `<kind>:<id>`.
    pub set_by: String,
    pub set_at: DateTime<Utc>,
}

/// One recorded event, as hashed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditEntry {
    /// Which log: [`SYSTEM_LOG`] or a tenant id.
    pub log: String,
    /// Position in the log, from 0, without gaps.
    pub seq: u64,
    /// UTC, RFC 3339 with microseconds.
    pub time: String,
    /// Base64 Merkle root of the log's entries before this one: every entry commits to the
    /// whole history before it, so a verifier can name the first entry that was altered.
    pub prev_root: String,
    pub actor: Actor,
    /// Dotted verb, e.g. `tenant.create`, `job.transition`, `token.revoke`.
    pub action: String,
    /// The resource, e.g. `tenant/01…`, `job/01…`.
    pub target: String,
    pub outcome: Outcome,
    pub reason: Option<String>,
    pub request_id: Option<String>,
    pub before: Option<Value>,
    pub after: Option<Value>,
}

impl AuditEntry {
    /// The timestamp format entries use (fixed width, so bytes are stable across backends).
    pub fn format_time(at: DateTime<Utc>) -> String {
        at.to_rfc3339_opts(SecondsFormat::Micros, true)
    }

    /// The canonical bytes: what is hashed and stored.
    pub fn canonical_bytes(&self) -> Vec<u8> {
        let mut entry = self.clone();
        entry.before = entry.before.as_ref().map(sort_keys);
        entry.after = entry.after.as_ref().map(sort_keys);
        // Serializing plain structs, strings and serde_json values cannot fail.
        serde_json::to_vec(&entry).unwrap_or_default()
    }
}

/// `value` with every object's keys in sorted order, whether or not serde_json keeps
/// insertion order (its `preserve_order` feature, which any crate in the build may turn on).
fn sort_keys(value: &Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort_unstable();
            Value::Object(
                keys.into_iter()
                    .map(|k| (k.clone(), sort_keys(&map[k])))
                    .collect(),
            )
        }
        Value::Array(items) => Value::Array(items.iter().map(sort_keys).collect()),
        other => other.clone(),
    }
}

/// A change to record: everything but the log position and time, which the store assigns.
#[derive(Debug, Clone, PartialEq)]
pub struct AuditEvent {
    pub log: String,
    pub action: String,
    pub target: String,
    pub outcome: Outcome,
    pub reason: Option<String>,
    pub before: Option<Value>,
    pub after: Option<Value>,
}

impl AuditEvent {
    pub fn success(log: impl Into<String>, action: &str, target: impl Into<String>) -> Self {
        Self {
            log: log.into(),
            action: action.to_owned(),
            target: target.into(),
            outcome: Outcome::Success,
            reason: None,
            before: None,
            after: None,
        }
    }

    pub fn before(mut self, v: impl Serialize) -> Self {
        self.before = serde_json::to_value(v).ok();
        self
    }

    pub fn after(mut self, v: impl Serialize) -> Self {
        self.after = serde_json::to_value(v).ok();
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_bytes_are_stable_and_round_trip() {
        let entry = AuditEntry {
            log: SYSTEM_LOG.into(),
            seq: 7,
            time: "2026-11-29T12:00:00.000000Z".into(),
            prev_root: "47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=".into(),
            actor: Actor::system("scheduler"),
            action: "job.transition".into(),
            target: "job/x".into(),
            outcome: Outcome::Success,
            reason: None,
            request_id: None,
            before: Some(serde_json::json!({"state": "pending", "a": 1})),
            after: Some(serde_json::json!({"state": "scheduled"})),
        };
        let bytes = entry.canonical_bytes();
        let text = String::from_utf8(bytes.clone()).expect("utf8");
        assert!(text.starts_with(r#"{"log":"system","seq":7,"time":"2026-11-29T12:00:00.000000Z","prev_root":"47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=","actor":{"kind":"system""#), "{text}");
        assert!(
            text.contains(r#""before":{"a":1,"state":"pending"}"#),
            "keys sorted: {text}"
        );
        assert!(text.contains(r#""after":{"state":"scheduled"}"#), "{text}");
        let nested = AuditEntry {
            after: Some(serde_json::json!({"z": [{"y": 1, "b": 2}], "c": {"k": 0, "d": 1}})),
            ..entry.clone()
        };
        let nested = String::from_utf8(nested.canonical_bytes()).expect("utf8");
        assert!(
            nested.contains(r#""after":{"c":{"d":1,"k":0},"z":[{"b":2,"y":1}]}"#),
            "nested keys sorted: {nested}"
        );
        let back: AuditEntry = serde_json::from_slice(&bytes).expect("parse");
        assert_eq!(back, entry);
        assert_eq!(back.canonical_bytes(), bytes);
    }
}
