//! The workflows people bring from Slurm: who submitted each job (`submitted_by`: the
//! person's or the token's name), job arrays (`array_id`, the first task's job id, with the
//! task's `array_index` and the array as submitted, `array_spec`, `0-199%16`), and
//! dependencies between jobs (`dependencies`, a JSON array of `{kind, job_id}`).

use sea_orm_migration::prelude::*;

#[derive(DeriveIden)]
enum Jobs {
    Table,
    SubmittedBy,
    ArrayId,
    ArrayIndex,
    ArraySpec,
    Dependencies,
}

#[derive(DeriveMigrationName)]
pub struct Migration;

const ARRAY_INDEX: &str = "idx_jobs_array_id";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        // One column per statement: SQLite adds one at a time.
        for col in [
            ColumnDef::new(Jobs::SubmittedBy)
                .string_len(256)
                .null()
                .to_owned(),
            ColumnDef::new(Jobs::ArrayId)
                .string_len(36)
                .null()
                .to_owned(),
            ColumnDef::new(Jobs::ArrayIndex).integer().null().to_owned(),
            ColumnDef::new(Jobs::ArraySpec)
                .string_len(256)
                .null()
                .to_owned(),
            ColumnDef::new(Jobs::Dependencies)
                .text()
                .not_null()
                .default("[]")
                .to_owned(),
        ] {
            m.alter_table(Table::alter().table(Jobs::Table).add_column(col).to_owned())
                .await?;
        }
        m.create_index(
            Index::create()
                .name(ARRAY_INDEX)
                .table(Jobs::Table)
                .col(Jobs::ArrayId)
                .to_owned(),
        )
        .await
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.drop_index(
            Index::drop()
                .name(ARRAY_INDEX)
                .table(Jobs::Table)
                .to_owned(),
        )
        .await?;
        for col in [
            Jobs::Dependencies,
            Jobs::ArraySpec,
            Jobs::ArrayIndex,
            Jobs::ArrayId,
            Jobs::SubmittedBy,
        ] {
            m.alter_table(
                Table::alter()
                    .table(Jobs::Table)
                    .drop_column(col)
                    .to_owned(),
            )
            .await?;
        }
        Ok(())
    }
}
