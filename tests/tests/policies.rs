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
