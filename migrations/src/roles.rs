//! The PostgreSQL application role: what the control plane may do when it does not own the
//! schema. It reads and writes the operational tables, but may only append to the audit log,
//! its checkpoints and the record of leader terms: no UPDATE, DELETE or TRUNCATE on any,
//! except clearing an audit entry's payload columns, which is pruning (and which the
//! triggers still check: the whole payload at once, never under legal hold). The terms are
//! what deposed writes are dated against, so the control plane must not rewrite them. The
//! schema owner applies migrations; this role cannot.

/// Why a role name was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadRoleName(pub String);

impl std::fmt::Display for BadRoleName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "role name `{}` must be 1–63 lowercase letters, digits or `_`, starting with a letter",
            self.0
        )
    }
}

impl std::error::Error for BadRoleName {}

/// The tables that are append-only for the application role.
pub const APPEND_ONLY_TABLES: [&str; 3] = ["audit_entries", "audit_checkpoints", "leader_terms"];

/// The GRANT statements for `role` (which must exist), to run as the schema owner after
/// every migration. Idempotent.
pub fn postgres_app_role_grants(role: &str) -> Result<String, BadRoleName> {
    let ok = (1..=63).contains(&role.len())
        && role.starts_with(|c: char| c.is_ascii_lowercase())
        && role
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if !ok {
        return Err(BadRoleName(role.to_owned()));
    }
    let tables = APPEND_ONLY_TABLES.join(", ");
    Ok(format!(
        "GRANT USAGE ON SCHEMA public TO {role};\n\
         GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {role};\n\
         GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO {role};\n\
         REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON seaql_migrations FROM {role};\n\
         REVOKE UPDATE, DELETE, TRUNCATE ON {tables} FROM {role};\n\
         GRANT UPDATE (body, actor, target) ON audit_entries TO {role};\n"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn role_names_are_plain_identifiers() {
        assert!(postgres_app_role_grants("allot_app").is_ok());
        for bad in ["", "App", "a-b", "a;drop table x", "1abc", &"a".repeat(64)] {
            assert!(postgres_app_role_grants(bad).is_err(), "{bad}");
        }
    }
}
