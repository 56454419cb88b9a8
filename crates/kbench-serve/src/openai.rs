//! OpenAI's endpoints as vLLM and SGLang serve them: `/v1/completions`,
//! `/v1/chat/completions` (streaming or not, `stream_options`), `/v1/models`.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::extract::{Extension, State};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::body::{only, read_json, top_k, OneOrMany, Prompt};
use crate::chat::{self, Message};
use crate::error::ApiError;
use crate::gen::{Delta, GenRequest, Generation};
use crate::reqlog::RequestLog;
use crate::sglang::fault_for;
use crate::state::{AppState, PerRequestSpeculativeMetrics};
use crate::stream::{self, Format};

/// OpenAI's default `max_tokens` for completions.
const DEFAULT_COMPLETION_TOKENS: u32 = 16;
/// For chat, vLLM fills the context; on kbench's CPU engine that can take minutes, so a
/// request without `max_tokens` gets this (docs/serve.md).
const DEFAULT_CHAT_TOKENS: u32 = 128;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
    #[serde(default)]
    continuous_usage_stats: bool,
}

/// The sampling fields completions and chat share (vLLM's extra ones included).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Common {
    model: Option<String>,
    max_tokens: Option<u32>,
    max_completion_tokens: Option<u32>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<i64>,
    seed: Option<u64>,
    stop: Option<OneOrMany>,
    stop_token_ids: Option<Vec<u32>>,
    ignore_eos: Option<bool>,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    n: Option<u32>,
    user: Option<String>,
    presence_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    logprobs: Option<Value>,
    skip_special_tokens: Option<bool>,
    /// `vllm bench serve` sends 1.0.
    repetition_penalty: Option<f32>,
    min_tokens: Option<u32>,
    min_p: Option<f32>,
    best_of: Option<u32>,
}

impl Common {
    fn request(
        &mut self,
        state: &AppState,
        prompt: Vec<u32>,
        default_max: u32,
    ) -> Result<GenRequest, ApiError> {
        if let Some(m) = &self.model {
            if *m != state.model.served_name && *m != state.model.model_path {
                return Err(ApiError {
                    param: Some("model"),
                    ..ApiError::not_found(&format!("The model `{m}`"))
                });
            }
        }
        only("n", self.n, 1)?;
        only("presence_penalty", self.presence_penalty, 0.0)?;
        only("frequency_penalty", self.frequency_penalty, 0.0)?;
        only("skip_special_tokens", self.skip_special_tokens, true)?;
        only("repetition_penalty", self.repetition_penalty, 1.0)?;
        only("min_tokens", self.min_tokens, 0)?;
        only("min_p", self.min_p, 0.0)?;
        only("best_of", self.best_of, 1)?;
        match &self.logprobs {
            None | Some(Value::Null) | Some(Value::Bool(false)) => {}
            Some(_) => {
                return Err(
                    ApiError::bad_request("`logprobs` is not supported by kbench serve")
                        .with_param("logprobs"),
                )
            }
        }
        let _ = &self.user;
        let top_k = top_k(self.top_k)?;
        Ok(GenRequest {
            prompt,
            max_new: self
                .max_completion_tokens
                .or(self.max_tokens)
                .unwrap_or(default_max),
            temperature: self.temperature.unwrap_or(1.0),
            top_p: self.top_p.unwrap_or(1.0),
            top_k,
            seed: self.seed,
            ignore_eos: self.ignore_eos.unwrap_or(false),
            stop: self
                .stop
                .take()
                .map(OneOrMany::into_vec)
                .unwrap_or_default(),
            stop_token_ids: self.stop_token_ids.take().unwrap_or_default(),
        })
    }
}

/// Takes and parses one field of a request object.
fn take<T: serde::de::DeserializeOwned>(
    fields: &mut serde_json::Map<String, Value>,
    name: &'static str,
) -> Result<Option<T>, ApiError> {
    match fields.remove(name) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => serde_json::from_value(v)
            .map(Some)
            .map_err(|e| ApiError::bad_request(format!("invalid `{name}`: {e}")).with_param(name)),
    }
}

