//! Bearer JWTs issued by the organisation's OpenID Connect provider (access or ID tokens),
//! verified locally: the signature against the issuer's JWKS (discovered, cached, fetched
//! again when a token names a key id it has not seen), the issuer, the audience, expiry and
//! not-before by the injected clock, and only the asymmetric algorithms configured. `none`
//! and HMAC are never accepted: an HMAC "signed" with the provider's public key is the
//! classic confusion attack. Claims map to role bindings by configuration
//! ([`ClaimRole`]).

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use allot_domain::{Clock, Role, RoleBinding};
use chrono::{DateTime, Utc};
use jsonwebtoken::jwk::Jwk;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::{Map, Value};
use tokio::sync::Mutex;

/// Longer bearer values are refused before any parsing.
pub const MAX_TOKEN_BYTES: usize = 8 * 1024;
/// By default, a token naming an unknown key id fetches the JWKS again at most this often.
pub const DEFAULT_JWKS_REFETCH: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum JwtError {
    #[error("the token is longer than {MAX_TOKEN_BYTES} bytes")]
    Oversized,
    #[error("the token is not a well-formed JWT")]
    Malformed,
    #[error("the token's algorithm is not accepted")]
    Algorithm,
    #[error(
        "the token names no key id (allowed only when the issuer publishes one key), or one the issuer does not publish"
    )]
    UnknownKey,
    #[error("the token's signature does not verify")]
    Signature,
    #[error("the provider says the token is not active (revoked, expired or unknown)")]
    Inactive,
    #[error("the token was not issued by the configured issuer")]
    Issuer,
    #[error("the token is not meant for this service (audience)")]
    Audience,
    #[error("the token has expired")]
    Expired,
    #[error("the token is not valid yet")]
    NotYetValid,
    #[error("the token lacks the `{0}` claim")]
    MissingClaim(&'static str),
    /// Details go to the log: the client learns only that the issuer could not be reached.
    #[error("the identity provider's keys could not be fetched")]
    Provider(String),
}

/// Grants `role` (in `tenant`, by name, for tenant roles) to tokens whose `claim` is
/// `value`, or is a list containing it. Written `CLAIM=VALUE:ROLE[@TENANT]`, e.g.
/// `groups=ml-team:member@ml` or `email=root@example.com:platform-admin`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRole {
    pub claim: String,
    pub value: String,
    pub role: Role,
    pub tenant: Option<String>,
}

impl FromStr for ClaimRole {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let usage = "expected CLAIM=VALUE:ROLE[@TENANT], e.g. groups=ml-team:member@ml";
        let (claim, rest) = s.split_once('=').ok_or(usage)?;
        let (value, grant) = rest.rsplit_once(':').ok_or(usage)?;
        let (role, tenant) = match grant.split_once('@') {
            Some((r, t)) => (r, Some(t.to_owned())),
            None => (grant, None),
        };
        let role: Role = role.parse()?;
        if claim.is_empty() || value.is_empty() {
            return Err(usage.to_owned());
        }
        match (role.is_platform(), &tenant) {
            (true, Some(_)) => Err(format!("the {role} role spans all tenants: drop `@TENANT`")),
            (false, None) => Err(format!("the {role} role needs a tenant: `{role}@TENANT`")),
            _ => Ok(Self {
                claim: claim.to_owned(),
                value: value.to_owned(),
                role,
                tenant,
            }),
        }
    }
}

/// Where tokens come from and what they grant.
#[derive(Debug, Clone)]
pub struct OidcConfig {
    /// The issuer URL, exactly as in the tokens' `iss` and the discovery document.
    pub issuer: String,
    /// Accepted `aud` values; a token must name at least one.
    pub audiences: Vec<String>,
    /// Accepted signature algorithms (asymmetric only).
    pub algorithms: Vec<Algorithm>,
    /// Clock skew tolerated on `exp` and `nbf`.
    pub leeway: Duration,
    pub claim_roles: Vec<ClaimRole>,
    /// A token naming a key id not in the cached JWKS fetches it again at most this often,
    /// so made-up key ids cannot hammer the provider ([`DEFAULT_JWKS_REFETCH`]).
    pub jwks_refetch: Duration,
    /// Also accept opaque access tokens, asking the provider about each
    /// ([`crate::introspection`]).
    pub introspection: Option<crate::introspection::Introspection>,
}

