//! SGLang's native endpoints: `/generate` and the server endpoints (`/health`,
//! `/health_generate`, `/get_model_info`, `/get_server_info`, `/flush_cache`), and vLLM's
//! `/reset_prefix_cache` beside the flush it aliases.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Extension, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::body::{only, read_json, top_k, InputIds, OneOrMany, Prompt};
use crate::error::ApiError;
use crate::gen::{Delta, GenRequest, Generation};
use crate::reqlog::RequestLog;
use crate::state::AppState;
use crate::stream::{self, Format, StreamFault};

/// SGLang's default `max_new_tokens`.
const DEFAULT_MAX_NEW_TOKENS: u32 = 128;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GenerateBody {
    text: Option<Prompt>,
    /// Read as [`InputIds`] once the body parsed, so that text here gets its own message.
    input_ids: Option<Value>,
    #[serde(default)]
    sampling_params: SamplingParams,
    stream: Option<bool>,
    rid: Option<String>,
    return_logprob: Option<bool>,
    logprob_start_len: Option<i64>,
    top_logprobs_num: Option<u32>,
    return_text_in_logprobs: Option<bool>,
    lora_path: Option<Value>,
    /// bench_serving sends it; `/generate` streams the same either way.
    stream_options: Option<Value>,
    image_data: Option<Value>,
    return_routed_experts: Option<bool>,
    return_hidden_states: Option<bool>,
    token_ids_logprob: Option<Value>,
    custom_logit_processor: Option<Value>,
    /// Scheduling hints with no effect on one worker: accepted and ignored.
    priority: Option<i64>,
    routing_key: Option<String>,
    data_parallel_rank: Option<i64>,
    log_metrics: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SamplingParams {
    max_new_tokens: Option<u32>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    /// -1 (SGLang's default) or 0: no cut.
    top_k: Option<i64>,
    ignore_eos: Option<bool>,
    stop: Option<OneOrMany>,
    stop_token_ids: Option<Vec<u32>>,
    sampling_seed: Option<u64>,
    min_new_tokens: Option<u32>,
    min_p: Option<f32>,
    n: Option<u32>,
    frequency_penalty: Option<f32>,
    presence_penalty: Option<f32>,
    repetition_penalty: Option<f32>,
    skip_special_tokens: Option<bool>,
    no_stop_trim: Option<bool>,
    stream_interval: Option<u32>,
}

impl SamplingParams {
    pub fn into_request(self, prompt: Vec<u32>, default_max: u32) -> Result<GenRequest, ApiError> {
        only("min_new_tokens", self.min_new_tokens, 0)?;
        only("min_p", self.min_p, 0.0)?;
        only("n", self.n, 1)?;
        only("frequency_penalty", self.frequency_penalty, 0.0)?;
        only("presence_penalty", self.presence_penalty, 0.0)?;
        only("repetition_penalty", self.repetition_penalty, 1.0)?;
        only("skip_special_tokens", self.skip_special_tokens, true)?;
        only("no_stop_trim", self.no_stop_trim, false)?;
        only("stream_interval", self.stream_interval, 1)?;
        let top_k = top_k(self.top_k)?;
        Ok(GenRequest {
            prompt,
            max_new: self.max_new_tokens.unwrap_or(default_max),
            temperature: self.temperature.unwrap_or(1.0),
            top_p: self.top_p.unwrap_or(1.0),
            top_k,
            seed: self.sampling_seed,
            ignore_eos: self.ignore_eos.unwrap_or(false),
            stop: self.stop.map(OneOrMany::into_vec).unwrap_or_default(),
            stop_token_ids: self.stop_token_ids.unwrap_or_default(),
        })
    }
}

/// Applies the fault drawn for this request: an error response, or a stream fault.
pub fn fault_for(state: &AppState, id: u64) -> Result<Option<StreamFault>, ApiError> {
    let kind = state.faults.pick(id);
    if let Some(e) = kind.and_then(|k| k.response(state.model.context_length)) {
        return Err(e);
    }
    Ok(StreamFault::of(kind, state.faults.stall))
}

pub async fn generate(
    State(state): State<Arc<AppState>>,
    log: Option<Extension<Arc<RequestLog>>>,
    body: Body,
) -> Response {
    match start_generate(&state, log.map(|Extension(l)| l), body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn start_generate(
    state: &Arc<AppState>,
    log: Option<Arc<RequestLog>>,
    body: Body,
) -> Result<Response, ApiError> {
    let b: GenerateBody = read_json(state, body).await?;
    only("return_logprob", b.return_logprob, false)?;
    only("top_logprobs_num", b.top_logprobs_num, 0)?;
    only("lora_path", b.lora_path, Value::Null)?;
    only("image_data", b.image_data, Value::Null)?;
    only("return_routed_experts", b.return_routed_experts, false)?;
    only("return_hidden_states", b.return_hidden_states, false)?;
    only("token_ids_logprob", b.token_ids_logprob, Value::Null)?;
    only(
        "custom_logit_processor",
        b.custom_logit_processor,
        Value::Null,
    )?;
    let _ = (
        b.logprob_start_len,
        b.return_text_in_logprobs,
        b.stream_options,
    );
    let _ = (
        b.priority,
        b.routing_key,
        b.data_parallel_rank,
        b.log_metrics,
    );
    let prompt = match (b.text, b.input_ids) {
        (Some(_), Some(_)) => {
            return Err(ApiError::bad_request(
                "give `text` or `input_ids`, not both",
            ))
        }
        (Some(p), None) => p.ids(state).await?,
        (None, Some(ids)) => {
            let ids: InputIds = serde_json::from_value(ids).map_err(|_| {
                ApiError::bad_request(
                    "`input_ids` must be token ids: a list of non-negative integers (or one \
                     such list in a list); send text as `text`",
                )
                .with_param("input_ids")
            })?;
            Prompt::from(ids).ids(state).await?
        }
        (None, None) => return Err(ApiError::bad_request("give `text` or `input_ids`")),
    };
    let req = b
        .sampling_params
        .into_request(prompt, DEFAULT_MAX_NEW_TOKENS)?;
    let id = state.next_id();
    let rid = b.rid.unwrap_or_else(|| format!("{id:032x}"));
    if let Some(l) = &log {
        l.set_id(&rid);
    }
    let fault = fault_for(state, id)?;
    let gen = Generation::start(state, req, id)?.logged(log);
    let format = GenerateFormat {
        rid,
        speculative: state.model.draft_positions > 0,
        incremental: state.answering.incremental_streaming_output,
    };
    Ok(if b.stream.unwrap_or(false) {
        stream::sse(gen, format, fault)
    } else {
        stream::whole(gen, format, fault).await
    })
}

struct GenerateFormat {
    rid: String,
    speculative: bool,
    /// `--incremental-streaming-output`: a stream's chunks carry only what they add.
    incremental: bool,
}

impl GenerateFormat {
    /// The answer so far, or (`delta`) what this chunk adds to it, with the meta_info of now.
    fn body(&self, gen: &Generation, delta: Option<&Delta>, virtual_ns: Option<u64>) -> Value {
        let mut meta = Map::new();
        meta.insert("id".into(), json!(self.rid));
        meta.insert(
            "finish_reason".into(),
            gen.finish
                .as_ref()
                .map(|f| f.sglang())
                .unwrap_or(Value::Null),
        );
        meta.insert("prompt_tokens".into(), json!(gen.prompt_tokens));
        meta.insert("completion_tokens".into(), json!(gen.completion_tokens()));
        meta.insert("cached_tokens".into(), json!(gen.cached_tokens));
        meta.insert("num_retractions".into(), json!(0));
        if gen.done() {
            meta.insert(
                "e2e_latency".into(),
                json!(gen.started.elapsed().as_secs_f64()),
            );
            if self.speculative {
                spec_fields(gen, &mut meta);
            }
        }
        if let Some(v) = virtual_ns {
            meta.insert("kbench_virtual_ns".into(), json!(v));
            // when the chunk left the server, so a client on the same machine can measure
            // what it adds (benches/http_client.rs)
            let sent = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0);
            meta.insert("kbench_sent_unix_ns".into(), json!(sent));
        }
        let (text, output_ids) = match delta {
            Some(d) => (&d.text, &d.ids),
            None => (&gen.text, &gen.output_ids),
        };
        json!({
            "text": text,
            "output_ids": output_ids,
            "meta_info": meta,
            "index": 0,
        })
    }
}

/// SGLang's speculative fields of a finished request, under the current (>= 0.5.12) names.
pub fn spec_fields(gen: &Generation, meta: &mut Map<String, Value>) {
    let s = &gen.spec;
    meta.insert("spec_verify_ct".into(), json!(s.verify_ct));
    meta.insert("spec_accept_length".into(), json!(gen.spec_accept_length()));
    let rate = if s.proposed == 0 {
        0.0
    } else {
        s.accepted as f64 / s.proposed as f64
    };
    meta.insert("spec_accept_rate".into(), json!(rate));
    meta.insert("spec_num_proposed_drafts".into(), json!(s.proposed));
    meta.insert("spec_num_correct_drafts".into(), json!(s.accepted));
    meta.insert("spec_correct_drafts_histogram".into(), json!(s.histogram));
    meta.insert("spec_accept_histogram".into(), json!(s.histogram));
}

impl Format for GenerateFormat {
    fn chunk(&mut self, gen: &Generation, delta: &Delta) -> Vec<Value> {
        let part = self.incremental.then_some(delta);
        vec![self.body(gen, part, delta.virtual_ns)]
    }

    fn whole(&mut self, gen: &Generation) -> Value {
        self.body(gen, None, None)
    }
}

pub async fn health() -> StatusCode {
    StatusCode::OK
}

/// A one-token generation through the worker: 200 when it answers in time, else 503.
pub async fn health_generate(State(state): State<Arc<AppState>>) -> Response {
    let req = GenRequest {
        prompt: vec![0],
        max_new: 1,
        temperature: 0.0,
        top_p: 1.0,
        top_k: 0,
        seed: Some(0),
        ignore_eos: true,
        stop: Vec::new(),
        stop_token_ids: Vec::new(),
    };
    let mut gen = match Generation::start(&state, req, state.next_id()) {
        Ok(g) => g,
        Err(e) => return ApiError::unavailable(e.message).into_response(),
    };
    let done = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(r) = gen.next().await {
            if r.is_err() {
                return false;
            }
        }
        true
    })
    .await;
    match done {
        Ok(true) => StatusCode::OK.into_response(),
        _ => ApiError::unavailable("health check generation failed").into_response(),
    }
}

