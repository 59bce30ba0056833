//! The quick start as a user runs it: the real `allot` binary, `allot dev` on a free port,
//! the token read from the file it writes, a job run through the CLI with `--wait`, Ctrl-C,
//! and a restart that keeps the data.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use allot_system_tests::allot_bin;

struct Dev {
    child: Child,
    url: String,
}

/// Starts `allot dev` and reads its banner until the API URL appears.
fn start_dev(bin: &Path, data_dir: &Path, listen: &str) -> Dev {
    let mut child = Command::new(bin)
        .args(["dev", "--listen", listen, "--data-dir"])
        .arg(data_dir)
        .env("ALLOT_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("allot dev starts");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        // Keep reading after the URL is found, as a terminal would: the pipe stays open.
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let url = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = rx.recv_timeout(left).expect("allot dev prints its URL");
        if let Some(rest) = line.trim().strip_prefix("API:") {
            break rest.trim().to_owned();
        }
    };
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    Dev { child, url }
}

impl Dev {
    /// Ctrl-C, and the exit status.
    fn interrupt(mut self) -> std::process::ExitStatus {
        let pid = Pid::from_raw(i32::try_from(self.child.id()).expect("pid"));
        kill(pid, Signal::SIGINT).expect("SIGINT");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "allot dev did not stop after Ctrl-C"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Dev {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn cli(bin: &Path, dev: &Dev, token: &str, args: &[&str]) -> Output {
    Command::new(bin)
        .args(args)
        .env("ALLOT_SERVER", &dev.url)
        .env("ALLOT_TOKEN", token)
        .output()
        .expect("allot runs")
}

/// `allot dev` in a fresh home, and its admin token.
fn dev_as_admin(bin: &Path) -> (tempfile::TempDir, Dev, String) {
    let home = tempfile::tempdir().expect("temp dir");
    let data = home.path().join(".allot");
    let dev = start_dev(bin, &data, "127.0.0.1:0");
    let token = std::fs::read_to_string(data.join("admin.token"))
        .expect("token")
        .trim()
        .to_owned();
    (home, dev, token)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn quick_start_as_a_user_runs_it() {
    let bin = allot_bin();
    let home = tempfile::tempdir().expect("temp dir");
    let data = home.path().join(".allot");
    let dev = start_dev(&bin, &data, "127.0.0.1:0");

    let token_file = data.join("admin.token");
    let mode = std::fs::metadata(&token_file)
        .expect("admin.token")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "the token file is private");
    let token = std::fs::read_to_string(&token_file)
        .expect("token")
        .trim()
        .to_owned();

    let out = cli(
        &bin,
        &dev,
        &token,
        &[
            "tenant",
            "create",
            "demo",
            "--guaranteed-gpus",
            "2",
            "--max-gpus",
            "4",
            "--max-gpu-memory",
            "600GiB",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let shown = text(&out.stdout);
    assert!(shown.contains("0 B / 600 GiB"), "{shown}");
    assert!(shown.contains("2 / 4"), "{shown}");
    // A quota change names what it changes, and the rest stays (as the README shows it).
    let out = cli(
        &bin,
        &dev,
        &token,
        &["tenant", "set-quota", "demo", "--mig-limit", "1g.18gb=4"],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let shown = text(&out.stdout);
    assert!(
        shown.contains("2 / 4") && shown.contains("0 B / 600 GiB") && shown.contains("1g.18gb=4"),
        "{shown}"
    );
    let out = cli(&bin, &dev, &token, &["tenant", "set-quota", "demo"]);
    assert!(!out.status.success(), "nothing named is refused");
    assert!(
        text(&out.stderr).contains("name what to change"),
        "{}",
        text(&out.stderr)
    );
    let out = cli(
        &bin,
        &dev,
        &token,
        &[
            "tenant",
            "create",
            "demo-train",
            "--parent",
            "demo",
            "--guaranteed-gpus",
            "1",
            "--min-isolation",
            "dedicated",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("dedicated"),
        "{}",
        text(&out.stdout)
    );

    let out = cli(&bin, &dev, &token, &["whoami"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let me = text(&out.stdout);
    assert!(
        me.contains("platform-admin") && me.contains("api-token"),
        "{me}"
    );

    // Roles for people who sign in through the identity provider: granted to a claim,
    // listed, revoked; a tenant role without a tenant is refused naming the field.
    let out = cli(
        &bin,
        &dev,
        &token,
        &[
            "binding", "create", "--claim", "groups", "--value", "ml-team", "--role", "member",
            "--tenant", "demo", "-o", "json",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let binding: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let binding_id = binding["id"].as_str().expect("id").to_owned();
    let out = cli(&bin, &dev, &token, &["binding", "list"]);
    let listed = text(&out.stdout);
    assert!(
        listed.contains("groups=ml-team") && listed.contains("member") && listed.contains("demo"),
        "{listed}"
    );
    let out = cli(&bin, &dev, &token, &["binding", "revoke", &binding_id]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = cli(
        &bin,
        &dev,
        &token,
        &[
            "binding", "create", "--claim", "groups", "--value", "x", "--role", "member",
        ],
    );
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("tenant"),
        "{}",
        text(&out.stderr)
    );

    // A quarter of a shared GPU: the job is told its share.
    let out = cli(
        &bin,
        &dev,
        &token,
        &[
            "job",
            "submit",
            "--tenant",
            "demo",
            "--gpus",
            "0.25",
            "--wait",
            "--",
            "sh",
            "-c",
            "echo share $ALLOT_GPU_MILLI",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "share 250");
    let out = cli(
        &bin,
        &dev,
        &token,
        &[
            "job", "submit", "--tenant", "demo", "--gpus", "1.5", "--", "true",
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("ask for whole GPUs, or a fraction of one GPU"),
        "{}",
        text(&out.stderr)
    );

    let out = cli(
        &bin,
        &dev,
        &token,
        &[
            "job",
            "submit",
            "--tenant",
            "demo",
            "--wait",
            "--",
            "sh",
            "-c",
            "echo quick start on $CUDA_VISIBLE_DEVICES",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let printed = text(&out.stdout);
    assert!(printed.starts_with("quick start on GPU-"), "{printed}");

    let out = cli(
        &bin,
        &dev,
        &token,
        &[
            "job", "submit", "--tenant", "demo", "--wait", "--", "sh", "-c", "exit 7",
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(7),
        "--wait exits with the job's status"
    );

    // Bad input is a clear error naming the field, not a crash.
    let out = cli(
        &bin,
        &dev,
        &token,
        &["job", "submit", "--tenant", "nope", "--", "true"],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("--tenant (tenant): no tenant named `nope`"),
        "{}",
        text(&out.stderr)
    );

    let out = cli(&bin, &dev, &token, &["job", "list", "-o", "json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let states: Vec<_> = list["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|j| j["state"].as_str().unwrap_or("").to_owned())
        .collect();
    assert_eq!(states, ["failed", "succeeded", "succeeded"]);
    let out = cli(&bin, &dev, &token, &["job", "list"]);
    let table = text(&out.stdout);
    assert!(
        table.starts_with("ID") && table.contains("succeeded") && table.contains("exit 7"),
        "{table}"
    );
    assert!(
        table
            .lines()
            .any(|l| l.split_whitespace().any(|cell| cell == "0.25")),
        "the quarter-GPU job shows its share, not 1 GPU: {table}"
    );
    let out = cli(&bin, &dev, &token, &["node", "list"]);
    assert_eq!(
        text(&out.stdout).matches("ready").count(),
        2,
        "{}",
        text(&out.stdout)
    );

    // A port in use is a clear error.
    let port = dev.url.rsplit(':').next().expect("port").to_owned();
    let busy = Command::new(&bin)
        .args([
            "dev",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--data-dir",
        ])
        .arg(home.path().join("other"))
        .output()
        .expect("second dev");
    assert!(!busy.status.success());
    assert!(
        text(&busy.stderr).contains(&format!("cannot listen on 127.0.0.1:{port}")),
        "{}",
        text(&busy.stderr)
    );

    let status = dev.interrupt();
    assert!(status.success(), "Ctrl-C is a clean shutdown: {status}");

    // A restart keeps the data and the token.
    let dev = start_dev(&bin, &data, "127.0.0.1:0");
    let out = cli(&bin, &dev, &token, &["job", "list", "-o", "json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let again: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(again["items"].as_array().map(Vec::len), Some(3));
    assert_eq!(
        std::fs::read_to_string(&token_file).expect("token").trim(),
        token
    );
    assert!(dev.interrupt().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_development_sign_in_picks_a_seeded_user() {
    let bin = allot_bin();
    let home = tempfile::tempdir().expect("temp dir");
    let dev = start_dev(&bin, &home.path().join(".allot"), "127.0.0.1:0");
    let browser = allot_system_tests::http_client()
        .cookie_provider(std::sync::Arc::new(reqwest::cookie::Jar::default()))
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let page = browser
        .get(format!("{}/auth/dev", dev.url))
        .send()
        .await
        .expect("page");
    assert_eq!(page.status(), reqwest::StatusCode::OK);
    let html = page.text().await.expect("html");
    assert!(html.contains("Dev Auditor"), "{html}");
    // The form of the admin: its hidden user id precedes its button.
    let admin_at = html
        .find("Sign in as Dev Admin")
        .expect("the admin is offered");
    let value_at = html[..admin_at].rfind("value=\"").expect("a user id") + 7;
    let user_id = &html[value_at..value_at + html[value_at..].find('"').expect("quote")];
    // The page's token goes back with the form, as a browser sends it.
    let token = allot_system_tests::dev_sign_in_token(&html);

    let signed_in = browser
        .post(format!("{}/auth/dev", dev.url))
        .form(&[("user", user_id), ("csrf_token", token)])
        .send()
        .await
        .expect("sign in");
    assert_eq!(signed_in.status(), reqwest::StatusCode::SEE_OTHER);
    let me: serde_json::Value = browser
        .get(format!("{}/auth/session", dev.url))
        .send()
        .await
        .expect("session")
        .json()
        .await
        .expect("json");
    assert_eq!(me["kind"], "user", "{me}");
    assert!(
        me["roles"]
            .as_array()
            .is_some_and(|r| r.iter().any(|b| b["role"] == "platform-admin")),
        "{me}"
    );
    let refused = browser
        .post(format!("{}/auth/dev", dev.url))
        .form(&[("user", "not-a-dev-user"), ("csrf_token", token)])
        .send()
        .await
        .expect("refused");
    assert_eq!(refused.status(), reqwest::StatusCode::UNPROCESSABLE_ENTITY);
    // Without the page's token, nobody is signed in.
    let refused = browser
        .post(format!("{}/auth/dev", dev.url))
        .form(&[("user", user_id)])
        .send()
        .await
        .expect("refused");
    assert_eq!(refused.status(), reqwest::StatusCode::FORBIDDEN);
    assert!(dev.interrupt().success());
}

#[test]
fn logs_can_be_json_lines_for_log_shippers() {
    let bin = allot_bin();
    let home = tempfile::tempdir().expect("temp dir");
    let mut child = Command::new(&bin)
        .args([
            "dev",
            "--listen",
            "127.0.0.1:0",
            "--log-format",
            "json",
            "--data-dir",
        ])
        .arg(home.path().join(".allot"))
        // `allot dev` logs warnings only unless asked (its banner comes first).
        .env("ALLOT_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("allot dev starts");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    // The agents log their registration at info level: one JSON object per line.
    let deadline = Instant::now() + Duration::from_secs(60);
    let registered = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = rx.recv_timeout(left).expect("a registration is logged");
        let Ok(entry) = serde_json::from_str::<serde_json::Value>(&line) else {
            // Plain lines are the banner's companions (key files written), not logs.
            assert!(!line.contains("INFO"), "a text log line: {line}");
            continue;
        };
        if entry["fields"]["message"] == "registered" {
            break entry;
        }
    };
    assert_eq!(registered["level"], "INFO", "{registered}");
    assert!(registered["timestamp"].is_string(), "{registered}");
    assert!(registered["fields"]["node"].is_string(), "{registered}");
    let pid = Pid::from_raw(i32::try_from(child.id()).expect("pid"));
    kill(pid, Signal::SIGINT).expect("SIGINT");
    assert!(child.wait().expect("exits").success());
}

/// Runs `c` with its standard output's reading end closed before it writes a byte: it
/// exits 0 or by SIGPIPE, never with a panic.
fn quiet_on_a_closed_pipe(mut c: Command, what: &[&str]) {
    use std::os::unix::process::ExitStatusExt;
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    let out = c
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .expect("allot runs");
    let stderr = text(&out.stderr);
    assert!(!stderr.contains("panicked"), "{what:?}: {stderr}");
    assert!(
        out.status.success() || out.status.signal() == Some(Signal::SIGPIPE as i32),
        "{what:?}: {:?} {stderr}",
        out.status
    );
}

/// Every `allot …` command the portal's pages tell people to run exists, with the flags
/// they name (the audit page once said `--key`, a flag `allot audit verify` never had).
#[test]
fn the_commands_the_portal_shows_exist() {
    let bin = allot_bin();
    let templates = Path::new(env!("CARGO_MANIFEST_DIR")).join("../web/templates");
    let mut checked = 0;
    for entry in std::fs::read_dir(&templates).expect("templates") {
        let path = entry.expect("entry").path();
        let page = std::fs::read_to_string(&path).expect("template");
        for snippet in page.split("<code>allot ").skip(1) {
            let command = snippet.split("</code>").next().unwrap_or_default();
            let words: Vec<&str> = command.split_whitespace().collect();
            // The verb: its leading lower-case words; then flags among the rest.
            let verb: Vec<&str> = words
                .iter()
                .take_while(|w| w.chars().all(|c| c.is_ascii_lowercase() || c == '-'))
                .take_while(|w| !w.starts_with("--"))
                .copied()
                .collect();
            let help = Command::new(&bin)
                .args(&verb)
                .arg("--help")
                .output()
                .expect("allot runs");
            assert!(
                help.status.success(),
                "{}: `allot {command}`: {}",
                path.display(),
                text(&help.stderr)
            );
            let help = text(&help.stdout);
            for flag in words.iter().filter(|w| w.starts_with("--")) {
                assert!(
                    help.contains(&format!("{flag} ")) || help.contains(&format!("{flag}\n")),
                    "{}: `allot {command}` names {flag}, which `allot {} --help` lacks",
                    path.display(),
                    verb.join(" ")
                );
            }
            checked += 1;
        }
    }
    assert!(checked >= 3, "the portal shows commands: {checked}");
}

/// A memory size without a unit is refused where it can only be a unit left out, and the
/// error says what to write; `G` is a gibibyte, as in Slurm's `--mem=16G`.
#[test]
fn a_memory_size_needs_its_unit() {
    let bin = allot_bin();
    let out = Command::new(&bin)
        .args([
            "job", "submit", "--tenant", "t", "--memory", "16", "--", "true",
        ])
        .env("ALLOT_TOKEN", "unused")
        .output()
        .expect("allot runs");
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--memory") && stderr.contains("16GiB"),
        "{stderr}"
    );
}

/// The leaf verbs under `path` (`allot <path> <verb>`), from the help pages.
fn leaf_verbs(bin: &Path, path: &[String]) -> Vec<Vec<String>> {
    let help = Command::new(bin)
        .args(path)
        .arg("--help")
        .output()
        .expect("allot runs");
    let help = text(&help.stdout);
    let subs: Vec<String> = help
        .lines()
        .skip_while(|l| *l != "Commands:")
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next())
        .filter(|s| *s != "help")
        .map(str::to_owned)
        .collect();
    if subs.is_empty() {
        return vec![path.to_vec()];
    }
    subs.into_iter()
        .flat_map(|s| {
            let mut p = path.to_vec();
            p.push(s);
            leaf_verbs(bin, &p)
        })
        .collect()
}

/// Every verb that talks to the control plane (and the offline audit verify) takes
/// `-o json`, and a session of them against `allot dev` prints JSON that parses, each also
/// quiet when its output pipe is closed (exit 0 or SIGPIPE, never a panic; `node list -o
/// json | head` once panicked with a backtrace). Several once
/// refused `-o json` (`job logs`, `job cancel`, `node return`, `node bootstrap-token
/// create`).
#[test]
fn every_client_verb_speaks_json() {
    let bin = allot_bin();
    // Not client verbs: the daemons, benchmarks, database tools, the GPU probe, the shell
    // completion script and the offline key generator (whose output is a secret line).
    let not_client = [
        "server",
        "agent",
        "dev",
        "bench",
        "db",
        "gpu",
        "completion",
        "help",
    ];
    let verbs: Vec<Vec<String>> = leaf_verbs(&bin, &[])
        .into_iter()
        .filter(|v| !not_client.contains(&v[0].as_str()))
        .filter(|v| v != &["audit", "keygen"])
        .collect();
    assert!(verbs.len() > 40, "{verbs:?}");
    for verb in &verbs {
        let help = Command::new(&bin)
            .args(verb)
            .arg("--help")
            .output()
            .expect("allot runs");
        let help = text(&help.stdout);
        assert!(
            help.contains("-o, --output <OUTPUT>") && help.contains("json"),
            "`allot {}` takes no -o json:\n{help}",
            verb.join(" ")
        );
    }

    let (home, dev, token) = dev_as_admin(&bin);
    // A verb whose reader has gone (`allot node list -o json | head`) ends quietly:
    // successfully, or killed by SIGPIPE as Unix tools are, never with a panic.
    for args in [
        &["node", "list", "-o", "json"][..],
        &["node", "list"],
        &["tenant", "list", "-o", "json"],
        &["job", "list"],
        &["audit", "search", "--all", "-o", "json"],
        &["audit", "keys"],
        &["--help"],
    ] {
        let mut c = Command::new(&bin);
        c.args(args)
            .env("ALLOT_SERVER", &dev.url)
            .env("ALLOT_TOKEN", &token);
        quiet_on_a_closed_pipe(c, args);
    }
    let run = |args: &[&str]| -> serde_json::Value {
        // `-o json` among the verb's flags, before a job's command.
        let mut all: Vec<&str> = args.to_vec();
        let at = all.iter().position(|a| *a == "--").unwrap_or(all.len());
        all.splice(at..at, ["-o", "json"]);
        let env = |c: &mut Command| {
            c.args(&all)
                .env("ALLOT_SERVER", &dev.url)
                .env("ALLOT_TOKEN", &token)
                .env("ALLOT_SECRET_VALUE", "s3cret-value")
                .env("ALLOT_REGISTRY_PASSWORD", "pull-password");
        };
        // Once to a closed pipe (for verbs that change nothing twice: reads, and the
        // last of the session's steps), then for real.
        let second = args.get(1).copied().unwrap_or_default();
        if args[0] == "audit" && matches!(second, "keys" | "search" | "logs") || second == "list" {
            let mut c = Command::new(&bin);
            env(&mut c);
            quiet_on_a_closed_pipe(c, &all);
        }
        let mut c = Command::new(&bin);
        env(&mut c);
        let out = c.output().expect("allot runs");
        assert!(
            out.status.success(),
            "{all:?}: {}{}",
            text(&out.stdout),
            text(&out.stderr)
        );
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{all:?} printed no JSON ({e}): {}", text(&out.stdout)))
    };
    let t = run(&["tenant", "create", "json-t"]);
    assert_eq!(t["name"], "json-t", "{t}");
    let t = run(&["tenant", "set-quota", "json-t", "--max-gpus", "2"]);
    assert_eq!(t["quota"]["limit"]["gpu_milli"], 2000, "{t}");
    // Refused, naming the flag typed and the limit in GPUs (not `gpu_milli` and 2000).
    let out = cli(
        &bin,
        &dev,
        &token,
        &["tenant", "set-quota", "json-t", "--guaranteed-gpus", "3"],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains(
            "--guaranteed-gpus (guaranteed.gpu_milli): must not be above the limit (2 GPUs)"
        ),
        "{}",
        text(&out.stderr)
    );
    run(&["tenant", "get", "json-t"]);
    run(&["tenant", "list"]);
    run(&["tenant", "create", "json-gone"]);
    assert_eq!(run(&["tenant", "delete", "json-gone"])["name"], "json-gone");
    let p = run(&["tenant", "set-policy", "json-t", "--require-confinement"]);
    assert_eq!(p["require_confinement"], true, "{p}");
    assert_eq!(
        p["egress"],
        serde_json::Value::Null,
        "the default egress: {p}"
    );
    let p = run(&[
        "tenant",
        "set-policy",
        "json-t",
        "--allow-egress",
        "10.20.0.0/16:443,8000-8100",
        "--allow-egress",
        "192.0.2.7",
        "--allow-host-network",
    ]);
    assert_eq!(p["egress"][0]["cidr"], "10.20.0.0/16", "{p}");
    assert_eq!(p["egress"][0]["ports"], "443,8000-8100", "{p}");
    assert_eq!(p["egress"][1]["cidr"], "192.0.2.7/32", "{p}");
    assert_eq!(p["allow_host_network"], true, "{p}");
    let p = run(&["tenant", "set-policy", "json-t", "--deny-egress"]);
    assert_eq!(p["egress"], serde_json::json!([]), "no egress: {p}");
    assert_eq!(
        p["allow_host_network"], false,
        "set-policy replaces the policy: {p}"
    );
    let out = cli(
        &bin,
        &dev,
        &token,
        &[
            "tenant",
            "set-policy",
            "json-t",
            "--allow-egress",
            "2001:db8::/32",
        ],
    );
    assert_ne!(out.status.code(), Some(0));
    assert!(
        text(&out.stderr).contains("--allow-egress") && text(&out.stderr).contains("IPv6"),
        "{}",
        text(&out.stderr)
    );
    run(&["tenant", "set-policy", "json-t"]);
    let l = run(&[
        "tenant",
        "set-limits",
        "json-t",
        "--default-cpus",
        "0.5",
        "--max-memory",
        "4GiB",
    ]);
    assert_eq!(l["effective"]["default_cpu_milli"], 500, "{l}");
    assert_eq!(l["effective"]["max_memory_bytes"], 4u64 << 30, "{l}");
    let out = cli(
        &bin,
        &dev,
        &token,
        &["tenant", "set-limits", "json-t", "--default-memory", "8GiB"],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains(
            "--default-memory (default_memory_bytes): must not be above the maximum (4 GiB)"
        ),
        "{}",
        text(&out.stderr)
    );
    run(&[
        "tenant",
        "set-limits",
        "json-t",
        "--default-cpus",
        "inherit",
        "--max-memory",
        "none",
    ]);
    let s = run(&["tenant", "set-secret", "json-t", "db"]);
    assert_eq!(s["name"], "db", "{s}");
    assert!(
        !s.to_string().contains("s3cret-value"),
        "never the value: {s}"
    );
    run(&["tenant", "secrets", "json-t"]);
    assert_eq!(
        run(&["tenant", "delete-secret", "json-t", "db"])["deleted"],
        true
    );
    run(&[
        "tenant",
        "set-registry-credential",
        "json-t",
        "registry.example:5000",
        "--username",
        "puller",
    ]);
    run(&["tenant", "registry-credentials", "json-t"]);
    run(&[
        "tenant",
        "delete-registry-credential",
        "json-t",
        "registry.example:5000",
    ]);
    let nodes = run(&["node", "list"]);
    let node = nodes[0]["name"].as_str().expect("a node").to_owned();
    run(&["node", "get", &node]);
    assert_eq!(run(&["node", "cordon", &node])["cordoned"], true);
    assert_eq!(run(&["node", "return", &node])["cordoned"], false);
    let job = run(&["job", "submit", "--tenant", "json-t", "--", "sleep", "30"]);
    let id = job["id"].as_str().expect("job id").to_owned();
    run(&["job", "get", &id]);
    run(&["job", "list"]);
    let cancelled = run(&["job", "cancel", &id]);
    assert_eq!(cancelled["id"], id.as_str(), "{cancelled}");
    let log = run(&["job", "logs", &id]);
    assert!(log["log"].is_string(), "{log}");
    run(&["node", "drain", &node]);
    run(&["node", "return", &node]);
    let bt = run(&["node", "bootstrap-token", "create", "--node", "json-node"]);
    assert!(bt["secret"].is_string(), "{bt}");
    let bt_id = bt["id"].as_str().expect("id").to_owned();
    run(&["node", "bootstrap-token", "list"]);
    run(&["node", "bootstrap-token", "delete", &bt_id]);
    let tok = run(&[
        "token",
        "create",
        "json-viewer",
        "--role",
        "viewer",
        "--tenant",
        "json-t",
    ]);
    let tok_id = tok["token"]["id"]
        .as_str()
        .or(tok["id"].as_str())
        .expect("token id")
        .to_owned();
    run(&["token", "list"]);
    run(&["token", "revoke", &tok_id]);
    let b = run(&[
        "binding", "create", "--claim", "groups", "--value", "ops", "--role", "viewer", "--tenant",
        "json-t",
    ]);
    run(&["binding", "list"]);
    run(&["binding", "revoke", b["id"].as_str().expect("binding id")]);
    let shared = home.path().join("shared");
    std::fs::create_dir_all(&shared).expect("dir");
    run(&[
        "volume",
        "put",
        "json-vol",
        "--host-path",
        shared.to_str().expect("path"),
        "--tenant",
        "json-t",
    ]);
    run(&["volume", "list"]);
    assert_eq!(run(&["volume", "delete", "json-vol"])["deleted"], true);
    run(&["user", "list"]);
    run(&["usage"]);
    run(&["whoami"]);
    run(&["audit", "logs"]);
    run(&["audit", "search"]);
    run(&["audit", "hold", "set", "json-t", "--reason", "litigation"]);
    run(&["audit", "hold", "list"]);
    run(&["audit", "hold", "release", "json-t"]);
    let pruned = run(&[
        "audit",
        "prune",
        "json-t",
        "--before",
        "2000-01-01T00:00:00Z",
    ]);
    assert_eq!(pruned["pruned"], 0, "{pruned}");
    let keys = run(&["audit", "keys"]);
    let key_file = home.path().join("keys.txt");
    std::fs::write(&key_file, keys["keys"].as_str().expect("keys")).expect("write");
    let bundle = home.path().join("json-t.tar");
    let export = run(&[
        "audit",
        "export",
        "json-t",
        "-O",
        bundle.to_str().expect("path"),
    ]);
    assert!(export["bytes"].as_u64().is_some_and(|b| b > 0), "{export}");
    let report = run(&[
        "audit",
        "verify",
        bundle.to_str().expect("path"),
        "--trusted-key",
        key_file.to_str().expect("path"),
    ]);
    assert_eq!(report["ok"], true, "{report}");
    assert_eq!(report["key_trusted"], true, "{report}");
    let evidence = run(&[
        "audit",
        "evidence",
        "--out",
        home.path().join("evidence").to_str().expect("path"),
    ]);
    assert!(
        evidence["files"].as_u64().is_some_and(|f| f > 0),
        "{evidence}"
    );
    assert!(dev.interrupt().success());
}

/// Runs `allot …` and stamps each line of its standard output with when it arrived; returns
/// the lines, when the command exited, and its standard error.
fn stamped(
    bin: &Path,
    dev: &Dev,
    token: &str,
    args: &[&str],
) -> (Vec<(Instant, String)>, Instant, String) {
    let mut child = Command::new(bin)
        .args(args)
        .env("ALLOT_SERVER", &dev.url)
        .env("ALLOT_TOKEN", token)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("allot runs");
    let stdout = child.stdout.take().expect("stdout");
    let mut stderr = child.stderr.take().expect("stderr");
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut s);
        s
    });
    let lines: Vec<(Instant, String)> = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .map(|l| (Instant::now(), l))
        .collect();
    let status = child.wait().expect("exits");
    let exited = Instant::now();
    let err = err.join().expect("stderr read");
    assert!(status.success(), "{args:?}: {status:?} {err}");
    (lines, exited, err)
}

/// `allot job logs -f` prints a running job's lines as they are written, and `job submit
/// --wait` streams its output and says how it ended once: asserted by when each line
/// arrives, not only what arrives.
#[test]
fn a_running_jobs_output_is_followed_as_it_is_written() {
    let bin = allot_bin();
    let (_home, dev, token) = dev_as_admin(&bin);
    let out = cli(&bin, &dev, &token, &["tenant", "create", "logs"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let script = "echo first; sleep 3; echo second; sleep 2; echo third";
    let out = cli(
        &bin,
        &dev,
        &token,
        &[
            "job", "submit", "--tenant", "logs", "--name", "talker", "--", "sh", "-c", script,
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let id = text(&out.stdout).trim().to_owned();

    let started = Instant::now();
    let (lines, exited, _) = stamped(&bin, &dev, &token, &["job", "logs", &id, "-f"]);
    let texts: Vec<&str> = lines.iter().map(|(_, l)| l.as_str()).collect();
    assert_eq!(texts, ["first", "second", "third"], "{lines:?}");
    let at = |i: usize| lines[i].0;
    // Each line came when it was written: about 3 s and 2 s apart, and the first well before
    // the job (and with it the follow) ended.
    assert!(
        at(1) - at(0) >= Duration::from_millis(2000),
        "second {:?} after first",
        at(1) - at(0)
    );
    assert!(
        at(2) - at(1) >= Duration::from_millis(1200),
        "third {:?} after second",
        at(2) - at(1)
    );
    assert!(
        exited - at(0) >= Duration::from_millis(3500),
        "the first line came only {:?} before the end",
        exited - at(0)
    );
    assert!(at(0) - started < Duration::from_secs(20), "the job started");
    // Read again once it ended: the same output, whole.
    let out = cli(&bin, &dev, &token, &["job", "logs", "talker"]);
    assert_eq!(text(&out.stdout), "first\nsecond\nthird\n");

    let (lines, exited, err) = stamped(
        &bin,
        &dev,
        &token,
        &[
            "job",
            "submit",
            "--tenant",
            "logs",
            "--wait",
            "--",
            "sh",
            "-c",
            "echo one; sleep 3; echo two",
        ],
    );
    let texts: Vec<&str> = lines.iter().map(|(_, l)| l.as_str()).collect();
    assert_eq!(texts, ["one", "two"], "{lines:?} {err}");
    assert!(
        lines[1].0 - lines[0].0 >= Duration::from_millis(2000),
        "--wait printed the output at the end: {:?} apart",
        lines[1].0 - lines[0].0
    );
    assert!(exited - lines[0].0 >= Duration::from_millis(2000));
    assert_eq!(
        err.matches("succeeded").count(),
        1,
        "the end is said once: {err}"
    );
}

/// `allot job list` goes past the API's 500 a page: `--limit` beyond it, `--all`, and a
/// `--page-token` printed to go on from.
#[test]
fn job_lists_go_past_one_page() {
    let bin = allot_bin();
    let (_home, dev, token) = dev_as_admin(&bin);
    let out = cli(
        &bin,
        &dev,
        &token,
        &["tenant", "create", "many", "--max-gpus", "1"],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    // 501 jobs (one runs, the rest wait for the limit), sent straight to the API.
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let http = allot_system_tests::http_client()
            .build()
            .expect("HTTP client");
        for i in 0..501 {
            let res = http
                .post(format!("{}/api/v1/jobs", dev.url))
                .bearer_auth(&token)
                .json(
                    &serde_json::json!({ "tenant": "many", "name": format!("j-{i}"), "gpus": 1,
                                            "command": ["sleep", "600"] }),
                )
                .send()
                .await
                .expect("submitted");
            assert!(
                res.status().is_success(),
                "{}",
                res.text().await.unwrap_or_default()
            );
        }
    });
    let listed = |args: &[&str]| -> serde_json::Value {
        let mut all = vec!["job", "list", "--tenant", "many", "-o", "json"];
        all.extend_from_slice(args);
        let out = cli(&bin, &dev, &token, &all);
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
        serde_json::from_slice(&out.stdout).expect("JSON")
    };
    let ids = |v: &serde_json::Value| -> Vec<String> {
        v["items"]
            .as_array()
            .expect("items")
            .iter()
            .map(|j| j["id"].as_str().expect("id").to_owned())
            .collect()
    };
    let every = listed(&["--all"]);
    assert_eq!(ids(&every).len(), 501);
    assert!(
        every["next_page_token"].is_null(),
        "{}",
        every["next_page_token"]
    );
    let most = listed(&["--limit", "501"]);
    assert_eq!(ids(&most), ids(&every));
    // Two, then on from the token: the next ones, none repeated.
    let first = listed(&["--limit", "2"]);
    let token_next = first["next_page_token"]
        .as_str()
        .expect("a token")
        .to_owned();
    let rest = listed(&["--limit", "3", "--page-token", &token_next]);
    let mut shown = ids(&first);
    shown.extend(ids(&rest));
    assert_eq!(shown, ids(&every)[..5]);
    // The table says how to go on.
    let out = cli(
        &bin,
        &dev,
        &token,
        &["job", "list", "--tenant", "many", "--limit", "1"],
    );
    assert!(
        text(&out.stderr).contains("--page-token"),
        "{}",
        text(&out.stderr)
    );
}

/// What a fleet's people ask of lists, as squeue, sinfo and kubectl give it: columns by
/// name (`--format`), every column (`-o wide`), YAML, a listing that keeps itself current
/// (`--watch`), names instead of ids, where pending jobs stand in their queue, what each
/// tenant holds and how many of its jobs wait, free GPUs per node, `job resubmit`, and
/// shell completion.
#[test]
fn lists_show_what_people_ask_of_them() {
    let bin = allot_bin();
    let (_home, dev, token) = dev_as_admin(&bin);
    let ok = |args: &[&str]| -> String {
        let out = cli(&bin, &dev, &token, args);
        assert!(
            out.status.success(),
            "{args:?}: {}{}",
            text(&out.stdout),
            text(&out.stderr)
        );
        text(&out.stdout)
    };
    let json = |args: &[&str]| -> serde_json::Value {
        let mut all = args.to_vec();
        all.extend(["-o", "json"]);
        serde_json::from_str(&ok(&all)).expect("json")
    };
    ok(&[
        "tenant",
        "create",
        "lab",
        "--guaranteed-gpus",
        "1",
        "--max-gpus",
        "2",
    ]);
    // Two GPUs run (the limit); three wait, the high-priority one first in the queue.
    let mut ids = Vec::new();
    for (name, priority) in [
        ("run-a", "normal"),
        ("run-b", "normal"),
        ("wait-old", "normal"),
        ("wait-new", "normal"),
        ("wait-urgent", "high"),
    ] {
        let id = ok(&[
            "job",
            "submit",
            "--tenant",
            "lab",
            "--name",
            name,
            "--priority",
            priority,
            "-e",
            "STEP=7",
            "--",
            "sleep",
            "600",
        ]);
        ids.push(id.trim().to_owned());
        // Submission order is the age order: keep the two that run first in it.
        std::thread::sleep(Duration::from_millis(30));
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while json(&["job", "list", "--state", "running"])["items"]
        .as_array()
        .map_or(0, Vec::len)
        < 2
    {
        assert!(Instant::now() < deadline, "two jobs never ran");
        std::thread::sleep(Duration::from_millis(200));
    }

    // Queue places, in the API and the CLI.
    let place = |name: &str| {
        let j = json(&["job", "get", name]);
        (j["queue_position"].as_u64(), j["queue_length"].as_u64())
    };
    assert_eq!(place("wait-urgent"), (Some(1), Some(3)));
    assert_eq!(place("wait-old"), (Some(2), Some(3)));
    assert_eq!(place("wait-new"), (Some(3), Some(3)));
    assert_eq!(
        place("run-a"),
        (None, None),
        "a running job has no queue place"
    );
    let got = ok(&["job", "get", "wait-old"]);
    assert!(got.contains("2 of 3 in lab's queue"), "{got}");
    assert!(got.contains("waiting "), "elapsed time: {got}");
    // Held by lab's limit behind jobs without a time limit: no estimate, and said so.
    assert!(
        json(&["job", "get", "wait-old"])
            .get("estimated_start")
            .is_none(),
        "free GPUs are not a start while the tenant is at its limit"
    );
    assert!(got.contains("Estimated start:  unknown"), "{got}");
    let running = ok(&["job", "get", "run-a"]);
    assert!(running.contains("running "), "{running}");
    let node_name = json(&["job", "get", "run-a"])["node_name"]
        .as_str()
        .expect("a placed job names its node")
        .to_owned();
    assert!(node_name.starts_with("dev-node-"), "{node_name}");

    // --format: these columns, in this order; an unknown one names those there are.
    let picked = ok(&["job", "list", "--format", "name,state,queue,node"]);
    let mut lines = picked.lines();
    assert_eq!(
        lines
            .next()
            .map(|l| l.split_whitespace().collect::<Vec<_>>()),
        Some(vec!["NAME", "STATE", "QUEUE", "NODE"]),
        "{picked}"
    );
    assert!(
        picked
            .lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>()
                == ["wait-urgent", "pending", "1/3", "-"]),
        "{picked}"
    );
    assert!(
        picked
            .lines()
            .any(|l| l.starts_with("run-a") && l.contains(&node_name)),
        "node names, not ids: {picked}"
    );
    let out = cli(
        &bin,
        &dev,
        &token,
        &["job", "list", "--format", "name,colour"],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("no column `colour`; the columns are id, tenant, user, name"),
        "{}",
        text(&out.stderr)
    );
    // --format help lists the columns, as the README says, and is not an error.
    let help = ok(&["job", "list", "--format", "help"]);
    let first = help.lines().next().unwrap_or_default();
    assert_eq!(
        first.split_whitespace().collect::<Vec<_>>(),
        ["COLUMN", "HEADER", "SHOWN", "BY"],
        "{help}"
    );
    for (column, shown) in [("id", "table"), ("queue", "wide"), ("uuid", "wide")] {
        assert!(
            help.lines()
                .any(|l| l.split_whitespace().next() == Some(column) && l.ends_with(shown)),
            "{column} ({shown}) in\n{help}"
        );
    }
    // The plain table leaves out what -o wide adds.
    let plain = ok(&["job", "list"]);
    let wide = ok(&["job", "list", "-o", "wide"]);
    let header = |t: &str| t.lines().next().unwrap_or_default().to_owned();
    assert!(
        header(&plain).contains("TIME") && !header(&plain).contains("QUEUE"),
        "{plain}"
    );
    for h in ["QUEUE", "NODE", "PRIORITY", "ATTEMPT", "IMAGE"] {
        assert!(header(&wide).contains(h), "{h} in {wide}");
    }
    // YAML is the API's document, as JSON is.
    let yaml: serde_json::Value =
        serde_yaml_ng::from_str(&ok(&["job", "list", "-o", "yaml"])).expect("yaml");
    let listed = |v: &serde_json::Value| -> Vec<(String, String, Option<u64>)> {
        v["items"]
            .as_array()
            .expect("items")
            .iter()
            .map(|j| {
                (
                    j["id"].as_str().unwrap_or_default().to_owned(),
                    j["state"].as_str().unwrap_or_default().to_owned(),
                    j["queue_position"].as_u64(),
                )
            })
            .collect()
    };
    assert_eq!(listed(&yaml), listed(&json(&["job", "list"])));

    // Tenants: what they hold and how many of their jobs wait and run.
    let lab = json(&["tenant", "get", "lab"]);
    assert_eq!(lab["usage"]["gpus"], 2.0, "{lab}");
    assert_eq!(
        (lab["jobs_pending"].as_u64(), lab["jobs_running"].as_u64()),
        (Some(3), Some(2))
    );
    let tenants = ok(&[
        "tenant",
        "list",
        "--format",
        "name,gpus,guaranteed,max,pending,running",
    ]);
    assert!(
        tenants
            .lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["lab", "2", "1", "2", "3", "2"]),
        "{tenants}"
    );

    // Nodes: free GPUs and one state, cordoned included.
    let nodes = json(&["node", "list"]);
    let free: u64 = nodes
        .as_array()
        .expect("nodes")
        .iter()
        .map(|n| n["gpus_free"].as_f64().expect("gpus_free") as u64)
        .sum();
    let gpus: usize = nodes
        .as_array()
        .expect("nodes")
        .iter()
        .map(|n| n["gpus"].as_array().map_or(0, Vec::len))
        .sum();
    assert_eq!(free as usize, gpus - 2, "two GPUs are held: {nodes}");
    ok(&["node", "cordon", "dev-node-2"]);
    let listed = ok(&["node", "list", "--format", "name,state,free"]);
    assert!(
        listed
            .lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["dev-node-2", "cordoned", "0"]),
        "a cordoned node offers nothing: {listed}"
    );

    // --watch to a pipe prints each listing that differs from the last.
    let mut watch = Command::new(&bin)
        .args([
            "node",
            "list",
            "--format",
            "name,state",
            "--watch",
            "--interval",
            "0.2",
        ])
        .env("ALLOT_SERVER", &dev.url)
        .env("ALLOT_TOKEN", &token)
        .stdout(Stdio::piped())
        .spawn()
        .expect("watch");
    let stdout = watch.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let wait_for = |wanted: &str| {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = rx.recv_timeout(left).expect("the watch goes on");
            if line.split_whitespace().collect::<Vec<_>>().join(" ") == wanted {
                return;
            }
        }
    };
    wait_for("dev-node-2 cordoned");
    ok(&["node", "return", "dev-node-2"]);
    wait_for("dev-node-2 ready");
    let pid = Pid::from_raw(i32::try_from(watch.id()).expect("pid"));
    kill(pid, Signal::SIGTERM).expect("SIGTERM");
    let status = watch.wait().expect("wait");
    assert!(status.success(), "a watch ends cleanly when told: {status}");

    // Resubmit: a new job with the old one's spec.
    let again = json(&["job", "resubmit", "wait-new", "--name", "wait-again"]);
    let old = json(&["job", "get", "wait-new"]);
    assert_ne!(again["id"], old["id"]);
    assert_eq!(again["name"], "wait-again");
    for field in [
        "tenant",
        "gpus",
        "command",
        "env",
        "priority",
        "memory_bytes",
        "image",
    ] {
        assert_eq!(again[field], old[field], "{field}");
    }

    // Audit views name who acted: the admin token by its name, nodes by theirs.
    let entries = json(&["audit", "search", "--action", "job.submit"]);
    let first = &entries[0];
    assert_eq!(first["actor_name"], "bootstrap-admin", "{first}");
    assert_eq!(first["log_name"], "lab", "{first}");
    let table = ok(&["audit", "search", "--action", "job.transition"]);
    assert!(table.contains(&format!("node:{node_name}")), "{table}");
    assert!(table.contains("system:scheduler"), "{table}");

    // Shell completion, generated by the binary itself.
    let bash = ok(&["completion", "bash"]);
    assert!(
        bash.contains("_allot()") && bash.contains("complete -F _allot"),
        "bash"
    );
    assert!(
        bash.contains("resubmit") && bash.contains("--watch"),
        "its verbs and flags"
    );
    assert!(ok(&["completion", "zsh"]).starts_with("#compdef allot"));
    assert!(ok(&["completion", "fish"]).contains("complete -c allot"));
}

/// Every directory under `root` and every regular file, with its mode, as `path mode`
/// lines relative to `root`, for those others may use (a group or other bit, or a set-ID
/// bit on a file): private are 0700 directories and 0600 files, or stricter (a node's log
/// delivered whole is 0400).
fn open_modes(root: &Path) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(dir).expect("read_dir").flatten() {
            let meta = std::fs::symlink_metadata(e.path()).expect("stat");
            let mode = meta.permissions().mode() & 0o7777;
            let rel = e
                .path()
                .strip_prefix(root)
                .expect("below")
                .display()
                .to_string();
            if meta.is_dir() {
                if mode & 0o077 != 0 {
                    out.push(format!("{rel}/ {mode:04o}"));
                }
                walk(root, &e.path(), out);
            } else if meta.is_file() && mode & 0o7077 != 0 {
                out.push(format!("{rel} {mode:04o}"));
            }
        }
    }
    let mut out = Vec::new();
    walk(root, root, &mut out);
    out
}

/// `allot server` on free ports with its data in `data_dir`, and its API URL; its stderr is
/// kept in `<data_dir>.stderr`.
fn start_server(bin: &Path, data_dir: &Path) -> Dev {
    let stderr = std::fs::File::create(data_dir.with_extension("stderr")).expect("stderr file");
    let mut child = Command::new(bin)
        .args([
            "server",
            "--listen",
            "127.0.0.1:0",
            "--grpc-listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
            "--data-dir",
        ])
        .arg(data_dir)
        .env("ALLOT_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .expect("allot server starts");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    let url = loop {
        let line = lines
            .next()
            .expect("allot server prints its URL")
            .expect("a line");
        if let Some(rest) = line.strip_prefix("Allot API on ") {
            break rest.split(',').next().unwrap_or_default().to_owned();
        }
    };
    Dev { child, url }
}

/// The control plane's data dir is its user's alone, SQLite's WAL and shared memory
/// included (as uid 65534 once read job specs and secret variables out of `allot.db-wal`):
/// every directory 0700, every file 0600, for a fresh `allot server` and a fresh
/// `allot dev` that ran a job; a data dir made readable is tightened at the next start,
/// saying so.
#[test]
fn a_fresh_data_dir_is_its_users_alone() {
    let bin = allot_bin();
    let home = tempfile::tempdir().expect("temp dir");
    let srv = home.path().join("server");
    let server = start_server(&bin, &srv);
    let health = Command::new(&bin)
        .args(["tenant", "list"])
        .env("ALLOT_SERVER", &server.url)
        .env(
            "ALLOT_TOKEN",
            std::fs::read_to_string(srv.join("admin.token"))
                .expect("token")
                .trim(),
        )
        .output()
        .expect("allot runs");
    assert!(health.status.success(), "{}", text(&health.stderr));
    for f in [
        "allot.db",
        "allot.db-wal",
        "allot.db-shm",
        "audit.key",
        "secrets.key",
        "pki/ca.key",
    ] {
        assert!(srv.join(f).is_file(), "{f} exists");
    }
    assert_eq!(
        open_modes(&srv),
        Vec::<String>::new(),
        "allot server's data dir"
    );
    let root_mode = std::fs::metadata(&srv).expect("stat").permissions().mode() & 0o777;
    assert_eq!(root_mode, 0o700);
    assert!(server.interrupt().success());

    // Made readable by someone: tightened at the next start, which says what it did. (A
    // clean stop folded the WAL into the database and removed it.)
    for (p, m) in [
        ("allot.db", 0o644),
        ("audit.key", 0o640),
        ("pki", 0o755),
        ("", 0o755),
    ] {
        std::fs::set_permissions(srv.join(p), std::fs::Permissions::from_mode(m)).expect("chmod");
    }
    assert_eq!(
        open_modes(&srv).len(),
        3,
        "the negative control: {:?}",
        open_modes(&srv)
    );
    let server = start_server(&bin, &srv);
    assert_eq!(open_modes(&srv), Vec::<String>::new(), "tightened");
    let root_mode = std::fs::metadata(&srv).expect("stat").permissions().mode() & 0o777;
    assert_eq!(root_mode, 0o700);
    let said = std::fs::read_to_string(srv.with_extension("stderr")).expect("stderr");
    assert!(
        said.contains(&format!(
            "{} was 0644, now 0600",
            srv.join("allot.db").display()
        )),
        "{said}"
    );
    assert!(server.interrupt().success());

    let (dev_home, dev, token) = dev_as_admin(&bin);
    let data = dev_home.path().join(".allot");
    for args in [
        &["tenant", "create", "modes"][..],
        &[
            "job", "submit", "--tenant", "modes", "--wait", "--", "sh", "-c", "echo hi",
        ],
    ] {
        let out = cli(&bin, &dev, &token, args);
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
    }
    for f in [
        "allot.db",
        "allot.db-wal",
        "allot.db-shm",
        "admin.token",
        "nodes/dev-node-1/identity/node.key",
    ] {
        assert!(data.join(f).is_file(), "{f} exists");
    }
    assert_eq!(
        open_modes(&data),
        Vec::<String>::new(),
        "allot dev's data dir"
    );
    assert!(dev.interrupt().success());
}

/// `allot dev --runtime oci` below a directory the containers' users cannot pass through
/// (`mktemp -d` makes one 0700) stops at start naming it, instead of starting and failing
/// every job with the container runtime's "permission denied".
#[test]
fn a_data_dir_containers_cannot_reach_is_refused_at_start() {
    let bin = allot_bin();
    let private = tempfile::tempdir().expect("temp dir");
    std::fs::set_permissions(private.path(), std::fs::Permissions::from_mode(0o700))
        .expect("chmod");
    let out = Command::new(&bin)
        .args([
            "dev",
            "--runtime",
            "oci",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
        ])
        .arg(private.path().join("data"))
        .output()
        .expect("allot runs");
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    let said = text(&out.stderr);
    let named = std::fs::canonicalize(private.path()).expect("canonical");
    assert!(
        said.contains(&format!(
            "cannot pass through {} (mode 0700)",
            named.display()
        )),
        "{said}"
    );
    assert!(!said.contains("Allot dev cluster is running"), "{said}");
}

/// A server address that cannot work says what to do: a URL without its scheme, https to a
/// plain-HTTP port, nothing listening (naming ALLOT_SERVER and the address tried). The
/// working address, the negative control, answers.
#[test]
fn connection_errors_say_what_to_do() {
    let bin = allot_bin();
    let (_home, dev, token) = dev_as_admin(&bin);
    let at = |server: &str| {
        Command::new(&bin)
            .args(["tenant", "list"])
            .env("ALLOT_SERVER", server)
            .env("ALLOT_TOKEN", &token)
            .output()
            .expect("allot runs")
    };
    let ok = at(&dev.url);
    assert!(ok.status.success(), "{ok:?}");
    let hostport = dev.url.trim_start_matches("http://").to_owned();
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    for (server, says) in [
        (
            hostport.clone(),
            format!("give the control plane's URL with its scheme, e.g. http://{hostport}"),
        ),
        (
            format!(
                "localhost:{}",
                hostport.rsplit(':').next().unwrap_or_default()
            ),
            "has no http:// or https://".to_owned(),
        ),
        (
            format!("https://{hostport}"),
            format!(
                "does not speak TLS (it answered https with plain HTTP): use http://{hostport}"
            ),
        ),
        (
            format!("http://127.0.0.1:{closed}"),
            format!(
                "nothing listens at 127.0.0.1:{closed} (connection refused): is the control \
                 plane running, and is --server (ALLOT_SERVER, now http://127.0.0.1:{closed})"
            ),
        ),
    ] {
        let out = at(&server);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{server}: {err}");
        assert!(err.contains(&says), "{server}: {err}");
        assert!(!err.contains("relative URL without a base"), "{err}");
    }
}