impl OidcConfig {
    /// Refuses settings that would weaken verification.
    pub fn check(&self) -> Result<(), String> {
        if self.audiences.is_empty() {
            return Err(
                "an OIDC audience is required (the client id, or the API's audience)".into(),
            );
        }
        if self.algorithms.is_empty() {
            return Err("at least one signature algorithm is required".into());
        }
        if let Some(a) = self
            .algorithms
            .iter()
            .find(|a| matches!(a, Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512))
        {
            return Err(format!(
                "{a:?} is a shared-secret algorithm: only the provider's asymmetric keys are accepted"
            ));
        }
        Ok(())
    }
}

/// What the store learns of a person the provider vouched for: who they are, and the
/// `email` and `name` claims (each cut to 320 characters) when present.
pub fn sign_in(issuer: &str, subject: String, claims: &Map<String, Value>) -> allot_store::SignIn {
    let text = |claim: &str| {
        claims
            .get(claim)
            .and_then(Value::as_str)
            .map(|s| s.chars().take(320).collect())
    };
    allot_store::SignIn {
        issuer: issuer.to_owned(),
        subject,
        email: text("email"),
        name: text("name"),
    }
}

/// What a verified token says.
#[derive(Debug, Clone)]
pub struct VerifiedToken {
    pub subject: String,
    pub claims: Map<String, Value>,
    /// How it was verified, for audit entries: `oidc-jwt` or `oidc-opaque`.
    pub method: &'static str,
}

impl VerifiedToken {
    /// Every top-level claim with a string value, or a list of strings, as (claim, value)
    /// pairs: what claim bindings match against.
    pub fn claim_pairs(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for (claim, v) in &self.claims {
            match v {
                Value::String(s) => out.push((claim.clone(), s.clone())),
                Value::Array(items) => out.extend(
                    items
                        .iter()
                        .filter_map(Value::as_str)
                        .map(|s| (claim.clone(), s.to_owned())),
                ),
                _ => {}
            }
        }
        out
    }

    /// The role bindings `rules` grant these claims; tenant names resolve through
    /// `tenant_ids`, and rules naming unknown tenants grant nothing.
    pub fn bindings(
        &self,
        rules: &[ClaimRole],
        tenant_ids: &HashMap<String, String>,
    ) -> Vec<RoleBinding> {
        let mut out: Vec<RoleBinding> = Vec::new();
        for rule in rules {
            let matches = match self.claims.get(&rule.claim) {
                Some(Value::String(s)) => *s == rule.value,
                Some(Value::Array(items)) => items.iter().any(|i| i.as_str() == Some(&rule.value)),
                _ => false,
            };
            if !matches {
                continue;
            }
            let binding = match &rule.tenant {
                None => RoleBinding::platform(rule.role),
                Some(name) => match tenant_ids.get(name) {
                    Some(id) => RoleBinding::tenant(rule.role, id.clone()),
                    None => continue,
                },
            };
            if !out.contains(&binding) {
                out.push(binding);
            }
        }
        out
    }
}

struct Keys {
    /// The keys of the set this build can use.
    set: Vec<Jwk>,
    /// How many keys the set published, usable or not.
    published: usize,
    fetched_at: Option<DateTime<Utc>>,
}

impl Keys {
    /// The key a token names by `kid`; a token naming none may use the set's key only
    /// when the set publishes exactly one (OpenID Connect Core 1.0, 10.1).
    fn find(&self, kid: Option<&str>) -> Option<Jwk> {
        match kid {
            Some(kid) => self
                .set
                .iter()
                .find(|k| k.common.key_id.as_deref() == Some(kid))
                .cloned(),
            None if self.published == 1 => self.set.first().cloned(),
            None => None,
        }
    }
}

/// The HTTP client for the identity provider. It never follows a redirect: one could send
/// a key fetch, an authorization code or the client secret anywhere.
pub(crate) fn provider_client() -> Result<reqwest::Client, String> {
    crate::crypto::install_crypto_provider();
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(10))
        .build()
        .map_err(|e| format!("building the OIDC HTTP client: {e}"))
}

/// Verifies bearer JWTs against the issuer's published keys.
pub struct JwtVerifier {
    pub(crate) config: OidcConfig,
    pub(crate) client: reqwest::Client,
    pub(crate) clock: Arc<dyn Clock>,
    keys: Mutex<Keys>,
    pub(crate) opaque: Mutex<crate::introspection::OpaqueState>,
}

impl JwtVerifier {
    pub fn new(config: OidcConfig, clock: Arc<dyn Clock>) -> Result<Self, String> {
        config.check()?;
        Ok(Self {
            config,
            client: provider_client()?,
            clock,
            keys: Mutex::new(Keys {
                set: Vec::new(),
                published: 0,
                fetched_at: None,
            }),
            opaque: Mutex::new(crate::introspection::OpaqueState::default()),
        })
    }

    pub fn config(&self) -> &OidcConfig {
        &self.config
    }

