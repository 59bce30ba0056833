//! A headless Chromium for browser tests, driven over WebDriver (Debian's `chromium` and
//! `chromedriver`, installed by `scripts/test`). The few commands the tests use are plain
//! JSON over HTTP to the driver on loopback.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{Value, json};

/// The W3C key under which WebDriver names an element.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

pub struct Browser {
    http: reqwest::Client,
    session: String,
    driver: tokio::process::Child,
    /// Screenshots go to `target/screenshots/<prefix>-<name>.png`.
    prefix: String,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn which(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    names.iter().find_map(|n| {
        std::env::split_paths(&path)
            .map(|d| d.join(n))
            .find(|p| p.is_file())
    })
}

impl Browser {
    /// Starts chromedriver on a free port and a headless Chromium session at 1280×900.
    pub async fn start(prefix: &str) -> Self {
        let driver_bin = std::env::var_os("CHROMEDRIVER")
            .map(PathBuf::from)
            .or_else(|| which(&["chromedriver"]))
            .expect("chromedriver is not installed: run ./scripts/test (apt: chromium-driver)");
        let chrome = std::env::var_os("CHROMIUM")
            .map(PathBuf::from)
            .or_else(|| which(&["chromium", "chromium-browser", "google-chrome"]))
            .expect("Chromium is not installed: run ./scripts/test (apt: chromium)");
        let port = free_port();
        let driver = tokio::process::Command::new(driver_bin)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            // Its own process group, with the browser it starts: dropping the `Browser`
            // (a failed test included) ends them all.
            .process_group(0)
            .spawn()
            .expect("chromedriver starts");
        let http = crate::http_client().build().expect("client");
        let base = format!("http://127.0.0.1:{port}");
        let started = Instant::now();
        loop {
            if let Ok(r) = http.get(format!("{base}/status")).send().await
                && r.status().is_success()
            {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "chromedriver did not start"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let res: Value = http
            .post(format!("{base}/session"))
            .json(&json!({ "capabilities": { "alwaysMatch": {
                "browserName": "chrome",
                // Pages are ready to use once parsed; nothing waits on subresources (the
                // test provider's pages ask for web fonts, and tests have no internet).
                "pageLoadStrategy": "eager",
                "goog:chromeOptions": {
                    "binary": chrome,
                    "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                             "--disable-dev-shm-usage", "--window-size=1280,900",
                             "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1"]
                }
            }}}))
            .send()
            .await
            .expect("new session")
            .json()
            .await
            .expect("session answer");
        let session = res["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no WebDriver session: {res}"))
            .to_owned();
        Self {
            http,
            session: format!("{base}/session/{session}"),
            driver,
            prefix: prefix.to_owned(),
        }
    }

    async fn cmd(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let mut req = self.http.request(method, format!("{}{path}", self.session));
        req = req.json(&body.unwrap_or_else(|| json!({})));
        let res: Value = req
            .send()
            .await
            .expect("WebDriver")
            .json()
            .await
            .expect("JSON");
        res["value"].clone()
    }

    async fn post(&self, path: &str, body: Value) -> Value {
        self.cmd(reqwest::Method::POST, path, Some(body)).await
    }

    pub async fn goto(&self, url: &str) {
        self.post("/url", json!({ "url": url })).await;
    }

