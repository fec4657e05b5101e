//! JSON Web Tokens (`Authorization: Bearer eyJ…`), verified with the `jsonwebtoken` crate.
//!
//! Several keys may be configured at once, for rotation: a token naming a `kid` is checked
//! with that key only; a token without one with each key of its algorithm. HS256 takes a shared
//! secret; RS256 and ES256 a public key (PEM). Unsigned tokens (`alg: none`) are refused by
//! name before anything else is read. The claims give the tier, the quota bucket (`sub`) and an
//! optional scope (`networks`, `methods`, `contracts`); `exp` is required.
//!
//! A token verified once is remembered (by its SHA-256, at most [`REMEMBERED`] of them, each
//! for at most [`REMEMBER_FOR`] and never past its `exp`): a client sends the same token on
//! every request, and an ES256 verification costs far more than the rest of a request
//! (`cargo bench -p sluice-gateway --bench access`). Refusals are not remembered.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::{Deserialize, Serialize};

use crate::scope::Scope;

/// `[access.jwt]`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct JwtConfig {
    /// The verification keys (at least one).
    pub keys: Vec<JwtKey>,
    /// The tier of a token without a `tier` claim; none: such tokens are refused.
    pub default_tier: Option<String>,
    /// Required `iss`, if set.
    pub issuer: Option<String>,
    /// Required `aud`, if set (a token with an `aud` is refused when this is not set).
    pub audience: Option<String>,
    /// Clock skew allowed on `exp` and `nbf`, in seconds.
    pub leeway_secs: u64,
}

/// One verification key.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct JwtKey {
    /// The `kid` tokens name it by; none: tried for tokens without a `kid`.
    pub kid: Option<String>,
    /// `HS256`, `RS256` or `ES256`.
    pub algorithm: String,
    /// The shared secret (HS256).
    pub secret: Option<String>,
    /// The public key in PEM (RS256, ES256).
    pub public_key: Option<String>,
    /// A file holding the public key in PEM, instead of `public_key`.
    pub public_key_file: Option<PathBuf>,
}

/// The claims sluice reads.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Claims {
    /// The subject: quotas are counted per subject.
    pub sub: Option<String>,
    /// The tier's name.
    pub tier: Option<String>,
    /// Expiry, Unix seconds.
    pub exp: Option<u64>,
    /// Networks the token may use (absent: its tier's).
    pub networks: Vec<String>,
    /// Method patterns the token may call (absent: all its tier allows).
    pub methods: Vec<String>,
    /// Contracts the token may call (absent: all).
    pub contracts: Vec<String>,
}

/// What a valid token grants.
#[derive(Debug, Clone, PartialEq)]
pub struct Grant {
    /// The quota bucket: `jwt:` and the subject (or the `kid` when there is none).
    pub subject: String,
    /// The tier's name.
    pub tier: String,
    /// The token's own limits.
    pub scope: Arc<Scope>,
    /// When it stops being valid, Unix milliseconds.
    pub expires_ms: u64,
}

/// Why a token is refused; each says which, and nothing else.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenError {
    /// Not three base64url parts with a JSON header.
    Malformed,
    /// `alg: none`.
    Unsigned,
    /// An algorithm no configured key uses.
    Algorithm(String),
    /// A `kid` no configured key has.
    UnknownKid(String),
    /// The signature does not verify.
    BadSignature,
    /// Past `exp`.
    Expired,
    /// Before `nbf`.
    NotYetValid,
    /// A claim is missing or wrong (names it).
    Claim(String),
}

impl std::fmt::Display for TokenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TokenError::Malformed => write!(f, "malformed token"),
            TokenError::Unsigned => write!(f, "unsigned tokens (alg none) are not accepted"),
            TokenError::Algorithm(alg) => write!(f, "token algorithm {alg} is not accepted here"),
            TokenError::UnknownKid(kid) => write!(f, "unknown token key id (kid) {kid:?}"),
            TokenError::BadSignature => write!(f, "bad token signature"),
            TokenError::Expired => write!(f, "token expired"),
            TokenError::NotYetValid => write!(f, "token not yet valid (nbf)"),
            TokenError::Claim(what) => write!(f, "token claim {what}"),
        }
    }
}

