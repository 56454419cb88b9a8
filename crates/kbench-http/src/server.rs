//! The server's lifecycle around each level: wait for `/health`, read what it says it runs
//! (SGLang's `/get_server_info` or `/server_info`; vLLM's `/version`, `/metrics` and
//! `/v1/models`), refuse one whose speculative settings or model differ from the file's,
//! `/flush_cache` between levels.

use std::time::{Duration, Instant};

use kbench_core::backend::CudaGraphBound;
use kbench_core::experiment::{Algorithm, Experiment};

use crate::client::Client;
use crate::error::HttpError;
use crate::settings::Api;

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

/// Which serving engine answered, by the endpoints only it has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    /// `/get_server_info` or `/server_info` (SGLang, and `kbench serve`, which mimics it).
    Sglang,
    /// `/version` (`{"version": ...}`) and no SGLang server info.
    Vllm,
    /// Neither: some other OpenAI-compatible server.
    Unknown,
}

/// The speculative settings and version a server reports.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerFacts {
    pub engine: Engine,
    pub version: Option<String>,
    /// The speculative algorithm as the server names it: SGLang's `speculative_algorithm`
    /// (NEXTN reads EAGLE there), vLLM's `speculative_config.method` (development mode).
    pub method: Option<String>,
    /// None when the server does not say; Some(None) when it says it runs no speculation.
    /// A chain of K draft tokens is (K, 1, K + 1), SGLang's way of writing it.
    pub speculative: Option<Option<(u64, u64, u64)>>,
    /// What `/v1/models` lists (empty where it does not answer).
    pub models: Vec<String>,
    /// The largest forward it replays from a CUDA graph, where it says: SGLang's
    /// `cuda_graph_max_bs` (0 with `disable_cuda_graph`), vLLM's `max_cudagraph_capture_size`
    /// (development mode).
    pub cuda_graph_bound: Option<CudaGraphBound>,
}

impl ServerFacts {
    pub fn describe(&self) -> String {
        let version = match (&self.version, self.engine) {
            (Some(v), Engine::Vllm) => format!("vLLM {v}"),
            (Some(v), _) => v.clone(),
            (None, _) => "version not reported".into(),
        };
        match (self.speculative, self.engine) {
            (Some(Some((s, _, _))), Engine::Vllm) => match &self.method {
                Some(m) => format!("server {version}, {m} with num_speculative_tokens {s}"),
                None => format!("server {version}, speculation with num_speculative_tokens {s}"),
            },
            (Some(Some((s, k, d))), _) => format!(
                "server {version}, {} ({s}, {k}, {d})",
                self.method.as_deref().unwrap_or("EAGLE")
            ),
            (Some(None), _) => format!("server {version}, no speculation"),
            (None, _) => format!("server {version}, speculative settings not reported"),
        }
    }

    /// The API a file that names none goes through: SGLang's own where the server is
    /// SGLang, OpenAI completions (token ids in, exact lengths) elsewhere.
    pub fn default_api(&self) -> Api {
        match self.engine {
            Engine::Sglang => Api::Sglang,
            Engine::Vllm | Engine::Unknown => Api::OpenAiCompletions,
        }
    }
}

/// What the server says it is: SGLang's server info first (its speculative settings are
/// there), then vLLM's `/version`, whose speculative settings only `/metrics` shows.
pub async fn facts(client: &Client) -> Result<ServerFacts, HttpError> {
    let models = served_models(client).await.unwrap_or_default();
    for path in ["/get_server_info", "/server_info"] {
        if let Ok((200, v)) = client.json("GET", path, None, SHORT).await {
            // vLLM's development mode has a `/server_info` of its own
            if !v.is_object() || v.get("vllm_config").is_some() {
                continue;
            }
            let spec = v["speculative_algorithm"].as_str().map(|_| {
                (
                    v["speculative_num_steps"].as_u64().unwrap_or(0),
                    v["speculative_eagle_topk"].as_u64().unwrap_or(0),
                    v["speculative_num_draft_tokens"].as_u64().unwrap_or(0),
                )
            });
            let cuda_graph_bound = if v["disable_cuda_graph"].as_bool() == Some(true) {
                Some(CudaGraphBound::Requests(0))
            } else {
                v["cuda_graph_max_bs"]
                    .as_u64()
                    .map(|n| CudaGraphBound::Requests(u32::try_from(n).unwrap_or(u32::MAX)))
            };
            return Ok(ServerFacts {
                engine: Engine::Sglang,
                version: v["version"].as_str().map(str::to_string),
                method: v["speculative_algorithm"].as_str().map(str::to_string),
                speculative: Some(spec),
                models,
                cuda_graph_bound,
            });
        }
    }
    if let Ok((200, v)) = client.json("GET", "/version", None, SHORT).await {
        if let Some(version) = v["version"].as_str() {
            let (method, speculative, cuda_graph_bound) = match vllm_config(client).await {
                Some(c) => (c.method, Some(c.speculative), c.cuda_graph_bound),
                None => (None, vllm_speculative(client).await, None),
            };
            return Ok(ServerFacts {
                engine: Engine::Vllm,
                version: Some(version.to_string()),
                method,
                speculative,
                models,
                cuda_graph_bound,
            });
        }
    }
    Ok(ServerFacts {
        engine: Engine::Unknown,
        version: None,
        method: None,
        speculative: None,
        models,
        cuda_graph_bound: None,
    })
}

