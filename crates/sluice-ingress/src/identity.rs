//! Client and server identities: an Ed25519 key in a PEM file, a self-signed certificate made
//! from it, and the identity itself, the SHA-256 of the certificate's public key (its
//! SubjectPublicKeyInfo), written as 64 hex digits.
//!
//! Only the key matters: certificates are self-signed and made afresh at each start, so the
//! weights table names keys, as a stake table names validators.

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// The SHA-256 of a public key (SubjectPublicKeyInfo DER).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Identity([u8; 32]);

impl Identity {
    /// An identity from its bytes.
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Identity(bytes)
    }

    /// The identity of a SubjectPublicKeyInfo.
    pub fn of_spki(spki_der: &[u8]) -> Self {
        let digest = ring::digest::digest(&ring::digest::SHA256, spki_der);
        let mut bytes = [0u8; 32];
        bytes.copy_from_slice(digest.as_ref());
        Identity(bytes)
    }

    /// The identity of a certificate's public key, if it parses as an X.509 certificate.
    pub fn of_certificate(cert: &CertificateDer<'_>) -> Option<Self> {
        let parsed = webpki::EndEntityCert::try_from(cert).ok()?;
        Some(Identity::of_spki(parsed.subject_public_key_info().as_ref()))
    }

    /// The first 16 hex digits, for metric labels and logs.
    pub fn short(&self) -> String {
        hex::encode(&self.0[..8])
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl fmt::Debug for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Identity({})", self.short())
    }
}

/// Why an identity string was refused.
#[derive(Debug, thiserror::Error)]
#[error("an identity is 64 hex digits (the SHA-256 of a public key), got {0:?}")]
pub struct BadIdentity(String);

impl FromStr for Identity {
    type Err = BadIdentity;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let digits = s.trim().trim_start_matches("0x");
        let mut bytes = [0u8; 32];
        hex::decode_to_slice(digits, &mut bytes).map_err(|_| BadIdentity(s.to_string()))?;
        Ok(Identity(bytes))
    }
}

/// Errors reading or writing key files.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The file could not be read or written.
    #[error("key file {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// What went wrong.
        source: std::io::Error,
    },
    /// The file is not a PEM private key, or the certificate could not be made.
    #[error("key file {path}: {message}")]
    Invalid {
        /// The file.
        path: String,
        /// What went wrong.
        message: String,
    },
}

/// A private key and the self-signed certificate made from it.
pub struct KeyPair {
    key: rcgen::KeyPair,
    cert: CertificateDer<'static>,
}

impl fmt::Debug for KeyPair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyPair({})", self.identity())
    }
}

impl KeyPair {
    /// A new random Ed25519 key.
    pub fn generate() -> Self {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).expect("ring generates Ed25519 keys");
        Self::from_key(key).expect("a fresh key self-signs")
    }

    /// Reads a PEM (PKCS#8) private key.
    pub fn load(path: &Path) -> Result<Self, KeyError> {
        let pem = std::fs::read_to_string(path)
            .map_err(|source| KeyError::Io { path: path.display().to_string(), source })?;
        Self::from_pem(&pem).map_err(|message| KeyError::Invalid { path: path.display().to_string(), message })
    }

    /// Reads `path`, or makes a new key and writes it there (mode 0600) when it does not exist.
    pub fn load_or_generate(path: &Path) -> Result<Self, KeyError> {
        if path.exists() {
            return Self::load(path);
        }
        let pair = Self::generate();
        pair.save(path)?;
        Ok(pair)
    }

    /// A key from PEM text.
    pub fn from_pem(pem: &str) -> Result<Self, String> {
        let key = rcgen::KeyPair::from_pem(pem).map_err(|e| format!("not a PEM private key: {e}"))?;
        Self::from_key(key)
    }

    fn from_key(key: rcgen::KeyPair) -> Result<Self, String> {
        let mut params = rcgen::CertificateParams::new(vec!["sluice".to_string()]).map_err(|e| e.to_string())?;
        params.distinguished_name.push(rcgen::DnType::CommonName, "sluice ingress client");
        let cert = params.self_signed(&key).map_err(|e| format!("cannot self-sign: {e}"))?;
        Ok(KeyPair { cert: cert.der().clone(), key })
    }

    /// Writes the private key as PEM, readable by the owner only.
    pub fn save(&self, path: &Path) -> Result<(), KeyError> {
        let io = |source| KeyError::Io { path: path.display().to_string(), source };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let mut file = options.open(path).map_err(io)?;
        std::io::Write::write_all(&mut file, self.key.serialize_pem().as_bytes()).map_err(io)
    }

    /// This key's identity.
    pub fn identity(&self) -> Identity {
        Identity::of_spki(&self.key.public_key_der())
    }

    /// The self-signed certificate.
    pub fn certificate(&self) -> CertificateDer<'static> {
        self.cert.clone()
    }

    /// The private key, for rustls.
    pub fn private_key(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.key.serialize_der()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_certificate_carries_the_keys_identity() {
        let pair = KeyPair::generate();
        assert_eq!(Identity::of_certificate(&pair.certificate()), Some(pair.identity()));
        assert_ne!(KeyPair::generate().identity(), pair.identity());
    }

    #[test]
    fn a_saved_key_loads_with_the_same_identity() {
        let dir = std::env::temp_dir().join(format!("sluice-key-{}", std::process::id()));
        let path = dir.join("client.key");
        let _ = std::fs::remove_file(&path);
        let pair = KeyPair::load_or_generate(&path).expect("generate");
        assert_eq!(KeyPair::load(&path).expect("load").identity(), pair.identity());
        assert!(pair.save(&path).is_err(), "never overwrites a key");
        assert!(KeyPair::from_pem("nonsense").is_err());
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn identities_round_trip_as_hex() {
        let id = KeyPair::generate().identity();
        assert_eq!(id.to_string().parse::<Identity>().expect("parse"), id);
        assert!("abc".parse::<Identity>().is_err());
        assert!(Identity::of_certificate(&CertificateDer::from(vec![1, 2, 3])).is_none());
    }
}