/// True when `credential` has the shape of a JWT (three dot-separated parts, the first a
/// base64url JSON object), so that API keys and tokens can share `Authorization: Bearer`.
pub fn looks_like_jwt(credential: &str) -> bool {
    credential.starts_with("eyJ") && credential.bytes().filter(|b| *b == b'.').count() == 2
}

struct Verifier {
    kid: Option<String>,
    algorithm: Algorithm,
    key: DecodingKey,
}

/// Verified tokens remembered at most.
pub const REMEMBERED: u64 = 10_000;
/// How long a verified token is remembered at most.
pub const REMEMBER_FOR: Duration = Duration::from_secs(300);

/// The configured keys, ready to verify.
pub struct Jwt {
    verifiers: Vec<Verifier>,
    config: JwtConfig,
    verified: moka::sync::Cache<[u8; 32], Arc<Grant>>,
}

impl Jwt {
    /// Loads the keys; the error names the key (`access.jwt.keys[1].public_key: …`).
    pub fn new(config: &JwtConfig) -> Result<Self, String> {
        if config.keys.is_empty() {
            return Err("access.jwt.keys: at least one key is needed".into());
        }
        let mut verifiers = Vec::new();
        let mut kids = HashSet::new();
        for (i, k) in config.keys.iter().enumerate() {
            let at = format!("access.jwt.keys[{i}]");
            if let Some(kid) = &k.kid {
                if !kids.insert(kid.clone()) {
                    return Err(format!("{at}.kid: {kid:?} is used twice"));
                }
            }
            let algorithm = match k.algorithm.as_str() {
                "HS256" => Algorithm::HS256,
                "RS256" => Algorithm::RS256,
                "ES256" => Algorithm::ES256,
                other => return Err(format!("{at}.algorithm: {other:?}; use HS256, RS256 or ES256")),
            };
            let pem = || -> Result<Vec<u8>, String> {
                match (&k.public_key, &k.public_key_file) {
                    (Some(pem), None) => Ok(pem.as_bytes().to_vec()),
                    (None, Some(path)) => {
                        std::fs::read(path).map_err(|e| format!("{at}.public_key_file: {}: {e}", path.display()))
                    }
                    _ => Err(format!("{at}: {} needs public_key or public_key_file (one of them)", k.algorithm)),
                }
            };
            let key = match algorithm {
                Algorithm::HS256 => {
                    let secret = k.secret.as_deref().filter(|s| s.len() >= 16);
                    let secret =
                        secret.ok_or_else(|| format!("{at}.secret: HS256 needs a secret of 16 bytes or more"))?;
                    DecodingKey::from_secret(secret.as_bytes())
                }
                Algorithm::RS256 => DecodingKey::from_rsa_pem(&pem()?),
                _ => DecodingKey::from_ec_pem(&pem()?),
            }
            .map_err(|e| format!("{at}: {e}"))?;
            verifiers.push(Verifier { kid: k.kid.clone(), algorithm, key });
        }
        let verified = moka::sync::Cache::builder().max_capacity(REMEMBERED).time_to_live(REMEMBER_FOR).build();
        Ok(Self { verifiers, config: config.clone(), verified })
    }

    /// Verifies `token`, or finds it verified already; `now_ms` is checked against its `exp`.
    pub fn check(&self, token: &str, now_ms: u64) -> Result<Arc<Grant>, TokenError> {
        let digest: [u8; 32] = sha2::Digest::finalize(<sha2::Sha256 as sha2::Digest>::new_with_prefix(token)).into();
        if let Some(grant) = self.verified.get(&digest) {
            if grant.expires_ms.saturating_add(self.config.leeway_secs * 1000) <= now_ms {
                self.verified.invalidate(&digest);
                return Err(TokenError::Expired);
            }
            return Ok(grant);
        }
        let grant = Arc::new(self.verify(token)?);
        self.verified.insert(digest, grant.clone());
        // Bounded by REMEMBERED; shown so that an operator sees how full it runs.
        metrics::gauge!("sluice_access_jwt_remembered").set(self.verified.entry_count() as f64);
        Ok(grant)
    }

