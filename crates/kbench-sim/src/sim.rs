//! The simulator backend: a serving engine's continuous batching in virtual time (integer
//! ns). The session holds the queues, the KV pool and the front end; the engine's
//! [`crate::sched`] scheduler decides each forward, and the [`CostModel`] prices it.
//!
//! The KV cache is a pool of token slots ([`crate::kv`]); a shared prefix, once prefilled,
//! is served from the prefix cache.
//!
//! Tokens a forward commits reach the client through the front end (detokenizer, tokenizer
//! manager + HTTP streaming, the client's own parsing): a FIFO server costing
//! `host.frontend_per_chunk_us` per streamed chunk (one per request per forward that
//! commits tokens), pipelined with the GPU (the scheduler runs
//! ahead; the engines' ZMQ hand-off does not block it). A token is visible when the front
//! end has handled it; a request is finished for the client when its last token is
//! visible, and the closed-loop client's next request then arrives during the scheduler's
//! current forward and waits for it (it is admitted at the next forward boundary). With the
//! cost at 0 a token is visible at the end of its round.

use std::collections::VecDeque;
use std::sync::Arc;

use kbench_core::acceptance::AcceptanceModel;
use kbench_core::backend::{
    Backend, BackendError, ChunkEvent, KvCacheUsage, Nanos, Request, RequestRecord, Session,
};
use kbench_core::experiment::{Experiment, SpeculativeConfig};

use crate::cost::{CostModel, RoundBreakdown};
use crate::engine_profile::EngineProfile;
use crate::error::SimError;
use crate::kv::{KvPool, CLIP_MAX_NEW_TOKENS, INIT_NEW_TOKEN_RATIO};
use crate::optable::OpTables;
use crate::presets::{load_tables, resolve_engine_profile, resolve_profile};
use crate::profile::HardwareProfile;
use crate::sched::Scheduler;

pub struct SimBackend {
    pub(crate) cost: CostModel,
    pub(crate) spec: SpeculativeConfig,
    pub(crate) acceptance: Option<Arc<dyn AcceptanceModel>>,
    pub(crate) max_running: u32,
    name: String,
    pub(crate) kv: KvPool,
    pub(crate) prefix_caching: bool,
    pub(crate) max_prefill_tokens: u32,
    /// The engine's scheduler, chosen by the engine profile.
    scheduler: Box<dyn Scheduler>,
    /// vLLM's token budget per step.
    pub(crate) max_num_batched_tokens: u32,
    /// From a response's last byte at the client to its next request at the scheduler.
    client_to_scheduler_ns: Nanos,
    /// Between two requests the client sends at once.
    client_send_interval_ns: Nanos,
    /// Every forward simulated on its own, never a window of steady decodes at once: the
    /// reference the window is checked against.
    pub(crate) step_by_step: bool,
}

impl SimBackend {
    /// Resolves the experiment's hardware (preset or profile file) and its op tables.
    pub fn new(
        exp: &Experiment,
        acceptance: Option<Arc<dyn AcceptanceModel>>,
    ) -> Result<SimBackend, SimError> {
        let profile = resolve_profile(&exp.hardware).map_err(|e| e.in_file(&exp.path))?;
        let engine = resolve_engine_profile(exp, &profile).map_err(|e| e.in_file(&exp.path))?;
        let tables = load_tables(&profile)?;
        Self::with_profiles(exp, profile, engine, tables, acceptance)
    }