    async fn get_json(&self, url: &str) -> Result<Value, JwtError> {
        let res = self
            .client
            .get(url)
            .send()
            .await
            .map_err(|e| JwtError::Provider(format!("GET {url}: {e}")))?;
        if !res.status().is_success() {
            return Err(JwtError::Provider(format!("GET {url}: {}", res.status())));
        }
        res.json()
            .await
            .map_err(|e| JwtError::Provider(format!("GET {url}: {e}")))
    }

    /// The provider's discovery document, checked to name the configured issuer.
    pub(crate) async fn discovery(&self) -> Result<Value, JwtError> {
        let discovery_url = format!(
            "{}/.well-known/openid-configuration",
            self.config.issuer.trim_end_matches('/')
        );
        let discovery = self.get_json(&discovery_url).await?;
        if discovery["issuer"].as_str() != Some(self.config.issuer.as_str()) {
            return Err(JwtError::Provider(format!(
                "{discovery_url} names issuer {}, not {}",
                discovery["issuer"], self.config.issuer
            )));
        }
        Ok(discovery)
    }

    /// Discovery, then the JWKS: the keys this build can use, and how many the set holds.
    async fn fetch_keys(&self) -> Result<(Vec<Jwk>, usize), JwtError> {
        let discovery = self.discovery().await?;
        let jwks_uri = discovery["jwks_uri"]
            .as_str()
            .ok_or_else(|| JwtError::Provider("the discovery document has no jwks_uri".into()))?;
        let jwks = self.get_json(jwks_uri).await?;
        let published = jwks["keys"]
            .as_array()
            .ok_or_else(|| JwtError::Provider(format!("{jwks_uri} has no keys")))?;
        let keys = published
            .iter()
            .filter_map(|k| serde_json::from_value::<Jwk>(k.clone()).ok())
            .collect();
        Ok((keys, published.len()))
    }

    /// The key `kid` names (or, without one, the set's only key), fetching the JWKS when it
    /// is unknown, or when `tried` is the key found and it did not verify (a single-key
    /// provider rotates without a key id to say so), at most every `jwks_refetch`.
    async fn key(&self, kid: Option<&str>, tried: Option<&Jwk>) -> Result<Jwk, JwtError> {
        let mut keys = self.keys.lock().await;
        if let Some(k) = keys.find(kid)
            && tried != Some(&k)
        {
            return Ok(k);
        }
        let now = self.clock.now();
        let may_refresh = keys
            .fetched_at
            .is_none_or(|at| (now - at).to_std().unwrap_or_default() >= self.config.jwks_refetch);
        if !may_refresh {
            return Err(JwtError::UnknownKey);
        }
        let fetched = self.fetch_keys().await;
        keys.fetched_at = Some(now);
        (keys.set, keys.published) = fetched?;
        keys.find(kid)
            .filter(|k| tried != Some(k))
            .ok_or(JwtError::UnknownKey)
    }

    pub async fn verify(&self, token: &str) -> Result<VerifiedToken, JwtError> {
        if token.len() > MAX_TOKEN_BYTES {
            return Err(JwtError::Oversized);
        }
        let header = match jsonwebtoken::decode_header(token) {
            Ok(h) => h,
            // Not a JWT: an opaque access token, if the provider is asked about those.
            Err(_) if self.config.introspection.is_some() => {
                return self.verify_opaque(token).await;
            }
            Err(_) => return Err(JwtError::Malformed),
        };
        if !self.config.algorithms.contains(&header.alg) {
            return Err(JwtError::Algorithm);
        }
        let kid = header.kid.as_deref();
        let jwk = self.key(kid, None).await?;
        let claims = match self.decode(token, &header, &jwk) {
            // Without a key id, a key that does not verify may have been rotated away.
            Err(JwtError::Signature) if kid.is_none() => match self.key(None, Some(&jwk)).await {
                Ok(newer) => self.decode(token, &header, &newer)?,
                Err(_) => return Err(JwtError::Signature),
            },
            other => other?,
        };
        for c in ["iss", "aud", "sub", "exp"] {
            if !claims.contains_key(c) {
                return Err(JwtError::MissingClaim(c));
            }
        }
        let now = self.clock.now().timestamp();
        let leeway = i64::try_from(self.config.leeway.as_secs()).unwrap_or(i64::MAX);
        let exp = claims["exp"].as_i64().ok_or(JwtError::Malformed)?;
        if now >= exp.saturating_add(leeway) {
            return Err(JwtError::Expired);
        }
        if let Some(nbf) = claims.get("nbf") {
            let nbf = nbf.as_i64().ok_or(JwtError::Malformed)?;
            if now < nbf.saturating_sub(leeway) {
                return Err(JwtError::NotYetValid);
            }
        }
        let subject = claims["sub"]
            .as_str()
            .filter(|s| !s.is_empty() && s.len() <= 255)
            .ok_or(JwtError::Malformed)?
            .to_owned();
        Ok(VerifiedToken {
            subject,
            claims,
            method: "oidc-jwt",
        })
    }

