use super::*;

/// acme ⊃ acme-ml; globex stands apart.
fn tree() -> TenantTree {
    TenantTree::from_pairs([("acme", None), ("acme-ml", Some("acme")), ("globex", None)])
}

fn subject(bindings: Vec<RoleBinding>) -> Subject {
    Subject {
        id: "tok_1".to_owned(),
        bindings,
    }
}

fn allows(s: &Subject, action: Action, resource: Resource<'_>) -> bool {
    allows_granting(s, action, resource, None)
}

fn allows_granting(
    s: &Subject,
    action: Action,
    resource: Resource<'_>,
    granted: Option<Role>,
) -> bool {
    let policies = std::sync::Arc::new(Policies::builtin().expect("the shipped policies validate"));
    let tree = tree();
    let session = policies.session(s, &tree).expect("session");
    session.allows(action, resource, granted).expect("decision")
}

/// Whether `action` is permitted on any resource of any kind (kinds the action does not
/// apply to are refused as requests, which permits nothing either).
fn allowed_anywhere(s: &Subject, action: Action) -> bool {
    let policies = std::sync::Arc::new(Policies::builtin().expect("the shipped policies validate"));
    let tree = tree();
    let session = policies.session(s, &tree).expect("session");
    [
        Resource::Platform,
        Resource::Tenant("acme"),
        job("acme"),
        Resource::Node("n1"),
        Resource::Token {
            id: "tok_2",
            tenant: Some("acme"),
        },
        Resource::AuditLog {
            log: "acme",
            tenant: Some("acme"),
        },
        Resource::Binding {
            id: "rb_1",
            tenant: Some("acme"),
        },
    ]
    .into_iter()
    .any(|r| {
        session
            .allows(action, r, Some(Role::Viewer))
            .unwrap_or(false)
    })
}

fn job(tenant: &str) -> Resource<'_> {
    Resource::Job {
        id: "job_1",
        tenant,
    }
}

#[test]
fn the_shipped_policies_validate_and_name_every_action() {
    let p = Policies::builtin().expect("valid");
    assert!(format!("{p:?}").contains("policies"));
}

#[test]
fn the_shipped_directory_loads_like_the_builtin_policies() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../policies");
    Policies::from_dir(&dir).expect("policies/ loads and validates");
}

#[test]
fn a_policy_that_does_not_type_check_is_refused() {
    let bad = "permit (principal, action, resource) when { principal.no_such_attribute };";
    let e = Policies::parse(BUILTIN_SCHEMA, bad).expect_err("invalid");
    assert!(matches!(e, AuthzError::Invalid(_)), "{e}");
    let e = Policies::parse(BUILTIN_SCHEMA, "permit (principal,").expect_err("unparsable");
    assert!(matches!(e, AuthzError::Policies(_)), "{e}");
}

#[test]
fn a_schema_without_an_action_the_code_asks_about_is_refused() {
    let schema = BUILTIN_SCHEMA.replace("\"job.log\"", "\"job.logs\"");
    let e = Policies::parse(&schema, "").expect_err("job.log missing");
    assert!(e.to_string().contains("job.log"), "{e}");
}

#[test]
fn nothing_is_allowed_without_a_binding_but_the_public_audit_key() {
    let nobody = subject(vec![]);
    for action in Action::ALL {
        assert_eq!(
            allowed_anywhere(&nobody, action),
            action == Action::AuditKey,
            "{action:?}"
        );
    }
}

#[test]
fn a_request_naming_a_resource_the_action_does_not_apply_to_is_an_error() {
    let policies = std::sync::Arc::new(Policies::builtin().expect("valid"));
    let admin = subject(vec![RoleBinding::platform(Role::Admin)]);
    let tree = tree();
    let session = policies.session(&admin, &tree).expect("session");
    let e = session
        .allows(Action::TenantRead, Resource::Platform, None)
        .expect_err("tenant.read applies to tenants");
    assert!(e.to_string().contains("tenant.read"), "{e}");
}

