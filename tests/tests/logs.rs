//! Job logs reach the API whole and in order, however a job writes them: slowly, in bursts,
//! in long lines, as binary, or in great amounts (past what the control plane keeps, the log
//! says where it was cut and by how many bytes); and an agent killed and started again
//! ships what its attempt wrote that it had not yet shipped. Read through the real CLI
//! (`job submit --wait`, `job logs`, `job logs -f`) and the API, against a real control
//! plane and real agents.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Output, Stdio};

use std::time::{Duration, Instant};

use allot_domain::joblog::{HEAD_BYTES, TAIL_BYTES};
use allot_system_tests::{
    Backend, TestCluster, agent_process, allot_bin, spawn_cluster, spawn_cluster_with,
};

/// Runs `allot …` against the cluster as its admin.
fn cli(c: &TestCluster, args: &[&str]) -> Output {
    c.cli_output(args)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The job's whole log, as bytes, from the API.
async fn log_bytes(c: &TestCluster, id: &str, attempt: Option<u32>) -> Vec<u8> {
    let mut url = c.url(&format!("/api/v1/jobs/{id}/log"));
    if let Some(a) = attempt {
        url.push_str(&format!("?attempt={a}"));
    }
    let res = c
        .http
        .get(url)
        .bearer_auth(&c.admin_token)
        .send()
        .await
        .expect("log");
    assert!(res.status().is_success(), "{}", res.status());
    res.bytes().await.expect("bytes").to_vec()
}

/// Runs a CPU-only job of tenant `t` that prints the file at `input` `times` times, a
/// second apart, and waits for it to succeed; its id.
async fn print_file(c: &TestCluster, input: &std::path::Path, times: usize) -> String {
    let cat = format!("cat {}", input.display());
    let script = vec![cat; times].join("; sleep 1; ");
    let id = c
        .submit_with(
            "t",
            serde_json::json!({ "gpus": 0 }),
            &["sh", "-c", &script],
        )
        .await;
    let job = c.wait_for_end(&id).await;
    assert_eq!(job["state"], "succeeded", "{job}");
    id
}

/// The node's own file of the job's attempt.
fn node_log(c: &TestCluster, node: &str, id: &str, attempt: u32) -> std::path::PathBuf {
    c.data_dir
        .path()
        .join(node)
        .join("logs")
        .join(format!("{id}.{attempt}.log"))
}

fn lines(n: u32) -> String {
    (1..=n).map(|i| format!("t={i}\n")).collect()
}

/// A slow writer's every line reaches `job submit --wait` as it is written and `job logs`
/// afterwards: 40 lines a quarter-second apart through `--wait`, beside a job writing a line
/// every 0.2 s for 20 s read back with `job logs` and `job logs -f`. (Only the first five
/// writes of each attempt used to reach the API.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_writers_every_line_arrives_in_order() {
    let c = spawn_cluster(Backend::Sqlite, 1, "2xH200").await;
    c.create_tenant("t", None).await;
    let slow = cli(
        &c,
        &[
            "job",
            "submit",
            "--tenant",
            "t",
            "--gpus",
            "0",
            "--name",
            "slow",
            "--",
            "sh",
            "-c",
            "for i in $(seq 1 100); do echo t=$i; sleep 0.2; done",
        ],
    );
    assert!(slow.status.success(), "{}", text(&slow.stderr));
    let slow_id = text(&slow.stdout).trim().to_owned();
    let follower = std::thread::spawn({
        let (server, token, id) = (c.server.http_url(), c.admin_token.clone(), slow_id.clone());
        move || {
            Command::new(allot_bin())
                .args(["job", "logs", &id, "-f"])
                .env("ALLOT_SERVER", server)
                .env("ALLOT_TOKEN", token)
                .output()
                .expect("allot runs")
        }
    });

    let waited = tokio::task::spawn_blocking({
        let (server, token) = (c.server.http_url(), c.admin_token.clone());
        move || {
            Command::new(allot_bin())
                .args([
                    "job",
                    "submit",
                    "--tenant",
                    "t",
                    "--gpus",
                    "0",
                    "--wait",
                    "--",
                    "sh",
                    "-c",
                    "for i in $(seq 1 40); do echo t=$i; sleep 0.25; done",
                ])
                .env("ALLOT_SERVER", server)
                .env("ALLOT_TOKEN", token)
                .output()
                .expect("allot runs")
        }
    })
    .await
    .expect("--wait");
    assert!(waited.status.success(), "{}", text(&waited.stderr));
    assert_eq!(text(&waited.stdout), lines(40), "{}", text(&waited.stderr));
    let waited_id = text(&waited.stderr)
        .split_whitespace()
        .nth(1)
        .expect("the job's id")
        .to_owned();
    let logs = cli(&c, &["job", "logs", &waited_id]);
    assert_eq!(text(&logs.stdout), lines(40));

    c.wait_for_end(&slow_id).await;
    let logs = cli(&c, &["job", "logs", "slow"]);
    assert_eq!(text(&logs.stdout), lines(100));
    let followed = follower.join().expect("follower");
    assert!(followed.status.success(), "{}", text(&followed.stderr));
    assert_eq!(text(&followed.stdout), lines(100));
    // What the API serves is what the node wrote, byte for byte.
    let node_file = node_log(&c, "node-1", &slow_id, 1);
    assert_eq!(
        std::fs::read(node_file).expect("node's log"),
        lines(100).as_bytes()
    );
    c.shutdown().await;
}