    pub async fn url(&self) -> String {
        self.cmd(reqwest::Method::GET, "/url", None)
            .await
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// The first element matching `css`, if there is one now.
    pub async fn find(&self, css: &str) -> Option<String> {
        let v = self
            .post("/element", json!({ "using": "css selector", "value": css }))
            .await;
        v[ELEMENT].as_str().map(str::to_owned)
    }

    /// Waits (up to 30 s) for an element matching `css`.
    pub async fn wait_for(&self, css: &str) -> String {
        let started = Instant::now();
        loop {
            if let Some(e) = self.find(css).await {
                return e;
            }
            if started.elapsed() >= crate::PATIENCE {
                let source = self.cmd(reqwest::Method::GET, "/source", None).await;
                let source = source.as_str().unwrap_or_default();
                let source: String = source[source.find("<body").unwrap_or(0)..]
                    .chars()
                    .take(3000)
                    .collect();
                panic!(
                    "no `{css}` on {} after {:?}; the page: {source}",
                    self.url().await,
                    crate::PATIENCE
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub async fn click(&self, css: &str) {
        let e = self.wait_for(css).await;
        self.post(&format!("/element/{e}/click"), json!({})).await;
    }

    /// Replaces the text of the field matching `css`.
    pub async fn fill(&self, css: &str, text: &str) {
        let e = self.wait_for(css).await;
        self.post(&format!("/element/{e}/clear"), json!({})).await;
        self.post(&format!("/element/{e}/value"), json!({ "text": text }))
            .await;
    }

    pub async fn text(&self, css: &str) -> String {
        let e = self.wait_for(css).await;
        self.cmd(reqwest::Method::GET, &format!("/element/{e}/text"), None)
            .await
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// Waits (up to 30 s, reading the page again as it changes) until the element matching
    /// `css` says `wanted`; an empty `wanted` waits for it to say anything (an element that
    /// is there but still empty has not answered yet).
    pub async fn wait_for_text(&self, css: &str, wanted: &str) -> String {
        let started = Instant::now();
        let mut last = String::new();
        loop {
            if let Some(e) = self.find(css).await {
                let t = self
                    .cmd(reqwest::Method::GET, &format!("/element/{e}/text"), None)
                    .await;
                if let Some(t) = t.as_str() {
                    if t.contains(wanted) && !(wanted.is_empty() && t.trim().is_empty()) {
                        return t.to_owned();
                    }
                    last = t.to_owned();
                }
            }
            if started.elapsed() >= crate::PATIENCE {
                let main = self.execute("return document.body.innerText").await;
                panic!(
                    "`{css}` never said `{wanted}` on {} (it said `{last}`); the page: {}",
                    self.url().await,
                    main.as_str().unwrap_or_default()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Runs `script` (a function body; `arguments` as in WebDriver) in the page.
    pub async fn execute(&self, script: &str) -> Value {
        self.post("/execute/sync", json!({ "script": script, "args": [] }))
            .await
    }

    /// The value of a cookie of the current page.
    pub async fn cookie(&self, name: &str) -> Option<String> {
        let v = self
            .cmd(reqwest::Method::GET, &format!("/cookie/{name}"), None)
            .await;
        v["value"].as_str().map(str::to_owned)
    }

    /// Forgets every cookie (the identity provider's sign-in too): a fresh browser.
    pub async fn delete_cookies(&self) {
        self.cmd(reqwest::Method::DELETE, "/cookie", None).await;
    }

    pub async fn resize(&self, width: u32, height: u32) {
        self.post("/window/rect", json!({ "width": width, "height": height }))
            .await;
    }

    /// Saves a full-page screenshot to `target/screenshots/<prefix>-<name>.png`.
    pub async fn screenshot(&self, name: &str) {
        let shot = self
            .post(
                "/goog/cdp/execute",
                json!({ "cmd": "Page.captureScreenshot",
                        "params": { "captureBeyondViewport": true, "fromSurface": true } }),
            )
            .await;
        let data = match shot["data"].as_str() {
            Some(d) => d.to_owned(),
            // Not Chromium: the viewport only.
            None => self
                .cmd(reqwest::Method::GET, "/screenshot", None)
                .await
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        };
        let png = base64::engine::general_purpose::STANDARD
            .decode(data)
            .expect("a PNG screenshot");
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/screenshots");
        std::fs::create_dir_all(&dir).expect("screenshot directory");
        std::fs::write(dir.join(format!("{}-{name}.png", self.prefix)), png)
            .expect("screenshot written");
    }

    /// Ends the session (the browser closes); dropping the `Browser` then ends the driver.
    pub async fn quit(self) {
        let _ = self.http.delete(&self.session).send().await;
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if let Some(pid) = self.driver.id().and_then(|p| i32::try_from(p).ok()) {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}
