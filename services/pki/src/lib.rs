//! The control plane's internal certificate authority for node identities, with no IO but
//! [`private`]'s (files only their owner reads, for whoever keeps keys on disk): it
//! signs the agents' certificate signing requests into short-lived node certificates, issues
//! the gRPC server's certificate, and reads a peer certificate back into a node identity.
//!
//! A node certificate names its node twice: the subject common name and a URI subject
//! alternative name `urn:allot:node:<name>`. Its serial is what the control plane records,
//! so a certificate it has no record of (or has revoked) authenticates nothing, whoever
//! signed it.

use chrono::{DateTime, Utc};
use rcgen::{
    BasicConstraints, CertificateParams, CertificateSigningRequestParams, DistinguishedName,
    DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType, SerialNumber,
};
use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};

mod private;
pub use private::{Descend, Tightened, make_private, write_private};

/// The URI subject alternative name of a node certificate is this prefix and the node name.
pub const NODE_URI_PREFIX: &str = "urn:allot:node:";

#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("certificate signing request: {0}")]
    Csr(String),
    #[error("certificate: {0}")]
    Certificate(String),
    #[error("the certificate names no Allot node")]
    NotANode,
    #[error("{0}")]
    Rcgen(#[from] rcgen::Error),
}

fn to_time(t: DateTime<Utc>) -> Result<time::OffsetDateTime, PkiError> {
    time::OffsetDateTime::from_unix_timestamp(t.timestamp())
        .map_err(|e| PkiError::Certificate(format!("time out of range: {e}")))
}

/// A serial number from 16 random bytes, as a positive DER integer without leading zeros
/// (so its hex form reads back unchanged).
fn serial(random: [u8; 16]) -> (SerialNumber, String) {
    let mut bytes = random;
    bytes[0] = (bytes[0] & 0x7f) | 0x40;
    (SerialNumber::from_slice(&bytes), hex::encode(bytes))
}

/// A certificate and, when this side generated it, its private key.
#[derive(Debug, Clone)]
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: Option<String>,
    /// Lowercase hex.
    pub serial: String,
    pub not_before: DateTime<Utc>,
    pub not_after: DateTime<Utc>,
}

/// The certificate authority: its certificate and signing key.
pub struct Authority {
    issuer: Issuer<'static, KeyPair>,
    cert_pem: String,
}

impl std::fmt::Debug for Authority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authority").finish_non_exhaustive()
    }
}

impl Authority {
    /// A new authority valid for ten years from `now`.
    pub fn generate(
        common_name: &str,
        now: DateTime<Utc>,
        random: [u8; 16],
    ) -> Result<Self, PkiError> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        params.not_before = to_time(now - chrono::Duration::hours(1))?;
        params.not_after = to_time(now + chrono::Duration::days(3650))?;
        params.serial_number = Some(serial(random).0);
        let cert = params.self_signed(&key)?;
        Ok(Self {
            cert_pem: cert.pem(),
            issuer: Issuer::new(params, key),
        })
    }

    /// The authority saved earlier with [`Authority::cert_pem`] and [`Authority::key_pem`].
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self, PkiError> {
        let key = KeyPair::from_pem(key_pem)?;
        let issuer = Issuer::from_ca_cert_pem(cert_pem, key)?;
        Ok(Self {
            issuer,
            cert_pem: cert_pem.to_owned(),
        })
    }

    /// The certificate agents trust.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The signing key, to be kept secret.
    pub fn key_pem(&self) -> String {
        self.issuer.key().serialize_pem()
    }

    /// A server certificate (and its new key) for `names` (host names or IP addresses),
    /// valid from an hour before `now` (agents' clocks drift) for `valid_for`.
    pub fn issue_server(
        &self,
        names: &[String],
        now: DateTime<Utc>,
        valid_for: chrono::Duration,
        random: [u8; 16],
    ) -> Result<Issued, PkiError> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(names.to_vec())?;
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, "Allot control plane");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let not_before = now - chrono::Duration::hours(1);
        let not_after = now + valid_for;
        params.not_before = to_time(not_before)?;
        params.not_after = to_time(not_after)?;
        let (number, serial) = serial(random);
        params.serial_number = Some(number);
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(Issued {
            cert_pem: cert.pem(),
            key_pem: Some(key.serialize_pem()),
            serial,
            not_before,
            not_after,
        })
    }

    /// Signs the key of `csr_pem` (whose signature proves its holder has the private key)
    /// into a client certificate for `node`. Nothing else the request asks for is taken:
    /// the names, usages and validity are the authority's.
    pub fn sign_node(
        &self,
        csr_pem: &str,
        node: &str,
        not_before: DateTime<Utc>,
        not_after: DateTime<Utc>,
        random: [u8; 16],
    ) -> Result<Issued, PkiError> {
        let csr = CertificateSigningRequestParams::from_pem(csr_pem)
            .map_err(|e| PkiError::Csr(e.to_string()))?;
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, node);
        params.subject_alt_names = vec![SanType::URI(
            format!("{NODE_URI_PREFIX}{node}")
                .try_into()
                .map_err(|e: rcgen::Error| PkiError::Csr(format!("node name: {e}")))?,
        )];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.not_before = to_time(not_before)?;
        params.not_after = to_time(not_after)?;
        let (number, serial) = serial(random);
        params.serial_number = Some(number);
        let cert = CertificateSigningRequestParams {
            params,
            public_key: csr.public_key,
        }
        .signed_by(&self.issuer)?;
        Ok(Issued {
            cert_pem: cert.pem(),
            key_pem: None,
            serial,
            not_before,
            not_after,
        })
    }
}

