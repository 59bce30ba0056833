//! Web sign-in with the organisation's OpenID Connect provider: the authorization code flow
//! with PKCE, state and nonce (the `openidconnect` crate; its HTTP client never follows
//! redirects), then a server-side session in a cookie of Allot's own name (`allot_session`:
//! HttpOnly, SameSite=Lax, Secure behind HTTPS). Sessions end at sign-out, after an idle
//! period, and at an absolute expiry, all by the injected clock; state-changing requests
//! made with the cookie carry the session's CSRF token.

use std::sync::Arc;
use std::time::Duration;

use actix_web::cookie::{Cookie, SameSite};
use actix_web::http::{StatusCode, header};
use actix_web::{HttpMessage, HttpRequest, HttpResponse, web};
use allot_domain::{Actor, ActorKind, AuditContext, Clock};
use allot_store::{IdentityRepo, NewSession, SessionRepo, SignInRepo};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64URL;
use openidconnect::core::{CoreAuthenticationFlow, CoreClient, CoreProviderMetadata};
use openidconnect::{
    AuthorizationCode, ClientId, ClientSecret, CsrfToken, IssuerUrl, Nonce, PkceCodeChallenge,
    PkceCodeVerifier, RedirectUrl, Scope, TokenResponse,
};
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::auth::Principal;
use crate::problem::Problem;
use crate::{ApiError, AppState, json, secret};

/// The session cookie.
pub const SESSION_COOKIE: &str = "allot_session";
/// Binds a sign-in in progress to the browser that started it.
pub const LOGIN_COOKIE: &str = "allot_login";
/// Header (or form field `csrf_token`) carrying the session's CSRF token.
pub const CSRF_HEADER: &str = "x-csrf-token";
/// How long a sign-in may take at the provider.
const LOGIN_TTL: Duration = Duration::from_secs(600);
/// Sign-ins in progress kept at most.
const MAX_PENDING: u64 = 10_000;

/// [`LOGIN_TTL`] as the store takes it.
fn login_ttl() -> chrono::Duration {
    chrono::Duration::from_std(LOGIN_TTL).unwrap_or(chrono::Duration::minutes(10))
}

/// How people sign in on the web.
#[derive(Debug, Clone)]
pub struct SignInConfig {
    /// The provider's issuer URL (the same provider whose JWTs the API accepts).
    pub issuer: String,
    pub client_id: String,
    pub client_secret: Option<String>,
    /// Where the provider sends the browser back: `<public URL>/auth/callback`. `None`: the
    /// address the API listens on (filled in by the server once it is bound).
    pub redirect_url: Option<String>,
}

/// How long sessions last and how their cookies are marked.
#[derive(Debug, Clone, Copy)]
pub struct SessionPolicy {
    /// Mark cookies `Secure` (the public URL is HTTPS).
    pub secure_cookies: bool,
    /// A session ends this long after sign-in, however active.
    pub max: Duration,
    /// A session ends after this long without a request.
    pub idle: Duration,
}

impl Default for SessionPolicy {
    fn default() -> Self {
        Self {
            secure_cookies: false,
            max: Duration::from_secs(12 * 3600),
            idle: Duration::from_secs(3600),
        }
    }
}

/// Web sign-in through the identity provider. Sign-ins in progress are kept in the
/// database (`SignInRepo`), so the provider may send the browser back to any replica.
pub struct WebSignIn {
    pub config: SignInConfig,
    http: reqwest::Client,
    clock: Arc<dyn Clock>,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct HttpError(String);

impl WebSignIn {
    /// Sign-in with `config`, whose redirect URL must be set.
    pub fn new(config: SignInConfig, clock: Arc<dyn Clock>) -> Result<Self, String> {
        let redirect = config
            .redirect_url
            .clone()
            .ok_or("web sign-in needs a redirect URL")?;
        RedirectUrl::new(redirect.clone())
            .map_err(|e| format!("the redirect URL {redirect}: {e}"))?;
        IssuerUrl::new(config.issuer.clone())
            .map_err(|e| format!("the issuer URL {}: {e}", config.issuer))?;
        Ok(Self {
            config,
            http: crate::jwt::provider_client()?,
            clock,
        })
    }

