//! A TLS-terminating relay in front of a node: it lets tests reach a real anvil over
//! `https://` and `wss://`, with a fresh self-signed certificate whose PEM file a test passes to
//! sluice as `ca_file`.

use std::path::PathBuf;
use std::sync::Arc;

use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;

/// A TLS relay on a loopback port; stops when dropped.
pub struct TlsRelay {
    /// Its port (the certificate names 127.0.0.1 and localhost).
    pub port: u16,
    ca: tempfile::NamedTempFile,
    task: tokio::task::JoinHandle<()>,
}

impl TlsRelay {
    /// Relays TLS connections to `127.0.0.1:to_port` (call from inside a tokio runtime).
    pub async fn spawn(to_port: u16) -> Self {
        let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
            .expect("a self-signed certificate");
        let mut ca = tempfile::NamedTempFile::new().expect("temp file");
        std::io::Write::write_all(&mut ca, cert.cert.pem().as_bytes()).expect("PEM written");
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(cert.key_pair.serialize_der()));
        let chain = vec![CertificateDer::from(cert.cert.der().to_vec())];
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .expect("server config");
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(client).await else { return };
                    let Ok(mut node) = TcpStream::connect(("127.0.0.1", to_port)).await else { return };
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut node).await;
                });
            }
        });
        Self { port, ca, task }
    }

    /// The certificate to trust, as a PEM file.
    pub fn ca_file(&self) -> PathBuf {
        self.ca.path().to_owned()
    }
}

impl Drop for TlsRelay {
    fn drop(&mut self) {
        self.task.abort();
    }
}
