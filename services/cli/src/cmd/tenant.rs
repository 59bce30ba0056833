use allot_api::views::{
    DeletedTenant, JobLimitsView, LimitsBody, QuotaBody, RegistryCredentialView, ResourcesBody,
    TenantSecretView, TenantView,
};
use allot_domain::{Isolation, format_bytes, parse_memory};
use clap::{Args, Subcommand};
use reqwest::Method;
use serde_json::json;

use crate::client::Client;
use crate::cmd::{opt, parse_milli, show_gpus, show_milli, when};
use crate::output::{Column, Format, ListOutput, Watch, fields, print, table};

#[derive(Debug, Subcommand)]
pub enum TenantCmd {
    /// Create a tenant (or, with --parent, a team of one), optionally with a quota.
    Create {
        name: String,
        /// The tenant this one is a team of.
        #[arg(long)]
        parent: Option<String>,
        #[command(flatten)]
        quota: QuotaArgs,
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
    },
    /// List tenants: what each holds against its quota, and its jobs waiting and running.
    List {
        #[command(flatten)]
        output: ListOutput,
        #[command(flatten)]
        watch: Watch,
    },
    /// Show one tenant.
    Get {
        name: String,
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
    },
    /// Delete a tenant (platform admins): refused while it has teams, unfinished jobs or a
    /// volume naming it. Its tokens and role bindings are revoked and its secrets and pull
    /// credentials removed; its audit log and jobs' history stay, under its name.
    Delete {
        name: String,
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
    },
    /// Change a tenant's quota: only what is named changes (`none` lifts a limit, a MIG
    /// limit or the budget); `tenant get` shows all of it.
    SetQuota {
        name: String,
        #[command(flatten)]
        quota: QuotaArgs,
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
    },
    /// Set what a tenant's jobs may run and where (platform admins): the image registries
    /// (or registry/repository prefixes) it may use, whether its jobs must run confined,
    /// where their connections may go and whether they may share the node's network. The
    /// whole policy is replaced: what is not given goes back to its default.
    SetPolicy {
        name: String,
        /// A registry, or a registry/repository prefix, the tenant's images may come from
        /// (repeatable; none allows any).
        #[arg(long = "allow-registry")]
        registries: Vec<String>,
        /// Place its jobs only on nodes that run them in containers.
        #[arg(long)]
        require_confinement: bool,
        /// Where its jobs' connections may go, CIDR[:PORTS] (e.g. 10.20.0.0/16:443,8000-8100;
        /// repeatable): only there. Without it (nor --deny-egress), anywhere but the node,
        /// link-local addresses and other jobs, which no job ever reaches. IPv4 only.
        #[arg(long = "allow-egress", value_parser = allot_domain::EgressRule::parse, conflicts_with = "deny_egress")]
        egress: Vec<allot_domain::EgressRule>,
        /// No connections out at all.
        #[arg(long)]
        deny_egress: bool,
        /// Let its jobs ask for the node's own network (--network host), which reaches
        /// everything the node does (its services, other jobs' listeners); audited.
        #[arg(long)]
        allow_host_network: bool,
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
    },
    /// Set the CPU and memory a tenant's jobs get when they ask for none, and the most one
    /// job may ask for (platform admins; as a Kubernetes LimitRange), and the share an
    /// auto-sized job starts at. Only what is named changes; `inherit` clears a setting,
    /// which then comes from the parent tenant, else the platform (1 CPU and 2GiB, no
    /// maximum, auto-sized jobs at 0.1 of a GPU). A team is held to every maximum above it.
    SetLimits {
        name: String,
        /// CPUs a job asking for none gets, e.g. 2 or 0.5.
        #[arg(long, value_parser = setting_milli)]
        default_cpus: Option<Setting>,
        /// Memory a job asking for none gets, e.g. 8GiB.
        #[arg(long, value_parser = setting_memory)]
        default_memory: Option<Setting>,
        /// The most CPUs one job may ask for.
        #[arg(long, value_parser = setting_milli)]
        max_cpus: Option<Setting>,
        /// The most memory one job may ask for.
        #[arg(long, value_parser = setting_memory)]
        max_memory: Option<Setting>,
        /// The share of a GPU an auto-sized job (`--gpus auto`) starts at, e.g. 0.1, until
        /// Allot has measured what it uses.
        #[arg(long, value_parser = setting_milli)]
        default_gpu_share: Option<Setting>,
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
    },
    /// Set a tenant's pull credentials for a private registry (its admins): nodes pull its
    /// images from REGISTRY with them. The password is read from standard input (or
    /// ALLOT_REGISTRY_PASSWORD), never from the command line; no command shows it again.
    SetRegistryCredential {
        name: String,
        /// HOST[:PORT], as the tenant's image references name it.
        registry: String,
        #[arg(long)]
        username: String,
        /// Read the password from this variable instead of standard input.
        #[arg(long, default_value = "ALLOT_REGISTRY_PASSWORD")]
        password_env: String,
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
    },
    /// The registries a tenant has pull credentials for.
    RegistryCredentials {
        name: String,
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
    },
    /// Remove a tenant's pull credentials for a registry.
    DeleteRegistryCredential {
        name: String,
        registry: String,
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
    },
    /// Set (or replace) a tenant's secret (its admins); jobs get it with `job submit
    /// --secret`. The value is read from standard input (or ALLOT_SECRET_VALUE), never
    /// from the command line; no command shows it again.
    SetSecret {
        name: String,
        secret: String,
        /// Read the value from this variable instead of standard input.
        #[arg(long, default_value = "ALLOT_SECRET_VALUE")]
        value_env: String,
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
    },
    /// A tenant's secrets (names and when each was set; never values).
    Secrets {
        name: String,
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
    },
    /// Remove a tenant's secret (refused while an unfinished job uses it).
    DeleteSecret {
        name: String,
        secret: String,
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
    },
}

