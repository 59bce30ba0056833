//! The HTTP client of Allot's API, behind the CLI's verbs and the benchmarks' load: a
//! bearer token, the server's URL checked up front, and errors that say what to do (a
//! problem document's fields named by the CLI flag that sets each, where one does).

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// Why a call did not give an answer: said so that it tells the user what to do.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The client cannot be made as asked (its URL, token or CA certificates).
    #[error("{0}")]
    Config(String),
    /// The server could not be reached, or its answer not read.
    #[error("{0}")]
    Unreachable(String),
    /// The server refused (a problem document, its fields named).
    #[error("{message}")]
    Refused { status: u16, message: String },
    /// The answer is not what the path gives.
    #[error("unexpected answer from {path}: {why}")]
    Unexpected { path: String, why: String },
}

type Result<T> = std::result::Result<T, ClientError>;

/// A secret from a file (an API token, as `allot dev` writes to `.allot/admin.token`, or a
/// key), trimmed; `None` when it is missing or empty.
pub fn read_secret_file(path: &std::path::Path) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
}

/// The server's URL must be one: `127.0.0.1:8080` without a scheme is refused saying what
/// to write (reqwest would say "relative URL without a base").
fn check_server_url(server: &str) -> Result<()> {
    let hint = |why: &str| {
        ClientError::Config(format!(
            "--server (ALLOT_SERVER) `{server}` {why}: give the control plane's URL with its \
             scheme, e.g. http://{}",
            server
                .split_once("://")
                .map_or(server, |(_, rest)| rest)
                .trim_end_matches('/')
        ))
    };
    match reqwest::Url::parse(server) {
        Ok(url) if matches!(url.scheme(), "http" | "https") && url.host_str().is_some() => Ok(()),
        Ok(url) if !matches!(url.scheme(), "http" | "https") => {
            // `localhost:8080` parses as the scheme `localhost`.
            Err(hint("has no http:// or https://"))
        }
        Ok(_) => Err(hint("names no host")),
        Err(_) => Err(hint("is not a URL")),
    }
}

/// Why the server at `base` could not be reached, said so that it tells what to do:
/// TLS spoken to a plain-HTTP port, nothing listening, no answer in time.
fn unreachable(base: &str, e: &reqwest::Error) -> ClientError {
    let mut chain = Vec::new();
    let mut source: Option<&dyn std::error::Error> = Some(e);
    while let Some(s) = source {
        chain.push(s.to_string());
        source = s.source();
    }
    let text = chain.join(": ");
    let host = e
        .url()
        .and_then(|u| Some(format!("{}:{}", u.host_str()?, u.port_or_known_default()?)))
        .unwrap_or_else(|| base.to_owned());
    let said = if text.contains("InvalidContentType") || text.contains("corrupt message") {
        format!(
            "{host} does not speak TLS (it answered https with plain HTTP): use {}",
            base.replacen("https://", "http://", 1)
        )
    } else if text.to_ascii_lowercase().contains("connection refused") {
        format!(
            "nothing listens at {host} (connection refused): is the control plane running, and \
             is --server (ALLOT_SERVER, now {base}) its address?"
        )
    } else if e.is_timeout() {
        format!("{host} did not answer within 30 s")
    } else if base.starts_with("http://") && text.contains("connection closed") {
        format!(
            "{host} closed the connection: if it serves HTTPS, use {}",
            base.replacen("http://", "https://", 1)
        )
    } else {
        text.clone()
    };
    ClientError::Unreachable(format!("cannot reach the Allot server at {base}: {said}"))
}

#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    token: String,
}

