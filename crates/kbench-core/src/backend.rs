//! The seam every backend implements: serve requests, report when each token became
//! visible and what each verify round committed. Levels, warm-up, closed-loop clients and
//! metrics live above it and are written once (see [`crate::harness`]).

use serde::Serialize;

/// Nanoseconds since the start of a level: virtual time in the simulator, the wall clock
/// in the engine.
pub type Nanos = u64;

/// One request as the load generator issues it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Default)]
pub struct Request {
    /// Stable id: seeds everything random about this request (prompt, trace slice).
    pub id: u64,
    /// The whole prompt, shared prefix included.
    pub input_len: u32,
    /// What the request asks for.
    pub max_tokens: u32,
    /// `None`: it ignores EOS and runs to `max_tokens`. `Some(n)`: it meets EOS after `n`
    /// tokens; a simulated model stops there, a live server decides for itself.
    pub stop_at: Option<u32>,
    /// The prompt's first tokens that every request of the run shares (a prefix cache can
    /// serve them).
    pub shared_prefix_len: u32,
    /// Warm-up requests are served like any other and left out of the metrics.
    pub warmup: bool,
}

impl Request {
    /// Tokens a simulated model generates for it.
    #[inline]
    pub fn output_len(&self) -> u32 {
        self.stop_at
            .map_or(self.max_tokens, |n| n.min(self.max_tokens))
    }
}

/// What a backend reports for a finished request.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RequestRecord {
    pub id: u64,
    pub warmup: bool,
    pub input_len: u32,
    /// The request's `max_tokens` (produced tokens may be fewer when it met EOS).
    #[serde(default)]
    pub requested_tokens: u32,
    pub submitted_ns: Nanos,
    /// Times the server took the request's KV cache back to make room (SGLang retracts,
    /// vLLM preempts) and later recomputed it; `None` where the backend cannot know.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retractions: Option<u32>,
    /// When each output token became visible to the client, one entry per token.
    pub token_times_ns: Vec<Nanos>,
    /// Tokens committed by each verify round (bonus token included); empty without
    /// speculation. The first token (from prefill) belongs to no round.
    pub round_commits: Vec<u32>,
    /// Rounds in `round_commits` that proposed no draft (n-gram found no match, or
    /// speculation was off for that step); each committed one token. Accept length leaves
    /// them out, as vLLM's (1 + accepted / drafts) and SGLang's (tokens / verify passes) do.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub undrafted_rounds: u32,
    /// Verify rounds a server reported for a request whose stream does not give each round's
    /// commit (coalesced chunks): `round_commits` is then empty, and no rounds are invented.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reported_rounds: Option<u32>,
    /// Drafts those rounds accepted, where the server counts them (vLLM's per-request
    /// `num_accepted_draft_tokens`): the rounds then committed `reported_rounds` + this,
    /// whatever undrafted steps added. Without it, every token after the first counts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reported_accepted: Option<u32>,
    /// Why the request failed (refused, reset, timed out, a 4xx/5xx); failed requests are
    /// counted, not measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// Tokens that became visible to one request's client together: one streamed chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct ChunkEvent {
    pub id: u64,
    pub visible_ns: Nanos,
    pub tokens: u32,
    /// The chunk comes from a verify round (not from prefill, nor a round that did not
    /// speculate).
    pub spec_round: bool,
    /// The request's last chunk.
    pub finished: bool,
}