#[test]
fn a_platform_admin_may_do_everything() {
    let admin = subject(vec![RoleBinding::platform(Role::Admin)]);
    assert!(allows(&admin, Action::TenantCreate, Resource::Platform));
    assert!(allows(
        &admin,
        Action::QuotaWrite,
        Resource::Tenant("globex")
    ));
    assert!(allows(&admin, Action::JobCancel, job("acme-ml")));
    assert!(allows_granting(
        &admin,
        Action::TokenCreate,
        Resource::Platform,
        Some(Role::Auditor)
    ));
}

#[test]
fn roles_reach_down_the_tenant_tree_never_up_or_across() {
    let viewer = subject(vec![RoleBinding::tenant(Role::Viewer, "acme")]);
    assert!(allows(
        &viewer,
        Action::TenantRead,
        Resource::Tenant("acme")
    ));
    assert!(allows(&viewer, Action::JobRead, job("acme-ml")));
    assert!(!allows(
        &viewer,
        Action::TenantRead,
        Resource::Tenant("globex")
    ));
    assert!(!allows(&viewer, Action::JobRead, job("globex")));

    let child_admin = subject(vec![RoleBinding::tenant(Role::TenantAdmin, "acme-ml")]);
    assert!(allows(&child_admin, Action::JobCancel, job("acme-ml")));
    assert!(!allows(
        &child_admin,
        Action::TenantRead,
        Resource::Tenant("acme")
    ));
    assert!(!allows(&child_admin, Action::JobRead, job("acme")));
}

#[test]
fn the_tenant_role_ladder() {
    let viewer = subject(vec![RoleBinding::tenant(Role::Viewer, "acme")]);
    let member = subject(vec![RoleBinding::tenant(Role::Member, "acme")]);
    let admin = subject(vec![RoleBinding::tenant(Role::TenantAdmin, "acme")]);
    let acme = Resource::Tenant("acme");
    let log = Resource::AuditLog {
        log: "acme",
        tenant: Some("acme"),
    };
    let token = Resource::Token {
        id: "tok_2",
        tenant: Some("acme"),
    };
    for s in [&viewer, &member, &admin] {
        assert!(allows(s, Action::JobList, acme));
        assert!(allows(s, Action::QuotaRead, acme));
        assert!(allows(s, Action::NodeRead, Resource::Platform));
        assert!(!allows(s, Action::QuotaWrite, acme));
        assert!(!allows(s, Action::NodeOperate, Resource::Node("n1")));
        assert!(!allows(s, Action::TenantCreate, Resource::Platform));
        assert!(!allows(s, Action::VolumeWrite, Resource::Platform));
    }
    assert!(!allows(&viewer, Action::JobSubmit, acme));
    assert!(allows(&member, Action::JobSubmit, acme));
    assert!(allows(&admin, Action::JobSubmit, acme));
    for (s, may) in [(&viewer, false), (&member, false), (&admin, true)] {
        assert_eq!(allows(s, Action::TokenRead, token), may);
        assert_eq!(allows(s, Action::TokenRevoke, token), may);
        assert_eq!(allows(s, Action::AuditRead, log), may);
        assert_eq!(allows(s, Action::TokenList, acme), may);
        assert_eq!(allows(s, Action::CredentialRead, acme), may);
        assert_eq!(allows(s, Action::CredentialWrite, acme), may);
    }
    // Not in another tenant, even for its admin.
    assert!(!allows(
        &admin,
        Action::CredentialWrite,
        Resource::Tenant("other")
    ));
}

#[test]
fn tenant_admins_grant_no_role_above_their_own() {
    let admin = subject(vec![RoleBinding::tenant(Role::TenantAdmin, "acme")]);
    let acme = Resource::Tenant("acme");
    for role in [Role::Viewer, Role::Member, Role::TenantAdmin] {
        assert!(allows_granting(
            &admin,
            Action::TokenCreate,
            acme,
            Some(role)
        ));
    }
    for role in [Role::Admin, Role::Auditor] {
        assert!(!allows_granting(
            &admin,
            Action::TokenCreate,
            acme,
            Some(role)
        ));
    }
    assert!(!allows_granting(
        &admin,
        Action::TokenCreate,
        Resource::Tenant("globex"),
        Some(Role::Viewer)
    ));
}