    /// With explicit profiles (calibration and what-if studies).
    pub fn with_profiles(
        exp: &Experiment,
        profile: HardwareProfile,
        engine: EngineProfile,
        tables: Option<OpTables>,
        acceptance: Option<Arc<dyn AcceptanceModel>>,
    ) -> Result<SimBackend, SimError> {
        if exp.speculative.is_speculative() && acceptance.is_none() {
            return Err(SimError::Model(format!(
                "{}: speculative decoding needs an acceptance model (a trace)",
                exp.path.display()
            )));
        }
        let kv = crate::deployment::server_starts(exp, &profile, engine.memory.model_runner)?;
        let in_file = |e: SimError| match e {
            SimError::Model(m) => SimError::Model(format!("{}: {m}", exp.path.display())),
            e => e,
        };
        let max_num_batched_tokens = crate::vllm_defaults::batched_tokens(exp, &profile);
        let max_running = crate::vllm_defaults::max_running_requests(exp, &profile);
        kv.check_fits(exp)?;
        let client = crate::client::SimSettings::of(exp)?;
        let tables_home = crate::presets::tables_measured_on(&profile)?;
        let scheduler = crate::sched::for_engine(&engine.engine)?;
        let graph_bound = scheduler.graph_bound(exp, &profile);
        let cost = CostModel::new(
            profile,
            engine,
            tables,
            exp.model.clone(),
            exp.draft.clone(),
            exp.tp_size,
            exp.cuda_graph_max_bs,
        )
        .map_err(in_file)?
        .with_graph_bound(graph_bound)
        .with_kv_cache_dtype(exp.kv.kv_cache_dtype)
        .with_expert_spread(exp.expert_spread)
        .with_custom_all_reduce(exp.custom_all_reduce);
        let cost = match tables_home {
            Some(home) => cost.with_tables_measured_on(home),
            None => cost,
        };
        Ok(SimBackend {
            kv,
            prefix_caching: exp.kv.prefix_caching,
            max_prefill_tokens: exp.kv.max_prefill_tokens,
            scheduler,
            max_num_batched_tokens,
            cost,
            spec: exp.speculative.clone(),
            acceptance: if exp.speculative.is_speculative() {
                acceptance
            } else {
                None
            },
            max_running,
            name: exp.file.name.clone(),
            client_to_scheduler_ns: client.client_to_scheduler_ns(),
            client_send_interval_ns: client.client_send_interval_ns(),
            step_by_step: false,
        })
    }

    /// Simulates every forward on its own. A scheduler otherwise runs a window of forwards
    /// that only decode the same batch in one go (exact in virtual time); this is the
    /// reference that claim is tested against.
    pub fn step_by_step(mut self) -> SimBackend {
        self.step_by_step = true;
        self
    }

    /// Requests come from real clients over HTTP (`kbench serve --sim`): their way to the
    /// scheduler is real time, not modelled.
    pub fn with_real_clients(mut self) -> SimBackend {
        self.client_to_scheduler_ns = 0;
        self.client_send_interval_ns = 0;
        self
    }

    pub fn cost_model(&self) -> &CostModel {
        &self.cost
    }

    pub fn spec(&self) -> &SpeculativeConfig {
        &self.spec
    }

    /// The KV pool the simulation admits into.
    pub fn kv_pool(&self) -> &KvPool {
        &self.kv
    }

    /// Whether a round over `bs` requests speculates (disable_batch_threshold may turn it off).
    pub fn speculates_at(&self, bs: u32) -> bool {
        self.spec.is_speculative() && self.spec.disable_batch_threshold.is_none_or(|t| bs <= t)
    }

    /// The decode round this backend runs for `bs` requests at mean context `ctx`, explained.
    pub fn explain_round(&self, bs: u32, ctx: f64) -> Result<RoundBreakdown, SimError> {
        let spec = self.speculates_at(bs).then_some(&self.spec);
        self.cost.explain_round(bs, ctx, spec)
    }

    /// A prefill batch of `reqs` prompts of `input_len` tokens, explained.
    pub fn explain_prefill(&self, reqs: u32, input_len: u32) -> Result<RoundBreakdown, SimError> {
        self.cost
            .explain_prefill(reqs, reqs * input_len, self.spec.is_speculative())
    }

    /// Op-table queries that fell outside the measured range so far.
    pub fn flagged_queries(&self) -> Vec<String> {
        self.cost.flagged_queries()
    }
}

