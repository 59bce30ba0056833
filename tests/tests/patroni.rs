//! The database layout of `deploy/ha/`, run for real: PostgreSQL managed by Patroni in
//! synchronous mode (three members, the files `deploy/ha/patroni.yml` and
//! `deploy/ha/haproxy.cfg` as shipped, with only addresses, paths and Patroni's timings
//! changed for one machine), etcd holding Patroni's leader key, HAProxy routing to the
//! primary, and two `allot server` replicas on top taking submits from several clients.
//! The primary is first switched over, then its machine is killed (Patroni and PostgreSQL,
//! SIGKILL). Afterwards every submit a replica acknowledged is there, the failed ones were
//! told to retry (503) rather than given a server error, and both replicas serve again,
//! the same processes, without a restart.

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use allot_system_tests::replica::{
    eventually, eventually_following, free_port, leader_and_follower,
};
use serde_json::{Value, json};

const SUPERUSER_PASSWORD: &str = "allot-test-superuser";

/// A program the layout runs, from `PATH`; `scripts/test` installs the Debian packages.
fn program(name: &str) -> PathBuf {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .chain([PathBuf::from("/usr/sbin")])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "{name} is not installed: scripts/test installs patroni, etcd-server and haproxy"
            )
        })
}

/// The user PostgreSQL runs as: `postgres` when the tests run as root (initdb refuses
/// root), the test's own user otherwise.
fn pg_user() -> Option<(u32, u32)> {
    if !nix::unistd::geteuid().is_root() {
        return None;
    }
    let user = nix::unistd::User::from_name("postgres")
        .expect("user database")
        .expect("a postgres user (Debian's postgresql package makes it)");
    Some((user.uid.as_raw(), user.gid.as_raw()))
}

/// A process of the layout, killed with everything it started when the test ends.
struct Proc {
    child: Child,
    /// A PostgreSQL data directory whose postmaster (with its children) dies with it.
    pgdata: Option<PathBuf>,
}

