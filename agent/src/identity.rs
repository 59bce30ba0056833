//! The node's identity: its private key and the certificate the control plane's CA signed
//! for it, kept in `<data dir>/identity/` (the key readable by its owner only), and the TLS
//! channels to the control plane that trust that CA and present that certificate.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use allot_pki::NodeCert;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::AgentError;

/// A node key and its certificate.
#[derive(Debug, Clone)]
pub struct Credentials {
    pub key_pem: String,
    pub cert_pem: String,
    pub cert: NodeCert,
}

impl Credentials {
    pub fn new(key_pem: String, cert_pem: String) -> Result<Self, AgentError> {
        let cert = NodeCert::from_pem(&cert_pem)
            .map_err(|e| AgentError::Credentials(format!("the node certificate: {e}")))?;
        Ok(Self {
            key_pem,
            cert_pem,
            cert,
        })
    }
}

fn dir(data_dir: &Path) -> PathBuf {
    data_dir.join("identity")
}

/// The saved credentials of `node`, if any (those of another node name are ignored).
pub fn load(data_dir: &Path, node: &str) -> Result<Option<Credentials>, AgentError> {
    let dir = dir(data_dir);
    let (key, cert) = (dir.join("node.key"), dir.join("node.crt"));
    if !key.exists() || !cert.exists() {
        return Ok(None);
    }
    let creds = Credentials::new(
        std::fs::read_to_string(key)?,
        std::fs::read_to_string(cert)?,
    )?;
    if creds.cert.node != node {
        tracing::warn!(saved = %creds.cert.node, node, "saved node certificate is another node's; ignoring it");
        return Ok(None);
    }
    Ok(Some(creds))
}

/// Saves the credentials, replacing the earlier ones whole (write, then rename).
pub fn save(data_dir: &Path, creds: &Credentials) -> Result<(), AgentError> {
    let dir = dir(data_dir);
    std::fs::create_dir_all(&dir)?;
    allot_pki::write_private(&dir.join("node.key.new"), &creds.key_pem)?;
    std::fs::write(dir.join("node.crt.new"), &creds.cert_pem)?;
    std::fs::rename(dir.join("node.key.new"), dir.join("node.key"))?;
    std::fs::rename(dir.join("node.crt.new"), dir.join("node.crt"))?;
    Ok(())
}

/// The connections to the control plane: one that presents the node certificate, swapped
/// when the certificate is renewed, and one that presents none (to register with a
/// bootstrap token).
pub struct Link {
    endpoint: Endpoint,
    ca: Certificate,
    node: RwLock<Option<Channel>>,
    anonymous: Channel,
}

impl Link {
    pub fn new(server: &str, ca_pem: &str) -> Result<Arc<Self>, AgentError> {
        let endpoint = Endpoint::from_shared(server.to_owned())
            .map_err(|e| AgentError::Endpoint(server.to_owned(), e.to_string()))?
            .connect_timeout(Duration::from_secs(5))
            .tcp_nodelay(true);
        if !server.starts_with("https://") {
            return Err(AgentError::Endpoint(
                server.to_owned(),
                "agents speak to the control plane over TLS: use https://".into(),
            ));
        }
        let ca = Certificate::from_pem(ca_pem);
        let anonymous = endpoint
            .clone()
            .tls_config(ClientTlsConfig::new().ca_certificate(ca.clone()))
            .map_err(|e| AgentError::Endpoint(server.to_owned(), e.to_string()))?
            .connect_lazy();
        Ok(Arc::new(Self {
            endpoint,
            ca,
            node: RwLock::new(None),
            anonymous,
        }))
    }

    /// From now on, calls present these credentials (new connections; calls in flight finish
    /// on the old one).
    pub fn present(&self, creds: &Credentials) -> Result<(), AgentError> {
        let tls = ClientTlsConfig::new()
            .ca_certificate(self.ca.clone())
            .identity(Identity::from_pem(&creds.cert_pem, &creds.key_pem));
        let channel = self
            .endpoint
            .clone()
            .tls_config(tls)
            .map_err(|e| AgentError::Credentials(e.to_string()))?
            .connect_lazy();
        *self.node.write().unwrap_or_else(|e| e.into_inner()) = Some(channel);
        Ok(())
    }

    /// Stops presenting the node certificate (the control plane refused it).
    pub fn forget(&self) {
        *self.node.write().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// The channel that presents the node certificate, if there is one yet.
    pub fn node(&self) -> Option<Channel> {
        self.node.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// [`Link::node`], or the anonymous channel (whose calls the control plane refuses, as
    /// it should, until the node has registered).
    pub fn channel(&self) -> Channel {
        self.node().unwrap_or_else(|| self.anonymous.clone())
    }

    pub fn anonymous(&self) -> Channel {
        self.anonymous.clone()
    }
}