impl Backend for SimBackend {
    fn name(&self) -> &'static str {
        "sim"
    }

    /// Op-table lookups outside the measured range, one line per operator (a long run can
    /// make hundreds of distinct queries).
    fn warnings(&self) -> Vec<String> {
        let mut by_op: std::collections::BTreeMap<String, Vec<String>> = Default::default();
        for q in self.flagged_queries() {
            let op = q.split(" at (").next().unwrap_or(&q).to_string();
            by_op.entry(op).or_default().push(q);
        }
        by_op
            .into_iter()
            .map(|(op, queries)| match queries.len() {
                1 => format!("op table lookup outside the measured range: {}", queries[0]),
                n => format!(
                    "op table lookups outside the measured range: {n} for {op}, e.g. {}",
                    queries[n - 1]
                ),
            })
            .collect()
    }

    fn max_running_requests(&self) -> Option<u32> {
        Some(self.max_running)
    }

    fn cuda_graph_bound(&self) -> Option<kbench_core::backend::CudaGraphBound> {
        Some(self.cost.graph_bound)
    }

    fn describe(&self) -> String {
        let acc = self
            .acceptance
            .as_ref()
            .map(|a| format!("; acceptance: {}", a.describe()))
            .unwrap_or_default();
        let p = &self.cost.profile;
        let e = &self.cost.engine;
        format!(
            "sim: `{}` on cost model `{}` ({}){} with engine profile `{}`{}{}; {}",
            self.name,
            p.name,
            self.cost.tables_origin(),
            p.calibration
                .as_ref()
                .map(|c| format!(", calibrated to {}", c.measurements))
                .unwrap_or_default(),
            e.name,
            e.calibration
                .as_ref()
                .map(|c| format!(" (fitted to {})", c.sources.join(", ")))
                .unwrap_or_default(),
            acc,
            self.kv.describe()
        )
    }

    fn start_level(&mut self, _concurrency: u32) -> Result<Box<dyn Session + '_>, BackendError> {
        Ok(Box::new(SimSession {
            b: self,
            now: 0,
            arriving: Vec::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            prefilling: Vec::new(),
            kv: KvState {
                used: 0,
                peak: 0,
                prefix: None,
                new_token_ratio: INIT_NEW_TOKEN_RATIO,
            },
            frontend_free: 0,
            delivering: Vec::new(),
            delivered_at: VecDeque::new(),
            last_sent: None,
            chunks: None,
            schedules_ahead: self.scheduler.schedules_ahead(&self.spec),
            running_since: None,
            horizon: 0,
        }))
    }
}

pub(crate) struct Live {
    pub(crate) req: Request,
    submitted_ns: Nanos,
    pub(crate) token_times: Vec<Nanos>,
    pub(crate) round_commits: Vec<u32>,
    /// Of those, rounds that proposed no draft.
    pub(crate) undrafted_rounds: u32,
    pub(crate) retractions: u32,
    /// KV slots the request holds itself (a cached shared prefix is held by the pool).
    pub(crate) kv_tokens: u32,
    /// Tokens of its prompt (and, after a retraction, its output so far) in the KV cache
    /// in the current admission, cached prefix included.
    pub(crate) prefilled: u32,
}

impl Live {
    fn new(req: Request, submitted_ns: Nanos) -> Live {
        // one allocation for its whole output rather than a copy at each doubling (bounded:
        // a served request may ask for as much as the KV pool holds)
        let expected_tokens = req.output_len().min(1 << 16) as usize;
        Live {
            req,
            submitted_ns,
            token_times: Vec::with_capacity(expected_tokens),
            round_commits: Vec::new(),
            undrafted_rounds: 0,
            retractions: 0,
            kv_tokens: 0,
            prefilled: 0,
        }
    }
    pub(crate) fn output(&self) -> u32 {
        self.token_times.len() as u32
    }
    pub(crate) fn done(&self) -> bool {
        self.output() >= self.req.output_len()
    }
    /// What a prefill must bring into the KV cache: the prompt, and the output kept
    /// through a retraction.
    pub(crate) fn fill_len(&self) -> u32 {
        self.req.input_len + self.output()
    }
    /// The output tokens admission reserves for it: what it asked for, clipped.
    pub(crate) fn reserve(&self) -> u32 {
        self.req
            .max_tokens
            .saturating_sub(self.output())
            .min(CLIP_MAX_NEW_TOKENS)
    }
    pub(crate) fn into_record(self) -> RequestRecord {
        RequestRecord {
            id: self.req.id,
            warmup: self.req.warmup,
            input_len: self.req.input_len,
            requested_tokens: self.req.max_tokens,
            submitted_ns: self.submitted_ns,
            retractions: Some(self.retractions),
            token_times_ns: self.token_times,
            round_commits: self.round_commits,
            undrafted_rounds: self.undrafted_rounds,
            reported_rounds: None,
            reported_accepted: None,
            error: None,
        }
    }
}

/// The pool's state during a level.
pub(crate) struct KvState {
    /// Slots in use: every live request's own, plus the cached shared prefix.
    pub(crate) used: u64,
    pub(crate) peak: u64,
    /// The shared prefix's length, once it is in the prefix cache.
    prefix: Option<u32>,
    /// SGLang's estimate of the share of their remaining output running requests will
    /// still produce: it decays while decoding goes well and jumps after a retraction.
    pub(crate) new_token_ratio: f64,
}

impl KvState {
    pub(crate) fn take(&mut self, tokens: u32) {
        self.used += tokens as u64;
        self.peak = self.peak.max(self.used);
    }
    pub(crate) fn give_back(&mut self, tokens: u32) {
        self.used -= tokens as u64;
    }
}