pub async fn get_model_info(State(state): State<Arc<AppState>>) -> Response {
    let m = &state.model;
    axum::Json(json!({
        "model_path": m.model_path,
        "tokenizer_path": m.tokenizer_path,
        "is_generation": true,
        "weight_version": "default",
        "has_image_understanding": false,
        "has_audio_understanding": false,
        "model_type": state.server_info.get("model_type").cloned().unwrap_or(Value::Null),
    }))
    .into_response()
}

pub async fn get_server_info(State(state): State<Arc<AppState>>) -> Response {
    let mut info = match &state.server_info {
        Value::Object(m) => m.clone(),
        _ => Map::new(),
    };
    let load = &state.worker.load;
    info.insert(
        "internal_states".into(),
        json!([{
            "avg_spec_accept_length": state.stats.avg_spec_accept_length(),
            "last_gen_throughput": state.stats.last_gen_throughput(),
            "num_running_reqs": load.running.load(std::sync::atomic::Ordering::Relaxed),
            "num_queue_reqs": load.waiting.load(std::sync::atomic::Ordering::Relaxed),
        }]),
    );
    info.insert(
        "version".into(),
        json!(format!("kbench-{}", env!("CARGO_PKG_VERSION"))),
    );
    axum::Json(Value::Object(info)).into_response()
}