impl RequestRecord {
    pub fn output_tokens(&self) -> u32 {
        self.token_times_ns.len() as u32
    }
    pub fn finished_ns(&self) -> Nanos {
        self.token_times_ns
            .last()
            .copied()
            .unwrap_or(self.submitted_ns)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("{backend} backend: {message}")]
    Failed {
        backend: &'static str,
        message: String,
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    #[error("{backend} backend: no request can finish (submitted {pending}, none in progress)")]
    Stalled {
        backend: &'static str,
        pending: usize,
    },
    /// Ctrl-C (see [`crate::interrupt`]).
    #[error("interrupted by Ctrl-C")]
    Interrupted,
}

impl BackendError {
    pub fn failed(
        backend: &'static str,
        message: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> BackendError {
        BackendError::Failed {
            backend,
            message: message.into(),
            source: Some(source.into()),
        }
    }
    pub fn msg(backend: &'static str, message: impl Into<String>) -> BackendError {
        BackendError::Failed {
            backend,
            message: message.into(),
            source: None,
        }
    }
}

/// Speculative counters a server keeps itself (vLLM's Prometheus `spec_decode_*`), as the
/// change over a level's measured requests: warm-up left out, but anything else the server
/// served meanwhile counted in.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct ServerSpeculativeCounters {
    /// Where they were read (e.g. `vllm:spec_decode_* deltas from /metrics`).
    pub source: String,
    pub num_drafts: u64,
    pub num_draft_tokens: u64,
    pub num_accepted_tokens: u64,
    /// 1 + accepted / drafts, as `vllm bench serve` gives it.
    pub acceptance_length: Option<f64>,
    /// accepted / draft tokens.
    pub acceptance_rate: Option<f64>,
    /// `[i]`: accepted at draft position i / drafts.
    pub per_position_acceptance_rates: Vec<f64>,
}

/// Where a backend says what it is waiting for (a server to come up), while it waits.
pub type Notice = Box<dyn Fn(&str) + Send>;

/// A serving backend. `start_level` gives a fresh server (empty batch, empty caches) for
/// one concurrency level.
pub trait Backend {
    /// Where to say what a long wait is for; a backend that never waits ignores it.
    fn set_notice(&mut self, _notice: Notice) {}
    fn name(&self) -> &'static str;
    /// One line for the report: what produced tokens and times.
    fn describe(&self) -> String;
    fn start_level(&mut self, concurrency: u32) -> Result<Box<dyn Session + '_>, BackendError>;
    /// What the reader must know about the run so far (e.g. op-table lookups outside the
    /// measured range). Ordered and deduplicated by the backend.
    fn warnings(&self) -> Vec<String> {
        Vec::new()
    }
    /// The most requests it runs at once, where the backend decides it rather than the
    /// experiment (an engine's default for the GPU that the file left unset).
    fn max_running_requests(&self) -> Option<u32> {
        None
    }
    /// The largest forward it replays from a CUDA graph, where the backend decides it rather
    /// than the experiment (the engine's own unit and its default for the GPU).
    fn cuda_graph_bound(&self) -> Option<CudaGraphBound> {
        None
    }
}

/// The largest decode-type forward an engine replays from a CUDA graph; a larger one runs
/// eagerly. The engines count it differently: SGLang in requests (`--cuda-graph-max-bs`, its
/// runner captures one graph per batch size), vLLM in tokens (`--max-cudagraph-capture-size`,
/// its dispatcher runs a batch of more tokens than the largest capture size without a graph),
/// so a speculative vLLM batch of `n` requests needs `n x (1 + K)` tokens of graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CudaGraphBound {
    Requests(u32),
    Tokens(u32),
}

impl CudaGraphBound {
    /// Whether a forward of `tokens` query tokens over `requests` requests replays a graph.
    pub fn covers(self, tokens: u32, requests: u32) -> bool {
        match self {
            CudaGraphBound::Requests(n) => requests <= n,
            CudaGraphBound::Tokens(n) => tokens <= n,
        }
    }

    /// The bound, in its own unit.
    pub fn max(self) -> u32 {
        match self {
            CudaGraphBound::Requests(n) | CudaGraphBound::Tokens(n) => n,
        }
    }
}

/// A running server for one level. The harness submits requests and waits for completions;
/// the backend advances its own clock (virtual or wall) while it serves them.
pub trait Session {
    fn now_ns(&self) -> Nanos;
    /// Queue a request arriving now.
    fn submit(&mut self, request: Request) -> Result<(), BackendError>;
    /// Serve until at least one submitted request has finished; return every request that
    /// finished (in order of finishing, ties by id).
    fn run_until_completion(&mut self) -> Result<Vec<RequestRecord>, BackendError>;
    /// Serve every forward that starts at or before `deadline` (an arrival, a wall-clock
    /// instant), then return the requests finished by then. An idle session's clock moves to
    /// `deadline`; a busy one's may end past it, inside the forward that was running then:
    /// a request submitted next waits for that forward, as it would on a server.
    fn advance_to(&mut self, deadline: Nanos) -> Result<Vec<RequestRecord>, BackendError>;
    /// From now on, keep a [`ChunkEvent`] for every streamed chunk, for [`Session::take_chunks`].
    fn record_chunks(&mut self);
    /// The chunks recorded since the last call, in the order their forwards ran.
    fn take_chunks(&mut self) -> Vec<ChunkEvent>;
    /// Drops a waiting or running request (its client went away); whether it was there.
    fn cancel(&mut self, id: u64) -> bool;
    /// The warm-up requests have finished and the measured ones are about to start.
    fn measured_started(&mut self) {}
    /// The server's own speculative counters over the measured requests, where it keeps
    /// them; asked once, after the last measured request finished.
    fn server_counters(&mut self) -> Option<ServerSpeculativeCounters> {
        None
    }
    /// How full the server's KV cache got over the level, where the backend knows it.
    fn kv_cache(&self) -> Option<KvCacheUsage> {
        None
    }
}

/// A level's KV-cache use (the simulator's pool; SGLang logs it as `token usage`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct KvCacheUsage {
    /// Token slots per GPU.
    pub capacity_tokens: u64,
    /// The most slots in use at once.
    pub peak_used_tokens: u64,
}