/// A secret given on standard input (one line) or in the variable `var`; never an argument,
/// which other users of the machine could read.
fn secret_input(var: &str, what: &str) -> anyhow::Result<String> {
    let value = match std::env::var(var) {
        Ok(p) => p,
        Err(_) => {
            let mut line = String::new();
            std::io::stdin()
                .read_line(&mut line)
                .map_err(|e| anyhow::anyhow!("reading the {what} from stdin: {e}"))?;
            line.trim_end_matches(['\n', '\r']).to_owned()
        }
    };
    if value.is_empty() {
        anyhow::bail!("no {what}: give it on standard input or in ${var}");
    }
    Ok(value)
}

/// A quota: what is guaranteed (held for the tenant, lent while idle, reclaimed from
/// borrowers), hard limits, the weight for spare capacity, and the minimum isolation.
#[derive(Debug, Args)]
pub struct QuotaArgs {
    /// GPUs guaranteed, fractions allowed (e.g. 7.5).
    #[arg(long, value_parser = parse_milli)]
    guaranteed_gpus: Option<u64>,
    /// Most GPUs the tenant's jobs may hold at once, borrowing included (e.g. 8; `none`
    /// for no limit).
    #[arg(long, alias = "gpus", value_parser = limit_milli)]
    max_gpus: Option<Limit>,
    /// CPUs guaranteed (e.g. 64).
    #[arg(long, value_parser = parse_milli)]
    guaranteed_cpus: Option<u64>,
    /// Most CPUs (`none` for no limit).
    #[arg(long, value_parser = limit_milli)]
    max_cpus: Option<Limit>,
    /// Memory guaranteed, e.g. 256GiB.
    #[arg(long, value_parser = parse_memory)]
    guaranteed_memory: Option<u64>,
    /// Most memory (`none` for no limit).
    #[arg(long, value_parser = limit_memory)]
    max_memory: Option<Limit>,
    /// GPU memory guaranteed, e.g. 640GiB.
    #[arg(long, value_parser = parse_memory)]
    guaranteed_gpu_memory: Option<u64>,
    /// Most GPU memory the tenant may hold at once, e.g. 80GiB (`none` for no limit).
    #[arg(long, alias = "gpu-memory", value_parser = limit_memory)]
    max_gpu_memory: Option<Limit>,
    /// Share of spare capacity relative to other tenants (1-10000) [new tenants: 1].
    #[arg(long)]
    weight: Option<u32>,
    /// The least isolation the tenant's jobs run at: shared, mig or dedicated [new
    /// tenants: shared].
    #[arg(long)]
    min_isolation: Option<Isolation>,
    /// Most MIG instances of a profile held at once, as PROFILE=N (e.g. 1g.18gb=4), or
    /// PROFILE=none to lift it; repeatable. Profiles not named are unlimited.
    #[arg(long = "mig-limit", value_parser = parse_mig_limit)]
    mig_limits: Vec<(String, Option<u32>)>,
    /// GPU-hours the tenant and its teams may use per calendar month (UTC), e.g. 5000
    /// (`none` for no budget).
    #[arg(long, value_parser = limit_hours)]
    gpu_hour_budget: Option<Budget>,
}