/// 400 while requests run (SGLang's rule); otherwise resets the speculative gauges.
pub async fn flush_cache(State(state): State<Arc<AppState>>) -> Response {
    if state.in_flight() > 0 {
        return (
            StatusCode::BAD_REQUEST,
            "Cache not flushed because there are pending requests.",
        )
            .into_response();
    }
    state.stats.flush();
    (StatusCode::OK, "Cache flushed.").into_response()
}

/// vLLM's `/reset_prefix_cache`: the same reset as `/flush_cache`, answered as vLLM answers
/// it, 200 with an empty body. While requests run, vLLM's engine declines the reset and its
/// API server answers 200 all the same (it does not check); `reset_running_requests=true`
/// resets anyway (vLLM preempts the running requests; kbench has no cache to take from
/// them, so they run on untouched).
pub async fn reset_prefix_cache(
    State(state): State<Arc<AppState>>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Response {
    let Ok(Query(pairs)) = query else {
        return ApiError::bad_request("malformed query string").into_response();
    };
    let mut reset_running = false;
    for (k, v) in &pairs {
        // FastAPI ignores query parameters an endpoint does not declare
        let param = match k.as_str() {
            "reset_running_requests" => "reset_running_requests",
            // no external (connector-managed) cache here: validated, then nothing to reset
            "reset_external" => "reset_external",
            _ => continue,
        };
        let Some(b) = query_bool(v) else {
            return ApiError::bad_request(format!("`{param}` must be a boolean, not `{v}`"))
                .with_param(param)
                .into_response();
        };
        if param == "reset_running_requests" {
            reset_running = b;
        }
    }
    let running = state.in_flight();
    if running > 0 && !reset_running {
        // vLLM logs the refusal the client is never told of; so does kbench
        eprintln!(
            "kbench serve: /reset_prefix_cache not applied: {running} request(s) running \
             (reset_running_requests=true resets anyway)"
        );
        return StatusCode::OK.into_response();
    }
    state.stats.flush();
    StatusCode::OK.into_response()
}

/// A boolean query parameter as FastAPI (pydantic) reads one.
fn query_bool(v: &str) -> Option<bool> {
    match v.to_ascii_lowercase().as_str() {
        "1" | "true" | "t" | "yes" | "y" | "on" => Some(true),
        "0" | "false" | "f" | "no" | "n" | "off" => Some(false),
        _ => None,
    }
}

pub async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    let load = &state.worker.load;
    let text = state.stats.prometheus(
        &state.model.served_name,
        load.running.load(std::sync::atomic::Ordering::Relaxed),
        load.waiting.load(std::sync::atomic::Ordering::Relaxed),
        state.model.draft_positions,
    );
    (
        StatusCode::OK,
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}