/// A new node key and a certificate signing request for it.
#[derive(Debug, Clone)]
pub struct NodeRequest {
    pub key_pem: String,
    pub csr_pem: String,
}

pub fn node_request(node: &str) -> Result<NodeRequest, PkiError> {
    request_with(node, KeyPair::generate()?)
}

/// A certificate signing request for the key the node already holds (PEM): what a
/// renewal sends, since the control plane renews only the key a node holds.
pub fn node_request_for_key(node: &str, key_pem: &str) -> Result<NodeRequest, PkiError> {
    request_with(node, KeyPair::from_pem(key_pem)?)
}

fn request_with(node: &str, key: KeyPair) -> Result<NodeRequest, PkiError> {
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, node);
    let csr = params.serialize_request(&key)?;
    Ok(NodeRequest {
        key_pem: key.serialize_pem(),
        csr_pem: csr.pem()?,
    })
}

/// What a node certificate says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeCert {
    pub node: String,
    /// Lowercase hex.
    pub serial: String,
    pub not_before: DateTime<Utc>,
    pub not_after: DateTime<Utc>,
    /// Its subject public key info (DER).
    pub public_key: Vec<u8>,
}

/// The subject public key info (DER) a certificate signing request (PEM) asks for.
pub fn csr_public_key(csr_pem: &str) -> Result<Vec<u8>, PkiError> {
    let (_, block) = x509_parser::pem::parse_x509_pem(csr_pem.as_bytes())
        .map_err(|e| PkiError::Csr(e.to_string()))?;
    let (_, csr) =
        x509_parser::certification_request::X509CertificationRequest::from_der(&block.contents)
            .map_err(|e| PkiError::Csr(e.to_string()))?;
    Ok(csr.certification_request_info.subject_pki.raw.to_vec())
}

/// What identifies the key a certificate signing request (PEM) is for: the lowercase hex
/// SHA-256 of its subject public key info.
pub fn csr_key_fingerprint(csr_pem: &str) -> Result<String, PkiError> {
    use sha2::{Digest, Sha256};
    Ok(hex::encode(Sha256::digest(csr_public_key(csr_pem)?)))
}

impl NodeCert {
    /// Reads a node certificate (DER). Its signature is not checked here: the TLS handshake
    /// did that, against the authority.
    pub fn from_der(der: &[u8]) -> Result<Self, PkiError> {
        let (_, cert) =
            X509Certificate::from_der(der).map_err(|e| PkiError::Certificate(e.to_string()))?;
        let node = cert
            .subject_alternative_name()
            .map_err(|e| PkiError::Certificate(e.to_string()))?
            .and_then(|san| {
                san.value.general_names.iter().find_map(|n| match n {
                    GeneralName::URI(uri) => uri.strip_prefix(NODE_URI_PREFIX).map(str::to_owned),
                    _ => None,
                })
            })
            .filter(|n| !n.is_empty())
            .ok_or(PkiError::NotANode)?;
        let at = |t: x509_parser::time::ASN1Time| {
            DateTime::from_timestamp(t.timestamp(), 0)
                .ok_or_else(|| PkiError::Certificate("validity out of range".into()))
        };
        Ok(Self {
            node,
            serial: hex::encode(cert.raw_serial()),
            not_before: at(cert.validity().not_before)?,
            not_after: at(cert.validity().not_after)?,
            public_key: cert.public_key().raw.to_vec(),
        })
    }