#[test]
fn tenant_admins_bind_roles_in_their_tenants_only_admins_manage_users() {
    let admin = subject(vec![RoleBinding::tenant(Role::TenantAdmin, "acme")]);
    let platform = subject(vec![RoleBinding::platform(Role::Admin)]);
    let child = Resource::Tenant("acme-ml");
    assert!(allows_granting(
        &admin,
        Action::BindingCreate,
        child,
        Some(Role::Member)
    ));
    assert!(!allows_granting(
        &admin,
        Action::BindingCreate,
        child,
        Some(Role::Admin)
    ));
    assert!(!allows_granting(
        &admin,
        Action::BindingCreate,
        Resource::Tenant("globex"),
        Some(Role::Viewer)
    ));
    let binding = Resource::Binding {
        id: "rb_1",
        tenant: Some("acme-ml"),
    };
    assert!(allows(&admin, Action::BindingRevoke, binding));
    for action in [Action::UserList, Action::UserRead, Action::UserDelete] {
        assert!(!allows(&admin, action, Resource::Platform), "{action:?}");
        assert!(allows(&platform, action, Resource::Platform), "{action:?}");
    }
}

#[test]
fn auditors_read_audit_logs_and_nothing_else() {
    let auditor = subject(vec![RoleBinding::platform(Role::Auditor)]);
    let system = Resource::AuditLog {
        log: "system",
        tenant: None,
    };
    let tenant_log = Resource::AuditLog {
        log: "globex",
        tenant: Some("globex"),
    };
    assert!(allows(&auditor, Action::AuditRead, system));
    assert!(allows(&auditor, Action::AuditRead, tenant_log));
    assert!(allows(&auditor, Action::AuditHolds, Resource::Platform));
    assert!(allows(&auditor, Action::AuditKey, Resource::Platform));
    for action in [
        Action::TenantRead,
        Action::JobRead,
        Action::JobList,
        Action::NodeRead,
        Action::TokenList,
        Action::AuditHold,
        Action::AuditPrune,
    ] {
        assert!(!allowed_anywhere(&auditor, action), "{action:?}");
    }
}

#[test]
fn a_tenant_admin_reads_only_their_own_tenants_logs() {
    let admin = subject(vec![RoleBinding::tenant(Role::TenantAdmin, "acme")]);
    let system = Resource::AuditLog {
        log: "system",
        tenant: None,
    };
    let child = Resource::AuditLog {
        log: "acme-ml",
        tenant: Some("acme-ml"),
    };
    let other = Resource::AuditLog {
        log: "globex",
        tenant: Some("globex"),
    };
    assert!(allows(&admin, Action::AuditRead, child));
    assert!(!allows(&admin, Action::AuditRead, system));
    assert!(!allows(&admin, Action::AuditRead, other));
    assert!(!allows(&admin, Action::AuditHolds, Resource::Platform));
}

#[test]
fn a_binding_to_a_tenant_that_no_longer_exists_grants_nothing() {
    let stale = subject(vec![RoleBinding::tenant(Role::TenantAdmin, "deleted")]);
    assert!(!allows(&stale, Action::NodeRead, Resource::Platform));
    assert!(!allows(
        &stale,
        Action::JobList,
        Resource::Tenant("deleted")
    ));
}

#[test]
fn a_tenant_scoped_binding_of_a_platform_role_grants_nothing_platform_wide() {
    // Bindings are made by code that keeps platform roles platform-wide; if one slipped
    // through with a tenant, it must not make its holder a platform admin.
    let odd = subject(vec![RoleBinding::tenant(Role::Admin, "acme")]);
    assert!(!allows(&odd, Action::TenantCreate, Resource::Platform));
    assert!(!allows(&odd, Action::JobRead, job("acme")));
}