/// The CLI flag that sets an API field, where one does: errors name what was typed
/// (`--max-gpus`), not the API's milli-unit field (`quota.limit.gpu_milli`).
fn flag_of(field: &str) -> Option<&'static str> {
    let field = field.strip_prefix("quota.").unwrap_or(field);
    if field.starts_with("mig_limits") {
        return Some("--mig-limit");
    }
    if field.starts_with("volumes") {
        return Some("--volume");
    }
    if field.starts_with("secrets") {
        return Some("--secret");
    }
    if field.starts_with("gpu_models") {
        return Some("--gpu-model");
    }
    if field.starts_with("dependencies") {
        return Some("--after-ok/--after-any/--after-not-ok");
    }
    Some(match field {
        "guaranteed.gpu_milli" => "--guaranteed-gpus",
        "limit.gpu_milli" => "--max-gpus",
        "guaranteed.cpu_milli" => "--guaranteed-cpus",
        "limit.cpu_milli" => "--max-cpus",
        "guaranteed.memory_bytes" => "--guaranteed-memory",
        "limit.memory_bytes" => "--max-memory",
        "guaranteed.gpu_memory_bytes" => "--guaranteed-gpu-memory",
        "limit.gpu_memory_bytes" => "--max-gpu-memory",
        "gpu_hour_budget" => "--gpu-hour-budget",
        "default_cpu_milli" => "--default-cpus",
        "default_memory_bytes" => "--default-memory",
        "max_cpu_milli" => "--max-cpus",
        "max_memory_bytes" => "--max-memory",
        "default_gpu_milli" => "--default-gpu-share",
        "weight" => "--weight",
        "min_isolation" => "--min-isolation",
        "gpus" | "gpu_milli" => "--gpus",
        "cpu_milli" => "--cpus",
        "memory_bytes" => "--memory",
        "gpu_memory_bytes" => "--gpu-memory",
        "mig_profile" => "--mig",
        "priority" => "--priority",
        "isolation" => "--isolation",
        "class" => "--class",
        "max_retries" => "--max-retries",
        "name" => "--name",
        "image" => "--image",
        "network" => "--network",
        "workdir" => "--workdir",
        "checkpoint_dir" => "--checkpoint-dir",
        "gpu_compute" => "--gpu-compute",
        "tenant" => "--tenant",
        "grace_secs" => "--grace",
        "reason" => "--reason",
        "array" => "--array",
        "time_limit_secs" => "--time-limit",
        "replicas" => "--replicas",
        _ => return None,
    })
}

/// Turns a problem document into a readable error naming each field (by the CLI flag
/// that sets it, where one does).
fn problem_error(status: StatusCode, body: &str) -> ClientError {
    let refused = |message: String| ClientError::Refused {
        status: status.as_u16(),
        message,
    };
    let Ok(p) = serde_json::from_str::<Value>(body) else {
        return refused(format!("the server answered {status}: {body}"));
    };
    let detail = p["detail"].as_str().unwrap_or("").to_owned();
    let title = p["title"].as_str().unwrap_or("error");
    let fields: Vec<String> = p["errors"]
        .as_array()
        .map(|errs| {
            errs.iter()
                .map(|e| {
                    let field = e["field"].as_str().unwrap_or("?");
                    let named = match flag_of(field) {
                        Some(flag) => format!("{flag} ({field})"),
                        None => field.to_owned(),
                    };
                    format!("  {named}: {}", e["reason"].as_str().unwrap_or("?"))
                })
                .collect()
        })
        .unwrap_or_default();
    if fields.is_empty() {
        refused(format!("{title} ({}): {detail}", status.as_u16()))
    } else {
        refused(format!(
            "{title} ({}):\n{}",
            status.as_u16(),
            fields.join("\n")
        ))
    }
}