/// A limit as given: an amount, or `none` (no limit).
#[derive(Debug, Clone, Copy)]
struct Limit(Option<u64>);

/// A budget as given: GPU-hours, or `none` (no budget).
#[derive(Debug, Clone, Copy)]
struct Budget(Option<f64>);

fn is_none(s: &str) -> bool {
    matches!(s.trim().to_ascii_lowercase().as_str(), "none" | "unlimited")
}

fn limit_milli(s: &str) -> Result<Limit, String> {
    if is_none(s) {
        return Ok(Limit(None));
    }
    parse_milli(s).map(|m| Limit(Some(m)))
}

fn limit_memory(s: &str) -> Result<Limit, String> {
    if is_none(s) {
        return Ok(Limit(None));
    }
    parse_memory(s).map(|b| Limit(Some(b)))
}

/// A job-limit setting as given: an amount, or `inherit` (the parent's).
#[derive(Debug, Clone, Copy)]
pub struct Setting(Option<u64>);

fn is_inherit(s: &str) -> bool {
    is_none(s) || s.trim().eq_ignore_ascii_case("inherit")
}

fn setting_milli(s: &str) -> Result<Setting, String> {
    if is_inherit(s) {
        return Ok(Setting(None));
    }
    parse_milli(s).map(|m| Setting(Some(m)))
}

fn setting_memory(s: &str) -> Result<Setting, String> {
    if is_inherit(s) {
        return Ok(Setting(None));
    }
    parse_memory(s).map(|b| Setting(Some(b)))
}

fn limit_hours(s: &str) -> Result<Budget, String> {
    if is_none(s) {
        return Ok(Budget(None));
    }
    s.trim()
        .parse::<f64>()
        .map(|h| Budget(Some(h)))
        .map_err(|_| format!("`{s}` is not a number of GPU-hours (or `none`)"))
}

fn parse_mig_limit(s: &str) -> Result<(String, Option<u32>), String> {
    let (profile, n) = s
        .split_once('=')
        .ok_or_else(|| format!("`{s}` is not PROFILE=N, like 1g.18gb=4"))?;
    let n = if is_none(n) {
        None
    } else {
        Some(
            n.trim()
                .parse()
                .map_err(|_| format!("`{n}` in `{s}` is not a whole number (or `none`)"))?,
        )
    };
    Ok((profile.trim().to_owned(), n))
}

impl QuotaArgs {
    /// The whole quota of a new tenant: what is not named takes its default.
    fn body(&self) -> QuotaBody {
        let limit = |l: Option<Limit>| l.and_then(|l| l.0);
        QuotaBody {
            guaranteed: ResourcesBody {
                gpu_milli: self.guaranteed_gpus.unwrap_or(0),
                cpu_milli: self.guaranteed_cpus.unwrap_or(0),
                memory_bytes: self.guaranteed_memory.unwrap_or(0),
                gpu_memory_bytes: self.guaranteed_gpu_memory.unwrap_or(0),
            },
            limit: LimitsBody {
                gpu_milli: limit(self.max_gpus),
                cpu_milli: limit(self.max_cpus),
                memory_bytes: limit(self.max_memory),
                gpu_memory_bytes: limit(self.max_gpu_memory),
            },
            weight: self.weight.unwrap_or(1),
            min_isolation: self.min_isolation.unwrap_or_default(),
            mig_limits: self
                .mig_limits
                .iter()
                .filter_map(|(p, n)| Some((p.clone(), (*n)?)))
                .collect(),
            gpu_hour_budget: self.gpu_hour_budget.and_then(|b| b.0),
        }
    }

