//! HTTPS for the API and portal: a certificate chain and private key in PEM, served with
//! rustls (ring provider). Without one the API speaks plain HTTP, which `start` allows on
//! loopback only.

use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// A certificate chain (leaf first) and its private key, both PEM.
#[derive(Clone)]
pub struct TlsIdentity {
    pub cert_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for TlsIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("TlsIdentity").finish_non_exhaustive()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("the TLS certificate: {0}")]
    Certificate(String),
    #[error("the TLS private key: {0}")]
    Key(String),
    #[error("TLS: {0}")]
    Rustls(#[from] rustls::Error),
}

/// The rustls server configuration for `id`, TLS 1.2 and 1.3, no client certificates.
pub fn server_config(id: &TlsIdentity) -> Result<rustls::ServerConfig, TlsError> {
    let certs = CertificateDer::pem_slice_iter(id.cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Certificate(e.to_string()))?;
    if certs.is_empty() {
        return Err(TlsError::Certificate("no certificate in the PEM".into()));
    }
    let key = PrivateKeyDer::from_pem_slice(id.key_pem.as_bytes())
        .map_err(|e| TlsError::Key(e.to_string()))?;
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_no_client_auth()
    .with_single_cert(certs, key)?;
    Ok(config)
}
