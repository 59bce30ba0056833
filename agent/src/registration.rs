//! Registering with the control plane (a bootstrap token and a CSR the first time, the node
//! certificate after) and renewing the node certificate.

use super::*;

impl Agent {
    pub(crate) fn lock_creds(&self) -> std::sync::MutexGuard<'_, Option<Credentials>> {
        self.creds.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes a newly signed certificate for the key of `request` into use (and saves it).
    pub(crate) fn adopt(&self, key_pem: String, cert_pem: String) -> Result<(), AgentError> {
        let creds = Credentials::new(key_pem, cert_pem)?;
        identity::save(&self.cfg.data_dir, &creds)?;
        self.link.present(&creds)?;
        *self.lock_creds() = Some(creds);
        Ok(())
    }

    /// Registers, retrying until it works or the agent stops: with the node certificate when
    /// there is one, else (or when it is refused) with the bootstrap token, for a new key.
    /// Retries send the same request: one whose answer was lost (a call that timed out after
    /// the control plane committed it, spending the token) is taken again as that
    /// registration because it is for the same key. Returns whether it registered (false:
    /// the agent stopped first).
    pub(crate) async fn register(&self, stop: &CancellationToken) -> Result<bool, AgentError> {
        let mut attempt = 0;
        let mut new_key: Option<allot_pki::NodeRequest> = None;
        loop {
            let seen = self.link.moved();
            let (channel, bootstrap_token) = match self.link.node() {
                Some(channel) => (channel, String::new()),
                None => match &self.cfg.bootstrap_token {
                    Some(t) => (self.link.anonymous(), t.clone()),
                    None => {
                        return Err(AgentError::NoCredentials(
                            self.cfg.data_dir.join("identity"),
                        ));
                    }
                },
            };
            let with_certificate = bootstrap_token.is_empty();
            // With its certificate, for the key it holds (the control plane renews only
            // that); with a bootstrap token, for a new one.
            let held = with_certificate
                .then(|| self.lock_creds().as_ref().map(|c| c.key_pem.clone()))
                .flatten();
            let request = match (&held, &new_key) {
                (Some(key), _) => allot_pki::node_request_for_key(&self.cfg.node_name, key),
                (None, Some(request)) => Ok(request.clone()),
                (None, None) => allot_pki::node_request(&self.cfg.node_name),
            }
            .map_err(|e| AgentError::Credentials(e.to_string()))?;
            if held.is_none() {
                new_key = Some(request.clone());
            }
            let req = RegisterRequest {
                bootstrap_token,
                csr_pem: request.csr_pem,
                node_name: self.cfg.node_name.clone(),
                agent_version: VERSION.to_owned(),
                gpu_backend: self.backend.kind().to_owned(),
                gpus: self.gpus()?,
                running_job_ids: self.running_ids(),
                cpu_milli: self.cfg.offer.cpu_milli,
                memory_bytes: self.cfg.offer.memory_bytes,
                runtime: self.runtime.kind().as_str().to_owned(),
                address: self.advertised_address(),
            };
            let sent = Instant::now();
            let mut rpc = NodeServiceClient::new(channel);
            match self
                .link
                .within(Duration::from_secs(5), rpc.register(req))
                .await
            {
                Ok(res) => {
                    let res = res.into_inner();
                    self.adopt(request.key_pem, res.certificate_pem)?;
                    self.lock_lease().granted(
                        sent,
                        Duration::from_millis(res.lease_duration_ms.into()),
                        Duration::from_millis(res.heartbeat_interval_ms.into()),
                        Duration::from_millis(res.outage_tolerance_ms.into()),
                    );
                    tracing::info!(node = %self.cfg.node_name, id = %res.node_id, "registered");
                    return Ok(true);
                }
                Err(s) if s.code() == Code::Unauthenticated && with_certificate => {
                    // Revoked, expired, or from an earlier CA: only a bootstrap token helps.
                    tracing::error!(node = %self.cfg.node_name, error = %s.message(), "the control plane refused the node certificate");
                    self.link.forget();
                    *self.lock_creds() = None;
                }
                Err(s) if matches!(s.code(), Code::Unauthenticated | Code::PermissionDenied) => {
                    return Err(AgentError::Refused(s.message().to_owned()));
                }
                Err(s) => {
                    tracing::warn!(node = %self.cfg.node_name, error = %s.message(), "registration failed; retrying");
                    let wait = if self.link.failed(seen, &s) {
                        // Another replica: try it at once.
                        Duration::from_millis(50)
                    } else {
                        attempt += 1;
                        self.link.jitter(backoff(attempt))
                    };
                    tokio::select! {
                        () = stop.cancelled() => return Ok(false),
                        () = tokio::time::sleep(wait) => {}
                    }
                }
            }
        }
    }

    /// Replaces the node certificate, two thirds through its life, with one for the same
    /// key (the control plane renews only the key a node holds). A failure is retried at
    /// the next heartbeat; the current certificate serves meanwhile.
    pub(crate) async fn renew(&self) {
        let Some(key_pem) = self.lock_creds().as_ref().map(|c| c.key_pem.clone()) else {
            return;
        };
        let request = match allot_pki::node_request_for_key(&self.cfg.node_name, &key_pem) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "cannot make a certificate signing request");
                return;
            }
        };
        let req = RenewCertificateRequest {
            csr_pem: request.csr_pem,
        };
        let seen = self.link.moved();
        let mut rpc = client(&self.link);
        match self
            .link
            .within(Duration::from_secs(5), rpc.renew_certificate(req))
            .await
        {
            Ok(res) => match self.adopt(request.key_pem, res.into_inner().certificate_pem) {
                Ok(()) => {
                    let until = self.lock_creds().as_ref().map(|c| c.cert.not_after);
                    tracing::info!(until = ?until, "node certificate renewed");
                }
                Err(e) => tracing::warn!(error = %e, "renewed node certificate not taken"),
            },
            Err(s) => {
                self.link.failed(seen, &s);
                tracing::warn!(error = %s.message(), "renewing the node certificate failed");
            }
        }
    }
}
