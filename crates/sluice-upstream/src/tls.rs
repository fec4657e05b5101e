//! TLS for connections to upstreams (`https://`, `wss://`): the public web PKI roots, plus CA
//! certificates the operator trusts (`ca_file`, e.g. for a node behind a private CA).
//!
//! Trust anchors are process-wide: [`trust_ca_file`] is called for every configured file at
//! start, before the first connection builds the shared [`client_config`].

use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};

use rustls::{ClientConfig, RootCertStore};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;

static EXTRA: Mutex<Vec<CertificateDer<'static>>> = Mutex::new(Vec::new());
static CONFIG: OnceLock<Arc<ClientConfig>> = OnceLock::new();

/// Adds the PEM certificates in `path` to the trusted roots. Returns how many were added.
pub fn trust_ca_file(path: &Path) -> Result<usize, String> {
    if CONFIG.get().is_some() {
        return Err("trusted CAs must be added before the first TLS connection".into());
    }
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("{}: {e}", path.display()))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: no PEM certificate in it", path.display()));
    }
    let n = certs.len();
    EXTRA.lock().unwrap_or_else(|e| e.into_inner()).extend(certs);
    Ok(n)
}

/// The shared client configuration (ring provider, TLS 1.2 and 1.3).
pub fn client_config() -> Arc<ClientConfig> {
    CONFIG
        .get_or_init(|| {
            let mut roots = RootCertStore { roots: webpki_roots::TLS_SERVER_ROOTS.to_vec() };
            for cert in EXTRA.lock().unwrap_or_else(|e| e.into_inner()).iter() {
                if let Err(e) = roots.add(cert.clone()) {
                    tracing::warn!(error = %e, "a trusted CA certificate was rejected");
                }
            }
            let config = ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .expect("ring supports the default protocol versions")
                .with_root_certificates(roots)
                .with_no_client_auth();
            Arc::new(config)
        })
        .clone()
}