impl Client {
    /// A client of the API at `server`, trusting the CA certificates in `ca_cert` (PEM)
    /// besides the system's.
    pub fn new(
        server: &str,
        token: Option<String>,
        ca_cert: Option<&std::path::Path>,
    ) -> Result<Self> {
        check_server_url(server)?;
        let token = token.filter(|t| !t.trim().is_empty()).ok_or_else(|| {
            ClientError::Config(
                "no API token: pass --token or set ALLOT_TOKEN (`allot dev` writes one to .allot/admin.token)"
                    .into(),
            )
        })?;
        let mut builder = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .redirect(reqwest::redirect::Policy::none());
        // Plain HTTP (`allot dev`, a proxy on loopback) needs no TLS: not reading the
        // system's CA certificates saves a CLI call a few hundred file reads. Redirects are
        // off, so nothing can lead it to an HTTPS URL it would then trust nothing for.
        if server.starts_with("http://")
            && ca_cert.is_none()
            && let Some(provider) = rustls::crypto::CryptoProvider::get_default()
            && let Ok(tls) = rustls::ClientConfig::builder_with_provider(provider.clone())
                .with_safe_default_protocol_versions()
        {
            builder = builder.tls_backend_preconfigured(
                tls.with_root_certificates(rustls::RootCertStore::empty())
                    .with_no_client_auth(),
            );
        }
        if let Some(path) = ca_cert {
            let pem = std::fs::read(path).map_err(|e| {
                ClientError::Config(format!("--ca-cert: reading {}: {e}", path.display()))
            })?;
            for cert in reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| {
                ClientError::Config(format!(
                    "--ca-cert: {} is not PEM certificates: {e}",
                    path.display()
                ))
            })? {
                builder = builder.add_root_certificate(cert);
            }
        }
        let http = builder
            .build()
            .map_err(|e| ClientError::Config(format!("building the HTTP client: {e}")))?;
        Ok(Self {
            http,
            base: server.trim_end_matches('/').to_owned(),
            token: token.trim().to_owned(),
        })
    }

    /// GET returning the raw body.
    pub async fn get_bytes(&self, path: &str, query: &[(&str, String)]) -> Result<Vec<u8>> {
        let res = self
            .get_response(path, query, Duration::from_secs(600))
            .await?;
        let bytes = res.bytes().await.map_err(|e| reading(&e))?;
        Ok(bytes.to_vec())
    }

    /// GET returning the raw body and the value of one header of the answer.
    pub async fn get_bytes_with(
        &self,
        path: &str,
        query: &[(&str, String)],
        header: &str,
    ) -> Result<(Vec<u8>, Option<String>)> {
        let res = self
            .get_response(path, query, Duration::from_secs(600))
            .await?;
        let value = res
            .headers()
            .get(header)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let bytes = res.bytes().await.map_err(|e| reading(&e))?;
        Ok((bytes.to_vec(), value))
    }

    /// GET whose answer is read as it comes (a followed log), with no overall time limit.
    pub async fn stream(&self, path: &str, query: &[(&str, String)]) -> Result<reqwest::Response> {
        self.get_response(path, query, Duration::from_secs(366 * 24 * 3600))
            .await
    }

    /// A successful GET's answer, its body not yet read.
    async fn get_response(
        &self,
        path: &str,
        query: &[(&str, String)],
        timeout: Duration,
    ) -> Result<reqwest::Response> {
        let url = format!("{}{path}", self.base);
        let res = self
            .http
            .get(&url)
            .bearer_auth(&self.token)
            .query(query)
            .timeout(timeout)
            .send()
            .await
            .map_err(|e| unreachable(&self.base, &e))?;
        let status = res.status();
        if !status.is_success() {
            let text = res.text().await.map_err(|e| reading(&e))?;
            return Err(problem_error(status, &text));
        }
        Ok(res)
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&Value>,
    ) -> Result<(StatusCode, String)> {
        let url = format!("{}{path}", self.base);
        let mut req = self
            .http
            .request(method, &url)
            .bearer_auth(&self.token)
            .query(query);
        if let Some(b) = body {
            req = req.json(b);
        }
        let res = req.send().await.map_err(|e| unreachable(&self.base, &e))?;
        let status = res.status();
        let text = res.text().await.map_err(|e| reading(&e))?;
        if !status.is_success() {
            return Err(problem_error(status, &text));
        }
        Ok((status, text))
    }

    /// DELETE, for resources that answer 204 with no body.
    pub async fn delete(&self, path: &str) -> Result<()> {
        self.send(Method::DELETE, path, &[], None).await.map(|_| ())
    }

    pub async fn get<T: DeserializeOwned>(
        &self,
        path: &str,
        query: &[(&str, String)],
    ) -> Result<T> {
        let (_, text) = self.send(Method::GET, path, query, None).await?;
        decode(path, &text)
    }

    pub async fn call<B: Serialize, T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
    ) -> Result<T> {
        let body = body
            .map(serde_json::to_value)
            .transpose()
            .map_err(|e| ClientError::Config(format!("the body for {path}: {e}")))?;
        let (_, text) = self.send(method, path, &[], body.as_ref()).await?;
        if text.is_empty() {
            return Err(ClientError::Unexpected {
                path: path.to_owned(),
                why: "it is empty".into(),
            });
        }
        decode(path, &text)
    }
}

fn reading(e: &reqwest::Error) -> ClientError {
    ClientError::Unreachable(format!("reading the server's answer: {e}"))
}

fn decode<T: DeserializeOwned>(path: &str, text: &str) -> Result<T> {
    serde_json::from_str(text).map_err(|e| ClientError::Unexpected {
        path: path.to_owned(),
        why: e.to_string(),
    })
}
