//! Jobs are confined on a shared node: tried as a malicious tenant would, with real `runc`,
//! the real agent and images from a real registry on loopback. Tenant B's job runs on the
//! node while each of tenant A's attacks runs beside it; every attack is refused, and the
//! refusal is asserted (from what the attack printed, how it ended, and what the node sees).
//!
//! Each attack script prints `REFUSED` where the node held and `BREACH` where it did not.

use std::time::{Duration, Instant};

use allot_system_tests::oci::{
    BusyboxCluster, Outside, Registry, add_file, add_symlink, busybox_cluster, busybox_layer,
    cgroup_of, confined_cluster, confined_cluster_configured, layer, listen_on_host,
    process_running, push_busybox, require_container_support, run_image, syscall_outcomes,
    syscall_probe,
};
use allot_system_tests::{StatusCode, TestCluster};
use serde_json::{Value, json};

/// The index of the GPU with this UUID on the cluster's only node.
async fn gpu_index(c: &TestCluster, uuid: &str) -> u64 {
    let (_, nodes) = c.get("/api/v1/nodes").await;
    nodes[0]["gpus"]
        .as_array()
        .expect("gpus")
        .iter()
        .find(|g| g["uuid"] == uuid)
        .and_then(|g| g["index"].as_u64())
        .expect("the job's GPU is on the node")
}

struct Attack {
    what: &'static str,
    fields: Value,
    script: String,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenant_cannot_reach_beyond_its_own_container() {
    if !require_container_support() {
        return;
    }
    let registry = Registry::start();
    push_busybox(&registry, "team-a/busybox:1").await;
    push_busybox(&registry, "team-b/busybox:1").await;
    // An image with a set-user-ID-root copy of busybox, run as an ordinary user.
    let busybox = std::fs::read(allot_system_tests::oci::BUSYBOX).expect("busybox");
    registry
        .push(
            "team-a/suid:1",
            &[
                busybox_layer(),
                layer(|b| add_file(b, "opt/suid/id", &busybox, 0o4755)),
            ],
            json!({ "Env": ["PATH=/bin"], "User": "1000:1000" }),
        )
        .await;
    let c = confined_cluster(&registry, 1, "2xH200", 64).await;
    c.create_tenant("team-a", None).await;
    c.create_tenant("team-b", None).await;
    let image = |t: &str| format!("{}/{t}/busybox:1", registry.addr);
    let (_, nodes) = c.get("/api/v1/nodes").await;
    assert_eq!(nodes[0]["runtime"], "oci", "the node reports its runtime");
    let node_dir = c.data_dir.path().join("node-1");
    // The node is ready once registered; its agent saves the key a moment after.
    let node_key = c
        .eventually("the agent saved its key", || async {
            std::fs::read(node_dir.join("identity/node.key")).ok()
        })
        .await;

    // Tenant B's job, with a secret in its environment and its scratch directory.
    let b = c
        .submit_with(
            "team-b",
            json!({ "gpus": 1, "image": image("team-b"), "env": { "SECRET_OF_B": "hunter2" } }),
            &[
                "sh",
                "-c",
                "echo hunter2 > /scratch/b.txt; echo b-started; sleep 300",
            ],
        )
        .await;
    let b_job = c.wait_for_state(&b, "running").await;
    let b_pid = b_job["pid"].as_u64().expect("B's pid");
    let b_gpu = gpu_index(&c, b_job["gpu_uuids"][0].as_str().expect("B's GPU")).await;
    let data = node_dir.display().to_string();

    // The container's root is not the host's: its processes run as an unprivileged
    // host uid of the tenant's range.
    let status = std::fs::read_to_string(format!("/proc/{b_pid}/status")).expect("status");
    let host_uid: u32 = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|u| u.split_whitespace().next())
        .and_then(|u| u.parse().ok())
        .expect("uid");
    assert!(
        host_uid >= allot_domain::Tenant::UID_FIRST,
        "B's container runs as host uid {host_uid}"
    );

