//! What reaches the CA from nodes — certificate signing requests, and the certificates
//! they present — is refused or accepted, never a panic, whatever the bytes.

use allot_pki::{Authority, NodeCert, csr_public_key, node_request};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn signing_requests_are_parsed_or_refused(text in "\\PC{0,400}") {
        let _ = csr_public_key(&text);
        let pem = format!("-----BEGIN CERTIFICATE REQUEST-----\n{text}\n-----END CERTIFICATE REQUEST-----\n");
        let _ = csr_public_key(&pem);
    }

    #[test]
    fn presented_certificates_are_parsed_or_refused(der in proptest::collection::vec(any::<u8>(), 0..600)) {
        let _ = NodeCert::from_der(&der);
    }

    #[test]
    fn a_bent_request_is_never_signed_for_another_key(flip in 0usize..2000, bit in 0u8..8) {
        let now = chrono::Utc::now();
        let ca = Authority::generate("test CA", now, [1; 16]).expect("CA");
        let req = node_request("node-1").expect("CSR");
        let mut bytes = req.csr_pem.clone().into_bytes();
        let at = flip % bytes.len();
        bytes[at] ^= 1 << bit;
        if let Ok(bent) = String::from_utf8(bytes)
            && let Ok(issued) =
                ca.sign_node(&bent, "node-1", now, now + chrono::Duration::hours(1), [2; 16])
        {
            // Whatever was signed is for the key the request proves it holds: a flipped bit
            // is either one the request's encoding ignores, or the request is refused.
            let der = pem_der(&issued.cert_pem);
            let cert = NodeCert::from_der(&der).expect("a certificate it issued");
            prop_assert_eq!(cert.public_key, csr_public_key(&req.csr_pem).expect("the original"));
        }
    }
}

fn pem_der(pem: &str) -> Vec<u8> {
    use base64::Engine;
    let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    base64::engine::general_purpose::STANDARD
        .decode(body)
        .expect("PEM")
}