impl Proc {
    fn spawn(mut cmd: Command, log: &Path, user: Option<(u32, u32)>) -> Self {
        let out = std::fs::File::create(log).expect("log file");
        if let Some((uid, gid)) = user {
            cmd.uid(uid).gid(gid);
        }
        let child = cmd
            .stdout(out.try_clone().expect("log"))
            .stderr(out)
            .stdin(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
        Proc {
            child,
            pgdata: None,
        }
    }

    /// Kills it as a power cut would: the process, and the PostgreSQL server it runs
    /// with all that server's processes.
    fn kill(&mut self) {
        kill_tree(self.child.id());
        let _ = self.child.wait();
        if let Some(pid) = self.pgdata.as_deref().and_then(postmaster) {
            kill_tree(pid);
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The postmaster's process id, from the first line of `postmaster.pid`.
fn postmaster(pgdata: &Path) -> Option<u32> {
    std::fs::read_to_string(pgdata.join("postmaster.pid"))
        .ok()?
        .lines()
        .next()?
        .trim()
        .parse()
        .ok()
}

/// SIGKILLs `pid` and, first, every process whose parent it is (PostgreSQL's backends).
fn kill_tree(pid: u32) {
    let children: Vec<u32> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let child: u32 = e.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            // pid (comm) state ppid …: comm may hold spaces and parentheses.
            let ppid: u32 = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            (ppid == pid).then_some(child)
        })
        .collect();
    for p in children.into_iter().chain([pid]) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(p as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

/// One database member: Patroni and the PostgreSQL it manages.
struct Member {
    name: String,
    pg_port: u16,
    api_port: u16,
    proc: Option<Proc>,
}

fn deploy_file(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/ha")
        .join(name)
}

/// `deploy/ha/patroni.yml` for a test on one machine: paths under `dir`, and timings short
/// enough that a failover takes seconds (ttl 10 s instead of 30 s).
fn patroni_config(dir: &Path) -> PathBuf {
    let text = std::fs::read_to_string(deploy_file("patroni.yml")).expect("patroni.yml");
    let mut config: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).expect("YAML");
    let dcs = &mut config["bootstrap"]["dcs"];
    assert_eq!(
        dcs["synchronous_mode"].as_bool(),
        Some(true),
        "the layout is synchronous"
    );
    dcs["ttl"] = 10.into();
    dcs["loop_wait"] = 1.into();
    dcs["retry_timeout"] = 3.into();
    let pg = &mut config["postgresql"];
    let bindir = allot_store::postgres_server_bindir()
        .expect("PostgreSQL is installed (scripts/test installs it)");
    pg["bin_dir"] = bindir.to_string_lossy().into_owned().into();
    pg["parameters"]["unix_socket_directories"] = dir.to_string_lossy().into_owned().into();
    // Quick to throw away: no flush to disk (the failover under test is a process's
    // death, not a power cut of the disk).
    pg["parameters"]["fsync"] = "off".into();
    let path = dir.join("patroni.yml");
    std::fs::write(&path, serde_yaml_ng::to_string(&config).expect("YAML")).expect("write");
    path
}

fn spawn_member(
    name: &str,
    dir: &Path,
    config: &Path,
    etcd: u16,
    user: Option<(u32, u32)>,
) -> Member {
    let (pg_port, api_port) = (free_port(), free_port());
    let pgdata = dir.join(name);
    let mut cmd = Command::new(program("patroni"));
    cmd.arg(config)
        .env("PATRONI_NAME", name)
        .env("PATRONI_RESTAPI_LISTEN", format!("127.0.0.1:{api_port}"))
        .env(
            "PATRONI_RESTAPI_CONNECT_ADDRESS",
            format!("127.0.0.1:{api_port}"),
        )
        .env("PATRONI_ETCD3_HOSTS", format!("127.0.0.1:{etcd}"))
        .env("PATRONI_POSTGRESQL_LISTEN", format!("127.0.0.1:{pg_port}"))
        .env(
            "PATRONI_POSTGRESQL_CONNECT_ADDRESS",
            format!("127.0.0.1:{pg_port}"),
        )
        .env("PATRONI_POSTGRESQL_DATA_DIR", &pgdata)
        .env(
            "PATRONI_POSTGRESQL_PGPASS",
            dir.join(format!("{name}.pgpass")),
        )
        .env("PATRONI_SUPERUSER_PASSWORD", SUPERUSER_PASSWORD)
        .env("PATRONI_REPLICATION_PASSWORD", "allot-test-replication")
        .env("PATRONI_REWIND_PASSWORD", "allot-test-rewind")
        .env("HOME", dir);
    let mut proc = Proc::spawn(cmd, &dir.join(format!("{name}.log")), user);
    proc.pgdata = Some(pgdata);
    Member {
        name: name.to_owned(),
        pg_port,
        api_port,
        proc: Some(proc),
    }
}

/// Patroni's view of the cluster, from whichever of `members` still answers: each running
/// member's role (`leader`, `sync_standby`, `replica`).
async fn roles(http: &reqwest::Client, members: &[Member]) -> BTreeMap<String, String> {
    cluster(http, members).await.0
}

/// The running members' roles, and every member as Patroni sees it (name, role, state,
/// lag): what a wait says it last saw.
async fn cluster(http: &reqwest::Client, members: &[Member]) -> (BTreeMap<String, String>, String) {
    for m in members.iter().filter(|m| m.proc.is_some()) {
        let Ok(res) = http
            .get(format!("http://127.0.0.1:{}/cluster", m.api_port))
            .send()
            .await
        else {
            continue;
        };
        let Ok(cluster) = res.json::<Value>().await else {
            continue;
        };
        let all = cluster["members"].as_array().cloned().unwrap_or_default();
        let seen = all
            .iter()
            .map(|m| {
                format!(
                    "{} {} {} lag {}",
                    m["name"], m["role"], m["state"], m["lag"]
                )
            })
            .collect::<Vec<_>>()
            .join("; ");
        let running = all
            .iter()
            .filter(|m| m["state"] == "running" || m["state"] == "streaming")
            .filter_map(|m| Some((m["name"].as_str()?.into(), m["role"].as_str()?.into())))
            .collect();
        return (running, seen);
    }
    (BTreeMap::new(), "no member's REST API answers".to_owned())
}

/// The running leader and a synchronous standby, once Patroni reports both.
async fn primary_and_sync(
    http: &reqwest::Client,
    members: &[Member],
    what: &str,
) -> (String, String) {
    // Bootstrapping three members (initdb, two base backups) took 2.5 minutes alone on a
    // 2-core machine, more beside other work: waited on while Patroni reports progress.
    eventually_following(
        what,
        Duration::from_secs(120),
        Duration::from_secs(330),
        async || {
            let (roles, seen) = cluster(http, members).await;
            let with = |role: &str| {
                roles
                    .iter()
                    .find(|(_, r)| r.as_str() == role)
                    .map(|(n, _)| n.clone())
            };
            match (with("leader"), with("sync_standby")) {
                (Some(l), Some(s)) => Ok((l, s)),
                _ => Err(seen),
            }
        },
    )
    .await
}

/// What one submit came to.
#[derive(Debug)]
enum Outcome {
    /// 201, with the job's id: the replica acknowledged it.
    Acknowledged {
        id: String,
        replica: usize,
        at: Instant,
    },
    /// Another status.
    Refused(u16, String),
    /// No answer at all.
    Unanswered(String),
}

/// Clients submitting jobs, spread over the replicas, until `stop`.
fn submit_load(
    http: reqwest::Client,
    token: String,
    replicas: Vec<String>,
    clients: usize,
    stop: Arc<AtomicBool>,
    outcomes: Arc<Mutex<Vec<Outcome>>>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..clients)
        .map(|client| {
            let (http, token, replicas, stop, outcomes) = (
                http.clone(),
                token.clone(),
                replicas.clone(),
                stop.clone(),
                outcomes.clone(),
            );
            tokio::spawn(async move {
                let mut n = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let replica = (client + n) % replicas.len();
                    let res = http
                        .post(format!("{}/api/v1/jobs", replicas[replica]))
                        .bearer_auth(&token)
                        .json(&json!({
                            "tenant": "ha",
                            "name": format!("c{client}-{n}"),
                            "gpus": 1,
                            "command": ["true"],
                        }))
                        .send()
                        .await;
                    let outcome = match res {
                        Err(e) => Outcome::Unanswered(e.to_string()),
                        Ok(res) => {
                            let status = res.status().as_u16();
                            let body: Value = res.json().await.unwrap_or(Value::Null);
                            match (status, body["id"].as_str()) {
                                (201, Some(id)) => Outcome::Acknowledged {
                                    id: id.to_owned(),
                                    replica,
                                    at: Instant::now(),
                                },
                                _ => Outcome::Refused(status, body.to_string()),
                            }
                        }
                    };
                    outcomes.lock().expect("outcomes").push(outcome);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
        })
        .collect()
}

/// Waits until every replica has acknowledged a submit after `since`.
async fn every_replica_acknowledges(
    outcomes: &Mutex<Vec<Outcome>>,
    replicas: usize,
    since: Instant,
    what: &str,
) {
    eventually(what, Duration::from_secs(60), async || {
        let outcomes = outcomes.lock().expect("outcomes");
        (0..replicas)
            .all(|r| {
                outcomes.iter().any(|o| {
                    matches!(o, Outcome::Acknowledged { replica, at, .. } if *replica == r && *at > since)
                })
            })
            .then_some(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_switchover_and_a_killed_primary_lose_no_acknowledged_submit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().to_owned();
    let user = pg_user();
    if let Some((uid, gid)) = user {
        std::os::unix::fs::chown(&root, Some(uid), Some(gid)).expect("chown");
    }
    let http = allot_system_tests::http_client()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client");

    // etcd, one member: Patroni's leader key.
    let (etcd_client, etcd_peer) = (free_port(), free_port());
    let mut etcd = Command::new(program("etcd"));
    let client_url = format!("http://127.0.0.1:{etcd_client}");
    let peer_url = format!("http://127.0.0.1:{etcd_peer}");
    etcd.args(["--name", "e1", "--data-dir"])
        .arg(root.join("etcd"))
        .args(["--listen-client-urls", &client_url])
        .args(["--advertise-client-urls", &client_url])
        .args(["--listen-peer-urls", &peer_url])
        .args(["--initial-advertise-peer-urls", &peer_url])
        .args(["--initial-cluster", &format!("e1={peer_url}")]);
    let _etcd = Proc::spawn(etcd, &root.join("etcd.log"), None);
    eventually("etcd answers", Duration::from_secs(30), async || {
        let res = http.get(format!("{client_url}/health")).send().await.ok()?;
        res.status().is_success().then_some(())
    })
    .await;

    // Three Patroni members, one configuration file.
    let config = patroni_config(&root);
    let mut members: Vec<Member> = ["db1", "db2", "db3"]
        .iter()
        .map(|name| spawn_member(name, &root, &config, etcd_client, user))
        .collect();
    let (first, _) = primary_and_sync(&http, &members, "a primary and a synchronous standby").await;

    // HAProxy with deploy/ha/haproxy.cfg as shipped: only the addresses differ.
    let haproxy_port = free_port();
    let mut haproxy = Command::new(program("haproxy"));
    haproxy
        .arg("-f")
        .arg(deploy_file("haproxy.cfg"))
        .arg("-db")
        .env("ALLOT_DB_BIND", format!("127.0.0.1:{haproxy_port}"));
    for (i, m) in members.iter().enumerate() {
        haproxy
            .env(
                format!("ALLOT_DB{}", i + 1),
                format!("127.0.0.1:{}", m.pg_port),
            )
            .env(
                format!("ALLOT_DB{}_API_PORT", i + 1),
                m.api_port.to_string(),
            );
    }
    let _haproxy = Proc::spawn(haproxy, &root.join("haproxy.log"), None);
    // HAProxy counts every member up until its first checks: wait until both standbys
    // are out of the rotation.
    eventually(
        "HAProxy routes to the primary only",
        Duration::from_secs(30),
        async || {
            let log = std::fs::read_to_string(root.join("haproxy.log")).unwrap_or_default();
            (log.matches(" is DOWN").count() >= 2).then_some(())
        },
    )
    .await;

    // Two Allot replicas, both reaching the database only through HAProxy.
    let url = format!(
        "postgres://postgres:{SUPERUSER_PASSWORD}@127.0.0.1:{haproxy_port}/postgres?sslmode=disable"
    );
    let allot = root.join("allot");
    std::fs::create_dir_all(&allot).expect("mkdir");
    let (mut a, mut b) = leader_and_follower(&http, &url, &allot, 2, &[]).await;
    let token = std::fs::read_to_string(allot.join("server/admin.token"))
        .expect("admin token")
        .trim()
        .to_owned();
    let res = http
        .post(format!("{}/api/v1/tenants", b.http))
        .bearer_auth(&token)
        .json(&json!({ "name": "ha" }))
        .send()
        .await
        .expect("the API answers");
    assert_eq!(res.status(), 201);

    let stop = Arc::new(AtomicBool::new(false));
    let outcomes = Arc::new(Mutex::new(Vec::new()));
    let replicas = [&a, &b];
    let clients = submit_load(
        http.clone(),
        token.clone(),
        replicas.iter().map(|r| r.http.clone()).collect(),
        4,
        stop.clone(),
        outcomes.clone(),
    );
    every_replica_acknowledges(&outcomes, 2, Instant::now(), "submits before").await;
    tokio::time::sleep(Duration::from_secs(2)).await;

    // 1. A planned switchover to the synchronous standby.
    let (primary, standby) = primary_and_sync(&http, &members, "the cluster is healthy").await;
    assert_eq!(primary, first);
    let api = members
        .iter()
        .find(|m| m.name == primary)
        .map(|m| m.api_port)
        .expect("member");
    let res = http
        .post(format!("http://127.0.0.1:{api}/switchover"))
        .json(&json!({ "leader": primary, "candidate": standby }))
        .send()
        .await
        .expect("Patroni answers");
    assert!(res.status().is_success(), "{:?}", res.text().await);
    let switched = Instant::now();
    let (after_switchover, _) = eventually(
        "the standby is primary",
        Duration::from_secs(60),
        async || {
            let (p, s) = primary_and_sync(&http, &members, "a primary").await;
            (p == standby).then_some((p, s))
        },
    )
    .await;
    every_replica_acknowledges(&outcomes, 2, switched, "submits after the switchover").await;
    let switchover_served = switched.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;

    // 2. The primary's machine dies: Patroni and PostgreSQL killed at once.
    let victim = members
        .iter_mut()
        .find(|m| m.name == after_switchover)
        .expect("member");
    victim.proc.take().expect("running").kill();
    let killed = Instant::now();
    let (promoted, _) = eventually(
        "a standby is promoted",
        Duration::from_secs(90),
        async || {
            let roles = roles(&http, &members).await;
            roles
                .iter()
                .find(|(n, r)| r.as_str() == "leader" && **n != after_switchover)
                .map(|(n, _)| (n.clone(), ()))
        },
    )
    .await;
    every_replica_acknowledges(&outcomes, 2, killed, "submits after the primary died").await;
    let failover_served = killed.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.expect("client");
    }

    // Every acknowledged submit is there, read through either replica.
    let outcomes = std::mem::take(&mut *outcomes.lock().expect("outcomes"));
    let acknowledged: Vec<&String> = outcomes
        .iter()
        .filter_map(|o| match o {
            Outcome::Acknowledged { id, .. } => Some(id),
            _ => None,
        })
        .collect();
    let mut missing = Vec::new();
    for (i, id) in acknowledged.iter().enumerate() {
        let replica = replicas[i % 2];
        let res = http
            .get(format!("{}/api/v1/jobs/{id}", replica.http))
            .bearer_auth(&token)
            .send()
            .await
            .expect("the API answers");
        if res.status() != 200 {
            missing.push((id, res.status()));
        }
    }
    assert!(missing.is_empty(), "acknowledged, then lost: {missing:?}");
    // A submit that failed was told to retry: no server errors, no dropped connections.
    let mut refused: BTreeMap<u16, usize> = BTreeMap::new();
    for o in &outcomes {
        match o {
            Outcome::Acknowledged { .. } => {}
            Outcome::Refused(status, body) => {
                assert_eq!(*status, 503, "{body}");
                *refused.entry(*status).or_default() += 1;
            }
            Outcome::Unanswered(e) => panic!("a submit went unanswered: {e}"),
        }
    }
    // Both replicas are the processes started at first, and one of them leads.
    assert!(a.alive() && b.alive(), "a replica exited");
    let epochs = eventually("one replica leads", Duration::from_secs(30), async || {
        let (ea, eb) = (a.epoch(&http).await?, b.epoch(&http).await?);
        ((ea > 0) != (eb > 0)).then_some((ea, eb))
    })
    .await;
    eprintln!(
        "{} submits acknowledged, refused {refused:?}; primary {first} → {after_switchover} \
         (switchover, both replicas acknowledging again after {switchover_served:?}) → \
         {promoted} (killed, after {failover_served:?}); leader epochs {epochs:?}",
        acknowledged.len()
    );
    assert!(
        acknowledged.len() >= 50,
        "too little load to tell: {}",
        acknowledged.len()
    );
    a.stop();
    b.stop();
    drop(members);
}