/// What vLLM's own config says, where its development mode serves it.
struct VllmConfigFacts {
    method: Option<String>,
    speculative: Option<(u64, u64, u64)>,
    cuda_graph_bound: Option<CudaGraphBound>,
}

/// vLLM's own config, where its development mode (`VLLM_SERVER_DEV_MODE=1`) serves it:
/// `/server_info?config_format=json` has `vllm_config.speculative_config` with the method
/// and `num_speculative_tokens`, and `compilation_config.max_cudagraph_capture_size`
/// (vllm/entrypoints/serve/dev/server_info/api_router.py).
async fn vllm_config(client: &Client) -> Option<VllmConfigFacts> {
    let (status, v) = client
        .json("GET", "/server_info?config_format=json", None, SHORT)
        .await
        .ok()?;
    let config = v.get("vllm_config").filter(|_| status == 200)?;
    let cuda_graph_bound = config["compilation_config"]["max_cudagraph_capture_size"]
        .as_u64()
        .map(|n| CudaGraphBound::Tokens(u32::try_from(n).unwrap_or(u32::MAX)));
    let spec = &config["speculative_config"];
    if spec.is_null() {
        return Some(VllmConfigFacts {
            method: None,
            speculative: None,
            cuda_graph_bound,
        });
    }
    let k = spec["num_speculative_tokens"].as_u64()?;
    Some(VllmConfigFacts {
        method: spec["method"].as_str().map(str::to_string),
        speculative: Some((k, 1, k + 1)),
        cuda_graph_bound,
    })
}

/// Elsewhere vLLM shows its speculative settings only in `/metrics`: the `spec_decode`
/// counters exist only when speculation is on (vllm/v1/spec_decode/metrics.py,
/// SpecDecodingProm), with one per-position series per draft token, created at start.
/// A server with no `vllm:` series (`--disable-log-stats`) says nothing.
async fn vllm_speculative(client: &Client) -> Option<Option<(u64, u64, u64)>> {
    let r = client.send("GET", "/metrics", None, SHORT).await.ok()?;
    if r.status != 200 {
        return None;
    }
    let text = String::from_utf8_lossy(&r.all(SHORT).await.ok()?).into_owned();
    speculative_in_metrics(&text)
}

fn speculative_in_metrics(text: &str) -> Option<Option<(u64, u64, u64)>> {
    if !text.lines().any(|l| l.starts_with("vllm:")) {
        return None;
    }
    let k = crate::prometheus::read(text).map_or(0, |r| r.per_position.len() as u64);
    Some((k > 0).then_some((k, 1, k + 1)))
}

/// Every model id `/v1/models` lists; None where it does not answer with a list.
pub async fn served_models(client: &Client) -> Option<Vec<String>> {
    match client.json("GET", "/v1/models", None, SHORT).await {
        Ok((200, v)) => Some(
            v["data"]
                .as_array()?
                .iter()
                .filter_map(|m| m["id"].as_str().map(str::to_string))
                .collect(),
        ),
        _ => None,
    }
}

/// The model OpenAI requests name: the file's, when the server serves it, else the
/// server's first. A name the server does not list is refused before anything is sent.
pub fn choose_model(
    facts: &ServerFacts,
    named: Option<&str>,
    url: &str,
) -> Result<Option<String>, HttpError> {
    match named {
        None => Ok(facts.models.first().cloned()),
        // a server that lists nothing cannot be checked
        Some(m) if facts.models.is_empty() || facts.models.iter().any(|s| s == m) => {
            Ok(Some(m.to_string()))
        }
        Some(m) => Err(HttpError::UnknownModel {
            url: url.to_string(),
            model: m.to_string(),
            served: facts.models.join(", "),
        }),
    }
}

