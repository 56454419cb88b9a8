//! One generation as the HTTP side follows it: submitted to the worker, its commits turned
//! into token and text deltas (stop strings applied, a possible stop-string prefix held back),
//! its speculative statistics summed, and cancelled in the worker if the client goes away.

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use crate::error::ApiError;
use crate::reqlog::RequestLog;
use crate::state::{AppState, InFlight};
use crate::stats::Finished;
use crate::worker::{Event, Finish, Job, JobParams};

/// Most stop strings one request may give, and the longest: every chunk is matched against
/// each of them, on the runtime's threads. OpenAI's API takes 4; vLLM's TGIS-compatible gRPC
/// front end caps 6 of 240 characters (`vllm/entrypoints/grpc/validation.py` in IBM's
/// vllm fork); SGLang and vLLM's OpenAI servers set no cap. 64 leaves every client we know
/// room while bounding a chunk's matching to 64 x 240 bytes.
pub const MAX_STOP_STRINGS: usize = 64;
pub const MAX_STOP_BYTES: usize = 240;
/// Stop token ids are searched once per committed token (sorted, so the count costs little);
/// the cap keeps a request's own size bounded.
pub const MAX_STOP_TOKEN_IDS: usize = 1024;

/// A request, whatever endpoint it came through.
#[derive(Debug, Clone, PartialEq)]
pub struct GenRequest {
    pub prompt: Vec<u32>,
    pub max_new: u32,
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: u32,
    pub seed: Option<u64>,
    pub ignore_eos: bool,
    pub stop: Vec<String>,
    pub stop_token_ids: Vec<u32>,
}

/// Why a generation ended, as SGLang's `finish_reason` and OpenAI's strings say it.
#[derive(Debug, Clone, PartialEq)]
pub enum FinishReason {
    Length(u32),
    StopToken(u32),
    StopString(String),
}

impl FinishReason {
    /// OpenAI's `finish_reason`.
    pub fn openai(&self) -> &'static str {
        match self {
            FinishReason::Length(_) => "length",
            _ => "stop",
        }
    }

    /// SGLang's `meta_info.finish_reason` object.
    pub fn sglang(&self) -> serde_json::Value {
        match self {
            FinishReason::Length(n) => serde_json::json!({"type": "length", "length": n}),
            FinishReason::StopToken(t) => serde_json::json!({"type": "stop", "matched": t}),
            FinishReason::StopString(s) => serde_json::json!({"type": "stop", "matched": s}),
        }
    }

    /// OpenAI responses' `matched_stop` (SGLang and vLLM's `stop_reason`).
    pub fn matched_stop(&self) -> serde_json::Value {
        match self {
            FinishReason::Length(_) => serde_json::Value::Null,
            FinishReason::StopToken(t) => serde_json::json!(t),
            FinishReason::StopString(s) => serde_json::json!(s),
        }
    }
}

/// Speculative statistics of one request (or, summed, of the server).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SpeculativeTotals {
    pub verify_ct: u64,
    pub proposed: u64,
    pub accepted: u64,
    /// Tokens committed by verify rounds, bonus included.
    pub round_tokens: u64,
    /// `[i]`: rounds whose accepted drafts reached position i.
    pub accepted_per_pos: Vec<u64>,
    /// `[n]`: rounds that accepted n drafts.
    pub histogram: Vec<u64>,
    /// Each round's accepted and proposed drafts, in order (vLLM's `per_step_*`).
    pub per_step_accepted: Vec<u32>,
    pub per_step_drafted: Vec<u32>,
}

/// What one chunk adds.
#[derive(Debug, Clone, PartialEq)]
pub struct Delta {
    pub ids: Vec<u32>,
    pub text: String,
    /// Set on the last chunk.
    pub finish: Option<FinishReason>,
    /// `--sim`: when the modelled deployment made the chunk visible (ns since start).
    pub virtual_ns: Option<u64>,
}

pub struct Generation {
    state: Arc<AppState>,
    pub id: u64,
    rx: UnboundedReceiver<Event>,
    _slot: InFlight,
    pub prompt_tokens: usize,
    /// Prompt tokens served from a prefix cache (`cached_tokens` in SGLang's `meta_info`,
    /// OpenAI's `usage.prompt_tokens_details`).
    pub cached_tokens: usize,
    pub output_ids: Vec<u32>,
    /// Text of `output_ids` the client has been sent.
    pub text: String,
    decoded_ids: usize,
    decoded: String,
    stop: Vec<String>,
    pub spec: SpeculativeTotals,
    pub finish: Option<FinishReason>,
    pub started: Instant,
    /// Chunks the worker has sent (prefill's included).
    pub chunks: u64,
    /// `--log-requests`: where the token counts go as they change.
    log: Option<Arc<RequestLog>>,
}