/// Bursts, lines longer than a chunk and binary output come back byte for byte (`job logs
/// --raw`), and a log written faster than it is shipped catches up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bursts_long_lines_and_binary_output_come_back_whole() {
    let c = spawn_cluster(Backend::Sqlite, 1, "2xH200").await;
    c.create_tenant("t", None).await;
    let dir = tempfile::tempdir().expect("temp dir");
    // 3,000 short lines at once, a 700 KiB line, every byte value, and a final line
    // without its newline.
    let mut expected = Vec::new();
    for i in 0..3000 {
        expected.extend_from_slice(format!("burst line {i}\n").as_bytes());
    }
    expected.extend(std::iter::repeat_n(b'L', 700 * 1024));
    expected.push(b'\n');
    for _ in 0..64 {
        expected.extend(0u8..=255);
    }
    expected.extend_from_slice(b"no newline at the end");
    let input = dir.path().join("output.bin");
    std::fs::write(&input, &expected).expect("write");
    let id = print_file(&c, &input, 2).await;
    let twice = [expected.clone(), expected.clone()].concat();
    assert!(twice.len() as u64 <= HEAD_BYTES + TAIL_BYTES, "kept whole");
    assert_eq!(log_bytes(&c, &id, None).await, twice);
    let raw = cli(&c, &["job", "logs", &id, "--raw"]);
    assert!(raw.status.success(), "{}", text(&raw.stderr));
    assert!(raw.stdout == twice, "--raw gives the bytes as written");
    c.shutdown().await;
}

/// 100 MB of output: the API keeps its first MiB and last 4 MiB exactly, and says between
/// them how many bytes it did not keep, to the byte; the node keeps its head and its last
/// 64 MiB, and frees the rest of the file's blocks as it goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_megabytes_are_cut_where_said_and_bounded_on_the_node() {
    use std::os::unix::fs::MetadataExt;
    let c = spawn_cluster(Backend::Sqlite, 1, "2xH200").await;
    c.create_tenant("t", None).await;
    let dir = tempfile::tempdir().expect("temp dir");
    // Distinct lines, so an offset out of place shows.
    let mut expected = Vec::with_capacity(100_000_000 + 64);
    let mut i = 0u64;
    while expected.len() < 100_000_000 {
        expected.extend_from_slice(format!("{i:015}\n").as_bytes());
        i += 1;
    }
    let input = dir.path().join("big.txt");
    std::fs::write(&input, &expected).expect("write");
    let id = print_file(&c, &input, 1).await;
    let log = log_bytes(&c, &id, None).await;
    let head = usize::try_from(HEAD_BYTES).expect("fits");
    let tail = usize::try_from(TAIL_BYTES).expect("fits");
    let dropped = expected.len() - head - tail;
    assert_eq!(&log[..head], &expected[..head], "the head is kept whole");
    assert_eq!(
        &log[log.len() - tail..],
        &expected[expected.len() - tail..],
        "the tail is kept whole"
    );
    let note = text(&log[head..log.len() - tail]);
    assert!(
        note.contains(&format!("{dropped} bytes")) && note.contains("not kept here"),
        "the cut is said, to the byte: {note}"
    );
    assert!(
        note.contains("node node-1"),
        "and where more of it is: {note}"
    );
    // On the node: the file keeps its length (offsets hold), its middle's blocks freed.
    let node_file = node_log(&c, "node-1", &id, 1);
    let meta = std::fs::metadata(&node_file).expect("node's log");
    assert_eq!(meta.len(), expected.len() as u64);
    let on_disk = meta.blocks() * 512;
    assert!(
        on_disk <= HEAD_BYTES + allot_agent::DEFAULT_JOB_LOG_TAIL + (8 << 20),
        "the node keeps {on_disk} bytes of a {} byte log",
        meta.len()
    );
    c.shutdown().await;
}

/// Sends `signal` to a process this test started.
fn signal(child: &Child, signal: nix::sys::signal::Signal) {
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("pid"));
    nix::sys::signal::kill(pid, signal).expect("signalled");
}