pub(crate) struct SimSession<'a> {
    pub(crate) b: &'a SimBackend,
    pub(crate) now: Nanos,
    /// Sent, but still in the API server (parsing, tokenizing): they reach `waiting` at the
    /// time beside them.
    arriving: Vec<(Nanos, Live)>,
    pub(crate) waiting: VecDeque<Live>,
    pub(crate) running: Vec<Live>,
    /// Admitted requests whose prompts are not all prefilled yet, in admission order
    /// (SGLang holds at most one, its `chunked_req`).
    pub(crate) prefilling: Vec<Live>,
    pub(crate) kv: KvState,
    /// When the front end (detokenizer, tokenizer manager, HTTP, client) is free again.
    frontend_free: Nanos,
    /// Finished requests whose last token the front end has not delivered yet.
    pub(crate) delivering: Vec<RequestRecord>,
    /// When each record the last `run_until_completion` returned reached its client, in
    /// the order returned: a closed-loop client sends its next request then, not when the
    /// simulator has stepped past it.
    delivered_at: VecDeque<Nanos>,
    /// When the client's last request left it: the next leaves no sooner than one send
    /// interval later.
    last_sent: Option<Nanos>,
    /// Streamed chunks, kept only when a caller asked for them (`kbench serve --sim`).
    pub(crate) chunks: Option<Vec<ChunkEvent>>,
    /// Whether the engine chooses a forward's batch while the previous one runs.
    schedules_ahead: bool,
    /// When the forward in progress started: an engine that schedules ahead chose the next
    /// batch then, from what had reached it by then. None while the GPU is idle (the loop
    /// waits for input and schedules on arrival).
    running_since: Option<Nanos>,
    /// Once virtual time reaches this, the loop driving the session must look at it again
    /// (a delivery the client sees, a deadline) before the next forward.
    horizon: Nanos,
}

/// Keeps the chunk a request just streamed, when chunks are recorded.
pub(crate) fn record_chunk(
    chunks: &mut Option<Vec<ChunkEvent>>,
    r: &Live,
    visible_ns: Nanos,
    tokens: u32,
    spec_round: bool,
) {
    if let Some(c) = chunks {
        c.push(ChunkEvent {
            id: r.req.id,
            visible_ns,
            tokens,
            spec_round,
            finished: r.done(),
        });
    }
}

pub(crate) fn fail(e: SimError) -> BackendError {
    BackendError::failed("sim", "cost model", e)
}

