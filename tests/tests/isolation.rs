//! Jobs are confined on a shared node: tried as a malicious tenant would, with real `runc`,
//! the real agent and images from a real registry on loopback. Tenant B's job runs on the
//! node while each of tenant A's attacks runs beside it; every attack is refused, and the
//! refusal is asserted (from what the attack printed, how it ended, and what the node sees).
//!
//! Each attack script prints `REFUSED` where the node held and `BREACH` where it did not.

use std::time::{Duration, Instant};

use allot_system_tests::TestCluster;
use allot_system_tests::oci::{
    Registry, add_file, busybox_layer, cgroup_of, confined_cluster, layer, process_running,
    push_busybox, require_container_support, syscall_outcomes, syscall_probe,
};
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
    let registry = Registry::start();
    push_busybox(&registry, "team-a/busybox:1").await;
    let c = confined_cluster(&registry, 1, "1xH200", 64).await;
    c.create_tenant("team-a", None).await;
    let id = c
        .submit_with(
            "team-a",
            json!({ "gpus": 0, "cpu_milli": 500, "image": format!("{}/team-a/busybox:1", registry.addr) }),
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