    /// One HTTP exchange with the provider, for `openidconnect`.
    async fn send(
        &self,
        req: openidconnect::HttpRequest,
    ) -> Result<openidconnect::HttpResponse, HttpError> {
        let (parts, body) = req.into_parts();
        let res = self
            .http
            .request(parts.method, parts.uri.to_string())
            .headers(parts.headers)
            .body(body)
            .send()
            .await
            .map_err(|e| HttpError(e.to_string()))?;
        let mut out = openidconnect::http::Response::builder().status(res.status());
        for (k, v) in res.headers() {
            out = out.header(k, v);
        }
        let body = res.bytes().await.map_err(|e| HttpError(e.to_string()))?;
        out.body(body.to_vec())
            .map_err(|e| HttpError(e.to_string()))
    }

    async fn client(
        &self,
    ) -> Result<
        CoreClient<
            openidconnect::EndpointSet,
            openidconnect::EndpointNotSet,
            openidconnect::EndpointNotSet,
            openidconnect::EndpointNotSet,
            openidconnect::EndpointMaybeSet,
            openidconnect::EndpointMaybeSet,
        >,
        String,
    > {
        let issuer = IssuerUrl::new(self.config.issuer.clone()).map_err(|e| e.to_string())?;
        let http = |req| self.send(req);
        let metadata = CoreProviderMetadata::discover_async(issuer, &http)
            .await
            .map_err(|e| format!("discovery: {e}"))?;
        let redirect = RedirectUrl::new(self.config.redirect_url.clone().unwrap_or_default())
            .map_err(|e| e.to_string())?;
        Ok(CoreClient::from_provider_metadata(
            metadata,
            ClientId::new(self.config.client_id.clone()),
            self.config.client_secret.clone().map(ClientSecret::new),
        )
        .set_redirect_uri(redirect))
    }

    /// Where to send the browser, and the state that binds it to this sign-in.
    async fn start(
        &self,
        store: &allot_store::Store,
        return_to: String,
    ) -> Result<(String, String), String> {
        let client = self.client().await?;
        let (challenge, verifier) = PkceCodeChallenge::new_random_sha256();
        let (url, state, nonce) = client
            .authorize_url(
                CoreAuthenticationFlow::AuthorizationCode,
                CsrfToken::new_random,
                Nonce::new_random,
            )
            .add_scope(Scope::new("email".into()))
            .add_scope(Scope::new("profile".into()))
            .set_pkce_challenge(challenge)
            .url();
        let pending = allot_store::PendingSignIn {
            verifier: verifier.secret().clone(),
            nonce: nonce.secret().clone(),
            return_to,
        };
        store
            .begin_sign_in(
                &crate::secret::hash(state.secret()),
                &pending,
                login_ttl(),
                MAX_PENDING,
            )
            .await
            .map_err(|e| e.to_string())?;
        Ok((url.to_string(), state.secret().clone()))
    }

    /// Exchanges the code and verifies the ID token: its subject, every claim, and where
    /// the browser wanted to go.
    async fn finish(
        &self,
        store: &allot_store::Store,
        state: &str,
        code: String,
    ) -> Result<(String, Map<String, Value>, String), String> {
        let pending = store
            .take_sign_in(&crate::secret::hash(state), login_ttl())
            .await
            .map_err(|e| e.to_string())?
            .ok_or("the sign-in expired or was already used; start again")?;
        let client = self.client().await?;
        let http = |req| self.send(req);
        let tokens = client
            .exchange_code(AuthorizationCode::new(code))
            .map_err(|e| format!("the provider has no token endpoint: {e}"))?
            .set_pkce_verifier(PkceCodeVerifier::new(pending.verifier))
            .request_async(&http)
            .await
            .map_err(|e| format!("exchanging the code: {e}"))?;
        let id_token = tokens
            .id_token()
            .ok_or("the provider returned no ID token")?;
        let clock = self.clock.clone();
        let verifier = client.id_token_verifier().set_time_fn(move || clock.now());
        let claims = id_token
            .claims(&verifier, &Nonce::new(pending.nonce))
            .map_err(|e| format!("the ID token: {e}"))?;
        let subject = claims.subject().as_str().to_owned();
        // Verified above: read every claim (groups included) from its payload.
        let raw = id_token.to_string();
        let payload = raw
            .split('.')
            .nth(1)
            .and_then(|p| B64URL.decode(p).ok())
            .and_then(|p| serde_json::from_slice::<Value>(&p).ok())
            .and_then(|v| v.as_object().cloned())
            .ok_or("the ID token's payload is not a JSON object")?;
        Ok((subject, payload, pending.return_to))
    }
}

fn cookie<'c>(name: &'c str, value: String, secure: bool) -> Cookie<'c> {
    Cookie::build(name, value)
        .path("/")
        .http_only(true)
        .same_site(SameSite::Lax)
        .secure(secure)
        .finish()
}