    /// A change of an existing quota (a JSON merge patch): only what is named.
    fn patch(&self) -> anyhow::Result<serde_json::Value> {
        use serde_json::{Map, Value};
        let mut guaranteed = Map::new();
        for (key, v) in [
            ("gpu_milli", self.guaranteed_gpus),
            ("cpu_milli", self.guaranteed_cpus),
            ("memory_bytes", self.guaranteed_memory),
            ("gpu_memory_bytes", self.guaranteed_gpu_memory),
        ] {
            if let Some(v) = v {
                guaranteed.insert(key.into(), json!(v));
            }
        }
        let mut limit = Map::new();
        for (key, v) in [
            ("gpu_milli", self.max_gpus),
            ("cpu_milli", self.max_cpus),
            ("memory_bytes", self.max_memory),
            ("gpu_memory_bytes", self.max_gpu_memory),
        ] {
            if let Some(Limit(v)) = v {
                limit.insert(key.into(), json!(v));
            }
        }
        let mut patch = Map::new();
        if !guaranteed.is_empty() {
            patch.insert("guaranteed".into(), Value::Object(guaranteed));
        }
        if !limit.is_empty() {
            patch.insert("limit".into(), Value::Object(limit));
        }
        if let Some(w) = self.weight {
            patch.insert("weight".into(), json!(w));
        }
        if let Some(i) = self.min_isolation {
            patch.insert("min_isolation".into(), json!(i.as_str()));
        }
        if !self.mig_limits.is_empty() {
            let mig: Map<String, Value> = self
                .mig_limits
                .iter()
                .map(|(p, n)| (p.clone(), json!(n)))
                .collect();
            patch.insert("mig_limits".into(), Value::Object(mig));
        }
        if let Some(Budget(b)) = self.gpu_hour_budget {
            patch.insert("gpu_hour_budget".into(), json!(b));
        }
        if patch.is_empty() {
            anyhow::bail!(
                "name what to change (e.g. --max-gpus 8, --min-isolation dedicated, --mig-limit 1g.18gb=4)"
            );
        }
        Ok(Value::Object(patch))
    }
}

/// "used / limit" style cells: a guarantee and a limit of one resource.
fn amounts(guaranteed: u64, limit: Option<u64>, show: impl Fn(u64) -> String) -> String {
    format!("{} / {}", show(guaranteed), opt(limit.map(show)))
}

/// "1.5 of 2 / 4": held, guaranteed and limit of one resource.
fn held(used: u64, guaranteed: u64, limit: Option<u64>, show: impl Fn(u64) -> String) -> String {
    format!("{} of {}", show(used), amounts(guaranteed, limit, show))
}

/// What `tenant list` can show of a tenant (`--format` names, `-o wide` all).
fn tenant_columns() -> [Column<TenantView>; 15] {
    [
        Column::new("name", "NAME", |t| t.name.clone()),
        Column::new("parent", "PARENT", |t| opt(t.parent.clone())),
        Column::new("gpus", "GPUS HELD", |t| show_gpus(t.usage.gpus)),
        Column::wide("own", "OWN GPUS", |t| show_gpus(t.own.usage.gpus)),
        Column::new("guaranteed", "GUARANTEED", |t| {
            show_milli(t.quota.guaranteed.gpu_milli)
        }),
        Column::new("max", "MAX", |t| {
            opt(t.quota.limit.gpu_milli.map(show_milli))
        }),
        Column::new("pending", "PENDING", |t| t.jobs_pending.to_string()),
        Column::new("running", "RUNNING", |t| t.jobs_running.to_string()),
        Column::new("weight", "WEIGHT", |t| t.quota.weight.to_string()),
        Column::new("isolation", "ISOLATION", |t| {
            t.quota.min_isolation.to_string()
        }),
        Column::wide("cpus", "CPUS (HELD OF GUAR. / MAX)", |t| {
            let q = &t.quota;
            held(
                t.usage.cpu_milli,
                q.guaranteed.cpu_milli,
                q.limit.cpu_milli,
                show_milli,
            )
        }),
        Column::wide("memory", "MEMORY (HELD OF GUAR. / MAX)", |t| {
            let q = &t.quota;
            held(
                t.usage.memory_bytes,
                q.guaranteed.memory_bytes,
                q.limit.memory_bytes,
                format_bytes,
            )
        }),
        Column::wide("gpu_memory", "GPU MEMORY (HELD OF GUAR. / MAX)", |t| {
            let q = &t.quota;
            held(
                t.usage.gpu_memory_bytes,
                q.guaranteed.gpu_memory_bytes,
                q.limit.gpu_memory_bytes,
                format_bytes,
            )
        }),
        Column::wide("budget", "GPU-HOUR BUDGET", |t| {
            opt(t.quota.gpu_hour_budget.map(|b| b.to_string()))
        }),
        Column::wide("created", "CREATED", |t| when(Some(t.created_at))),
    ]
}