    /// Reads the first certificate of a PEM file.
    pub fn from_pem(pem: &str) -> Result<Self, PkiError> {
        let (_, block) = x509_parser::pem::parse_x509_pem(pem.as_bytes())
            .map_err(|e| PkiError::Certificate(e.to_string()))?;
        Self::from_der(&block.contents)
    }

    /// When a holder should renew it: two thirds of the way through its validity.
    pub fn renew_at(&self) -> DateTime<Utc> {
        self.not_before + (self.not_after - self.not_before) * 2 / 3
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000, 0).expect("valid")
    }

    #[test]
    fn a_signed_request_reads_back_as_its_node() {
        let ca = Authority::generate("test CA", now(), [7; 16]).expect("CA");
        let req = node_request("gpu-7").expect("CSR");
        let until = now() + chrono::Duration::hours(24);
        let issued = ca
            .sign_node(&req.csr_pem, "gpu-7", now(), until, [0xff; 16])
            .expect("signed");
        let cert = NodeCert::from_pem(&issued.cert_pem).expect("parsed");
        assert_eq!(cert.node, "gpu-7");
        assert_eq!(cert.serial, issued.serial);
        assert_eq!((cert.not_before, cert.not_after), (now(), until));
        assert_eq!(cert.renew_at(), now() + chrono::Duration::hours(16));
        // A renewal's request for the same key asks for the certificate's key; a new
        // key's request does not.
        let same = node_request_for_key("gpu-7", &req.key_pem).expect("CSR");
        assert_eq!(csr_public_key(&same.csr_pem).expect("key"), cert.public_key);
        let other = node_request("gpu-7").expect("CSR");
        assert_ne!(
            csr_public_key(&other.csr_pem).expect("key"),
            cert.public_key
        );
    }

    #[test]
    fn the_authority_names_the_node_not_the_request() {
        // A request asking for another node's name (in its subject) gets the name the
        // authority was told, from the registration it checked.
        let ca = Authority::generate("test CA", now(), [7; 16]).expect("CA");
        let req = node_request("node-b").expect("CSR");
        let issued = ca
            .sign_node(&req.csr_pem, "node-a", now(), now(), [1; 16])
            .expect("signed");
        assert_eq!(
            NodeCert::from_pem(&issued.cert_pem).expect("parsed").node,
            "node-a"
        );
    }

    #[test]
    fn a_tampered_request_is_refused() {
        let ca = Authority::generate("test CA", now(), [7; 16]).expect("CA");
        let req = node_request("n").expect("CSR");
        let mut pem = req.csr_pem.clone();
        // Flip one character in the base64 body (the signature or the key).
        let i = pem.len() / 2;
        let c = if &pem[i..=i] == "A" { "B" } else { "A" };
        pem.replace_range(i..=i, c);
        assert!(ca.sign_node(&pem, "n", now(), now(), [1; 16]).is_err());
        assert!(ca.sign_node("garbage", "n", now(), now(), [1; 16]).is_err());
    }

    #[test]
    fn the_authority_survives_a_round_trip_through_pem() {
        let ca = Authority::generate("test CA", now(), [7; 16]).expect("CA");
        let again = Authority::from_pem(ca.cert_pem(), &ca.key_pem()).expect("loaded");
        let req = node_request("n").expect("CSR");
        again
            .sign_node(&req.csr_pem, "n", now(), now(), [1; 16])
            .expect("signs");
    }

    #[test]
    fn a_server_certificate_is_not_a_node() {
        let ca = Authority::generate("test CA", now(), [7; 16]).expect("CA");
        let server = ca
            .issue_server(
                &["localhost".into(), "127.0.0.1".into()],
                now(),
                chrono::Duration::days(1),
                [2; 16],
            )
            .expect("issued");
        assert!(matches!(
            NodeCert::from_pem(&server.cert_pem),
            Err(PkiError::NotANode)
        ));
    }
}