fn created() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

pub async fn completions(
    State(state): State<Arc<AppState>>,
    log: Option<Extension<Arc<RequestLog>>>,
    body: Body,
) -> Response {
    match start(&state, log.map(|Extension(l)| l), body, false).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

pub async fn chat_completions(
    State(state): State<Arc<AppState>>,
    log: Option<Extension<Arc<RequestLog>>>,
    body: Body,
) -> Response {
    match start(&state, log.map(|Extension(l)| l), body, true).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn start(
    state: &Arc<AppState>,
    log: Option<Arc<RequestLog>>,
    body: Body,
    chat: bool,
) -> Result<Response, ApiError> {
    // The endpoint's own fields come off first; the rest must all be known sampling fields.
    let mut fields: serde_json::Map<String, Value> = read_json(state, body).await?;
    let (prompt, default_max) = if chat {
        let messages: Vec<Message> = take(&mut fields, "messages")?.ok_or_else(|| {
            ApiError::bad_request("`messages` is required").with_param("messages")
        })?;
        let text = chat::render(&messages)?;
        (
            crate::offload::encode(state, text).await?,
            DEFAULT_CHAT_TOKENS,
        )
    } else {
        let prompt: Prompt = take(&mut fields, "prompt")?
            .ok_or_else(|| ApiError::bad_request("`prompt` is required").with_param("prompt"))?;
        only("echo", take::<bool>(&mut fields, "echo")?, false)?;
        (prompt.ids(state).await?, DEFAULT_COMPLETION_TOKENS)
    };
    let mut common: Common = serde_json::from_value(Value::Object(fields))
        .map_err(|e| ApiError::bad_request(format!("invalid request: {e}")))?;
    let req = common.request(state, prompt, default_max)?;
    let id = state.next_id();
    let response_id = format!("{}-{id:016x}", if chat { "chatcmpl" } else { "cmpl" });
    if let Some(l) = &log {
        l.set_id(&response_id);
    }
    let fault = fault_for(state, id)?;
    let gen = Generation::start(state, req, id)?.logged(log);
    let opts = common.stream_options.unwrap_or_default();
    let format = OpenAiFormat {
        id: response_id,
        chat,
        model: state.model.served_name.clone(),
        created: created(),
        include_usage: opts.include_usage,
        continuous_usage: opts.continuous_usage_stats,
        first: true,
        spec_metrics: state.answering.per_request_spec_metrics,
    };
    Ok(if common.stream.unwrap_or(false) {
        stream::sse(gen, format, fault)
    } else {
        stream::whole(gen, format, fault).await
    })
}

struct OpenAiFormat {
    id: String,
    chat: bool,
    model: String,
    created: u64,
    include_usage: bool,
    continuous_usage: bool,
    first: bool,
    spec_metrics: Option<PerRequestSpeculativeMetrics>,
}

/// vLLM's per-request `metrics.speculative_decoding` (its names); None for a request that
/// ran no verify round.
fn speculative_decoding(gen: &Generation, detail: PerRequestSpeculativeMetrics) -> Option<Value> {
    let s = &gen.spec;
    if s.verify_ct == 0 {
        return None;
    }
    let mut m = json!({
        "num_spec_steps": s.verify_ct,
        "num_draft_tokens": s.proposed,
        "num_accepted_draft_tokens": s.accepted,
        "mean_acceptance_length": 1.0 + s.accepted as f64 / s.verify_ct as f64,
        "draft_acceptance_rate": if s.proposed == 0 { 0.0 } else { s.accepted as f64 / s.proposed as f64 },
        "acceptance_histogram": s.histogram,
    });
    if detail == PerRequestSpeculativeMetrics::Detailed {
        m["per_step_accepted"] = json!(s.per_step_accepted);
        m["per_step_drafted"] = json!(s.per_step_drafted);
    }
    Some(json!({ "speculative_decoding": m }))
}

fn usage(gen: &Generation) -> Value {
    json!({
        "prompt_tokens": gen.prompt_tokens,
        "completion_tokens": gen.completion_tokens(),
        "total_tokens": gen.prompt_tokens + gen.completion_tokens(),
        "prompt_tokens_details": {"cached_tokens": gen.cached_tokens},
    })
}

impl OpenAiFormat {
    fn object(&self, streaming: bool) -> &'static str {
        match (self.chat, streaming) {
            (true, true) => "chat.completion.chunk",
            (true, false) => "chat.completion",
            (false, _) => "text_completion",
        }
    }

    fn envelope(&self, streaming: bool, choices: Value) -> serde_json::Map<String, Value> {
        let mut m = serde_json::Map::new();
        m.insert("id".into(), json!(self.id));
        m.insert("object".into(), json!(self.object(streaming)));
        m.insert("created".into(), json!(self.created));
        m.insert("model".into(), json!(self.model));
        m.insert("choices".into(), choices);
        m
    }
}

impl Format for OpenAiFormat {
    fn chunk(&mut self, gen: &Generation, delta: &Delta) -> Vec<Value> {
        let finish = delta.finish.as_ref();
        let mut choice = if self.chat {
            let mut d = serde_json::Map::new();
            if self.first {
                d.insert("role".into(), json!("assistant"));
            }
            d.insert("content".into(), json!(delta.text));
            json!({"index": 0, "delta": d, "logprobs": null})
        } else {
            json!({"index": 0, "text": delta.text, "logprobs": null})
        };
        self.first = false;
        choice["finish_reason"] = finish.map(|f| json!(f.openai())).unwrap_or(Value::Null);
        if let Some(f) = finish {
            choice["matched_stop"] = f.matched_stop();
        }
        let mut m = self.envelope(true, json!([choice]));
        if self.continuous_usage {
            m.insert("usage".into(), usage(gen));
        }
        vec![Value::Object(m)]
    }

    fn end(&mut self, gen: &Generation) -> Vec<Value> {
        if !self.include_usage {
            return Vec::new();
        }
        let mut m = self.envelope(true, json!([]));
        m.insert("usage".into(), usage(gen));
        if let Some(spec) = self.spec_metrics.and_then(|d| speculative_decoding(gen, d)) {
            m.insert("metrics".into(), spec);
        }
        vec![Value::Object(m)]
    }

    fn whole(&mut self, gen: &Generation) -> Value {
        let finish = gen.finish.as_ref();
        let mut choice = if self.chat {
            json!({"index": 0, "message": {"role": "assistant", "content": gen.text}, "logprobs": null})
        } else {
            json!({"index": 0, "text": gen.text, "logprobs": null})
        };
        choice["finish_reason"] = finish.map(|f| json!(f.openai())).unwrap_or(Value::Null);
        choice["matched_stop"] = finish.map(|f| f.matched_stop()).unwrap_or(Value::Null);
        let mut m = self.envelope(false, json!([choice]));
        m.insert("usage".into(), usage(gen));
        if let Some(spec) = self.spec_metrics.and_then(|d| speculative_decoding(gen, d)) {
            m.insert("metrics".into(), spec);
        }
        Value::Object(m)
    }
}

pub async fn models(State(state): State<Arc<AppState>>) -> Response {
    let m = &state.model;
    axum::Json(json!({
        "object": "list",
        "data": [{
            "id": m.served_name,
            "object": "model",
            "created": created(),
            "owned_by": "kbench",
            "root": m.model_path,
            "parent": null,
            "max_model_len": m.context_length,
            "max_prompt_tokens": m.max_prompt_tokens,
        }]
    }))
    .into_response()
}