impl SimSession<'_> {
    /// The front end handles `chunks` streamed chunks committed at `self.now` (FIFO, after
    /// what it already has queued); returns when they become visible to the client.
    pub(crate) fn deliver(&mut self, chunks: u32) -> Nanos {
        let per_chunk_ns =
            (self.b.cost.engine.host.frontend_per_chunk_us.value * 1e3).round() as u64;
        let start = self.now.max(self.frontend_free);
        self.frontend_free = start + per_chunk_ns * chunks as u64;
        self.frontend_free
    }

    /// Finished requests the client has seen by now (ordered by id).
    fn delivered(&mut self) -> Vec<RequestRecord> {
        let now = self.now;
        if !self.delivering.iter().any(|r| r.finished_ns() <= now) {
            return Vec::new();
        }
        let (mut done, rest): (Vec<_>, Vec<_>) = self
            .delivering
            .drain(..)
            .partition(|r| r.finished_ns() <= now);
        self.delivering = rest;
        done.sort_by_key(|r| r.id);
        done
    }

    pub(crate) fn free_slots(&self) -> u64 {
        self.b.kv.tokens.saturating_sub(self.kv.used)
    }

    /// The prompt tokens the prefix cache serves for a request being admitted.
    pub(crate) fn prefix_hit(&self, r: &Live) -> u32 {
        match self.kv.prefix {
            Some(p) if self.b.prefix_caching => {
                p.min(r.req.shared_prefix_len).min(r.fill_len() - 1)
            }
            _ => 0,
        }
    }

    /// A request's whole prompt is in the cache: with prefix caching its shared prefix is
    /// the cache's from now on (one copy for everyone).
    pub(crate) fn prompt_done(&mut self, r: &mut Live) {
        let shared = r.req.shared_prefix_len;
        if !self.b.prefix_caching || shared == 0 {
            return;
        }
        if self.kv.prefix.is_none() {
            self.kv.prefix = Some(shared);
            r.kv_tokens -= shared;
        } else if r.kv_tokens >= r.fill_len() {
            // it computed the prefix beside the one that cached it: its copy is dropped
            r.kv_tokens -= shared;
            self.kv.give_back(shared);
        }
    }

    /// A request whose whole prompt is now in the cache samples its first token, visible to
    /// the client at `visible`.
    pub(crate) fn first_token(&mut self, r: &mut Live, visible: Nanos) {
        self.prompt_done(r);
        r.token_times.push(visible);
        r.kv_tokens += 1;
        self.kv.take(1);
        record_chunk(&mut self.chunks, r, visible, 1, false);
    }

    /// Running requests that produced their last token leave the batch, their KV freed.
    pub(crate) fn retire_finished(&mut self) {
        // most steps finish nobody: leave the batch where it is
        if !self.running.iter().any(Live::done) {
            return;
        }
        let (done, running): (Vec<Live>, Vec<Live>) = std::mem::take(&mut self.running)
            .into_iter()
            .partition(Live::done);
        self.running = running;
        for r in done {
            self.kv.give_back(r.kv_tokens);
            self.delivering.push(r.into_record());
        }
    }

    /// Nothing for the scheduler to run now (requests may still be on their way to it).
    fn nothing_scheduled(&self) -> bool {
        self.running.is_empty() && self.waiting.is_empty() && self.prefilling.is_empty()
    }

    fn idle(&self) -> bool {
        self.nothing_scheduled() && self.arriving.is_empty()
    }

    /// Requests the API server has handed over by now join the queue, in the order they
    /// got there.
    fn admit_arrivals(&mut self, by: Nanos) {
        if self.arriving.is_empty() {
            return;
        }
        let now = by;
        let (mut ready, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut self.arriving)
            .into_iter()
            .partition(|(t, _)| *t <= now);
        self.arriving = rest;
        ready.sort_by_key(|(t, r)| (*t, r.req.id));
        self.waiting.extend(ready.into_iter().map(|(_, r)| r));
    }

    fn next_arrival(&self) -> Option<Nanos> {
        self.arriving.iter().map(|(t, _)| *t).min()
    }

    /// One forward, as the engine's scheduler chooses it; `horizon` is when the caller's
    /// loop must look at the session again (a scheduler's window of forwards stops there).
    fn step(&mut self, horizon: Nanos) -> Result<(), BackendError> {
        self.horizon = horizon;
        // an engine that schedules ahead chose this forward's batch when the previous one
        // started, from the requests that had reached it by then
        let chosen_at = match (self.schedules_ahead, self.running_since) {
            (true, Some(t)) => t,
            _ => self.now,
        };
        self.admit_arrivals(chosen_at);
        if self.nothing_scheduled() {
            // the GPU waits for the API server; the loop schedules what arrives at once
            self.running_since = None;
            self.admit_arrivals(self.now);
            if self.nothing_scheduled() {
                if let Some(t) = self.next_arrival() {
                    self.now = self.now.max(t);
                    self.admit_arrivals(self.now);
                }
                return Ok(());
            }
        }
        self.running_since = Some(self.now);
        self.b.scheduler.step(self)
    }

    /// Begins the next forward in a scheduler's window, doing what `step` does before the
    /// scheduler runs, if nothing would make that forward differ from the one before: the
    /// driving loop would not stop first, and no request reaches the scheduler by the time
    /// the engine chooses the batch.
    pub(crate) fn next_forward_is_quiet(&mut self) -> bool {
        if self.now >= self.horizon {
            return false;
        }
        let chosen_at = match (self.schedules_ahead, self.running_since) {
            (true, Some(t)) => t,
            _ => self.now,
        };
        if self.next_arrival().is_some_and(|t| t <= chosen_at) {
            return false;
        }
        self.running_since = Some(self.now);
        true
    }

    /// Nothing can be scheduled though requests wait: the fit check before a run rules this
    /// out, so it is reported rather than spun on.
    pub(crate) fn cannot_admit(&self) -> BackendError {
        BackendError::msg(
            "sim",
            format!(
                "the KV cache ({} tokens, {} in use) cannot admit the next request",
                self.b.kv.tokens, self.kv.used
            ),
        )
    }
}