/// An agent stopped mid-job (SIGSTOP, so nothing it ships goes out while the job goes on
/// writing), then SIGKILLed and started again: what the attempt wrote meanwhile reaches the
/// API when the agent is back (attempt 1's log there is the node's file, byte for byte); the
/// job runs again as attempt 2 on the other node, and `job submit --wait` prints attempt 1's
/// lines, says the attempt ended, then prints all 40 lines of attempt 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_killed_mid_job_ships_what_its_attempt_wrote_when_it_is_back() {
    let c = spawn_cluster_with(Backend::Sqlite, 0, "", |cfg| {
        cfg.lease = Duration::from_secs(30);
    })
    .await;
    c.create_tenant("t", None).await;
    let token = allot_system_tests::bootstrap_token(&c.server).await;
    let mut a = agent_process(&c, "agent-a", "1xH200", Some(&token));
    c.eventually("agent-a ready", || async {
        let (_, nodes) = c.get("/api/v1/nodes").await;
        (nodes.as_array().map_or(0, Vec::len) == 1 && nodes[0]["status"] == "ready").then_some(())
    })
    .await;
    // --wait follows the job from the start, through its requeue.
    let mut waiter = Command::new(allot_bin())
        .args([
            "job",
            "submit",
            "--tenant",
            "t",
            "--gpus",
            "1",
            "--name",
            "steady",
            "--wait",
            "--",
            "sh",
            "-c",
            "for i in $(seq 1 40); do echo t=$i; sleep 0.25; done",
        ])
        .env("ALLOT_SERVER", c.server.http_url())
        .env("ALLOT_TOKEN", &c.admin_token)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("allot runs");
    let stdout = waiter.stdout.take().expect("stdout");
    let printed = std::thread::spawn(move || {
        BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .collect::<Vec<_>>()
    });
    let job = c
        .eventually("the job to run and write", || async {
            let (_, jobs) = c.get("/api/v1/jobs?name=steady").await;
            let j = jobs["items"][0].clone();
            (j["state"] == "running").then_some(j)
        })
        .await;
    let id = job["id"].as_str().expect("id").to_owned();
    let node_file = node_log(&c, "agent-a", &id, 1);
    let started = Instant::now();
    while std::fs::read(&node_file).map_or(0, |b| b.len()) < lines(8).len() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the job writes"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Held still: the job writes on (it is a process of its own), nothing is shipped.
    signal(&a, nix::sys::signal::Signal::SIGSTOP);
    let shipped_before = log_bytes(&c, &id, Some(1)).await.len();
    tokio::time::sleep(Duration::from_secs(2)).await;
    signal(&a, nix::sys::signal::Signal::SIGKILL);
    let _ = a.wait();
    let written = std::fs::read(&node_file).expect("node's log");
    assert!(
        written.len() >= shipped_before + lines(12).len() - lines(8).len(),
        "the job wrote while its agent was held: {} then {}",
        shipped_before,
        written.len()
    );
    // The other node, for attempt 2 (a lost node is avoided for a while).
    let token_b = allot_system_tests::bootstrap_token(&c.server).await;
    let mut b = agent_process(&c, "agent-b", "1xH200", Some(&token_b));
    a = agent_process(&c, "agent-a", "1xH200", None);
    let written = std::fs::read(&node_file).expect("node's log");
    c.eventually("attempt 1's log to be whole", || async {
        (log_bytes(&c, &id, Some(1)).await == written).then_some(())
    })
    .await;
    // Attempt 2 runs its 10 s whole, on a machine that may be busy.
    let until = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(s) = waiter.try_wait().expect("--wait") {
            break s;
        }
        if Instant::now() > until {
            let (_, job) = c.get(&format!("/api/v1/jobs/{id}")).await;
            let _ = waiter.kill();
            panic!("--wait did not end; the job is {job:#}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let printed = printed.join().expect("stdout read");
    assert!(status.success(), "{printed:?}");
    let first: Vec<&String> = printed
        .iter()
        .take_while(|l| !l.contains("attempt 1 ended"))
        .collect();
    let written_lines: Vec<String> = text(&written).lines().map(str::to_owned).collect();
    assert_eq!(
        first.iter().filter(|l| !l.is_empty()).count(),
        written_lines.len(),
        "--wait printed attempt 1 as the node wrote it: {printed:?}"
    );
    let second: Vec<&str> = printed
        .iter()
        .skip_while(|l| !l.contains("attempt 1 ended"))
        .skip(1)
        .map(String::as_str)
        .collect();
    assert_eq!(
        second.join("\n") + "\n",
        lines(40),
        "then all of attempt 2: {printed:?}"
    );
    let (_, job) = c.get(&format!("/api/v1/jobs/{id}")).await;
    assert_eq!(job["attempt"], 2, "{job}");
    assert_eq!(job["state"], "succeeded", "{job}");
    for agent in [&mut a, &mut b] {
        let _ = agent.kill();
        let _ = agent.wait();
    }
    c.shutdown().await;
}