impl Generation {
    /// Validates the request against the model and submits it.
    pub fn start(state: &Arc<AppState>, req: GenRequest, id: u64) -> Result<Generation, ApiError> {
        let m = &state.model;
        if req.prompt.is_empty() {
            return Err(ApiError::bad_request("the prompt is empty").with_param("prompt"));
        }
        if let Some(t) = req.prompt.iter().find(|&&t| t as usize >= m.vocab) {
            return Err(ApiError::bad_request(format!(
                "token id {t} is outside the vocabulary (0..{})",
                m.vocab
            ))
            .with_param("prompt"));
        }
        if req.max_new == 0 {
            return Err(
                ApiError::bad_request("max_tokens must be at least 1").with_param("max_tokens")
            );
        }
        if let Some(max) = m.max_prompt_tokens.filter(|&max| req.prompt.len() > max) {
            return Err(ApiError::prompt_too_long(req.prompt.len(), max));
        }
        if req.prompt.len() + req.max_new as usize > m.context_length {
            return Err(ApiError::context_length(
                m.context_length,
                req.prompt.len(),
                req.max_new as usize,
            ));
        }
        if !(req.temperature.is_finite() && req.temperature >= 0.0) {
            return Err(ApiError::bad_request(format!(
                "temperature {} must be finite and >= 0",
                req.temperature
            ))
            .with_param("temperature"));
        }
        if !(req.top_p > 0.0 && req.top_p <= 1.0) {
            return Err(
                ApiError::bad_request(format!("top_p {} must be in (0, 1]", req.top_p))
                    .with_param("top_p"),
            );
        }
        if let Some(t) = req.stop_token_ids.iter().find(|&&t| t as usize >= m.vocab) {
            return Err(ApiError::bad_request(format!(
                "stop token id {t} is outside the vocabulary"
            ))
            .with_param("stop_token_ids"));
        }
        if req.stop.iter().any(String::is_empty) {
            return Err(ApiError::bad_request("a stop string is empty").with_param("stop"));
        }
        if req.stop.len() > MAX_STOP_STRINGS {
            return Err(ApiError::bad_request(format!(
                "{} stop strings: at most {MAX_STOP_STRINGS} are accepted",
                req.stop.len()
            ))
            .with_param("stop"));
        }
        if let Some(s) = req.stop.iter().find(|s| s.len() > MAX_STOP_BYTES) {
            return Err(ApiError::bad_request(format!(
                "a stop string of {} bytes: at most {MAX_STOP_BYTES} are accepted",
                s.len()
            ))
            .with_param("stop"));
        }
        if req.stop_token_ids.len() > MAX_STOP_TOKEN_IDS {
            return Err(ApiError::bad_request(format!(
                "{} stop token ids: at most {MAX_STOP_TOKEN_IDS} are accepted",
                req.stop_token_ids.len()
            ))
            .with_param("stop_token_ids"));
        }
        let slot = InFlight::acquire(state)
            .ok_or_else(|| ApiError::too_many(state.limits.max_in_flight))?;
        let mut stop_token_ids = req.stop_token_ids.clone();
        if !req.ignore_eos {
            stop_token_ids.extend(m.eos_token_id);
        }
        let (tx, rx) = unbounded_channel();
        let (seed, stream) = match req.seed {
            Some(s) => (s, 0),
            None => (state.answering.seed, id),
        };
        let job = Job {
            id,
            prompt: req.prompt.clone(),
            params: JobParams {
                max_new: req.max_new,
                temperature: req.temperature,
                top_k: req.top_k,
                top_p: req.top_p,
                seed,
                stream,
                stop_token_ids,
            },
            events: tx,
        };
        if !state.worker.submit(job) {
            return Err(ApiError::unavailable("the generation worker has stopped"));
        }
        Ok(Generation {
            state: state.clone(),
            id,
            rx,
            _slot: slot,
            prompt_tokens: req.prompt.len(),
            // Neither worker reuses KV across requests: the engine's batcher gives each
            // request fresh caches, and the simulator's prefix cache only serves a
            // request's `shared_prefix_len`, which a served request never has (sim.rs).
            cached_tokens: 0,
            output_ids: Vec::new(),
            text: String::new(),
            decoded_ids: 0,
            decoded: String::new(),
            stop: req.stop,
            spec: SpeculativeTotals::default(),
            finish: None,
            started: Instant::now(),
            chunks: 0,
            log: None,
        })
    }

    /// Reports this generation's token counts to its request's log line.
    pub fn logged(mut self, log: Option<Arc<RequestLog>>) -> Generation {
        if let Some(l) = &log {
            l.set_tokens(self.prompt_tokens, self.output_ids.len());
        }
        self.log = log;
        self
    }

    pub fn done(&self) -> bool {
        self.finish.is_some()
    }

