//! The policies in `policies/` are validated at start-up: the shipped directory starts a
//! server, and one with a broken elastic share policy does not.

use std::sync::Arc;

use allot_store::testing::{Backend, TestDb};

/// Starts (and stops) a server with the policies in `dir`, or says why it would not start.
async fn start_with(dir: &std::path::Path) -> Result<(), allot_server::ServerError> {
    let db = TestDb::new(Backend::Sqlite).await.expect("database");
    let mut config = allot_server::ServerConfig::new(db.url.clone());
    config.policy_dir = Some(dir.to_owned());
    let server = allot_server::start(config, Arc::new(allot_domain::SystemClock)).await?;
    server.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_elastic_policy_stops_the_server_from_starting() {
    let shipped = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies");
    start_with(&shipped)
        .await
        .expect("the shipped policies start a server");
    let dir = tempfile::tempdir().expect("temp dir");
    for f in ["allot.cedarschema", "allot.cedar"] {
        std::fs::copy(shipped.join(f), dir.path().join(f)).expect("copy");
    }
    // Weekdays only: the weekend is in no window.
    let elastic = std::fs::read_to_string(shipped.join("elastic.toml"))
        .expect("shipped elastic policy")
        .replace("days = [\"sat\", \"sun\"]", "days = [\"sat\"]");
    std::fs::write(dir.path().join("elastic.toml"), elastic).expect("write");
    match start_with(dir.path()).await {
        Err(allot_server::ServerError::ElasticPolicy(e)) => {
            assert!(e.to_string().contains("cover the week exactly once"), "{e}");
        }
        Err(other) => panic!("refused for another reason: {other}"),
        Ok(()) => panic!("started with a policy that leaves Sundays uncovered"),
    }
}

/// The crates of the workspace, by package name: their directories.
fn crate_dirs(root: &std::path::Path) -> std::collections::HashMap<String, std::path::PathBuf> {
    let mut out = std::collections::HashMap::new();
    let mut stack = vec![root.to_owned()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let path = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            if path.is_dir() && !name.starts_with('.') && name != "target" && name != "node_modules"
            {
                stack.push(path);
            } else if name == "Cargo.toml"
                && let Ok(text) = std::fs::read_to_string(&path)
                && let Some(pkg) = text
                    .split("[package]")
                    .nth(1)
                    .and_then(|p| p.lines().find(|l| l.trim_start().starts_with("name")))
                    .and_then(|l| l.split('"').nth(1))
            {
                out.insert(pkg.to_owned(), dir.clone());
            }
        }
    }
    out
}

/// Every `.rs` file below `dir`, read.
fn sources(dir: &std::path::Path) -> Vec<(std::path::PathBuf, String)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs")
                && let Ok(text) = std::fs::read_to_string(&p)
            {
                out.push((p, text));
            }
        }
    }
    out
}

#[test]
fn every_test_the_control_matrices_name_exists() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let crates = crate_dirs(&root);
    let mut missing = Vec::new();
    let mut checked = 0;
    for matrix in ["soc2-controls.md", "iso27001-controls.md"] {
        let text = std::fs::read_to_string(root.join("policies").join(matrix)).expect("matrix");
        for row in text
            .lines()
            .filter(|l| l.starts_with("| ") && !l.starts_with("| ---"))
        {
            let Some(evidence) = row.trim_end_matches('|').rsplit('|').next() else {
                continue;
            };
            let mut previous: Option<String> = None;
            for name in evidence.split('`').skip(1).step_by(2) {
                // `…::x` continues the crate and module of the name before it.
                let name = match (name.strip_prefix("…::"), &previous) {
                    (Some(rest), Some(prev)) => {
                        let base = prev.rsplit_once("::").map_or(prev.as_str(), |(b, _)| b);
                        format!("{base}::{rest}")
                    }
                    _ => name.to_owned(),
                };
                previous = Some(name.clone());
                let parts: Vec<&str> = name.split("::").collect();
                let (Some(krate), Some(last)) = (parts.first(), parts.last()) else {
                    continue;
                };
                let Some(dir) = crates.get(*krate) else {
                    missing.push(format!("{matrix}: `{name}`: no crate {krate}"));
                    continue;
                };
                checked += 1;
                // `x::*` names a module or a test group; `x_*` a family of tests.
                let (needle, prefix) = match *last {
                    "*" => (parts[parts.len() - 2].to_owned(), false),
                    l if l.ends_with('*') => (l.trim_end_matches('*').to_owned(), true),
                    l => (l.to_owned(), false),
                };
                // `crate::file::*`: every test of that test file.
                let whole_file =
                    *last == "*" && dir.join("tests").join(format!("{needle}.rs")).is_file();
                let found = whole_file
                    || sources(dir).iter().any(|(_, src)| {
                        let word = |at: &str| {
                            src.match_indices(at).any(|(i, m)| {
                                let before = src[..i].chars().next_back();
                                let after = src[i + m.len()..].chars().next();
                                let boundary = |c: Option<char>| {
                                    !c.is_some_and(|c| c.is_alphanumeric() || c == '_')
                                };
                                boundary(before) && (prefix || boundary(after))
                            })
                        };
                        // A test is a `fn`; a group of them (`x::*`) may be made by a macro.
                        if *last == "*" {
                            word(&needle)
                        } else {
                            word(&format!("fn {needle}"))
                        }
                    });
                if !found {
                    missing.push(format!("{matrix}: `{name}`"));
                }
            }
        }
    }
    assert!(checked > 50, "only {checked} names read");
    assert!(
        missing.is_empty(),
        "the matrices name tests that do not exist:\n{}",
        missing.join("\n")
    );
}