fn removal(name: &str, secure: bool) -> Cookie<'_> {
    let mut c = cookie(name, String::new(), secure);
    c.make_removal();
    c
}

/// A local path to return to; anything else (another site, `//host`, control characters
/// that could split a header) becomes `/`.
fn local_path(p: Option<&str>) -> String {
    match p {
        Some(p)
            if p.starts_with('/')
                && !p.starts_with("//")
                && !p.contains('\\')
                && p.len() <= 512
                && !p.chars().any(char::is_control) =>
        {
            p.to_owned()
        }
        _ => "/".to_owned(),
    }
}

fn web_sign_in(state: &AppState) -> Result<Arc<WebSignIn>, ApiError> {
    state
        .web_sign_in
        .clone()
        .ok_or_else(|| ApiError::NotFound("web sign-in is not configured".into()))
}

#[derive(Debug, Deserialize)]
pub struct LoginQuery {
    return_to: Option<String>,
}

/// Start web sign-in: a redirect to the identity provider. `return_to` is a local path to
/// come back to (default `/`).
#[utoipa::path(get, path = "/auth/login", tag = "sign-in",
    params(("return_to" = Option<String>, Query)),
    responses((status = 302, description = "to the identity provider"),
        (status = 404, body = Problem), (status = 503, body = Problem)))]
pub async fn login(
    state: web::Data<AppState>,
    q: web::Query<LoginQuery>,
) -> Result<HttpResponse, ApiError> {
    let signin = web_sign_in(&state)?;
    let (url, login_state) = signin
        .start(&state.store, local_path(q.return_to.as_deref()))
        .await
        .map_err(|e| {
            tracing::warn!(error = %e, "cannot start a sign-in");
            ApiError::Unavailable(
                "the identity provider cannot be reached; try again shortly".into(),
            )
        })?;
    let mut c = cookie(LOGIN_COOKIE, login_state, state.sessions.secure_cookies);
    c.set_max_age(actix_web::cookie::time::Duration::seconds(
        i64::try_from(LOGIN_TTL.as_secs()).unwrap_or(600),
    ));
    Ok(HttpResponse::Found()
        .insert_header((header::LOCATION, url))
        .cookie(c)
        .finish())
}

#[derive(Debug, Deserialize)]
pub struct CallbackQuery {
    code: Option<String>,
    state: Option<String>,
    error: Option<String>,
}

/// Where the identity provider sends the browser back: the code is exchanged, the ID token
/// verified, and a session started (cookie `allot_session`).
#[utoipa::path(get, path = "/auth/callback", tag = "sign-in",
    params(("code" = Option<String>, Query), ("state" = Option<String>, Query),
        ("error" = Option<String>, Query)),
    responses((status = 303, description = "signed in: back to where sign-in started"),
        (status = 401, body = Problem), (status = 404, body = Problem),
        (status = 429, body = Problem)))]
pub async fn callback(
    req: HttpRequest,
    state: web::Data<AppState>,
    q: web::Query<CallbackQuery>,
) -> Result<HttpResponse, ApiError> {
    let signin = web_sign_in(&state)?;
    let source = crate::client::address(&req);
    let from = source.clone().unwrap_or_else(|| "unknown".to_owned());
    if let Some(e) = &q.error {
        let why = format!(
            "the provider answered `{}`",
            e.chars().take(64).collect::<String>()
        );
        return Err(sign_in_failed(&state, &from, why).await);
    }
    let (Some(code), Some(returned_state)) = (q.code.clone(), q.state.as_deref()) else {
        let why = "the provider's answer lacks `code` or `state`".to_owned();
        return Err(sign_in_failed(&state, &from, why).await);
    };
    // The state must be the one this browser was given: nobody else's sign-in completes here.
    if req
        .cookie(LOGIN_COOKIE)
        .map(|c| c.value().to_owned())
        .as_deref()
        != Some(returned_state)
    {
        return Err(sign_in_failed(
            &state,
            &from,
            "this browser did not start this sign-in".into(),
        )
        .await);
    }
    let (subject, claims, return_to) = match signin.finish(&state.store, returned_state, code).await
    {
        Ok(done) => done,
        Err(why) => return Err(sign_in_failed(&state, &from, why).await),
    };
    let user = state
        .store
        .sign_in(crate::jwt::sign_in(&signin.config.issuer, subject, &claims))
        .await?;
    if user.deleted_at.is_some() {
        return Err(
            sign_in_failed(&state, &from, "the user has been removed from Allot".into()).await,
        );
    }
    start_session(&state, user, claims, source, "oidc-code-flow", &return_to).await
}

