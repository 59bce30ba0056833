//! `allot db`: schema administration for deployments where the control plane runs as a
//! PostgreSQL application role that may not change the schema or rewrite the audit log.

use std::sync::Arc;

use allot_store::Store;
use clap::Subcommand;

#[derive(Debug, Subcommand)]
pub enum DbCmd {
    /// Apply pending migrations (run as the schema owner, before starting new servers).
    Migrate {
        /// `postgres://owner@host/db` or `sqlite://path?mode=rwc`.
        #[arg(long, env = "DATABASE_URL")]
        database_url: String,
    },
    /// Print the GRANTs for the PostgreSQL application role: everything the control plane
    /// needs, but no UPDATE, DELETE or TRUNCATE on the audit log or its checkpoints. Run
    /// the output as the schema owner after every migration, e.g. `| psql "$OWNER_URL"`.
    AppRoleGrants {
        /// The application role (it must exist: CREATE ROLE allot_app LOGIN PASSWORD …).
        #[arg(long, default_value = "allot_app")]
        role: String,
    },
}

pub async fn run(cmd: DbCmd) -> anyhow::Result<()> {
    match cmd {
        DbCmd::Migrate { database_url } => {
            let store = Store::connect(&database_url, Arc::new(allot_domain::SystemClock)).await?;
            println!("the {} schema is up to date", store.backend_name());
            store.close().await?;
        }
        DbCmd::AppRoleGrants { role } => {
            print!("{}", allot_migrations::postgres_app_role_grants(&role)?);
        }
    }
    Ok(())
}