    /// The token's claims, if `jwk` signed it for this issuer and audience (time is
    /// checked by the caller, by the injected clock).
    fn decode(
        &self,
        token: &str,
        header: &jsonwebtoken::Header,
        jwk: &Jwk,
    ) -> Result<Map<String, Value>, JwtError> {
        if let Some(alg) = jwk.common.key_algorithm
            && alg.to_string() != format!("{:?}", header.alg)
        {
            return Err(JwtError::Algorithm);
        }
        let key = DecodingKey::from_jwk(jwk).map_err(|_| JwtError::UnknownKey)?;
        let mut validation = Validation::new(header.alg);
        validation.algorithms = vec![header.alg];
        validation.set_issuer(&[&self.config.issuer]);
        validation.set_audience(&self.config.audiences);
        // Time is checked by the caller, by the injected clock.
        validation.validate_exp = false;
        validation.validate_nbf = false;
        validation.required_spec_claims.clear();
        let data =
            jsonwebtoken::decode::<Map<String, Value>>(token, &key, &validation).map_err(|e| {
                use jsonwebtoken::errors::ErrorKind as K;
                match e.kind() {
                    K::InvalidSignature => JwtError::Signature,
                    K::InvalidIssuer => JwtError::Issuer,
                    K::InvalidAudience => JwtError::Audience,
                    K::MissingRequiredClaim(c) if c == "iss" => JwtError::MissingClaim("iss"),
                    K::MissingRequiredClaim(c) if c == "aud" => JwtError::MissingClaim("aud"),
                    K::InvalidAlgorithm | K::InvalidAlgorithmName => JwtError::Algorithm,
                    _ => JwtError::Malformed,
                }
            })?;
        Ok(data.claims)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claim_roles_parse_and_refuse_what_makes_no_sense() {
        let r: ClaimRole = "groups=ml-team:member@ml".parse().expect("valid");
        assert_eq!(
            r,
            ClaimRole {
                claim: "groups".into(),
                value: "ml-team".into(),
                role: Role::Member,
                tenant: Some("ml".into()),
            }
        );
        let r: ClaimRole = "email=root@example.com:platform-admin"
            .parse()
            .expect("valid");
        assert_eq!(r.value, "root@example.com");
        assert_eq!(r.tenant, None);
        for bad in [
            "groups",
            "groups=x",
            "=x:viewer@a",
            "groups=:viewer@a",
            "groups=x:viewer",
            "groups=x:auditor@a",
            "groups=x:emperor@a",
        ] {
            assert!(bad.parse::<ClaimRole>().is_err(), "{bad}");
        }
    }

    #[test]
    fn claims_grant_the_bindings_their_rules_name() {
        let token = VerifiedToken {
            subject: "u1".into(),
            claims: serde_json::json!({"groups": ["ml-team", "ops"], "email": "a@x"})
                .as_object()
                .cloned()
                .unwrap_or_default(),
            method: "oidc-jwt",
        };
        let rules: Vec<ClaimRole> = [
            "groups=ml-team:member@ml",
            "groups=ml-team:member@ml",
            "groups=ops:platform-admin",
            "email=a@x:viewer@gone",
            "groups=other:tenant-admin@ml",
        ]
        .iter()
        .map(|r| r.parse().expect("rule"))
        .collect();
        let tenants = HashMap::from([("ml".to_owned(), "t-ml".to_owned())]);
        assert_eq!(
            token.bindings(&rules, &tenants),
            [
                RoleBinding::tenant(Role::Member, "t-ml"),
                RoleBinding::platform(Role::Admin)
            ]
        );
    }

    #[test]
    fn shared_secret_algorithms_cannot_be_configured() {
        let config = OidcConfig {
            issuer: "https://idp".into(),
            audiences: vec!["allot".into()],
            algorithms: vec![Algorithm::RS256, Algorithm::HS256],
            leeway: Duration::from_secs(30),
            claim_roles: vec![],
            jwks_refetch: DEFAULT_JWKS_REFETCH,
            introspection: None,
        };
        assert!(config.check().is_err());
        let no_audience = OidcConfig {
            audiences: vec![],
            algorithms: vec![Algorithm::RS256],
            ..config
        };
        assert!(no_audience.check().is_err());
    }
}
