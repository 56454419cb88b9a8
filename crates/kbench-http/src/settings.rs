//! `[backend.http]`: which server to drive and how.

use serde::Deserialize;

use kbench_core::experiment::Experiment;

use crate::error::HttpError;

/// Which of the server's APIs the requests go through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum Api {
    /// SGLang's `/generate` with `input_ids`: `meta_info` gives cumulative token counts and,
    /// in the finished chunk, the speculative statistics.
    #[serde(rename = "sglang")]
    Sglang,
    /// `/v1/completions` with the prompt as token ids and `stream_options`
    /// (`include_usage`, `continuous_usage_stats`) for the token counts.
    #[serde(rename = "openai-completions")]
    OpenAiCompletions,
    /// `/v1/chat/completions`: the prompt goes as text (one `w<id>` word per prompt token,
    /// inside the server's chat template), so input lengths are the server's
    /// `usage.prompt_tokens`, not the file's.
    #[serde(rename = "openai-chat")]
    OpenAiChat,
}

impl Api {
    pub fn name(self) -> &'static str {
        match self {
            Api::Sglang => "SGLang /generate",
            Api::OpenAiCompletions => "OpenAI /v1/completions",
            Api::OpenAiChat => "OpenAI /v1/chat/completions",
        }
    }

    /// The OpenAI APIs name a model in every request.
    pub fn names_model(self) -> bool {
        !matches!(self, Api::Sglang)
    }
}

fn default_request_timeout() -> f64 {
    600.0
}

fn default_ready_timeout() -> f64 {
    60.0
}

fn default_true() -> bool {
    true
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSettings {
    /// `http://HOST:PORT` of a running server.
    pub url: Option<String>,
    /// Which API; none: the server's own (SGLang's `/generate` on SGLang, OpenAI
    /// completions on vLLM and other servers), detected before the first level.
    pub api: Option<Api>,
    /// The `model` OpenAI requests name (default: the first of the server's `/v1/models`).
    pub model: Option<String>,
    /// The name of an environment variable holding a bearer token (the token itself never
    /// appears in a file, a report, a log or an error).
    pub api_key_env: Option<String>,
    #[serde(default = "default_request_timeout")]
    pub request_timeout_s: f64,
    /// How long to wait for `/health` before each level.
    #[serde(default = "default_ready_timeout")]
    pub ready_timeout_s: f64,
    /// Run even when the server's speculative settings differ from the file's.
    #[serde(default)]
    pub allow_mismatch: bool,
    /// `/flush_cache` before each level where the server has it.
    #[serde(default = "default_true")]
    pub flush_cache: bool,
    /// Start the server for each sweep variant (and stop it after).
    pub launch: Option<crate::launch::LaunchSettings>,
}

/// Where the server is: host, port and a path prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub url: String,
    pub host: String,
    pub port: u16,
    pub prefix: String,
}

impl Target {
    pub fn parse(url: &str) -> Result<Target, HttpError> {
        let shown = redacted(url);
        let bad = |why: &str| HttpError::Settings(format!("url `{shown}`: {why}"));
        if shown != url {
            return Err(bad(
                "credentials in the url are not sent (and are not printed): give the server's key with [backend.http] api_key_env",
            ));
        }
        if url.starts_with("https://") {
            return Err(bad(
                "https is not supported yet (use http:// on a trusted network or a local tunnel)",
            ));
        }
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| bad("must start with http://"))?;
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
            None => (rest, ""),
        };
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) if !h.is_empty() => (
                h.trim_start_matches('[').trim_end_matches(']').to_string(),
                p.parse::<u16>()
                    .map_err(|_| bad("the port is not a number"))?,
            ),
            _ if !authority.is_empty() => (authority.to_string(), 80),
            _ => return Err(bad("no host")),
        };
        Ok(Target {
            url: url.trim_end_matches('/').to_string(),
            host,
            port,
            prefix: path.to_string(),
        })
    }
}

/// The url with any password in its authority replaced by `***`, for messages.
pub fn redacted(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let end = rest.find('/').unwrap_or(rest.len());
    match rest[..end].rfind('@') {
        Some(at) => {
            let user = rest[..at].split(':').next().unwrap_or("");
            format!("{scheme}://{user}:***@{}", &rest[at + 1..])
        }
        None => url.to_string(),
    }
}

impl HttpSettings {
    pub fn of(exp: &Experiment) -> Result<HttpSettings, HttpError> {
        let s: HttpSettings = exp
            .file
            .backend
            .parse("http")
            // the message names the table already
            .map_err(|m| {
                HttpError::Settings(m.trim_start_matches("[backend.http]: ").to_string())
            })?;
        for (key, v) in [
            ("request_timeout_s", s.request_timeout_s),
            ("ready_timeout_s", s.ready_timeout_s),
        ] {
            kbench_core::duration::checked_seconds(v)
                .map_err(|e| HttpError::Settings(format!("{key} = {e}")))?;
        }
        if let Some(l) = &s.launch {
            kbench_core::duration::checked_seconds(l.ready_timeout_s)
                .map_err(|e| HttpError::Settings(format!("launch.ready_timeout_s = {e}")))?;
            if l.grace_s != 0.0 {
                kbench_core::duration::checked_seconds(l.grace_s)
                    .map_err(|e| HttpError::Settings(format!("launch.grace_s = {e}")))?;
            }
        }
        Ok(s)
    }

    pub fn target(&self) -> Result<Target, HttpError> {
        let url = self.url.as_deref().ok_or_else(|| {
            HttpError::Settings(
                "no `url`: give the server, e.g. --set 'backend.http.url=\"http://127.0.0.1:30000\"'"
                    .into(),
            )
        })?;
        Target::parse(url)
    }

    /// The bearer token, read from the named environment variable.
    pub fn api_key(&self) -> Result<Option<String>, HttpError> {
        match &self.api_key_env {
            None => Ok(None),
            Some(var) => std::env::var(var).map(Some).map_err(|_| {
                HttpError::Settings(format!(
                    "api_key_env names `{var}`, which is not set in the environment"
                ))
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let t = Target::parse("http://127.0.0.1:30000/").unwrap();
        assert_eq!(
            (t.host.as_str(), t.port, t.prefix.as_str()),
            ("127.0.0.1", 30000, "")
        );
        let t = Target::parse("http://localhost/api").unwrap();
        assert_eq!((t.port, t.prefix.as_str()), (80, "/api"));
        assert!(Target::parse("https://x").is_err());
        assert!(Target::parse("ftp://x").is_err());
        assert!(Target::parse("http://x:notaport").is_err());
    }

    #[test]
    fn a_password_in_a_url_is_never_printed() {
        let e = Target::parse("http://admin:hunter2@10.0.0.5:8000/v1")
            .unwrap_err()
            .to_string();
        assert!(!e.contains("hunter2"), "{e}");
        assert!(
            e.contains("http://admin:***@10.0.0.5:8000/v1") && e.contains("api_key_env"),
            "{e}"
        );
        // and one that fails for another reason is redacted too
        let e = Target::parse("https://u:secret@x").unwrap_err().to_string();
        assert!(!e.contains("secret"), "{e}");
        assert_eq!(redacted("http://h:1/a@b"), "http://h:1/a@b");
    }
}