    /// Verifies `token` now; the grant's `expires_ms` lets long-lived WebSocket sessions
    /// close when it runs out.
    pub fn verify(&self, token: &str) -> Result<Grant, TokenError> {
        let (alg, kid) = read_header(token)?;
        let Ok(algorithm) = alg.parse::<Algorithm>() else { return Err(TokenError::Algorithm(alg)) };
        let candidates: Vec<&Verifier> = match &kid {
            Some(kid) => {
                let v = self.verifiers.iter().find(|v| v.kid.as_deref() == Some(kid.as_str()));
                vec![v.ok_or_else(|| TokenError::UnknownKid(kid.clone()))?]
            }
            None => self.verifiers.iter().filter(|v| v.algorithm == algorithm).collect(),
        };
        if candidates.iter().all(|v| v.algorithm != algorithm) {
            return Err(TokenError::Algorithm(alg));
        }
        let mut last = TokenError::BadSignature;
        for v in candidates {
            let mut validation = Validation::new(v.algorithm);
            validation.leeway = self.config.leeway_secs;
            validation.set_required_spec_claims(&["exp"]);
            validation.validate_nbf = true;
            match &self.config.audience {
                Some(aud) => validation.set_audience(&[aud]),
                None => validation.validate_aud = false,
            }
            if let Some(iss) = &self.config.issuer {
                validation.set_issuer(&[iss]);
            }
            match jsonwebtoken::decode::<Claims>(token, &v.key, &validation) {
                Ok(data) => return self.grant(data.claims, kid.as_deref()),
                Err(e) => {
                    use jsonwebtoken::errors::ErrorKind as K;
                    last = match e.kind() {
                        K::InvalidSignature | K::InvalidEcdsaKey | K::InvalidRsaKey(_) | K::InvalidAlgorithm => {
                            TokenError::BadSignature
                        }
                        K::ExpiredSignature => return Err(TokenError::Expired),
                        K::ImmatureSignature => return Err(TokenError::NotYetValid),
                        K::MissingRequiredClaim(c) => return Err(TokenError::Claim(format!("{c} is missing"))),
                        K::InvalidClaimFormat(c) => return Err(TokenError::Claim(format!("{c} is malformed"))),
                        K::InvalidIssuer => return Err(TokenError::Claim("iss is not the expected issuer".into())),
                        K::InvalidAudience => return Err(TokenError::Claim("aud is not the expected audience".into())),
                        K::Json(_) => return Err(TokenError::Claim("set is not a valid JSON object".into())),
                        _ => TokenError::Malformed,
                    };
                }
            }
        }
        Err(last)
    }

    fn grant(&self, claims: Claims, kid: Option<&str>) -> Result<Grant, TokenError> {
        let tier = claims.tier.or_else(|| self.config.default_tier.clone());
        let tier = tier.ok_or_else(|| TokenError::Claim("tier is missing".into()))?;
        let subject = claims.sub.or_else(|| kid.map(str::to_owned)).unwrap_or_else(|| "token".into());
        let scope = Scope { networks: claims.networks, methods: claims.methods, contracts: claims.contracts }
            .normalize()
            .map_err(|e| TokenError::Claim(e.replacen(':', " is malformed:", 1)))?;
        Ok(Grant {
            subject: format!("jwt:{subject}"),
            tier,
            scope: Arc::new(scope),
            expires_ms: claims.exp.unwrap_or(0).saturating_mul(1000),
        })
    }
}

/// The header's `alg` and `kid`, read before any key is chosen.
fn read_header(token: &str) -> Result<(String, Option<String>), TokenError> {
    #[derive(Deserialize)]
    struct Header {
        alg: String,
        kid: Option<String>,
    }
    let mut parts = token.split('.');
    let (Some(header), Some(_), Some(_), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
        return Err(TokenError::Malformed);
    };
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(header).map_err(|_| TokenError::Malformed)?;
    let header: Header = serde_json::from_slice(&bytes).map_err(|_| TokenError::Malformed)?;
    if header.alg.eq_ignore_ascii_case("none") {
        return Err(TokenError::Unsigned);
    }
    Ok((header.alg, header.kid))
}

#[cfg(test)]
mod tests {
    use jsonwebtoken::{encode, EncodingKey, Header};

    use super::*;

    const SECRET: &str = "0123456789abcdef-secret";