/// "2 (4 CPUs, 64 GiB, 282 GiB of GPU memory)".
fn held_text(h: &allot_api::views::HeldView) -> String {
    format!(
        "{} ({} CPUs, {}, {} of GPU memory)",
        show_gpus(h.gpus),
        show_milli(h.cpu_milli),
        format_bytes(h.memory_bytes),
        format_bytes(h.gpu_memory_bytes)
    )
}

/// A figure with its teams' included, and for a tenant that has teams its own jobs' beside.
fn with_own(total: String, own: String) -> String {
    if total == own {
        total
    } else {
        format!("{total}, its teams' included; its own jobs: {own}")
    }
}

/// "0.1 of a GPU (inherited)": the share an auto-sized job of the tenant starts at.
fn start_share(l: &JobLimitsView) -> String {
    format!(
        "{} of a GPU ({})",
        opt(l.effective.default_gpu_milli.map(show_milli)),
        if l.own.default_gpu_milli.is_some() {
            "own"
        } else {
            "inherited"
        }
    )
}

/// "2 / 8 (own default, inherited max)": what applies to a job of the tenant, and which
/// settings are the tenant's own.
fn job_limit(l: &JobLimitsView, cpu: bool) -> String {
    let show = |v: u64| {
        if cpu { show_milli(v) } else { format_bytes(v) }
    };
    let pick = |b: &allot_api::views::JobLimitsBody| {
        if cpu {
            (b.default_cpu_milli, b.max_cpu_milli)
        } else {
            (b.default_memory_bytes, b.max_memory_bytes)
        }
    };
    let ((own_default, own_max), (default, max)) = (pick(&l.own), pick(&l.effective));
    let whose = |own: Option<u64>| if own.is_some() { "own" } else { "inherited" };
    format!(
        "{} / {} ({} default, {} max)",
        opt(default.map(show)),
        opt(max.map(show)),
        whose(own_default),
        whose(own_max)
    )
}