/// Empties the server's caches where it can: SGLang's `/flush_cache`, vLLM's
/// `/reset_prefix_cache` (development mode only in 0.32,
/// vllm/entrypoints/serve/dev/cache/api_router.py); 404 and 405 mean the server has none.
pub async fn flush_cache(client: &Client, engine: Engine) -> Result<(), HttpError> {
    let path = match engine {
        Engine::Vllm => "/reset_prefix_cache",
        Engine::Sglang | Engine::Unknown => "/flush_cache",
    };
    let deadline = Instant::now() + SHORT;
    let failed = |message: String| HttpError::Server {
        what: path.into(),
        url: client.target.url.clone(),
        message,
    };
    loop {
        match client.json("POST", path, None, SHORT).await {
            Ok((200, _)) | Ok((404, _)) | Ok((405, _)) => return Ok(()),
            // still finishing the previous level's requests
            Ok((400, _)) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Ok((status, v)) => return Err(failed(format!("HTTP {status}: {v}"))),
            Err(message) => return Err(failed(message)),
        }
    }
}

/// What the file runs, to compare with what the server says it runs.
#[derive(Debug, Clone, PartialEq)]
pub struct Expected {
    pub speculative: Option<(u64, u64, u64)>,
    pub algorithm: Algorithm,
}

impl Expected {
    pub fn of(exp: &Experiment) -> Expected {
        Expected {
            speculative: exp.speculative.is_speculative().then_some({
                (
                    exp.speculative.shape.num_steps as u64,
                    exp.speculative.shape.topk as u64,
                    exp.speculative.shape.num_draft_tokens as u64,
                )
            }),
            algorithm: exp.speculative.algorithm,
        }
    }

    pub fn check(&self, facts: &ServerFacts) -> Result<(), HttpError> {
        let Some(server) = facts.speculative else {
            return Ok(());
        };
        let show = |s: Option<(u64, u64, u64)>| {
            match (s, facts.engine) {
            (Some((k, _, _)), Engine::Vllm) => format!("num_speculative_tokens {k}"),
            (Some((a, b, c)), _) => format!(
                "--speculative-num-steps {a} --speculative-eagle-topk {b} --speculative-num-draft-tokens {c}"
            ),
            (None, _) => "no speculation".into(),
        }
        };
        if server != self.speculative {
            return Err(HttpError::Mismatch(format!(
                "the file asks for {}, the server runs {}",
                show(self.speculative),
                show(server)
            )));
        }
        // the same shape drafted another way costs and accepts differently
        if let (Some(_), Some(name)) = (server, facts.method.as_deref()) {
            if runs_algorithm(name, self.algorithm) == Some(false) {
                let file_name = match facts.engine {
                    Engine::Vllm => self.algorithm.vllm_method(),
                    Engine::Sglang | Engine::Unknown => self.algorithm.sglang_name(),
                }
                .unwrap_or(match self.algorithm {
                    Algorithm::Eagle => "EAGLE",
                    Algorithm::Ngram => "NGRAM",
                    _ => "none",
                });
                return Err(HttpError::Mismatch(format!(
                    "the file drafts with {file_name}, the server with {name}"
                )));
            }
        }
        Ok(())
    }
}