/// Starts a session for `user` and sends the browser to `return_to` with its cookie.
async fn start_session(
    state: &AppState,
    user: allot_domain::User,
    claims: Map<String, Value>,
    source: Option<String>,
    auth_method: &str,
    return_to: &str,
) -> Result<HttpResponse, ApiError> {
    let policy = state.sessions;
    let session_id = secret::generate("allot_s_");
    let csrf = secret::generate("")[..32].to_owned();
    let expires_at = state.store.clock().now()
        + chrono::Duration::from_std(policy.max).unwrap_or(chrono::Duration::hours(12));
    let ctx = AuditContext {
        actor: Actor {
            kind: ActorKind::User,
            id: user.id.clone(),
            tenant_id: None,
            auth_method: auth_method.to_owned(),
            source,
        },
        request_id: None,
    };
    state
        .store
        .start_session(
            &ctx,
            NewSession {
                id_hash: secret::hash(&session_id),
                user_id: user.id,
                csrf_token: csrf,
                claims,
                expires_at,
            },
        )
        .await?;
    Ok(HttpResponse::SeeOther()
        .insert_header((header::LOCATION, return_to.to_owned()))
        .cookie(cookie(SESSION_COOKIE, session_id, policy.secure_cookies))
        .cookie(removal(LOGIN_COOKIE, policy.secure_cookies))
        .finish())
}

/// The caller's session (for cookie sign-ins), set by the authenticator.
#[derive(Debug, Clone)]
pub struct SessionAuth {
    pub id_hash: String,
    pub csrf_token: String,
}

/// Who the caller is.
#[derive(Debug, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct WhoAmI {
    /// `user` or `token`.
    pub kind: String,
    pub id: String,
    /// Who it is to people: the token's name, or the user's email (else name, else
    /// subject); what jobs they submit show as their `user`.
    #[serde(default)]
    pub name: String,
    /// `session`, `oidc-jwt` or `api-token`.
    pub auth_method: String,
    /// Every role held: `{role, tenant_id, tenant}` (the tenant's name).
    pub roles: Vec<HeldRole>,
    /// For sessions: send it as `X-CSRF-Token` with every change.
    pub csrf_token: Option<String>,
}

/// A role the caller holds, and where.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct HeldRole {
    #[schema(value_type = String, example = "member")]
    pub role: allot_domain::Role,
    /// The tenant it is held in (and every tenant below it); none for a platform role.
    pub tenant_id: Option<String>,
    /// That tenant's name.
    #[serde(default)]
    pub tenant: Option<String>,
}

/// Who the caller is, their roles, and (for sessions) the CSRF token the portal sends back
/// with every change.
#[utoipa::path(get, path = "/auth/session", tag = "sign-in", security(("bearer" = [])),
    responses((status = 200, body = WhoAmI), (status = 401, body = Problem)))]
pub async fn whoami(req: HttpRequest, who: Principal) -> Result<HttpResponse, ApiError> {
    let session = req.extensions().get::<SessionAuth>().cloned();
    let kind = match who.kind {
        ActorKind::User => "user",
        _ => "token",
    };
    Ok(json(
        StatusCode::OK,
        &WhoAmI {
            kind: kind.to_owned(),
            id: who.id.clone(),
            name: who.name.clone(),
            auth_method: who.auth_method.to_owned(),
            roles: who
                .bindings
                .iter()
                .map(|b| HeldRole {
                    role: b.role,
                    tenant: b.tenant_id.as_deref().map(|t| who.tenant_name(t)),
                    tenant_id: b.tenant_id.clone(),
                })
                .collect(),
            csrf_token: session.map(|s| s.csrf_token),
        },
    ))
}

