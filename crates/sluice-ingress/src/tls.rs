//! TLS 1.3 for the ingress: self-signed certificates on both sides, the client's key as its
//! identity, and optionally the server's key pinned by the client.
//!
//! No certificate authority is involved: as in Solana's QUIC ports, what matters is which key is
//! speaking, proven by the handshake signature, which both verifiers below do check.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, Error, SignatureScheme};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};

use crate::identity::{Identity, KeyPair};

/// The ALPN protocol: one transaction per stream.
pub const ALPN: &[u8] = b"sluice-tx/1";

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn verify13(
    message: &[u8],
    cert: &CertificateDer<'_>,
    dss: &DigitallySignedStruct,
) -> Result<HandshakeSignatureValid, Error> {
    rustls::crypto::verify_tls13_signature(message, cert, dss, &provider().signature_verification_algorithms)
}

fn schemes() -> Vec<SignatureScheme> {
    provider().signature_verification_algorithms.supported_schemes()
}

/// Accepts any well-formed client certificate (its identity is read afterwards), and clients
/// without one when `mandatory` is off; they are charged to the unknown class.
#[derive(Debug)]
struct AnyClientKey {
    mandatory: bool,
}

impl ClientCertVerifier for AnyClientKey {
    fn client_auth_mandatory(&self) -> bool {
        self.mandatory
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, Error> {
        Identity::of_certificate(end_entity)
            .map(|_| ClientCertVerified::assertion())
            .ok_or(Error::InvalidCertificate(rustls::CertificateError::BadEncoding))
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        Err(Error::PeerIncompatible(rustls::PeerIncompatible::Tls12NotOffered))
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        verify13(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        schemes()
    }
}

/// Accepts the server whose key has the pinned identity, or any server when none is pinned.
#[derive(Debug)]
struct ServerKey {
    pinned: Option<Identity>,
}

impl ServerCertVerifier for ServerKey {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        let identity = Identity::of_certificate(end_entity)
            .ok_or(Error::InvalidCertificate(rustls::CertificateError::BadEncoding))?;
        match self.pinned {
            Some(pinned) if pinned != identity => {
                Err(Error::InvalidCertificate(rustls::CertificateError::NotValidForName))
            }
            _ => Ok(ServerCertVerified::assertion()),
        }
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        Err(Error::PeerIncompatible(rustls::PeerIncompatible::Tls12NotOffered))
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        verify13(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        schemes()
    }
}

/// The server's TLS configuration: TLS 1.3 only, ALPN `sluice-tx/1`, client keys read.
pub fn server_config(key: &KeyPair, client_key_mandatory: bool) -> Result<rustls::ServerConfig, Error> {
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_client_cert_verifier(Arc::new(AnyClientKey { mandatory: client_key_mandatory }))
        .with_single_cert(vec![key.certificate()], key.private_key())?;
    config.alpn_protocols = vec![ALPN.to_vec()];
    Ok(config)
}

/// A client's TLS configuration: its key as its certificate, and the server's key pinned when
/// `server` is given.
pub fn client_config(key: &KeyPair, server: Option<Identity>) -> Result<rustls::ClientConfig, Error> {
    let mut config = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(ServerKey { pinned: server }))
        .with_client_auth_cert(vec![key.certificate()], key.private_key())?;
    config.alpn_protocols = vec![ALPN.to_vec()];
    Ok(config)
}
