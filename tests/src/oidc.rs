//! The real OpenID Connect provider of the sign-in and portal tests: npm's `oidc-provider`
//! (installed by `scripts/test`) on loopback.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

/// The provider process, killed when dropped.
pub struct Provider {
    child: Child,
    pub issuer: String,
}

impl Drop for Provider {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn start_provider() -> Provider {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("oidc-provider");
    assert!(
        dir.join("node_modules/oidc-provider").is_dir(),
        "the test OpenID provider is not installed: run ./scripts/test (or `npm ci --prefix tests/oidc-provider`)"
    );
    let mut child = Command::new("node")
        .arg(dir.join("provider.mjs"))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("node runs the provider");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut first = String::new();
    stdout
        .read_line(&mut first)
        .expect("the provider prints its issuer");
    // Keep the pipe open (and drained) for as long as the provider runs.
    std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
    let issuer = first.trim().to_owned();
    assert!(issuer.starts_with("http://127.0.0.1:"), "{issuer}");
    Provider { child, issuer }
}

impl Provider {
    /// Configures a control plane to accept this provider's tokens and sign people in
    /// through it, with claims granting roles by `claim_roles` (`CLAIM=VALUE:ROLE[@TENANT]`)
    /// and sessions ending after `max`, or `idle` without a request.
    pub fn configure(
        &self,
        c: &mut allot_server::ServerConfig,
        claim_roles: &[&str],
        max: std::time::Duration,
        idle: std::time::Duration,
    ) {
        c.oidc = Some(allot_api::jwt::OidcConfig {
            issuer: self.issuer.clone(),
            audiences: vec!["allot".into()],
            algorithms: vec![
                jsonwebtoken::Algorithm::RS256,
                jsonwebtoken::Algorithm::PS256,
                jsonwebtoken::Algorithm::ES256,
            ],
            leeway: std::time::Duration::from_secs(60),
            claim_roles: claim_roles
                .iter()
                .map(|r| r.parse().expect("rule"))
                .collect(),
            jwks_refetch: allot_api::jwt::DEFAULT_JWKS_REFETCH,
            introspection: None,
        });
        c.web_sign_in = Some(allot_api::signin::SignInConfig {
            issuer: self.issuer.clone(),
            client_id: "allot".into(),
            client_secret: Some("allot-test-secret".into()),
            redirect_url: None,
        });
        c.sessions = allot_api::signin::SessionPolicy {
            secure_cookies: false,
            max,
            idle,
        };
    }
}
