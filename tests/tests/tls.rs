//! HTTPS for the API: served with rustls when given a certificate; plain HTTP is refused
//! anywhere but loopback; clients trust a private CA with `--ca-cert`.

use std::process::Command;

use allot_server::tls::TlsIdentity;
use allot_store::testing::{Backend, TestDb};
use allot_system_tests::{allot_bin, spawn_cluster_with, test_pki};
use reqwest::StatusCode;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_speaks_https_with_its_certificate() {
    let (ca_pem, chain, key) = test_pki();
    let c = spawn_cluster_with(Backend::Sqlite, 0, "", |config| {
        config.tls = Some(TlsIdentity {
            cert_pem: chain,
            key_pem: key,
        });
    })
    .await;
    let url = c.server.http_url();
    assert!(url.starts_with("https://127.0.0.1:"), "{url}");
    let (s, body) = c.get("/api/v1/tenants").await;
    assert_eq!(s, StatusCode::OK, "{body}");

    // A client that does not trust the CA gets no answer; neither does plain HTTP.
    let stranger = allot_system_tests::http_client().build().expect("client");
    assert!(stranger.get(format!("{url}/healthz")).send().await.is_err());
    let plain = url.replacen("https://", "http://", 1);
    let res = stranger.get(format!("{plain}/healthz")).send().await;
    assert!(
        res.as_ref().map_or(true, |r| !r.status().is_success()),
        "plain HTTP to the TLS port: {res:?}"
    );

    // The CLI trusts the CA it is given, and only then.
    let dir = tempfile::tempdir().expect("temp dir");
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, ca_pem).expect("write CA");
    let run = |extra: &[&str]| {
        Command::new(allot_bin())
            .args([
                "tenant",
                "list",
                "--server",
                &url,
                "--token",
                &c.admin_token,
            ])
            .args(extra)
            .output()
            .expect("allot runs")
    };
    let out = run(&["--ca-cert", ca_file.to_str().expect("path")]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run(&[]);
    assert!(!out.status.success(), "an untrusted certificate is refused");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_http_is_refused_off_loopback() {
    let db = TestDb::new(Backend::Sqlite).await.expect("database");
    let mut config = allot_server::ServerConfig::new(db.url.clone());
    config.http_listen = "0.0.0.0:0".parse().expect("address");
    let refused = allot_server::start(config, std::sync::Arc::new(allot_domain::SystemClock)).await;
    assert!(
        matches!(refused, Err(allot_server::ServerError::PlainHttpExposed(_))),
        "the server must not speak plain HTTP beyond loopback"
    );
}