fn show(t: &TenantView, output: Format) -> anyhow::Result<()> {
    print(output, t, |t| {
        let (g, l) = (&t.quota.guaranteed, &t.quota.limit);
        fields(&[
            ("Name", t.name.clone()),
            ("ID", t.id.clone()),
            ("Parent", opt(t.parent.clone())),
            (
                "Jobs",
                with_own(
                    format!("{} pending, {} running", t.jobs_pending, t.jobs_running),
                    format!(
                        "{} pending, {} running",
                        t.own.jobs_pending, t.own.jobs_running
                    ),
                ),
            ),
            (
                "GPUs held",
                with_own(held_text(&t.usage), held_text(&t.own.usage)),
            ),
            (
                "GPUs (guaranteed / limit)",
                amounts(g.gpu_milli, l.gpu_milli, show_milli),
            ),
            (
                "CPUs (guaranteed / limit)",
                amounts(g.cpu_milli, l.cpu_milli, show_milli),
            ),
            (
                "Memory (guaranteed / limit)",
                amounts(g.memory_bytes, l.memory_bytes, format_bytes),
            ),
            (
                "GPU memory (guaranteed / limit)",
                amounts(g.gpu_memory_bytes, l.gpu_memory_bytes, format_bytes),
            ),
            ("Weight", t.quota.weight.to_string()),
            ("Minimum isolation", t.quota.min_isolation.to_string()),
            (
                "MIG limits",
                if t.quota.mig_limits.is_empty() {
                    "-".to_owned()
                } else {
                    t.quota
                        .mig_limits
                        .iter()
                        .map(|(p, n)| format!("{p}={n}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                },
            ),
            (
                "GPU-hour budget per month",
                opt(t.quota.gpu_hour_budget.map(|b| b.to_string())),
            ),
            ("Job CPUs (default / max)", job_limit(&t.job_limits, true)),
            (
                "Job memory (default / max)",
                job_limit(&t.job_limits, false),
            ),
            ("Auto-sized jobs start at", start_share(&t.job_limits)),
            ("Created", t.created_at.to_rfc3339()),
        ])
    })
}

pub async fn run(client: &Client, cmd: TenantCmd) -> anyhow::Result<()> {
    match cmd {
        TenantCmd::Create {
            name,
            parent,
            quota,
            output,
        } => {
            let body = json!({ "name": name, "parent": parent, "quota": quota.body() });
            let t: TenantView = client
                .call(Method::POST, "/api/v1/tenants", Some(&body))
                .await?;
            show(&t, output)
        }
        TenantCmd::List { output, watch } => {
            let columns = tenant_columns();
            output.columns(&columns)?;
            watch
                .run("allot tenant list", || async {
                    let ts: Vec<TenantView> = client.get("/api/v1/tenants", &[]).await?;
                    output.render(&ts, &ts, &columns)
                })
                .await
        }
        TenantCmd::Delete { name, output } => {
            let d: DeletedTenant = client
                .call::<(), _>(Method::DELETE, &format!("/api/v1/tenants/{name}"), None)
                .await?;
            print(output, &d, |d| {
                format!(
                    "tenant {} deleted: {} token(s) and {} role binding(s) revoked, {} secret(s) \
                     and {} pull credential(s) removed; its audit log and jobs' history stay",
                    d.name,
                    d.tokens_revoked,
                    d.bindings_revoked,
                    d.secrets_removed,
                    d.credentials_removed
                )
            })
        }
        TenantCmd::Get { name, output } => {
            let t: TenantView = client.get(&format!("/api/v1/tenants/{name}"), &[]).await?;
            show(&t, output)
        }
        TenantCmd::SetQuota {
            name,
            quota,
            output,
        } => {
            let t: TenantView = client
                .call(
                    Method::PATCH,
                    &format!("/api/v1/tenants/{name}/quota"),
                    Some(&quota.patch()?),
                )
                .await?;
            show(&t, output)
        }
        TenantCmd::SetPolicy {
            name,
            registries,
            require_confinement,
            egress,
            deny_egress,
            allow_host_network,
            output,
        } => {
            let egress = (deny_egress || !egress.is_empty()).then_some(egress);
            let body = serde_json::json!({
                "image_registries": registries,
                "require_confinement": require_confinement,
                "egress": egress,
                "allow_host_network": allow_host_network,
            });
            let p: serde_json::Value = client
                .call(
                    Method::PUT,
                    &format!("/api/v1/tenants/{name}/policy"),
                    Some(&body),
                )
                .await?;
            print(output, &p, |p| {
                let list = |v: &serde_json::Value| {
                    v.as_array()
                        .filter(|a| !a.is_empty())
                        .map_or("any".to_owned(), |a| {
                            a.iter()
                                .filter_map(|r| r.as_str())
                                .collect::<Vec<_>>()
                                .join(", ")
                        })
                };
                let network: allot_domain::NetworkPolicy =
                    serde_json::from_value(p.clone()).unwrap_or_default();
                format!(
                    "policy of tenant {name} set: images from {}; confinement {}; egress: {}; \
                     host network {}",
                    list(&p["image_registries"]),
                    if p["require_confinement"] == true {
                        "required"
                    } else {
                        "not required"
                    },
                    network.describe_egress(),
                    if network.allow_host_network {
                        "allowed"
                    } else {
                        "refused"
                    }
                )
            })
        }
        TenantCmd::SetLimits {
            name,
            default_cpus,
            default_memory,
            max_cpus,
            max_memory,
            default_gpu_share,
            output,
        } => {
            let mut patch = serde_json::Map::new();
            for (key, v) in [
                ("default_cpu_milli", default_cpus),
                ("default_memory_bytes", default_memory),
                ("max_cpu_milli", max_cpus),
                ("max_memory_bytes", max_memory),
                ("default_gpu_milli", default_gpu_share),
            ] {
                if let Some(Setting(v)) = v {
                    patch.insert(key.into(), json!(v));
                }
            }
            if patch.is_empty() {
                anyhow::bail!(
                    "name what to change (e.g. --default-cpus 2, --max-memory 64GiB, --default-memory inherit)"
                );
            }
            let l: JobLimitsView = client
                .call(
                    Method::PATCH,
                    &format!("/api/v1/tenants/{name}/job-limits"),
                    Some(&serde_json::Value::Object(patch)),
                )
                .await?;
            print(output, &l, |l| {
                format!(
                    "job limits of tenant {name} set: CPUs {}; memory {}; auto-sized jobs start at {}",
                    job_limit(l, true),
                    job_limit(l, false),
                    start_share(l)
                )
            })
        }
        TenantCmd::SetRegistryCredential {
            name,
            registry,
            username,
            password_env,
            output,
        } => {
            let password = secret_input(&password_env, "password")?;
            let body = json!({ "username": username, "password": password });
            let c: RegistryCredentialView = client
                .call(
                    Method::PUT,
                    &format!("/api/v1/tenants/{name}/registry-credentials/{registry}"),
                    Some(&body),
                )
                .await?;
            print(output, &c, |c| {
                format!("credentials of tenant {name} for {} set", c.registry)
            })
        }
        TenantCmd::RegistryCredentials { name, output } => {
            let list: Vec<RegistryCredentialView> = client
                .get(&format!("/api/v1/tenants/{name}/registry-credentials"), &[])
                .await?;
            print(output, &list, |list| {
                let rows: Vec<Vec<String>> = list
                    .iter()
                    .map(|c| vec![c.registry.clone(), when(Some(c.updated_at))])
                    .collect();
                table(&["REGISTRY", "SET"], &rows)
            })
        }
        TenantCmd::DeleteRegistryCredential {
            name,
            registry,
            output,
        } => {
            client
                .delete(&format!(
                    "/api/v1/tenants/{name}/registry-credentials/{registry}"
                ))
                .await?;
            let done = json!({ "tenant": name, "registry": registry, "deleted": true });
            print(output, &done, |_| {
                format!("credentials of tenant {name} for {registry} removed")
            })
        }
        TenantCmd::SetSecret {
            name,
            secret,
            value_env,
            output,
        } => {
            let value = secret_input(&value_env, "value")?;
            let s: TenantSecretView = client
                .call(
                    Method::PUT,
                    &format!("/api/v1/tenants/{name}/secrets/{secret}"),
                    Some(&json!({ "value": value })),
                )
                .await?;
            print(output, &s, |s| {
                format!("secret {} of tenant {name} set", s.name)
            })
        }
        TenantCmd::Secrets { name, output } => {
            let list: Vec<TenantSecretView> = client
                .get(&format!("/api/v1/tenants/{name}/secrets"), &[])
                .await?;
            print(output, &list, |list| {
                let rows: Vec<Vec<String>> = list
                    .iter()
                    .map(|s| vec![s.name.clone(), when(Some(s.updated_at))])
                    .collect();
                table(&["SECRET", "SET"], &rows)
            })
        }
        TenantCmd::DeleteSecret {
            name,
            secret,
            output,
        } => {
            client
                .delete(&format!("/api/v1/tenants/{name}/secrets/{secret}"))
                .await?;
            let done = json!({ "tenant": name, "secret": secret, "deleted": true });
            print(output, &done, |_| {
                format!("secret {secret} of tenant {name} removed")
            })
        }
    }
}