/// Sign out: the session ends (the CSRF token is checked as for any change).
#[utoipa::path(post, path = "/auth/logout", tag = "sign-in", security(("bearer" = [])),
    responses((status = 303, description = "signed out"), (status = 401, body = Problem),
        (status = 403, body = Problem), (status = 409, body = Problem)))]
pub async fn logout(
    req: HttpRequest,
    state: web::Data<AppState>,
    who: Principal,
) -> Result<HttpResponse, ApiError> {
    let Some(session) = req.extensions().get::<SessionAuth>().cloned() else {
        return Err(ApiError::Conflict(
            "signed in with a token, not a session: there is nothing to sign out of".into(),
        ));
    };
    state
        .store
        .end_session(&who.audit(), &session.id_hash)
        .await?;
    Ok(HttpResponse::SeeOther()
        .insert_header((header::LOCATION, "/"))
        .cookie(removal(SESSION_COOKIE, state.sessions.secure_cookies))
        .finish())
}

/// The issuer recorded for the development sign-in's seeded users.
pub const DEV_ISSUER: &str = "allot-dev";

/// The development sign-in's CSRF cookie (and form field `csrf_token`).
const DEV_CSRF_COOKIE: &str = "allot_dev_csrf";

/// Whether the request names this machine as its host (`localhost`, `127.0.0.1` or
/// `[::1]`, any port): a page on another name reaching a developer's server through DNS
/// rebinding sends its own name.
pub fn loopback_host(req: &HttpRequest) -> bool {
    let Some(host) = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
    else {
        return false;
    };
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split_once(']').map(|(h, _)| h),
        None => host.split(':').next(),
    };
    matches!(name, Some("localhost" | "127.0.0.1" | "::1"))
}

/// Refuses a request whose `Origin` is present and is not the host it was sent to: a change
/// a page of another site asks the browser to make.
pub fn same_origin(req: &HttpRequest) -> Result<(), ApiError> {
    let Some(origin) = req.headers().get(header::ORIGIN) else {
        return Ok(());
    };
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or_default();
    let from = origin
        .to_str()
        .ok()
        .and_then(|o| o.split_once("://").map(|(_, rest)| rest))
        .unwrap_or_default();
    if !host.is_empty() && from == host {
        Ok(())
    } else {
        Err(ApiError::Forbidden(format!(
            "a change sent from another origin ({}) is refused",
            origin
                .to_str()
                .unwrap_or("not text")
                .chars()
                .take(100)
                .collect::<String>()
        )))
    }
}

fn dev_only(state: &AppState, req: &HttpRequest) -> Result<(), ApiError> {
    if !state.dev_sign_in {
        return Err(ApiError::NotFound(
            "the development sign-in exists only in `allot dev`".into(),
        ));
    }
    if !loopback_host(req) {
        return Err(ApiError::Forbidden(
            "the development sign-in answers only to localhost, 127.0.0.1 or [::1] as the \
             host: open it by one of those names"
                .into(),
        ));
    }
    Ok(())
}

/// Text for HTML: `&`, `<`, `>`, `"` and `'` escaped.
fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The development sign-in page of `allot dev`: pick one of the seeded users.
#[utoipa::path(get, path = "/auth/dev", tag = "sign-in",
    responses((status = 200, content_type = "text/html", body = String),
        (status = 404, body = Problem)))]