    let cpu_only = |img: &str| json!({ "gpus": 0, "image": img });
    let attacks = vec![
        Attack {
            what: "read the agent's data dir or node key",
            fields: cpu_only(&image("team-a")),
            script: format!(
                "cat {data}/identity/node.key && echo BREACH || echo REFUSED; \
                 ls {data} && echo BREACH || echo REFUSED; \
                 ls /proc/1/root/{data} && echo BREACH || echo REFUSED"
            ),
        },
        Attack {
            what: "read B's job directory, log or environment",
            fields: cpu_only(&image("team-a")),
            script: format!(
                "cat {data}/logs/{b}.1.log && echo BREACH || echo REFUSED; \
                 cat /proc/{b_pid}/environ && echo BREACH || echo REFUSED; \
                 cat /scratch/b.txt && echo BREACH || echo REFUSED; \
                 if grep -l hunter2 /proc/*/environ; then echo BREACH; else echo REFUSED; fi"
            ),
        },
        Attack {
            what: "see or signal B's processes",
            fields: cpu_only(&image("team-a")),
            script: format!(
                "kill -TERM {b_pid} && echo BREACH || echo REFUSED; \
                 kill -KILL {b_pid} && echo BREACH || echo REFUSED; \
                 if ps -o args | grep -v grep | grep -q 'sleep 300'; then echo BREACH; else echo REFUSED; fi"
            ),
        },
        Attack {
            what: "open a GPU device node not assigned to it",
            fields: json!({ "gpus": 1, "image": image("team-a") }),
            script: format!(
                "for i in 0 1 2 3; do [ -c /dev/nvidia$i ] && echo have-gpu-$i; done; \
                 cat /dev/nvidia{b_gpu} && echo BREACH || echo REFUSED; \
                 mknod /tmp/nv c 195 {b_gpu} && echo BREACH || echo REFUSED; \
                 mknod /dev/nv c 195 {b_gpu} && echo BREACH || echo REFUSED"
            ),
        },
        Attack {
            what: "write to its image's root file system",
            fields: cpu_only(&image("team-a")),
            script: "echo x > /bin/pwned && echo BREACH || echo REFUSED; \
                     rm /bin/sleep && echo BREACH || echo REFUSED; \
                     echo ok > /scratch/mine && echo scratch-writable"
                .into(),
        },
        Attack {
            what: "fork past its pids limit",
            fields: cpu_only(&image("team-a")),
            // A fork failure ends a non-interactive shell: fork in a subshell, then wait
            // with a builtin until the sleeps are gone.
            script: "mkfifo /tmp/f; \
                     (i=0; while [ $i -lt 200 ]; do sleep 2 & i=$((i+1)); done) 2>/tmp/err; \
                     read -t 4 x <> /tmp/f; \
                     if grep -q fork /tmp/err; then echo REFUSED; else echo BREACH; fi; head -n 1 /tmp/err"
                .into(),
        },
        Attack {
            what: "gain root through a set-user-ID binary in its image",
            fields: cpu_only(&format!("{}/team-a/suid:1", registry.addr)),
            script: "echo euid-$(/opt/suid/id -u); \
                     [ \"$(/opt/suid/id -u)\" = 0 ] && echo BREACH || echo REFUSED; \
                     grep NoNewPrivs /proc/self/status"
                .into(),
        },
        Attack {
            what: "leave a process running after the job ends",
            fields: cpu_only(&image("team-a")),
            script: "setsid sleep 3011 & (sleep 3012 &) ; sleep 0.5; echo REFUSED".into(),
        },
        Attack {
            what: "turn its log into a link to a node file",
            fields: cpu_only(&image("team-a")),
            script: format!(
                "echo own-output; \
                 ln -sf {data}/identity/node.key {data}/logs/$ALLOT_JOB_ID.1.log && echo BREACH || echo REFUSED; \
                 echo more-output"
            ),
        },
    ];
    let mut ids = Vec::new();
    for a in &attacks {
        let id = c
            .submit_with("team-a", a.fields.clone(), &["sh", "-c", &a.script])
            .await;
        ids.push(id);
    }
    for (a, id) in attacks.iter().zip(&ids) {
        let (job, log) = (c.wait_for_end(id).await, c.log_of(id).await);
        assert_eq!(job["state"], "succeeded", "{}: {job:#}\n{log}", a.what);
        assert!(
            log.contains("REFUSED") && !log.contains("BREACH"),
            "{}: the attack got through:\n{log}",
            a.what
        );
        assert!(!log.contains("hunter2"), "{}: B's secret leaked", a.what);
        match a.what {
            "open a GPU device node not assigned to it" => {
                let own = gpu_index(&c, job["gpu_uuids"][0].as_str().expect("GPU")).await;
                let have: Vec<&str> = log.lines().filter(|l| l.starts_with("have-gpu-")).collect();
                assert_eq!(
                    have,
                    [format!("have-gpu-{own}")],
                    "only its own GPU's device node is in the container:\n{log}"
                );
            }
            "write to its image's root file system" => {
                assert!(log.contains("scratch-writable"), "{log}");
                assert!(log.contains("Read-only file system"), "{log}");
            }
            "gain root through a set-user-ID binary in its image" => {
                assert!(log.contains("euid-1000"), "{log}");
                assert!(log.contains("NoNewPrivs:\t1"), "{log}");
            }
            "leave a process running after the job ends" => {
                let deadline = Instant::now() + Duration::from_secs(10);
                while process_running("sleep 3011") || process_running("sleep 3012") {
                    assert!(
                        Instant::now() < deadline,
                        "a process of the ended job is still running on the node"
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
            "turn its log into a link to a node file" => {
                assert!(
                    log.contains("own-output") && log.contains("more-output"),
                    "the log shown is the job's own output:\n{log}"
                );
                assert!(!log.contains("PRIVATE KEY"), "{log}");
            }
            _ => {}
        }
    }
    // Memory: past its limit, the kernel ends it, and the job fails as its own fault.
    let oom = c
        .submit_with(
            "team-a",
            json!({ "gpus": 0, "image": image("team-a"), "memory_bytes": 64u64 << 20 }),
            &["sh", "-c", "x=aaaaaaaaaaaaaaaa; while :; do x=$x$x; done"],
        )
        .await;
    let (job, log) = (c.wait_for_end(&oom).await, c.log_of(&oom).await);
    assert_eq!(job["state"], "failed", "{job:#}\n{log}");
    let message = job["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("OutOfMemory") && message.contains("64 MiB"),
        "the message names the reason and the limit: {message}"
    );

    // B ran through all of it, untouched, and the node's key is as it was.
    let (_, b_now) = c.get(&format!("/api/v1/jobs/{b}")).await;
    assert_eq!(b_now["state"], "running", "{b_now:#}");
    assert_eq!(
        std::fs::read(node_dir.join("identity/node.key")).expect("node key"),
        node_key
    );
    let (status, _) = c.post(&format!("/api/v1/jobs/{b}/cancel"), json!({})).await;
    assert!(status.is_success());
    let (b_done, b_log) = (c.wait_for_end(&b).await, c.log_of(&b).await);
    assert_eq!(b_done["state"], "cancelled");
    assert_eq!(b_log.trim(), "b-started");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_half_cpu_job_gets_half_a_cpu() {
    if !require_container_support() {
        return;
    }
    let BusyboxCluster {
        c,
        image,
        registry: _registry,
        ..
    } = busybox_cluster("team-a/busybox:1", 64, &["team-a"]).await;
    let id = c
        .submit_with(
            "team-a",
            json!({ "gpus": 0, "cpu_milli": 500, "image": image }),
            &["sh", "-c", "while :; do :; done"],
        )
        .await;
    let job = c.wait_for_state(&id, "running").await;
    let pid = job["pid"].as_u64().expect("pid");
    let cgroup = cgroup_of(pid);
    assert!(cgroup.starts_with("/allot/"), "{cgroup}");
    let h = allot_agent::runtime::cgroup::Hierarchy::detect();
    // Let it settle, then measure by the cgroup's own accounting.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (t0, u0) = (Instant::now(), h.cpu_usage_ns(&cgroup).expect("usage"));
    tokio::time::sleep(Duration::from_secs(4)).await;
    let (t1, u1) = (Instant::now(), h.cpu_usage_ns(&cgroup).expect("usage"));
    let cpus = (u1 - u0) as f64 / (t1 - t0).as_nanos() as f64;
    assert!(
        (0.4..=0.6).contains(&cpus),
        "a busy loop in a 0.5-CPU job used {cpus:.3} CPUs"
    );
    let (status, _) = c
        .post(&format!("/api/v1/jobs/{id}/cancel"), json!({}))
        .await;
    assert!(status.is_success());
    c.wait_for_state(&id, "cancelled").await;
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_runtimes_directory_and_the_init_are_the_nodes() {
    if !require_container_support() {
        return;
    }
    let registry = Registry::start();
    // An image whose `/.allot` is a link into where the job mounts its volume.
    registry
        .push(
            "team-a/redirect:1",
            &[
                busybox_layer(),
                layer(|b| add_symlink(b, ".allot", "/data")),
            ],
            json!({ "Env": ["PATH=/bin"] }),
        )
        .await;
    let c = confined_cluster(&registry, 1, "1xH200", 64).await;
    c.create_tenant("team-a", None).await;
    let volume = tempfile::tempdir().expect("volume");
    allot_system_tests::oci::searchable(volume.path());
    c.put_volume("shared", volume.path(), &["team-a"]).await;
    let image = format!("{}/team-a/redirect:1", registry.addr);
    // Refused at submit, naming the field: a volume at or in /.allot, a working directory
    // there.
    for (fields, field) in [
        (
            json!({ "volumes": [{ "volume": "shared", "path": "/.allot" }] }),
            "volumes[0].path",
        ),
        (
            json!({ "volumes": [{ "volume": "shared", "path": "/.allot/init" }] }),
            "volumes[0].path",
        ),
        (json!({ "workdir": "/.allot" }), "workdir"),
    ] {
        let mut body =
            json!({ "tenant": "team-a", "gpus": 0, "image": image, "command": ["true"] });
        if let (Some(b), Some(f)) = (body.as_object_mut(), fields.as_object()) {
            b.extend(f.clone());
        }
        let (status, answer) = c.post("/api/v1/jobs", body).await;
        assert_eq!(
            status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{fields}: {answer}"
        );
        assert!(answer.to_string().contains(field), "{fields}: {answer}");
    }
    // The tenant's volume holds an `init` of its own, and its image links /.allot there:
    // PID 1 is still the node's init.
    let mine = volume.path().join("team-a");
    std::fs::create_dir_all(&mine).expect("mkdir");
    std::fs::write(
        mine.join("init"),
        "#!/bin/sh\necho PID1-REPLACED\nexec \"$@\"\n",
    )
    .expect("write");
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(mine.join("init"), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
    }
    let id = c
        .submit_with(
            "team-a",
            json!({ "gpus": 0, "image": image,
                    "volumes": [{ "volume": "shared", "path": "/data" }] }),
            &[
                "sh",
                "-c",
                "tr '\\0' ' ' < /proc/1/cmdline; echo; test -x /data/init && echo volume-mounted",
            ],
        )
        .await;
    let (job, log) = (c.wait_for_end(&id).await, c.log_of(&id).await);
    assert!(
        !log.contains("PID1-REPLACED"),
        "the job's file ran as PID 1:\n{log}"
    );
    assert_eq!(job["state"], "succeeded", "{job:#}\n{log}");
    assert!(
        log.starts_with("/.allot/init -s -p SIGKILL -g -- sh -c") && log.contains("volume-mounted"),
        "{log}"
    );
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scratch_space_is_bounded_and_counts_toward_the_jobs_memory() {
    if !require_container_support() {
        return;
    }
    // /scratch, /tmp and /dev/shm are 64 MiB each here.
    let BusyboxCluster {
        c,
        image,
        registry: _registry,
        ..
    } = busybox_cluster("team-a/busybox:1", 64, &["team-a"]).await;
    // Bounded: past its size, a write fails with ENOSPC.
    for dir in ["/scratch", "/tmp", "/dev/shm"] {
        let script = format!("dd if=/dev/zero of={dir}/f bs=1M count=100 2>&1; echo rc=$?");
        let (job, log) = run_image(&c, "team-a", &image, &["sh", "-c", &script]).await;
        assert_eq!(job["state"], "succeeded", "{dir}: {job:#}\n{log}");
        assert!(
            log.contains("No space left on device") && log.contains("rc=1"),
            "{dir}: {log}"
        );
    }
    // Counted: what a job keeps in /scratch is memory its cgroup holds.
    let id = c
        .submit_with(
            "team-a",
            json!({ "gpus": 0, "image": image, "memory_bytes": 128u64 << 20 }),
            &[
                "sh",
                "-c",
                "dd if=/dev/zero of=/scratch/f bs=1M count=48 2>/dev/null; echo written; sleep 300",
            ],
        )
        .await;
    let job = c.wait_for_state(&id, "running").await;
    let cgroup = cgroup_of(job["pid"].as_u64().expect("pid"));
    c.eventually("the job wrote its scratch file", || async {
        c.log_of(&id).await.contains("written").then_some(())
    })
    .await;
    let h = allot_agent::runtime::cgroup::Hierarchy::detect();
    let held = h.memory_bytes(&cgroup).expect("memory usage");
    assert!(
        held >= 48 << 20,
        "48 MiB in /scratch, {held} bytes charged to the job's memory"
    );
    let (status, _) = c
        .post(&format!("/api/v1/jobs/{id}/cancel"), json!({}))
        .await;
    assert!(status.is_success());
    c.wait_for_end(&id).await;
    // So a job cannot hold more in scratch than its memory limit: the kernel ends it.
    let id = c
        .submit_with(
            "team-a",
            json!({ "gpus": 0, "image": image, "memory_bytes": 32u64 << 20 }),
            &[
                "sh",
                "-c",
                "dd if=/dev/zero of=/scratch/f bs=1M count=60; sleep 5",
            ],
        )
        .await;
    let (job, log) = (c.wait_for_end(&id).await, c.log_of(&id).await);
    assert_eq!(job["state"], "failed", "{job:#}\n{log}");
    let message = job["message"].as_str().unwrap_or_default();
    assert!(message.starts_with("OutOfMemory"), "{message}\n{log}");
    c.shutdown().await;
}

/// Shell functions every network attack script starts with: `try ADDR PORT` prints
/// `BREACH` when something answers there, `REFUSED` when nothing does; `web ADDR PORT PATH`
/// the same for an HTTP GET (spoken through `nc`: busybox's static `wget` is not reliable
/// on every host's `/etc`); `reach ADDR PORT` prints `REACHED` or `UNREACHABLE` (for what must be
/// reachable).
const NET_PRELUDE: &str = r#"
try() { if out=$(busybox nc -w 2 "$1" "$2" </dev/null 2>/dev/null) && [ -n "$out" ]; then echo "BREACH $1:$2 $out"; else echo "REFUSED $1:$2"; fi; }
web() { if printf 'GET %s HTTP/1.0\r\nHost: %s:%s\r\n\r\n' "$3" "$1" "$2" | busybox nc -w 3 "$1" "$2" 2>/dev/null | grep -q '^HTTP/1'; then echo "BREACH http://$1:$2$3"; else echo "REFUSED http://$1:$2$3"; fi; }
reach() { if out=$(busybox nc -w 2 "$1" "$2" </dev/null 2>/dev/null) && [ -n "$out" ]; then echo "REACHED $1:$2 $out"; else echo "UNREACHABLE $1:$2"; fi; }
"#;

/// Where things are, for the network table's scripts.
struct NetTargets {
    /// The node's address on its way out (empty when it has no route out).
    node_ip: String,
    /// The gateway of each agent's job networks.
    gateways: Vec<String>,
    api_port: u16,
    server_metrics_port: u16,
    agent_metrics_port: u16,
    /// A service of the node's on all its addresses.
    node_service_port: u16,
    outside: std::net::Ipv4Addr,
    outside_host: std::net::Ipv4Addr,
    outside_port: u16,
    outside_other_port: u16,
    link_local: std::net::Ipv4Addr,
    link_local_port: u16,
}

impl NetTargets {
    fn node_addresses(&self) -> Vec<String> {
        let mut all = vec![self.outside_host.to_string()];
        all.extend(self.gateways.iter().cloned());
        if !self.node_ip.is_empty() {
            all.push(self.node_ip.clone());
        }
        all
    }
}

/// The rows of the table, each a script tried from a job of `team-a`: (what, script).
/// `b_at` is where tenant B's listener is (its address, or the node's loopback when it is
/// on the node's network); `rdv` the gang's rendezvous.
fn net_rows(
    t: &NetTargets,
    b_at: &str,
    b_port: u16,
    rdv: (&str, u16),
) -> Vec<(&'static str, String)> {
    let each = |f: &dyn Fn(&str) -> String, addrs: &[String]| -> String {
        addrs.iter().map(|a| f(a)).collect::<Vec<_>>().join("\n")
    };
    let mut local = vec!["127.0.0.1".to_owned()];
    local.extend(t.node_addresses());
    vec![
        (
            "another tenant's listener on the node",
            format!(
                "try {b_at} {b_port}\n{}",
                each(&|a| format!("try {a} {b_port}"), &local)
            ),
        ),
        (
            "the control plane's API and /auth/dev",
            each(
                &|a| {
                    format!(
                        "web {a} {p} /healthz\nweb {a} {p} /auth/dev",
                        p = t.api_port
                    )
                },
                &local,
            ),
        ),
        (
            "the agent's and the server's metrics",
            each(
                &|a| {
                    format!(
                        "web {a} {} /metrics\nweb {a} {} /metrics",
                        t.server_metrics_port, t.agent_metrics_port
                    )
                },
                &local,
            ),
        ),
        (
            "the node's own addresses",
            each(&|a| format!("try {a} {}", t.node_service_port), &local),
        ),
        (
            "169.254.169.254 and link-local services",
            format!(
                "try 169.254.169.254 80\nweb 169.254.169.254 80 /latest/meta-data/\ntry {} {}",
                t.link_local, t.link_local_port
            ),
        ),
        (
            "the rendezvous port of another tenant's gang",
            format!(
                "try {a} {p}\n\
                 (echo squatted | busybox nc -l -p {p} >/dev/null 2>&1 &) ; sleep 3; echo squat-tried",
                a = rdv.0,
                p = rdv.1
            ),
        ),
    ]
}

/// What a job's log says of the gang's rendezvous: `(MASTER_ADDR, MASTER_PORT)`.
fn rendezvous_of(log: &str) -> Option<(String, u16)> {
    let line = log.lines().find(|l| l.starts_with("rdv "))?;
    let mut f = line.split_whitespace().skip(1);
    Some((f.next()?.to_owned(), f.next()?.parse().ok()?))
}

/// A gang of two (one replica a node) of `tenant` on `network`: replica 0 serves a token on
/// its rendezvous port, replica 1 reads it from `MASTER_ADDR:MASTER_PORT`. Its id, and the
/// rendezvous once replica 0 runs.
async fn rendezvous_gang(
    c: &TestCluster,
    tenant: &str,
    image: &str,
    network: &str,
) -> (String, (String, u16)) {
    let script = "echo rdv $MASTER_ADDR $MASTER_PORT; \
        if [ \"$RANK\" = 0 ]; then \
          while :; do echo token-of-replica-0 | busybox nc -l -p $MASTER_PORT >/dev/null 2>&1; done; \
        else \
          for i in $(seq 120); do \
            out=$(busybox nc -w 2 $MASTER_ADDR $MASTER_PORT </dev/null 2>/dev/null); \
            if [ -n \"$out\" ]; then echo \"got $out\"; break; fi; sleep 0.5; \
          done; sleep 300; \
        fi";
    let id = c
        .submit_with(
            tenant,
            json!({ "gpus": 1, "replicas": 2, "image": image, "network": network }),
            &["sh", "-c", script],
        )
        .await;
    let rdv = c
        .eventually("replica 0 tells its rendezvous", || async {
            rendezvous_of(&c.log_of(&id).await)
        })
        .await;
    (id, rdv)
}

/// Replica 1's log, once it has tried the rendezvous.
async fn replica_one_log(c: &TestCluster, gang: &str) -> String {
    c.eventually("replica 1 reaches the rendezvous", || async {
        let (_, g) = c.get(&format!("/api/v1/jobs/{gang}")).await;
        let id = g["gang"].as_array()?.iter().find(|r| r["rank"] == 1)?["id"]
            .as_str()?
            .to_owned();
        let log = c.log_of(&id).await;
        log.contains("got ").then_some(log)
    })
    .await
}

async fn set_policy(c: &TestCluster, tenant: &str, policy: Value) {
    let (status, body) = c
        .put(&format!("/api/v1/tenants/{tenant}/policy"), policy)
        .await;
    assert!(status.is_success(), "{body}");
}

async fn cancel(c: &TestCluster, id: &str) {
    let (status, _) = c
        .post(&format!("/api/v1/jobs/{id}/cancel"), json!({}))
        .await;
    assert!(status.is_success());
    c.wait_for_end(id).await;
}

/// Every row's attack tried from `team-a`'s job on `network`: (what, the job, its log).
async fn run_net_rows(
    c: &TestCluster,
    image: &str,
    network: &str,
    rows: &[(&'static str, String)],
) -> Vec<(&'static str, Value, String)> {
    let mut ids = Vec::new();
    for (_, script) in rows {
        let script = format!("{NET_PRELUDE}\n{script}");
        ids.push(
            c.submit_with(
                "team-a",
                json!({ "gpus": 0, "image": image, "network": network }),
                &["sh", "-c", &script],
            )
            .await,
        );
    }
    let mut out = Vec::new();
    for ((what, _), id) in rows.iter().zip(ids) {
        out.push((*what, c.wait_for_end(&id).await, c.log_of(&id).await));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_job_reaches_only_what_its_network_policy_allows() {
    if !require_container_support() {
        return;
    }
    let registry = Registry::start();
    for t in ["team-a", "team-b", "team-c", "team-d"] {
        push_busybox(&registry, &format!("{t}/busybox:1")).await;
    }
    let image = |t: &str| format!("{}/{t}/busybox:1", registry.addr);
    let outside = Outside::create();
    let outside_port = outside.listen(outside.ip, "the-outside-world");
    let outside_other_port = outside.listen(outside.ip, "another-outside-service");
    let link_local_port = outside.listen(outside.link_local, "link-local-service");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let node_service_port = listen_on_host(
        "0.0.0.0:0".parse().expect("addr"),
        "node-service",
        stop.clone(),
    );
    // The agents' metrics on every address of the node (an operator's mistake the network
    // must survive), the server's too.
    let agent_metrics_port = allot_system_tests::replica::free_port();
    let c = confined_cluster_configured(
        &registry,
        2,
        "1xH200",
        |s| s.metrics_listen = Some("0.0.0.0:0".parse().expect("addr")),
        move |a| {
            if a.node_name == "node-1" {
                a.metrics_listen = Some(([0, 0, 0, 0], agent_metrics_port).into());
            }
        },
    )
    .await;
    for t in ["team-a", "team-b", "team-c", "team-d"] {
        c.create_tenant(t, None).await;
    }
    let gateways: Vec<String> = ["node-1", "node-2"]
        .iter()
        .map(|n| {
            let subnet = std::fs::read_to_string(c.data_dir.path().join(n).join("oci/network"))
                .expect("the agent's job subnet");
            let net: ipnet::Ipv4Net = subnet.trim().parse().expect("subnet");
            std::net::Ipv4Addr::from(u32::from(net.network()) + 1).to_string()
        })
        .collect();
    assert_ne!(
        gateways[0], gateways[1],
        "agents on one host take different subnets"
    );
    let targets = NetTargets {
        node_ip: allot_agent::route_address("http://198.51.100.1:80"),
        gateways,
        api_port: c.server.http_addr.port(),
        server_metrics_port: c.server.metrics_addr.expect("server metrics").port(),
        agent_metrics_port,
        node_service_port,
        outside: outside.ip,
        outside_host: outside.host_ip,
        outside_port,
        outside_other_port,
        link_local: outside.link_local,
        link_local_port,
    };

    // Tenant B's listener, in its own network; tenant C's gang.
    let b_port = allot_system_tests::replica::free_port();
    let b = c
        .submit_with(
            "team-b",
            json!({ "gpus": 0, "image": image("team-b") }),
            &[
                "sh",
                "-c",
                &format!(
                    "echo b-at $(grep job /etc/hosts | cut -f1); \
                 while :; do echo secret-of-b | busybox nc -l -p {b_port} >/dev/null 2>&1; done"
                ),
            ],
        )
        .await;
    let b_at = c
        .eventually("B tells its address", || async {
            let log = c.log_of(&b).await;
            let line = log.lines().find(|l| l.starts_with("b-at "))?.to_owned();
            let addr = line.trim_start_matches("b-at ").trim().to_owned();
            (!addr.is_empty()).then_some(addr)
        })
        .await;
    let (gang, rdv) = rendezvous_gang(&c, "team-c", &image("team-c"), "private").await;

    // Each row from a job with its own network: every target refused.
    let rows = net_rows(&targets, &b_at, b_port, (&rdv.0, rdv.1));
    let results = run_net_rows(&c, &image("team-a"), "private", &rows).await;
    for (what, job, log) in &results {
        assert_eq!(job["state"], "succeeded", "{what}: {job:#}\n{log}");
        println!("{what}:\n{log}");
        assert!(
            log.contains("REFUSED") && !log.contains("BREACH"),
            "{what}: the job got through:\n{log}"
        );
    }
    // The gang's replicas met at their rendezvous, the squatter notwithstanding.
    let one = replica_one_log(&c, &gang).await;
    assert!(one.contains("got token-of-replica-0"), "{one}");
    // The outside world is reachable by default, and an admin's allow-list holds.
    set_policy(
        &c,
        "team-d",
        json!({ "egress": [{ "cidr": format!("{}/32", targets.outside), "ports": targets.outside_port.to_string() }] }),
    )
    .await;
    let allowed = format!(
        "{NET_PRELUDE}\nreach {o} {p}\ntry {o} {q}\ntry {ll} {llp}",
        o = targets.outside,
        p = targets.outside_port,
        q = targets.outside_other_port,
        ll = targets.link_local,
        llp = targets.link_local_port,
    );
    let open = c
        .submit_with(
            "team-a",
            json!({ "gpus": 0, "image": image("team-a") }),
            &[
                "sh",
                "-c",
                &format!(
                    "{NET_PRELUDE}\nreach {} {}",
                    targets.outside, targets.outside_port
                ),
            ],
        )
        .await;
    let listed = c
        .submit_with(
            "team-d",
            json!({ "gpus": 0, "image": image("team-d") }),
            &["sh", "-c", &allowed],
        )
        .await;
    for (id, what) in [(&open, "the default egress"), (&listed, "an allow-list")] {
        let (job, log) = (c.wait_for_end(id).await, c.log_of(id).await);
        println!("{what}:\n{log}");
        assert_eq!(job["state"], "succeeded", "{job:#}\n{log}");
        assert!(
            log.contains("REACHED") && log.contains("the-outside-world"),
            "{what}: {log}"
        );
        assert!(!log.contains("BREACH"), "{what}: {log}");
    }
    cancel(&c, &gang).await;
    cancel(&c, &b).await;

    // The negative control: the same table from jobs on the node's network (their
    // tenants' policies allow it) shows each breach, so every check above can fail.
    for t in ["team-a", "team-b", "team-c"] {
        set_policy(&c, t, json!({ "allow_host_network": true })).await;
    }
    let b = c
        .submit_with(
            "team-b",
            json!({ "gpus": 0, "image": image("team-b"), "network": "host" }),
            &["sh", "-c", &format!(
                "echo b-ready; while :; do echo secret-of-b | busybox nc -l -p {b_port} >/dev/null 2>&1; done"
            )],
        )
        .await;
    c.eventually("B listens on the node", || async {
        c.log_of(&b).await.contains("b-ready").then_some(())
    })
    .await;
    let (gang, rdv) = rendezvous_gang(&c, "team-c", &image("team-c"), "host").await;
    let rows = net_rows(&targets, "127.0.0.1", b_port, (&rdv.0, rdv.1));
    for (what, job, log) in run_net_rows(&c, &image("team-a"), "host", &rows).await {
        assert_eq!(job["state"], "succeeded", "{what}: {job:#}\n{log}");
        assert!(
            log.contains("BREACH"),
            "{what}: on the node's network the check saw no breach, so it cannot fail:\n{log}"
        );
    }
    cancel(&c, &gang).await;
    cancel(&c, &b).await;
    // Each host-network job was audited as such (the rows, B's listener, both replicas).
    let (_, found) = c
        .eventually("the host-network jobs' audit entries", || async {
            let (status, found) = c.get("/api/v1/audit/entries?action=job.host_network").await;
            let n = found["entries"].as_array().map_or(0, Vec::len);
            (n >= rows.len() + 3).then_some((status, found))
        })
        .await;
    for e in found["entries"].as_array().expect("entries") {
        let body: Value = serde_json::from_str(e["body"].as_str().expect("body")).expect("entry");
        assert_eq!(body["after"]["network"], "host", "{body:#}");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    c.shutdown().await;
}

/// The development sign-in, taken from inside a job: GET `/auth/dev` (its `Host` a
/// loopback name), the page's CSRF cookie and token, POST the admin's id (HTTP spoken
/// through `nc`). Prints `BREACH` when a session came back, `REFUSED` otherwise, for each
/// loopback name tried.
fn dev_sign_in_attack(port: u16) -> String {
    format!(
        r#"
for h in 127.0.0.1 localhost; do
  page=$(printf 'GET /auth/dev HTTP/1.0\r\nHost: %s:{port}\r\n\r\n' "$h" | busybox nc -w 3 127.0.0.1 {port} 2>/dev/null | tr -d '\r')
  line=$(echo "$page" | grep 'Sign in as Dev Admin')
  if [ -z "$line" ]; then echo "REFUSED GET /auth/dev as $h"; continue; fi
  user=$(echo "$line" | sed 's/.*name="user" value="\([^"]*\)".*/\1/')
  csrf=$(echo "$line" | sed 's/.*name="csrf_token" value="\([^"]*\)".*/\1/')
  cookie=$(echo "$page" | grep -i '^set-cookie:' | head -n 1 | sed 's/^[^:]*: *\([^;]*\).*/\1/')
  body="user=$user&csrf_token=$csrf"
  resp=$(printf 'POST /auth/dev HTTP/1.0\r\nHost: %s:{port}\r\nOrigin: http://%s:{port}\r\nCookie: %s\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: %s\r\n\r\n%s' \
    "$h" "$h" "$cookie" "${{#body}}" "$body" | busybox nc -w 3 127.0.0.1 {port} 2>/dev/null | tr -d '\r')
  if echo "$resp" | grep -qi '^set-cookie: allot_session'; then echo "BREACH signed in as the dev admin through $h"; else echo "REFUSED sign-in through $h"; echo "$resp" | head -n 1; fi
done
"#
    )
}

/// `allot dev --runtime oci`: a job cannot sign in as the development admin through the
/// control plane's loopback listener (it has a network of its own); with the node's network
/// (the tenant's policy allowing it) the same script does, so the check can fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_job_in_allot_dev_cannot_sign_in_as_the_dev_admin() {
    use std::io::BufRead;
    if !require_container_support() {
        return;
    }
    let registry = Registry::start();
    push_busybox(&registry, "team-a/busybox:1").await;
    let home = tempfile::tempdir().expect("temp dir");
    allot_system_tests::oci::searchable(home.path());
    let data = home.path().join("data");
    let mut child = std::process::Command::new(allot_system_tests::allot_bin())
        .args([
            "dev",
            "--runtime",
            "oci",
            "--nodes",
            "1",
            "--listen",
            "127.0.0.1:0",
        ])
        .arg("--insecure-registry")
        .arg(&registry.addr)
        .arg("--data-dir")
        .arg(&data)
        .env("ALLOT_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("allot dev starts");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send(line);
        }
    });
    let url = loop {
        let line = rx
            .recv_timeout(Duration::from_secs(120))
            .expect("allot dev prints its URL");
        if let Some(rest) = line.trim().strip_prefix("API:") {
            break rest.trim().to_owned();
        }
    };
    let port: u16 = url
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("port");
    let token = std::fs::read_to_string(data.join("admin.token")).expect("admin token");
    let api = DevApi {
        http: allot_system_tests::http_client().build().expect("client"),
        url: url.clone(),
        token: token.trim().to_owned(),
    };
    let (status, body) = api
        .call(
            reqwest::Method::POST,
            "/api/v1/tenants",
            json!({ "name": "team-a" }),
        )
        .await;
    assert!(status.is_success(), "{body}");
    let image = format!("{}/team-a/busybox:1", registry.addr);
    let script = dev_sign_in_attack(port);
    let run = |network: Option<&'static str>| api.run(&image, network, &script);
    let (job, log) = run(None).await;
    println!("from a job's own network:\n{log}");
    assert_eq!(job["state"], "succeeded", "{job:#}\n{log}");
    assert!(
        log.contains("REFUSED") && !log.contains("BREACH"),
        "the dev sign-in worked from a job:\n{log}"
    );
    // Host network is refused at submit while the policy does not allow it.
    let (status, refused) = api
        .call(
        reqwest::Method::POST,
        "/api/v1/jobs",
        json!({ "tenant": "team-a", "gpus": 0, "image": image, "network": "host", "command": ["true"] }),
    )
    .await;
    assert_eq!(
        status,
        reqwest::StatusCode::UNPROCESSABLE_ENTITY,
        "{refused}"
    );
    assert_eq!(refused["errors"][0]["field"], "network", "{refused}");
    let (status, body) = api
        .call(
            reqwest::Method::PUT,
            "/api/v1/tenants/team-a/policy",
            json!({ "allow_host_network": true }),
        )
        .await;
    assert!(status.is_success(), "{body}");
    let (job, log) = run(Some("host")).await;
    println!("from the node's network:\n{log}");
    assert_eq!(job["state"], "succeeded", "{job:#}\n{log}");
    assert!(
        log.contains("BREACH"),
        "the negative control did not sign in, so the check cannot fail:\n{log}"
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("pid")),
        nix::sys::signal::Signal::SIGINT,
    )
    .expect("SIGINT");
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().expect("wait").is_none() {
        assert!(Instant::now() < deadline, "allot dev did not stop");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The API of an `allot dev` the test started, as its admin.
struct DevApi {
    http: reqwest::Client,
    url: String,
    token: String,
}

impl DevApi {
    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Value,
    ) -> (reqwest::StatusCode, Value) {
        let res = self
            .http
            .request(method, format!("{}{path}", self.url))
            .bearer_auth(&self.token)
            .json(&body)
            .send()
            .await
            .expect("request");
        let status = res.status();
        (status, res.json::<Value>().await.unwrap_or(Value::Null))
    }

    /// Runs `script` as a job of team-a (on `network`, else the default) to its end: the
    /// job and its log.
    async fn run(&self, image: &str, network: Option<&str>, script: &str) -> (Value, String) {
        let mut fields = json!({ "tenant": "team-a", "gpus": 0, "image": image, "command": ["sh", "-c", script] });
        if let Some(n) = network {
            fields["network"] = json!(n);
        }
        let (status, job) = self
            .call(reqwest::Method::POST, "/api/v1/jobs", fields)
            .await;
        assert!(status.is_success(), "{job}");
        let id = job["id"].as_str().expect("id").to_owned();
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let (_, j) = self
                .call(
                    reqwest::Method::GET,
                    &format!("/api/v1/jobs/{id}"),
                    Value::Null,
                )
                .await;
            if matches!(
                j["state"].as_str(),
                Some("succeeded" | "failed" | "cancelled")
            ) {
                let log = self
                    .http
                    .get(format!("{}/api/v1/jobs/{id}/log", self.url))
                    .bearer_auth(&self.token)
                    .send()
                    .await
                    .expect("log")
                    .text()
                    .await
                    .expect("text");
                return (j, log);
            }
            assert!(Instant::now() < deadline, "the job did not end: {j:#}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// The default seccomp profile is an allow list: each call of the table, made from a job's
/// container, ends as the row says. Refused calls are refused with `EPERM` (`clone3` with
/// `ENOSYS`, so C libraries fall back to `clone`, whose flags the filter reads); the same
/// program on the host, with no filter, is not refused them (so the refusal is the
/// profile's). `io_uring_setup` and `memfd_secret` are on no deny list, and the host does
/// not refuse them: refused in the container, they show that what the list does not name
/// is refused. (A call newer than any the list names is `ENOSYS`, which runc answers so
/// that C libraries fall back.) What programs need (threads, fork, files, sockets, memory,
/// timers) still works.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_seccomp_profile_refuses_all_but_what_programs_need() {
    if !require_container_support() {
        return;
    }
    let probe = syscall_probe();
    let host = std::process::Command::new(&probe)
        .output()
        .expect("the probe runs on the host");
    let host = syscall_outcomes(&String::from_utf8_lossy(&host.stdout));
    let registry = Registry::start();
    registry
        .push(
            "team-a/probe:1",
            &[
                busybox_layer(),
                layer(|b| {
                    add_file(
                        b,
                        "bin/syscalls",
                        &std::fs::read(&probe).expect("probe"),
                        0o755,
                    )
                }),
            ],
            json!({ "Env": ["PATH=/bin"] }),
        )
        .await;
    let c = confined_cluster(&registry, 1, "1xH200", 64).await;
    c.create_tenant("team-a", None).await;
    let id = c
        .submit_with(
            "team-a",
            json!({ "gpus": 0, "image": format!("{}/team-a/probe:1", registry.addr) }),
            &["/bin/syscalls"],
        )
        .await;
    let job = c.wait_for_end(&id).await;
    let log = c.log_of(&id).await;
    assert_eq!(job["state"], "succeeded", "{job:#}\n{log}");
    let inside = syscall_outcomes(&log);
    let refused = [
        "io_uring_setup",
        "io_uring_enter",
        "io_uring_register",
        "unshare_user",
        "unshare_net",
        "clone_newuser",
        "mount",
        "umount2",
        "fsopen",
        "bpf",
        "keyctl",
        "perf_event_open",
        "userfaultfd",
        "setns",
        "open_by_handle_at",
        "name_to_handle_at",
        "reboot",
        "finit_module",
        "swapon",
        "kcmp",
        "syslog",
        "chroot",
        "settimeofday",
        "personality_exec",
        "memfd_secret",
    ];
    let allowed = [
        "getpid",
        "fork",
        "thread",
        "uname",
        "openat_read",
        "memfd_create",
        "eventfd2",
        "epoll_create1",
        "pipe2",
        "socket",
        "mmap",
        "getrandom",
        "prctl",
        "sched_getaffinity",
        "personality_query",
        "membarrier",
        "close_range",
    ];
    let mut rows: Vec<(&str, &str)> = refused.iter().map(|c| (*c, "EPERM")).collect();
    rows.push(("clone3", "ENOSYS"));
    rows.extend(allowed.iter().map(|c| (*c, "OK")));
    let wrong: Vec<String> = rows
        .iter()
        .filter(|(call, want)| inside.get(*call).map(String::as_str) != Some(*want))
        .map(|(call, want)| format!("{call}: {:?}, not {want}", inside.get(*call)))
        .collect();
    assert!(wrong.is_empty(), "in the container: {wrong:#?}\n{log}");
    assert_eq!(
        inside.len(),
        rows.len(),
        "every call of the probe is in the table: {log}"
    );
    // The negative control: on the host, with no filter, none is refused with EPERM.
    for call in refused.iter().chain(["clone3"].iter()) {
        let on_host = host.get(*call).map(String::as_str);
        assert!(
            on_host.is_some() && on_host != Some("EPERM"),
            "{call} on the host: {on_host:?}"
        );
    }
    c.shutdown().await;
}