    /// The next chunk; `None` once finished.
    pub async fn next(&mut self) -> Option<Result<Delta, ApiError>> {
        if self.done() {
            return None;
        }
        let commit = match self.rx.recv().await {
            None => {
                return Some(Err(ApiError::internal("the generation worker stopped")));
            }
            Some(Event::Failed(m)) => {
                self.finish = Some(FinishReason::Length(0));
                return Some(Err(ApiError::internal(m)));
            }
            Some(Event::Commit(c)) => c,
        };
        self.chunks += 1;
        if let Some(r) = commit.round {
            let s = &mut self.spec;
            s.verify_ct += 1;
            s.proposed += r.proposed as u64;
            s.accepted += r.accepted as u64;
            s.round_tokens += commit.tokens.len() as u64;
            let positions = (r.proposed as usize).max(r.accepted as usize);
            if s.accepted_per_pos.len() < positions {
                s.accepted_per_pos.resize(positions, 0);
            }
            for p in &mut s.accepted_per_pos[..r.accepted as usize] {
                *p += 1;
            }
            if s.histogram.len() <= positions {
                s.histogram.resize(positions + 1, 0);
            }
            s.histogram[r.accepted as usize] += 1;
            s.per_step_accepted.push(r.accepted);
            s.per_step_drafted.push(r.proposed);
        }
        self.output_ids.extend_from_slice(&commit.tokens);
        if let Some(l) = &self.log {
            l.set_tokens(self.prompt_tokens, self.output_ids.len());
        }
        let mut finish = commit.finish.map(|f| match f {
            Finish::Length => FinishReason::Length(self.output_ids.len() as u32),
            Finish::StopToken(t) => FinishReason::StopToken(t),
        });
        self.decode();
        let mut visible = self.decoded.len();
        if let Some((at, s)) = self.first_stop() {
            visible = at;
            if finish.is_none() {
                // the worker is still generating for a request the client no longer wants
                self.state.worker.cancel(self.id);
            }
            finish = Some(FinishReason::StopString(s));
        } else if finish.is_none() {
            visible = self.decoded.len() - self.held_back();
        }
        let start = self.text.len().min(visible);
        let delta = self.decoded.get(start..visible).unwrap_or("").to_string();
        self.text.push_str(&delta);
        if let Some(f) = &finish {
            self.finish = Some(f.clone());
            self.state.stats.record(Finished {
                prompt_tokens: self.prompt_tokens as u64,
                completion_tokens: self.output_ids.len() as u64,
                spec: &self.spec,
            });
        }
        Some(Ok(Delta {
            ids: commit.tokens,
            text: delta,
            finish,
            virtual_ns: commit.virtual_ns,
        }))
    }

    fn decode(&mut self) {
        let codec = &self.state.codec;
        if codec.decodes_per_token() {
            let new = codec.decode(&self.output_ids[self.decoded_ids..]);
            if !new.is_empty() {
                if !self.decoded.is_empty() {
                    self.decoded.push(' ');
                }
                self.decoded.push_str(&new);
            }
        } else {
            self.decoded = codec.decode(&self.output_ids);
        }
        self.decoded_ids = self.output_ids.len();
    }

    /// The earliest stop string in the decoded text past what was already sent.
    fn first_stop(&self) -> Option<(usize, String)> {
        let from = self.text.len().min(self.decoded.len());
        self.stop
            .iter()
            .filter_map(|s| {
                let search_from = from.saturating_sub(s.len().saturating_sub(1));
                let hay = self.decoded.get(search_from..)?;
                hay.find(s.as_str()).map(|i| (search_from + i, s.clone()))
            })
            .min_by_key(|(i, _)| *i)
    }

    /// Bytes at the end of the decoded text that could begin a stop string: held back until
    /// the next chunk decides.
    fn held_back(&self) -> usize {
        let d = self.decoded.as_bytes();
        let mut hold = 0;
        for s in &self.stop {
            let s = s.as_bytes();
            let Some(&last) = d.last() else { break };
            for n in (hold + 1..s.len()).rev() {
                // the byte compare first: most lengths fail on it
                if n <= d.len() && s[n - 1] == last && d[d.len() - n..] == s[..n] {
                    hold = hold.max(n);
                    break;
                }
            }
        }
        // never split a character
        while hold > 0
            && hold < self.decoded.len()
            && !self.decoded.is_char_boundary(self.decoded.len() - hold)
        {
            hold += 1;
        }
        hold.min(self.decoded.len())
    }

    pub fn completion_tokens(&self) -> usize {
        self.output_ids.len()
    }

    /// SGLang's `spec_accept_length`: completion tokens per verify round.
    pub fn spec_accept_length(&self) -> f64 {
        if self.spec.verify_ct == 0 {
            0.0
        } else {
            self.output_ids.len() as f64 / self.spec.verify_ct as f64
        }
    }
}

impl Drop for Generation {
    fn drop(&mut self) {
        if !self.done() {
            self.state.worker.cancel(self.id);
        }
    }
}
