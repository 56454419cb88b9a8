//! What every handler shares: the settings, the worker, the text codec, the counters, and
//! the count of requests in flight.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::faults::Faults;
use crate::stats::Stats;
use crate::text::TextCodec;
use crate::worker::WorkerHandle;

/// vLLM's `--per-request-spec-decode-metrics`: each OpenAI response's
/// `metrics.speculative_decoding`, in the final usage chunk when streaming.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PerRequestSpeculativeMetrics {
    /// Counts and the mean acceptance length.
    Summary,
    /// Also `per_step_accepted` / `per_step_drafted`: every verify round.
    Detailed,
}

/// Limits that keep hostile or broken clients from hurting others.
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    /// Largest request body accepted (413 beyond).
    pub max_body_bytes: usize,
    /// A request's headers must arrive within this, its body within this after them.
    pub read_timeout: Duration,
    /// Requests running or queued at once; beyond, 429.
    pub max_in_flight: usize,
    /// After SIGTERM (or a shutdown), how long running requests may take to finish.
    pub drain_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_body_bytes: 4 << 20,
            read_timeout: Duration::from_secs(30),
            max_in_flight: 4096,
            drain_timeout: Duration::from_secs(30),
        }
    }
}

/// Facts about the model the endpoints report.
#[derive(Debug, Clone)]
pub struct ModelInfo {
    /// `model` in OpenAI responses and `/v1/models` (SGLang's `--served-model-name`).
    pub served_name: String,
    /// Also accepted as a request's `model`: SGLang and vLLM default the served name to the
    /// model path, so clients often send the path whatever the server was told to call it.
    pub model_path: String,
    pub tokenizer_path: Option<String>,
    pub context_length: usize,
    /// The longest prompt accepted, below the context where the engine could not prefill
    /// more in bounded time (`--max-prompt-tokens`, else measured at load); `None`: the
    /// context is the only bound.
    pub max_prompt_tokens: Option<usize>,
    pub vocab: usize,
    pub eos_token_id: Option<u32>,
    /// `num_draft_tokens - 1` when speculating (positions of vLLM's per-position counter).
    pub draft_positions: usize,
}

/// How requests are answered, beyond the model and the limits.
#[derive(Debug, Clone, Default)]
pub struct Answering {
    pub api_key: Option<String>,
    /// Seeds sampling for requests that give no seed.
    pub seed: u64,
    pub per_request_spec_metrics: Option<PerRequestSpeculativeMetrics>,
    /// `--log-requests`: one stderr line per finished request ([`crate::reqlog`]).
    pub log_requests: bool,
    /// SGLang's `--incremental-streaming-output` (formerly `--stream-output`): each chunk of a
    /// `/generate` stream carries only its new text and ids, not the output so far.
    pub incremental_streaming_output: bool,
}

pub struct AppState {
    pub model: ModelInfo,
    /// `/get_server_info`'s server arguments (and, for `--sim`, the modelled deployment).
    pub server_info: Value,
    pub worker: WorkerHandle,
    pub codec: TextCodec,
    pub stats: Stats,
    pub limits: Limits,
    pub faults: Faults,
    /// How requests are answered: the key, default seed, metrics, log and streaming mode.
    pub answering: Answering,
    /// Requests admitted and not yet finished (streams not yet closed).
    pub in_flight: AtomicUsize,
    next_id: AtomicU64,
    pub started: Instant,
    /// Bodies parsed and prompts tokenized at once ([`crate::offload`]): one per core, so a
    /// burst of huge prompts queues rather than taking every core and gigabytes at once.
    pub heavy_work: tokio::sync::Semaphore,
}

impl AppState {
    pub fn new(
        model: ModelInfo,
        server_info: Value,
        worker: WorkerHandle,
        codec: TextCodec,
        limits: Limits,
        faults: Faults,
        answering: Answering,
    ) -> Arc<AppState> {
        Arc::new(AppState {
            model,
            server_info,
            worker,
            codec,
            stats: Stats::default(),
            limits,
            faults,
            answering,
            in_flight: AtomicUsize::new(0),
            next_id: AtomicU64::new(0),
            started: Instant::now(),
            heavy_work: tokio::sync::Semaphore::new(
                std::thread::available_parallelism().map_or(1, |n| n.get()),
            ),
        })
    }

    /// Arrival number of the next request: its id for the worker and for fault picks.
    pub fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }
}

/// Holds one in-flight slot; released on drop, however the request ends.
pub struct InFlight(Arc<AppState>);

impl InFlight {
    /// None when the server already holds `max_in_flight` requests.
    pub fn acquire(state: &Arc<AppState>) -> Option<InFlight> {
        let max = state.limits.max_in_flight;
        state
            .in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()
            .map(|_| InFlight(state.clone()))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}
