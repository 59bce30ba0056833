//! `allot user …` and `allot binding …`: the people who sign in through the identity
//! provider, and the roles granted to them or to a claim their tokens carry.

use allot_api::signin::WhoAmI;
use allot_api::views::{BindingView, UserView};
use clap::Subcommand;
use reqwest::Method;
use serde_json::json;

use crate::client::Client;
use crate::cmd::{opt, when};
use crate::output::{Format, fields, print, table};

#[derive(Debug, Subcommand)]
pub enum UserCmd {
    /// List the people who have signed in (platform admins).
    List {
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
    },
    /// Show one user.
    Get {
        id: String,
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
    },
    /// Delete a user: their tokens stop working at once and their bindings are revoked.
    Delete {
        id: String,
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
    },
}

pub async fn run_user(client: &Client, cmd: UserCmd) -> anyhow::Result<()> {
    match cmd {
        UserCmd::List { output } => {
            let users: Vec<UserView> = client.get("/api/v1/users", &[]).await?;
            print(output, &users, |us| {
                let rows: Vec<_> = us
                    .iter()
                    .map(|u| {
                        vec![
                            u.id.clone(),
                            u.subject.clone(),
                            opt(u.email.clone()),
                            when(Some(u.last_seen_at)),
                            if u.deleted_at.is_some() {
                                "deleted"
                            } else {
                                "active"
                            }
                            .into(),
                        ]
                    })
                    .collect();
                table(&["ID", "SUBJECT", "EMAIL", "LAST SEEN", "STATUS"], &rows)
            })?;
        }
        UserCmd::Get { id, output } => {
            let u: UserView = client.get(&format!("/api/v1/users/{id}"), &[]).await?;
            print(output, &u, |u| {
                fields(&[
                    ("ID", u.id.clone()),
                    ("ISSUER", u.issuer.clone()),
                    ("SUBJECT", u.subject.clone()),
                    ("EMAIL", opt(u.email.clone())),
                    ("NAME", opt(u.name.clone())),
                    ("CREATED", when(Some(u.created_at))),
                    ("LAST SEEN", when(Some(u.last_seen_at))),
                    ("DELETED", when(u.deleted_at)),
                ])
            })?;
        }
        UserCmd::Delete { id, output } => {
            let u: UserView = client
                .call::<(), _>(Method::DELETE, &format!("/api/v1/users/{id}"), None)
                .await?;
            print(output, &u, |u| {
                format!("user {} ({}) deleted", u.id, u.subject)
            })?;
        }
    }
    Ok(())
}

#[derive(Debug, Subcommand)]
pub enum BindingCmd {
    /// Grant a role to a user (--user) or to everyone whose token carries a claim
    /// (--claim groups --value ml-team).
    Create {
        #[arg(long, conflicts_with_all = ["claim", "value"], required_unless_present = "claim")]
        user: Option<String>,
        #[arg(long, requires = "value")]
        claim: Option<String>,
        #[arg(long, requires = "claim")]
        value: Option<String>,
        /// viewer, member, tenant-admin, platform-admin or auditor.
        #[arg(long)]
        role: String,
        /// The tenant the role applies in, and below (all roles but platform-admin and auditor).
        #[arg(long)]
        tenant: Option<String>,
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
    },
    /// List role bindings.
    List {
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
    },
    /// Revoke a binding; it stops granting its role on the next request.
    Revoke {
        id: String,
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
    },
}

fn binding_rows(bs: &[BindingView]) -> String {
    let rows: Vec<_> = bs
        .iter()
        .map(|b| {
            let subject = match (&b.user, &b.claim, &b.value) {
                (Some(u), _, _) => format!("user {u}"),
                (None, Some(c), Some(v)) => format!("{c}={v}"),
                _ => "-".into(),
            };
            vec![
                b.id.clone(),
                subject,
                b.role.clone(),
                opt(b.tenant.clone()),
                if b.revoked_at.is_some() {
                    "revoked"
                } else {
                    "active"
                }
                .into(),
            ]
        })
        .collect();
    table(&["ID", "SUBJECT", "ROLE", "TENANT", "STATUS"], &rows)
}

pub async fn run_binding(client: &Client, cmd: BindingCmd) -> anyhow::Result<()> {
    match cmd {
        BindingCmd::Create {
            user,
            claim,
            value,
            role,
            tenant,
            output,
        } => {
            let body = json!({
                "user": user, "claim": claim, "value": value, "role": role, "tenant": tenant,
            });
            let b: BindingView = client
                .call(Method::POST, "/api/v1/role-bindings", Some(&body))
                .await?;
            print(output, &b, |b| binding_rows(std::slice::from_ref(b)))?;
        }
        BindingCmd::List { output } => {
            let bs: Vec<BindingView> = client.get("/api/v1/role-bindings", &[]).await?;
            print(output, &bs, |bs| binding_rows(bs))?;
        }
        BindingCmd::Revoke { id, output } => {
            let b: BindingView = client
                .call::<(), _>(Method::DELETE, &format!("/api/v1/role-bindings/{id}"), None)
                .await?;
            print(output, &b, |b| {
                format!("role binding {} ({}) revoked", b.id, b.role)
            })?;
        }
    }
    Ok(())
}

/// `allot whoami`: who the token is, and every role it holds.
pub async fn whoami(client: &Client, output: Format) -> anyhow::Result<()> {
    let me: WhoAmI = client.get("/auth/session", &[]).await?;
    print(output, &me, |me| {
        let roles: Vec<String> = me
            .roles
            .iter()
            .map(|b| match (&b.tenant, &b.tenant_id) {
                (Some(name), _) => format!("{} in tenant {name}", b.role),
                (None, Some(t)) => format!("{} in tenant {t}", b.role),
                (None, None) => b.role.to_string(),
            })
            .collect();
        fields(&[
            ("NAME", me.name.clone()),
            ("KIND", me.kind.clone()),
            ("ID", me.id.clone()),
            ("AUTHENTICATED BY", me.auth_method.clone()),
            (
                "ROLES",
                if roles.is_empty() {
                    "none".to_owned()
                } else {
                    roles.join(", ")
                },
            ),
        ])
    })
}
