//! The server's lifecycle around each level: wait for `/health`, read what it says it runs
//! (`/get_server_info`, or `/server_info` on newer SGLang), refuse one whose speculative
//! settings differ from the file's, `/flush_cache` between levels.

use std::time::{Duration, Instant};

use kbench_core::spec::Experiment;

use crate::client::Client;
use crate::error::HttpError;

const SHORT: Duration = Duration::from_secs(10);

pub async fn wait_healthy(client: &Client, limit: Duration) -> Result<(), HttpError> {
    let deadline = Instant::now() + limit;
    loop {
        // a probe ends within the wait, so a short wait is short
        let probe = SHORT.min(limit.max(Duration::from_millis(100)));
        let last = match client.send("GET", "/health", None, probe).await {
            Ok(r) if r.status == 200 => return Ok(()),
            Ok(r) => format!("HTTP {}", r.status),
            Err(e) => e,
        };
        if Instant::now() >= deadline {
            return Err(HttpError::NotReady {
                url: client.target.url.clone(),
                seconds: limit.as_secs_f64(),
                last,
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The speculative settings and version a server reports.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerFacts {
    pub version: Option<String>,
    /// None when the server does not say (not SGLang, or no `/get_server_info`).
    pub speculative: Option<Option<(u64, u64, u64)>>,
}

impl ServerFacts {
    pub fn describe(&self) -> String {
        let version = self.version.as_deref().unwrap_or("version not reported");
        match self.speculative {
            Some(Some((s, k, d))) => format!("server {version}, EAGLE ({s}, {k}, {d})"),
            Some(None) => format!("server {version}, no speculation"),
            None => format!("server {version}, speculative settings not reported"),
        }
    }
}

pub async fn facts(client: &Client) -> Result<ServerFacts, HttpError> {
    for path in ["/get_server_info", "/server_info"] {
        if let Ok((200, v)) = client.json("GET", path, None, SHORT).await {
            let spec = v["speculative_algorithm"].as_str().map(|_| {
                (
                    v["speculative_num_steps"].as_u64().unwrap_or(0),
                    v["speculative_eagle_topk"].as_u64().unwrap_or(0),
                    v["speculative_num_draft_tokens"].as_u64().unwrap_or(0),
                )
            });
            return Ok(ServerFacts {
                version: v["version"].as_str().map(str::to_string),
                speculative: Some(spec),
            });
        }
    }
    Ok(ServerFacts {
        version: None,
        speculative: None,
    })
}

/// The first model `/v1/models` lists.
pub async fn first_model(client: &Client) -> Result<Option<String>, HttpError> {
    match client.json("GET", "/v1/models", None, SHORT).await {
        Ok((200, v)) => Ok(v["data"][0]["id"].as_str().map(str::to_string)),
        Ok((status, v)) => Err(HttpError::Server {
            what: "/v1/models".into(),
            url: client.target.url.clone(),
            message: format!("HTTP {status}: {v}"),
        }),
        Err(message) => Err(HttpError::Server {
            what: "/v1/models".into(),
            url: client.target.url.clone(),
            message,
        }),
    }
}

/// `/flush_cache` where the server has it (404 and 405 mean it does not).
pub async fn flush_cache(client: &Client) -> Result<(), HttpError> {
    let deadline = Instant::now() + SHORT;
    loop {
        match client.json("POST", "/flush_cache", None, SHORT).await {
            Ok((200, _)) | Ok((404, _)) | Ok((405, _)) => return Ok(()),
            // still finishing the previous level's requests
            Ok((400, _)) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Ok((status, v)) => {
                return Err(HttpError::Server {
                    what: "/flush_cache".into(),
                    url: client.target.url.clone(),
                    message: format!("HTTP {status}: {v}"),
                })
            }
            Err(message) => {
                return Err(HttpError::Server {
                    what: "/flush_cache".into(),
                    url: client.target.url.clone(),
                    message,
                })
            }
        }
    }
}

/// What the file runs, to compare with what the server says it runs.
#[derive(Debug, Clone, PartialEq)]
pub struct Expected {
    pub speculative: Option<(u64, u64, u64)>,
}

impl Expected {
    pub fn of(exp: &Experiment) -> Expected {
        Expected {
            speculative: exp.spec.is_speculative().then_some({
                (
                    exp.spec.shape.num_steps as u64,
                    exp.spec.shape.topk as u64,
                    exp.spec.shape.num_draft_tokens as u64,
                )
            }),
        }
    }

    pub fn check(&self, facts: &ServerFacts) -> Result<(), HttpError> {
        let Some(server) = facts.speculative else {
            return Ok(());
        };
        let show = |s: Option<(u64, u64, u64)>| {
            match s {
            Some((a, b, c)) => format!(
                "--speculative-num-steps {a} --speculative-eagle-topk {b} --speculative-num-draft-tokens {c}"
            ),
            None => "no speculation".into(),
        }
        };
        if server != self.speculative {
            return Err(HttpError::Mismatch(format!(
                "the file asks for {}, the server runs {}",
                show(self.speculative),
                show(server)
            )));
        }
        Ok(())
    }
}