/// Whether a server that names its algorithm `name` drafts the way `file` does; None
/// for a name kbench does not know. SGLang turns NEXTN into EAGLE (server_args.py), and
/// vLLM's per-model MTP names (`deepseek_mtp`, ...) are its `mtp`.
fn runs_algorithm(name: &str, file: Algorithm) -> Option<bool> {
    let name = name.to_ascii_lowercase();
    let runs = match name.as_str() {
        "eagle3" => file == Algorithm::Eagle3,
        "eagle" => matches!(file, Algorithm::Eagle | Algorithm::Mtp),
        "nextn" | "mtp" => file == Algorithm::Mtp,
        n if n.ends_with("_mtp") => file == Algorithm::Mtp,
        "ngram" => file == Algorithm::Ngram,
        "standalone" | "draft_model" | "medusa" | "mlp_speculator" | "suffix" | "dflash"
        | "lookahead" => false,
        _ => return None,
    };
    Some(runs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vllm(models: &[&str]) -> ServerFacts {
        ServerFacts {
            engine: Engine::Vllm,
            version: Some("0.32.0".into()),
            method: None,
            speculative: Some(None),
            models: models.iter().map(|m| m.to_string()).collect(),
            cuda_graph_bound: None,
        }
    }

    #[test]
    fn a_model_the_server_does_not_list_is_refused_with_the_ones_it_does() {
        let f = vllm(&["/models/tiny", "tiny"]);
        assert_eq!(
            choose_model(&f, None, "u").unwrap().as_deref(),
            Some("/models/tiny")
        );
        assert_eq!(
            choose_model(&f, Some("tiny"), "u").unwrap().as_deref(),
            Some("tiny")
        );
        let e = choose_model(&f, Some("nope"), "http://h:1")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("does not serve the model `nope`; it serves: /models/tiny, tiny"),
            "{e}"
        );
        // nothing listed: nothing to check against
        assert!(choose_model(&vllm(&[]), Some("nope"), "u").is_ok());
    }

    #[test]
    fn vllms_speculation_is_read_from_its_per_position_counters() {
        let on = "vllm:num_requests_running{engine=\"0\"} 0.0\n\
vllm:spec_decode_num_drafts_total{engine=\"0\"} 0.0\n\
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine=\"0\",position=\"0\"} 0.0\n\
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine=\"0\",position=\"1\"} 0.0\n\
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine=\"0\",position=\"2\"} 0.0\n";
        assert_eq!(speculative_in_metrics(on), Some(Some((3, 1, 4))));
        assert_eq!(
            speculative_in_metrics("vllm:num_requests_running{engine=\"0\"} 0.0\n"),
            Some(None)
        );
        // --disable-log-stats: no vllm: series, so nothing is known
        assert_eq!(speculative_in_metrics("# nothing\n"), None);
    }

    #[test]
    fn a_mismatch_is_told_in_the_servers_own_terms() {
        let mut f = vllm(&[]);
        f.speculative = Some(Some((3, 1, 4)));
        let e = Expected {
            speculative: None,
            algorithm: Algorithm::None,
        }
        .check(&f)
        .unwrap_err()
        .to_string();
        assert!(
            e.contains(
                "the file asks for no speculation, the server runs num_speculative_tokens 3"
            ),
            "{e}"
        );
        f.engine = Engine::Sglang;
        let e = Expected {
            speculative: Some((2, 1, 3)),
            algorithm: Algorithm::Eagle3,
        }
        .check(&f)
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("the server runs --speculative-num-steps 3"),
            "{e}"
        );
    }

    #[test]
    fn the_same_shape_drafted_another_way_is_refused() {
        let mut f = vllm(&[]);
        f.engine = Engine::Sglang;
        f.speculative = Some(Some((3, 1, 4)));
        let file = |algorithm| Expected {
            speculative: Some((3, 1, 4)),
            algorithm,
        };
        // SGLang reports NEXTN as EAGLE: an MTP file is what it runs, an EAGLE-3 file is not
        f.method = Some("EAGLE".into());
        assert!(file(Algorithm::Mtp).check(&f).is_ok());
        let e = file(Algorithm::Eagle3).check(&f).unwrap_err().to_string();
        assert!(
            e.contains("the file drafts with EAGLE3, the server with EAGLE"),
            "{e}"
        );
        f.method = Some("EAGLE3".into());
        assert!(file(Algorithm::Eagle3).check(&f).is_ok());
        let e = file(Algorithm::Mtp).check(&f).unwrap_err().to_string();
        assert!(
            e.contains("drafts with NEXTN, the server with EAGLE3"),
            "{e}"
        );
        // vLLM's names, its deprecated per-model MTP names included
        f.engine = Engine::Vllm;
        f.method = Some("deepseek_mtp".into());
        assert!(file(Algorithm::Mtp).check(&f).is_ok());
        let e = file(Algorithm::Eagle3).check(&f).unwrap_err().to_string();
        assert!(
            e.contains("drafts with eagle3, the server with deepseek_mtp"),
            "{e}"
        );
        f.method = Some("suffix".into());
        assert!(file(Algorithm::Ngram).check(&f).is_err());
        // a name kbench does not know is not judged
        f.method = Some("something_new".into());
        assert!(file(Algorithm::Eagle3).check(&f).is_ok());
    }
}