pub async fn dev_page(
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    dev_only(&state, &req)?;
    let csrf = secret::generate("")[..32].to_owned();
    let mut items = String::new();
    for u in state.store.list_users().await? {
        if u.issuer != DEV_ISSUER || u.deleted_at.is_some() {
            continue;
        }
        let label = u.name.clone().unwrap_or_else(|| u.subject.clone());
        items.push_str(&format!(
            "<li><form method=\"post\" action=\"/auth/dev\">\
             <input type=\"hidden\" name=\"csrf_token\" value=\"{csrf}\">\
             <input type=\"hidden\" name=\"user\" value=\"{}\">\
             <button type=\"submit\">Sign in as {}</button> <small>{}</small></form></li>\n",
            escape(&u.id),
            escape(&label),
            escape(u.email.as_deref().unwrap_or_default()),
        ));
    }
    let mut cookie = cookie(DEV_CSRF_COOKIE, csrf.clone(), state.sessions.secure_cookies);
    cookie.set_path("/auth/dev");
    cookie.set_same_site(SameSite::Strict);
    Ok(HttpResponse::Ok()
        .content_type("text/html; charset=utf-8")
        // Nothing to load, forms only to itself, and framed by no page (a hostile page
        // overlaying "Sign in as Dev Admin" with its own button).
        .insert_header((
            actix_web::http::header::CONTENT_SECURITY_POLICY,
            "default-src 'none'; form-action 'self'; frame-ancestors 'none'",
        ))
        .insert_header((actix_web::http::header::X_FRAME_OPTIONS, "DENY"))
        .cookie(cookie)
        .body(format!(
            "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
             <title>Allot development sign-in</title></head><body>\
             <h1>Development sign-in</h1>\
             <p>This page exists only in <code>allot dev</code>. Pick a user:</p>\
             <ul>\n{items}</ul></body></html>\n"
        )))
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct DevSignIn {
    /// A seeded development user's name.
    #[schema(min_length = 1)]
    user: String,
    /// The token of the page the form came from (also in its cookie).
    #[serde(default)]
    csrf_token: String,
}

/// Sign in as a seeded user of `allot dev`.
#[utoipa::path(post, path = "/auth/dev", tag = "sign-in",
    request_body(content = DevSignIn, content_type = "application/x-www-form-urlencoded"),
    responses((status = 303, description = "signed in"), (status = 400, body = Problem),
        (status = 403, body = Problem), (status = 404, body = Problem),
        (status = 422, body = Problem)))]
pub async fn dev_sign_in(
    req: HttpRequest,
    state: web::Data<AppState>,
    body: web::Bytes,
) -> Result<HttpResponse, ApiError> {
    dev_only(&state, &req)?;
    same_origin(&req)?;
    let form: DevSignIn = serde_urlencoded::from_bytes(&body)
        .map_err(|_| ApiError::malformed("user", "send the form field `user`"))?;
    // The page's token, sent back both as its cookie and in the form: a page of another
    // site can make the browser send the cookie, but cannot read it to fill the form.
    let cookie = req.cookie(DEV_CSRF_COOKIE).map(|c| c.value().to_owned());
    let matches = cookie.is_some_and(|c| {
        !form.csrf_token.is_empty() && secret::hash(&c) == secret::hash(&form.csrf_token)
    });
    if !matches {
        return Err(ApiError::Forbidden(
            "the development sign-in needs the token of its page (`csrf_token`): sign in from \
             /auth/dev"
                .into(),
        ));
    }
    let unknown = || allot_domain::ValidationError::single("user", "is not a development user");
    let user = state
        .store
        .user(&form.user)
        .await
        .map_err(|e| ApiError::unless_not_found(e, || unknown().into()))?;
    if user.issuer != DEV_ISSUER || user.deleted_at.is_some() {
        return Err(unknown().into());
    }
    let source = crate::client::address(&req);
    start_session(&state, user, Map::new(), source, "dev-sign-in", "/").await
}

/// A failed sign-in, counted against its client: 429 past the limit, else 401 saying why.
async fn sign_in_failed(state: &AppState, from: &str, why: String) -> ApiError {
    match state.auth_failures.failed(from).await {
        Some(retry_after_secs) => ApiError::TooManyAttempts { retry_after_secs },
        None => ApiError::Unauthenticated(format!("sign-in failed: {why}")),
    }
}

#[cfg(test)]
mod tests {
    use super::{escape, local_path};

    #[test]
    fn only_local_paths_are_returned_to() {
        assert_eq!(
            local_path(Some("/api/v1/jobs?state=pending")),
            "/api/v1/jobs?state=pending"
        );
        for bad in [
            None,
            Some(""),
            Some("https://evil.example/"),
            Some("//evil.example/x"),
            Some("/\\evil.example"),
            Some("/ok\r\nSet-Cookie: x=y"),
            Some("relative/path"),
        ] {
            assert_eq!(local_path(bad), "/", "{bad:?}");
        }
        assert_eq!(local_path(Some(&format!("/{}", "a".repeat(600)))), "/");
    }

    #[test]
    fn html_text_is_escaped() {
        assert_eq!(
            escape(r#"<a href="x">Tom & 'Jerry'</a>"#),
            "&lt;a href=&quot;x&quot;&gt;Tom &amp; &#39;Jerry&#39;&lt;/a&gt;"
        );
    }
}
