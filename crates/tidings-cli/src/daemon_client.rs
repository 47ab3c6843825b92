//! Commands against a running daemon's console API (`--daemon URL`) rather
//! than the database: the same answers, through the daemon's tokens.

use anyhow::Context as _;
use serde::Serialize;
use serde::de::DeserializeOwned;

/// The variable holding the token sent to the daemon.
pub(crate) const TOKEN_VAR: &str = "TIDINGS_CONSOLE_TOKEN";

/// A daemon's console, reached over HTTP.
pub(crate) struct Daemon {
    base: String,
    http: reqwest::Client,
    token: Option<String>,
}

impl std::fmt::Debug for Daemon {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Daemon")
            .field("base", &self.base)
            .field("token", &self.token.as_ref().map(|_| "(set)"))
            .finish()
    }
}

impl Daemon {
    /// The console at `url` (`http://127.0.0.1:9470`), with the token of
    /// [`TOKEN_VAR`] if set.
    pub(crate) fn new(url: &str) -> anyhow::Result<Daemon> {
        let base = url.trim_end_matches('/').to_owned();
        anyhow::ensure!(
            base.starts_with("http://"),
            "--daemon {url}: write the console's address as http://host:port (its [console] listen)"
        );
        let http = reqwest::Client::builder()
            .connect_timeout(std::time::Duration::from_secs(5))
            .build()?;
        let token = std::env::var(TOKEN_VAR).ok().filter(|t| !t.trim().is_empty());
        Ok(Daemon { base, http, token })
    }

    /// `GET path?query`, its JSON answer.
    pub(crate) async fn get<T: DeserializeOwned>(
        &self,
        path: &str,
        query: &impl Serialize,
    ) -> anyhow::Result<T> {
        self.send(self.http.get(self.url(path)).query(query), path).await
    }

    /// `POST path` with `body` as JSON, its JSON answer.
    pub(crate) async fn post<T: DeserializeOwned>(
        &self,
        path: &str,
        body: &impl Serialize,
    ) -> anyhow::Result<T> {
        self.send(self.http.post(self.url(path)).json(body), path).await
    }

    fn url(&self, path: &str) -> String {
        format!("{}/api{path}", self.base)
    }

    async fn send<T: DeserializeOwned>(
        &self,
        mut request: reqwest::RequestBuilder,
        path: &str,
    ) -> anyhow::Result<T> {
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.with_context(|| {
            format!(
                "cannot reach the daemon's console at {} (is [console] listen set, and the daemon running?)",
                self.base
            )
        })?;
        let status = response.status();
        if status.is_success() {
            return response
                .json()
                .await
                .with_context(|| format!("the console's answer to {path} is not what this build reads"));
        }
        let said = response
            .json::<serde_json::Value>()
            .await
            .ok()
            .and_then(|v| v["error"].as_str().map(str::to_owned))
            .unwrap_or_default();
        let hint = match (status.as_u16(), &self.token) {
            (401, None) => format!(" (set {TOKEN_VAR} to a token of the console)"),
            _ => String::new(),
        };
        anyhow::bail!("the daemon's console refused {path}: {status}: {said}{hint}")
    }
}
