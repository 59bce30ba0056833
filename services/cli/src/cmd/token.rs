use allot_api::views::{CreatedToken, TokenView};
use clap::Subcommand;
use reqwest::Method;
use serde_json::json;

use crate::client::Client;
use crate::cmd::{opt, when};
use crate::output::{Format, print, table};

#[derive(Debug, Subcommand)]
pub enum TokenCmd {
    /// Create an API token; its secret is printed once.
    Create {
        name: String,
        /// viewer, member, tenant-admin, platform-admin, or auditor (reads every audit log,
        /// nothing else).
        #[arg(long)]
        role: String,
        /// The tenant the token acts in (all roles but platform-admin and auditor).
        #[arg(long)]
        tenant: Option<String>,
        /// Lifetime, e.g. 3600s, 90m, 12h, 30d.
        #[arg(long, value_parser = crate::cmd::parse_duration)]
        expires_in: Option<u64>,
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
    },
    /// List API tokens (never their secrets).
    List {
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
    },
    /// Revoke a token; it stops working at once.
    Revoke {
        id: String,
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
    },
}

pub async fn run(client: &Client, cmd: TokenCmd) -> anyhow::Result<()> {
    match cmd {
        TokenCmd::Create {
            name,
            role,
            tenant,
            expires_in,
            output,
        } => {
            let body = json!({
                "name": name, "role": role, "tenant": tenant, "expires_in_seconds": expires_in,
            });
            let t: CreatedToken = client
                .call(Method::POST, "/api/v1/tokens", Some(&body))
                .await?;
            if output.is_document() {
                print(output, &t, |_| String::new())?;
            } else {
                eprintln!(
                    "Created token {} ({}, role {}). Its secret is shown only now:",
                    t.token.id, t.token.name, t.token.role
                );
                println!("{}", t.secret);
            }
        }
        TokenCmd::List { output } => {
            let ts: Vec<TokenView> = client.get("/api/v1/tokens", &[]).await?;
            print(output, &ts, |ts| {
                let rows: Vec<_> = ts
                    .iter()
                    .map(|t| {
                        vec![
                            t.id.clone(),
                            t.name.clone(),
                            opt(t.tenant.clone()),
                            t.role.clone(),
                            when(t.expires_at),
                            when(t.last_used_at),
                            if t.revoked_at.is_some() {
                                "revoked"
                            } else {
                                "active"
                            }
                            .into(),
                        ]
                    })
                    .collect();
                table(
                    &[
                        "ID",
                        "NAME",
                        "TENANT",
                        "ROLE",
                        "EXPIRES",
                        "LAST USED",
                        "STATUS",
                    ],
                    &rows,
                )
            })?;
        }
        TokenCmd::Revoke { id, output } => {
            let t: TokenView = client
                .call::<(), _>(Method::DELETE, &format!("/api/v1/tokens/{id}"), None)
                .await?;
            print(output, &t, |t| {
                format!("token {} ({}) revoked", t.id, t.name)
            })?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn durations() {
        assert_eq!(crate::cmd::parse_duration("90m"), Ok(5400));
        assert_eq!(crate::cmd::parse_duration("2d"), Ok(172_800));
        assert_eq!(crate::cmd::parse_duration("15"), Ok(15));
        assert!(crate::cmd::parse_duration("0s").is_err());
        assert!(crate::cmd::parse_duration("soon").is_err());
    }
}
