//! Opaque access tokens (not JWTs), as some providers hand out to the CLI and automation:
//! checked by asking the provider, through its token introspection endpoint (RFC 7662)
//! with Allot's own client credentials. A token is accepted only while the provider says
//! it is active, unexpired by the injected clock, from the configured issuer, and issued
//! to (or for) one of the configured audiences, so another application's tokens do not
//! open Allot. Its claims, for the claim rules, are the introspection answer's, with the
//! provider's userinfo answer (when it has that endpoint) for those it leaves out. Each
//! answer is cached for a short while, keyed by the token's hash, so a busy client does not
//! ask the provider on every request, and a revoked token stops working within that time.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::jwt::{JwtError, JwtVerifier, VerifiedToken};

/// Allot's client at the provider, to authenticate its introspection requests.
#[derive(Debug, Clone)]
pub struct Introspection {
    pub client_id: String,
    pub client_secret: Option<String>,
    /// How long an answer is trusted (never past the token's own expiry).
    pub cache_for: Duration,
}

/// Tokens cached before the cache is emptied.
const MAX_CACHED: usize = 10_000;

/// The provider's endpoints, and answers already given.
#[derive(Default)]
pub(crate) struct OpaqueState {
    endpoints: Option<Endpoints>,
    cache: HashMap<[u8; 32], (VerifiedToken, DateTime<Utc>)>,
}

#[derive(Clone)]
struct Endpoints {
    introspection: Option<String>,
    userinfo: Option<String>,
}

fn strings(v: Option<&Value>) -> Vec<String> {
    match v {
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|x| x.as_str().map(str::to_owned))
            .collect(),
        _ => Vec::new(),
    }
}

impl JwtVerifier {
    async fn endpoints(&self) -> Result<Endpoints, JwtError> {
        if let Some(e) = self.opaque.lock().await.endpoints.clone() {
            return Ok(e);
        }
        let discovery = self.discovery().await?;
        let text = |k: &str| discovery[k].as_str().map(str::to_owned);
        let e = Endpoints {
            introspection: text("introspection_endpoint"),
            userinfo: text("userinfo_endpoint"),
        };
        self.opaque.lock().await.endpoints = Some(e.clone());
        Ok(e)
    }

    /// Verifies an opaque access token with the provider ([module docs](self)).
    pub(crate) async fn verify_opaque(&self, token: &str) -> Result<VerifiedToken, JwtError> {
        let Some(cfg) = self.config.introspection.clone() else {
            return Err(JwtError::Malformed);
        };
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let now = self.clock.now();
        if let Some((v, until)) = self.opaque.lock().await.cache.get(&key)
            && now < *until
        {
            return Ok(v.clone());
        }
        let endpoints = self.endpoints().await?;
        let Some(introspection) = endpoints.introspection else {
            return Err(JwtError::Provider(
                "the provider publishes no introspection endpoint: opaque tokens cannot be checked"
                    .into(),
            ));
        };
        let res = self
            .client
            .post(&introspection)
            .basic_auth(&cfg.client_id, cfg.client_secret.as_deref())
            .header(
                reqwest::header::CONTENT_TYPE,
                "application/x-www-form-urlencoded",
            )
            .body(
                form_urlencoded::Serializer::new(String::new())
                    .append_pair("token", token)
                    .append_pair("token_type_hint", "access_token")
                    .finish(),
            )
            .send()
            .await
            .map_err(|e| JwtError::Provider(format!("POST {introspection}: {e}")))?;
        if !res.status().is_success() {
            return Err(JwtError::Provider(format!(
                "POST {introspection}: {}",
                res.status()
            )));
        }
        let answer: Map<String, Value> = res
            .json()
            .await
            .map_err(|e| JwtError::Provider(format!("POST {introspection}: {e}")))?;
        if answer.get("active") != Some(&Value::Bool(true)) {
            return Err(JwtError::Inactive);
        }
        if let Some(iss) = answer.get("iss")
            && iss.as_str() != Some(self.config.issuer.as_str())
        {
            return Err(JwtError::Issuer);
        }
        let leeway = i64::try_from(self.config.leeway.as_secs()).unwrap_or(i64::MAX);
        let exp = answer.get("exp").and_then(Value::as_i64);
        if exp.is_some_and(|exp| now.timestamp() >= exp.saturating_add(leeway)) {
            return Err(JwtError::Expired);
        }
        // For Allot: its audience, or issued to a client Allot accepts tokens of.
        let mut for_whom = strings(answer.get("aud"));
        for_whom.extend(strings(answer.get("client_id")));
        if !for_whom.iter().any(|a| self.config.audiences.contains(a)) {
            return Err(JwtError::Audience);
        }
        let subject = answer
            .get("sub")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty() && s.len() <= 255)
            .ok_or(JwtError::MissingClaim("sub"))?
            .to_owned();
        let mut claims = answer;
        if let Some(userinfo) = endpoints.userinfo
            && let Ok(res) = self.client.get(&userinfo).bearer_auth(token).send().await
            && res.status().is_success()
            && let Ok(info) = res.json::<Map<String, Value>>().await
            && info.get("sub").and_then(Value::as_str) == Some(subject.as_str())
        {
            for (k, v) in info {
                claims.entry(k).or_insert(v);
            }
        }
        claims.insert("iss".into(), Value::String(self.config.issuer.clone()));
        let verified = VerifiedToken {
            subject,
            claims,
            method: "oidc-opaque",
        };
        let mut until = now + chrono::Duration::from_std(cfg.cache_for).unwrap_or_default();
        if let Some(exp) = exp.and_then(|e| DateTime::from_timestamp(e, 0)) {
            until = until.min(exp);
        }
        let mut state = self.opaque.lock().await;
        if state.cache.len() >= MAX_CACHED {
            state.cache.retain(|_, (_, u)| now < *u);
            if state.cache.len() >= MAX_CACHED {
                state.cache.clear();
            }
        }
        state.cache.insert(key, (verified.clone(), until));
        Ok(verified)
    }
}
