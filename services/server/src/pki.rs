//! Where the internal CA of node identities lives, and the gRPC server's TLS settings it
//! leads to: the CA's certificate and key in a directory (`ca.pem`, `ca.key`, the key
//! readable by its owner only), created on first start; or, for tests, only in memory.

use std::path::PathBuf;

use allot_pki::{Authority, PkiError};
use chrono::{DateTime, Utc};
use tonic::transport::{Certificate, Identity, ServerTlsConfig};

/// Where the CA comes from.
#[derive(Debug, Clone, Default)]
pub enum NodeCaSource {
    /// A new CA each start, kept in memory: agents enrolled against one start are strangers
    /// to the next. For tests and throwaway clusters.
    #[default]
    Ephemeral,
    /// `ca.pem` and `ca.key` in this directory, created when absent.
    Dir(PathBuf),
}

#[derive(Debug, thiserror::Error)]
pub enum CaError {
    #[error("node CA in {dir}: {source}")]
    Io {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("node CA: {0}")]
    Pki(#[from] PkiError),
}

/// Random bytes for serial numbers.
pub fn random16() -> [u8; 16] {
    uuid::Uuid::new_v4().into_bytes()
}

const CA_NAME: &str = "Allot node CA";

/// The CA of `source`, created (and, for a directory, saved) when absent.
pub fn load_or_create(source: &NodeCaSource, now: DateTime<Utc>) -> Result<Authority, CaError> {
    let dir = match source {
        NodeCaSource::Ephemeral => return Ok(Authority::generate(CA_NAME, now, random16())?),
        NodeCaSource::Dir(dir) => dir,
    };
    let io = |source| CaError::Io {
        dir: dir.clone(),
        source,
    };
    let (cert, key) = (dir.join("ca.pem"), dir.join("ca.key"));
    if key.exists() {
        let cert_pem = std::fs::read_to_string(&cert).map_err(io)?;
        let key_pem = std::fs::read_to_string(&key).map_err(io)?;
        return Ok(Authority::from_pem(&cert_pem, &key_pem)?);
    }
    std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
        .create(dir)
        .map_err(io)?;
    let ca = Authority::generate(CA_NAME, now, random16())?;
    allot_pki::write_private(&key, &ca.key_pem()).map_err(io)?;
    // The control plane's files are its user's alone; an operator copies the certificate
    // to the agents.
    allot_pki::write_private(&cert, ca.cert_pem()).map_err(io)?;
    tracing::info!(dir = %dir.display(), "created the node CA");
    Ok(ca)
}

/// The gRPC server's TLS: a certificate from the CA for `names`, and client certificates
/// from the same CA. A client certificate is optional at the handshake (an agent's first
/// registration has none yet); every call but `Register` requires one.
pub fn grpc_tls(
    ca: &Authority,
    names: &[String],
    now: DateTime<Utc>,
) -> Result<ServerTlsConfig, CaError> {
    let server = ca.issue_server(names, now, chrono::Duration::days(365), random16())?;
    let key = server.key_pem.unwrap_or_default();
    Ok(ServerTlsConfig::new()
        .identity(Identity::from_pem(server.cert_pem, key))
        .client_ca_root(Certificate::from_pem(ca.cert_pem()))
        .client_auth_optional(true))
}
