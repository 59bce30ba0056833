//! Named volumes (see `allot_domain::volume`): declared by platform admins, mounted by jobs
//! by name.

use allot_domain::{AuditContext, AuditEvent, JobState, SYSTEM_LOG, TenantName, Volume};
use sea_orm::sea_query::OnConflict;
use sea_orm::{ActiveValue::Set, ColumnTrait, EntityTrait, QueryFilter, QueryOrder, QuerySelect};

use crate::audit::record;
use crate::convert::{json, to_json};
use crate::entities::{jobs, volumes};
use crate::{Store, StoreError};

pub trait VolumeRepo {
    /// Declares a volume, or replaces its declaration (audited). Taking a tenant off it, or
    /// making it read-only, is refused while unfinished jobs of that tenant mount it.
    fn put_volume(
        &self,
        ctx: &AuditContext,
        volume: Volume,
    ) -> impl Future<Output = Result<Volume, StoreError>> + Send;
    /// Removes a declaration (audited); refused while unfinished jobs mount it.
    fn delete_volume(
        &self,
        ctx: &AuditContext,
        name: &str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
    fn list_volumes(&self) -> impl Future<Output = Result<Vec<Volume>, StoreError>> + Send;
}

fn to_domain(m: volumes::Model) -> Result<Volume, StoreError> {
    let names: Vec<String> = json("tenants", &m.tenants)?;
    let tenants = names
        .iter()
        .map(|n| {
            TenantName::parse("tenants", n)
                .map_err(|e| StoreError::Corrupt(format!("volume {}: {e}", m.name)))
        })
        .collect::<Result<_, _>>()?;
    Ok(Volume {
        name: m.name,
        host_path: m.host_path,
        tenants,
        read_only: m.read_only,
        created_at: m.created_at,
    })
}

impl Store {
    /// Tenants (by name) with unfinished jobs that mount volume `name`, and whether any of
    /// those mounts writes to it.
    async fn volume_users<C: sea_orm::ConnectionTrait>(
        &self,
        db: &C,
        name: &str,
    ) -> Result<Vec<(String, bool)>, StoreError> {
        // Names are `[a-z0-9-]`: nothing in them is special to LIKE.
        let pattern = format!("%\"volume\":\"{name}\"%");
        let rows: Vec<(String, String)> = jobs::Entity::find()
            .select_only()
            .column(jobs::Column::TenantId)
            .column(jobs::Column::Volumes)
            .filter(jobs::Column::State.is_in(
                [JobState::Pending, JobState::Scheduled, JobState::Running].map(JobState::as_str),
            ))
            .filter(jobs::Column::Volumes.like(pattern))
            .into_tuple()
            .all(db)
            .await?;
        let mut users = Vec::new();
        for (tenant_id, mounts) in rows {
            let mounts: Vec<allot_domain::VolumeMount> = json("volumes", &mounts)?;
            let writes = mounts.iter().any(|m| m.volume == name && !m.read_only);
            let tenant = crate::entities::tenants::Entity::find_by_id(tenant_id.clone())
                .one(db)
                .await?
                .map_or(tenant_id, |t| t.name);
            users.push((tenant, writes));
        }
        Ok(users)
    }
}

impl VolumeRepo for Store {
    async fn put_volume(&self, ctx: &AuditContext, volume: Volume) -> Result<Volume, StoreError> {
        let names: Vec<&str> = volume.tenants.iter().map(TenantName::as_str).collect();
        let txn = self.begin().await?;
        let before = volumes::Entity::find_by_id(volume.name.clone())
            .one(&txn)
            .await?
            .map(to_domain)
            .transpose()?;
        for (tenant, writes) in self.volume_users(&txn, &volume.name).await? {
            if !names.contains(&tenant.as_str()) {
                return Err(StoreError::Conflict(format!(
                    "unfinished jobs of tenant `{tenant}` mount volume `{}`",
                    volume.name
                )));
            }
            if writes && volume.read_only {
                return Err(StoreError::Conflict(format!(
                    "unfinished jobs of tenant `{tenant}` write to volume `{}`",
                    volume.name
                )));
            }
        }
        let created_at = before.as_ref().map_or(volume.created_at, |b| b.created_at);
        let row = volumes::ActiveModel {
            name: Set(volume.name.clone()),
            host_path: Set(volume.host_path.clone()),
            tenants: Set(to_json("tenants", &names)?),
            read_only: Set(volume.read_only),
            created_at: Set(created_at),
        };
        volumes::Entity::insert(row)
            .on_conflict(
                OnConflict::column(volumes::Column::Name)
                    .update_columns([
                        volumes::Column::HostPath,
                        volumes::Column::Tenants,
                        volumes::Column::ReadOnly,
                    ])
                    .to_owned(),
            )
            .exec(&txn)
            .await?;
        let after = Volume {
            created_at,
            ..volume
        };
        let mut event =
            AuditEvent::success(SYSTEM_LOG, "volume.put", format!("volume/{}", after.name))
                .after(&after);
        if let Some(b) = before {
            event = event.before(b);
        }
        record(&txn, self, ctx, event).await?;
        self.commit(txn).await?;
        Ok(after)
    }

    async fn delete_volume(&self, ctx: &AuditContext, name: &str) -> Result<(), StoreError> {
        let txn = self.begin().await?;
        let Some(before) = volumes::Entity::find_by_id(name.to_owned())
            .one(&txn)
            .await?
            .map(to_domain)
            .transpose()?
        else {
            return Err(StoreError::NotFound(format!("volume `{name}`")));
        };
        if let Some((tenant, _)) = self.volume_users(&txn, name).await?.first() {
            return Err(StoreError::Conflict(format!(
                "unfinished jobs of tenant `{tenant}` mount volume `{name}`"
            )));
        }
        volumes::Entity::delete_by_id(name.to_owned())
            .exec(&txn)
            .await?;
        let event = AuditEvent::success(SYSTEM_LOG, "volume.delete", format!("volume/{name}"))
            .before(before);
        record(&txn, self, ctx, event).await?;
        self.commit(txn).await?;
        Ok(())
    }

    async fn list_volumes(&self) -> Result<Vec<Volume>, StoreError> {
        volumes::Entity::find()
            .order_by_asc(volumes::Column::Name)
            .all(&self.db)
            .await?
            .into_iter()
            .map(to_domain)
            .collect()
    }
}