    fn config(keys: Vec<JwtKey>) -> JwtConfig {
        JwtConfig { keys, ..JwtConfig::default() }
    }

    fn hs(kid: Option<&str>, secret: &str) -> JwtKey {
        JwtKey {
            kid: kid.map(str::to_owned),
            algorithm: "HS256".into(),
            secret: Some(secret.into()),
            ..JwtKey::default()
        }
    }

    fn token(kid: Option<&str>, secret: &str, claims: serde_json::Value) -> String {
        let mut header = Header::new(Algorithm::HS256);
        header.kid = kid.map(str::to_owned);
        encode(&header, &claims, &EncodingKey::from_secret(secret.as_bytes()).unwrap()).unwrap()
    }

    fn later() -> u64 {
        jsonwebtoken::get_current_timestamp() + 600
    }

    #[test]
    fn a_valid_token_grants_its_tier_subject_and_scope() {
        let jwt = Jwt::new(&config(vec![hs(None, SECRET)])).unwrap();
        let t = token(
            None,
            SECRET,
            serde_json::json!({"sub": "alice", "tier": "pro", "exp": later(), "networks": ["eth"]}),
        );
        assert!(looks_like_jwt(&t));
        let grant = jwt.verify(&t).unwrap();
        assert_eq!((grant.subject.as_str(), grant.tier.as_str()), ("jwt:alice", "pro"));
        assert_eq!(grant.scope.networks, vec!["eth".to_owned()]);
    }

    #[test]
    fn each_refusal_says_which() {
        let jwt = Jwt::new(&config(vec![hs(Some("k1"), SECRET), hs(Some("k2"), "another-secret-of-16")])).unwrap();
        let claims = serde_json::json!({"tier": "pro", "exp": later()});
        assert!(jwt.verify(&token(Some("k2"), "another-secret-of-16", claims.clone())).is_ok(), "rotation");
        assert_eq!(jwt.verify(&token(Some("k1"), "wrong-secret-wrong", claims.clone())), Err(TokenError::BadSignature));
        assert_eq!(jwt.verify(&token(Some("k9"), SECRET, claims.clone())), Err(TokenError::UnknownKid("k9".into())));
        let expired = serde_json::json!({"tier": "pro", "exp": 1_000_000});
        assert_eq!(jwt.verify(&token(Some("k1"), SECRET, expired)), Err(TokenError::Expired));
        let no_exp = serde_json::json!({"tier": "pro"});
        assert!(matches!(jwt.verify(&token(Some("k1"), SECRET, no_exp)), Err(TokenError::Claim(_))));
        let no_tier = serde_json::json!({"exp": later()});
        assert_eq!(jwt.verify(&token(Some("k1"), SECRET, no_tier)), Err(TokenError::Claim("tier is missing".into())));
        // alg none: header {"alg":"none"}, claims, empty signature.
        let b64 = |v: serde_json::Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
        let unsigned = format!("{}.{}.", b64(serde_json::json!({"alg": "none"})), b64(claims));
        assert_eq!(jwt.verify(&unsigned), Err(TokenError::Unsigned));
        assert_eq!(jwt.verify("eyJ.not.base64!"), Err(TokenError::Malformed));
        assert_eq!(jwt.verify("a.b"), Err(TokenError::Malformed));
        let rs = format!("{}.e30.sig", b64(serde_json::json!({"alg": "RS256"})));
        assert_eq!(jwt.verify(&rs), Err(TokenError::Algorithm("RS256".into())));
    }

    #[test]
    fn bad_key_configuration_names_the_key() {
        let e = Jwt::new(&config(vec![hs(None, "short")])).err().unwrap();
        assert!(e.starts_with("access.jwt.keys[0].secret"), "{e}");
        let es = JwtKey { algorithm: "ES256".into(), ..JwtKey::default() };
        assert!(Jwt::new(&config(vec![es])).err().unwrap().contains("public_key"));
        let odd = JwtKey { algorithm: "XX1".into(), ..JwtKey::default() };
        assert!(Jwt::new(&config(vec![odd])).err().unwrap().contains("algorithm"));
        assert!(Jwt::new(&config(vec![hs(Some("a"), SECRET), hs(Some("a"), SECRET)])).err().unwrap().contains("twice"));
    }
}