impl Session for SimSession<'_> {
    fn now_ns(&self) -> Nanos {
        self.now
    }

    fn submit(&mut self, request: Request) -> Result<(), BackendError> {
        if request.max_tokens == 0 {
            return Err(BackendError::msg(
                "sim",
                format!("request {} asks for 0 tokens", request.id),
            ));
        }
        // one request the pool cannot hold even alone is refused by itself: admitted, it
        // would stall every other request behind it (the run's fit check covers the file's
        // own lengths; a served request brings its own)
        let need = u64::from(request.input_len)
            + u64::from(request.max_tokens)
            + u64::from(self.b.kv.decode_slots_per_request);
        if need > self.b.kv.tokens {
            return Err(BackendError::msg(
                "sim",
                format!(
                    "request {} needs {need} tokens of KV cache ({} of prompt + max_tokens {} + {} for a decode step); the modelled pool holds {}",
                    request.id,
                    request.input_len,
                    request.max_tokens,
                    self.b.kv.decode_slots_per_request,
                    self.b.kv.tokens
                ),
            ));
        }
        // sent when its predecessor reached the client (during the forward just priced, or
        // now); it reaches the scheduler after the client's turnaround and the API server
        let ready = self
            .delivered_at
            .pop_front()
            .unwrap_or(self.now)
            .min(self.now);
        let sent = match self.last_sent {
            Some(last) => ready.max(last.saturating_add(self.b.client_send_interval_ns)),
            None => ready,
        };
        self.last_sent = Some(sent);
        let reaches = sent
            .saturating_add(self.b.client_to_scheduler_ns)
            .saturating_add(self.b.cost.engine.admission_delay_ns(request.input_len));
        let live = Live::new(request, ready);
        if reaches <= self.now {
            self.waiting.push_back(live);
        } else {
            self.arriving.push((reaches, live));
        }
        Ok(())
    }

    fn run_until_completion(&mut self) -> Result<Vec<RequestRecord>, BackendError> {
        self.delivered_at.clear();
        loop {
            // The client sees a request finish when the front end has delivered its last
            // token; a request it then sends arrives during the scheduler's current forward
            // and waits for it (checked at forward boundaries).
            let finished = self.delivered();
            if !finished.is_empty() {
                self.delivered_at = finished.iter().map(RequestRecord::finished_ns).collect();
                return Ok(finished);
            }
            if self.idle() {
                // The GPU is idle: wait for the front end.
                match self.delivering.iter().map(|r| r.finished_ns()).min() {
                    Some(t) => {
                        self.now = self.now.max(t);
                        continue;
                    }
                    None => return Ok(Vec::new()),
                }
            }
            // the loop looks again once the front end has delivered a finished request
            let delivered_by = self
                .delivering
                .iter()
                .map(RequestRecord::finished_ns)
                .min()
                .unwrap_or(Nanos::MAX);
            self.step(delivered_by)?;
        }
    }

    fn advance_to(&mut self, deadline: Nanos) -> Result<Vec<RequestRecord>, BackendError> {
        self.delivered_at.clear();
        while self.now <= deadline && !self.idle() {
            if self.nothing_scheduled() && self.next_arrival().is_some_and(|t| t > deadline) {
                break;
            }
            self.step(deadline.saturating_add(1))?;
        }
        self.now = self.now.max(deadline);
        Ok(self.delivered())
    }

    fn record_chunks(&mut self) {
        self.chunks.get_or_insert_with(Vec::new);
    }

    fn measured_started(&mut self) {
        // the measured requests start together, not where warm-up requests left off
        self.delivered_at.clear();
    }

    fn take_chunks(&mut self) -> Vec<ChunkEvent> {
        self.chunks.as_mut().map(std::mem::take).unwrap_or_default()
    }

    fn cancel(&mut self, id: u64) -> bool {
        if let Some(i) = self.arriving.iter().position(|(_, r)| r.req.id == id) {
            self.arriving.remove(i);
            return true;
        }
        if let Some(i) = self.waiting.iter().position(|r| r.req.id == id) {
            self.waiting.remove(i);
            return true;
        }
        if let Some(i) = self.running.iter().position(|r| r.req.id == id) {
            let r = self.running.remove(i);
            self.kv.give_back(r.kv_tokens);
            return true;
        }
        if let Some(i) = self.prefilling.iter().position(|r| r.req.id == id) {
            let r = self.prefilling.remove(i);
            self.kv.give_back(r.kv_tokens);
            return true;
        }
        false
    }

    fn kv_cache(&self) -> Option<KvCacheUsage> {
        Some(KvCacheUsage {
            capacity_tokens: self.b.kv.tokens,
            peak_used_tokens: self.kv.peak,
        })
    }
}
