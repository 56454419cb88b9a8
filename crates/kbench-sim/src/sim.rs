//! The simulator backend: SGLang-like continuous batching in virtual time (integer ns).
//!
//! Scheduling follows SGLang's loop (prefill first): a waiting queue; whenever a slot is
//! free (running < max_running_requests) and the KV cache can take them, waiting requests
//! are prefilled as their own forward (EAGLE disables mixed chunked prefill), which yields
//! each one's first token; otherwise one decode round runs over every running request. Each
//! forward is priced by the [`CostModel`].
//!
//! The KV cache is a pool of token slots ([`crate::kv`]). Admission follows SGLang's
//! PrefillAdder: a prompt is admitted when it and its (clipped) output fit what the running
//! requests have not reserved (`new_token_ratio` of their remaining output); prompts longer
//! than `chunked_prefill_size` are prefilled in chunks over consecutive forwards; a shared
//! prefix, once prefilled, is served from the prefix cache. A decode round that cannot get
//! its slots retracts requests (fewest output tokens first, then longest prompt) back to
//! the front of the queue; they are prefilled again (prompt + output so far) later.
//!
//! Tokens a forward commits reach the client through the front end (detokenizer, tokenizer
//! manager + HTTP streaming, the client's own parsing): a FIFO server costing
//! `host.frontend_per_chunk_us` per streamed chunk (one per request per forward that
//! commits tokens), pipelined with the GPU (the scheduler runs
//! ahead; SGLang's ZMQ hand-off does not block it). A token is visible when the front end has
//! handled it; a request is finished for the client when its last token is visible, and the
//! closed-loop client's next request then arrives during the scheduler's current forward and
//! waits for it (it is admitted at the next forward boundary). With the cost at 0 a token is
//! visible at the end of its round.

use std::collections::VecDeque;
use std::sync::Arc;

use kbench_core::acceptance::AcceptanceModel;
use kbench_core::backend::{
    Backend, BackendError, ChunkEvent, KvCacheUsage, Nanos, Request, RequestRecord, Session,
};
use kbench_core::spec::{EngineKind, Experiment, SpecConfig};

use crate::cost::{CostModel, PrefillPart, RoundBreakdown};
use crate::engine_profile::EngineProfile;
use crate::error::SimError;
use crate::kv::{
    KvPool, CLIP_MAX_NEW_TOKENS, INIT_NEW_TOKEN_RATIO, MIN_NEW_TOKEN_RATIO_FACTOR,
    NEW_TOKEN_RATIO_DECAY_STEPS, RETRACT_DECODE_STEPS,
};
use crate::optable::OpTables;
use crate::presets::{load_tables, resolve_engine_profile, resolve_profile};
use crate::profile::HardwareProfile;

mod vllm;

pub struct SimBackend {
    cost: CostModel,
    spec: SpecConfig,
    acceptance: Option<Arc<dyn AcceptanceModel>>,
    max_running: u32,
    name: String,
    kv: KvPool,
    prefix_caching: bool,
    max_prefill_tokens: u32,
    engine: EngineKind,
    /// vLLM's token budget per step.
    max_num_batched_tokens: u32,
}

/// `vllm serve`'s default token budget: 8192 on GPUs of 70 GiB or more, else 2048.
fn default_max_num_batched_tokens(profile: &HardwareProfile) -> u32 {
    if profile.gpu.memory_gib.value >= 70.0 {
        8192
    } else {
        2048
    }
}

impl SimBackend {
    /// Resolves the experiment's hardware (preset or profile file) and its op tables.
    pub fn new(
        exp: &Experiment,
        acceptance: Option<Arc<dyn AcceptanceModel>>,
    ) -> Result<SimBackend, SimError> {
        let profile = resolve_profile(&exp.hardware)?;
        let engine = resolve_engine_profile(exp, &profile)?;
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
        if exp.spec.is_speculative() && acceptance.is_none() {
            return Err(SimError::Model(format!(
                "{}: speculative decoding needs an acceptance model (a trace)",
                exp.path.display()
            )));
        }
        crate::memory::check_weights_fit(&profile, &exp.model, exp.draft.as_ref(), exp.tp_size)
            .map_err(|e| match e {
                SimError::DoesNotFit(m) => {
                    SimError::DoesNotFit(format!("{}: {m}", exp.path.display()))
                }
                e => e,
            })?;
        let in_file = |e: SimError| match e {
            SimError::Model(m) => SimError::Model(format!("{}: {m}", exp.path.display())),
            e => e,
        };
        let kv = crate::kv::kv_pool(exp, &profile)?;
        let max_num_batched_tokens = exp
            .engine
            .max_num_batched_tokens
            .unwrap_or_else(|| default_max_num_batched_tokens(&profile));
        kv.check_fits(exp)?;
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
        .with_kv_cache_dtype(exp.kv.kv_cache_dtype);
        Ok(SimBackend {
            kv,
            prefix_caching: exp.kv.prefix_caching,
            max_prefill_tokens: exp.kv.max_prefill_tokens,
            engine: exp.engine.kind,
            max_num_batched_tokens,
            cost,
            spec: exp.spec.clone(),
            acceptance: if exp.spec.is_speculative() {
                acceptance
            } else {
                None
            },
            max_running: exp.max_running_requests,
            name: exp.file.name.clone(),
        })
    }

    pub fn cost_model(&self) -> &CostModel {
        &self.cost
    }

    pub fn spec(&self) -> &SpecConfig {
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
            chunked: None,
            partial: Vec::new(),
            kv: KvState {
                used: 0,
                peak: 0,
                prefix: None,
                new_token_ratio: INIT_NEW_TOKEN_RATIO,
            },
            frontend_free: 0,
            delivering: Vec::new(),
            chunks: None,
        }))
    }
}

struct Live {
    req: Request,
    submitted_ns: Nanos,
    token_times: Vec<Nanos>,
    round_commits: Vec<u32>,
    retractions: u32,
    /// KV slots the request holds itself (a cached shared prefix is held by the pool).
    kv_tokens: u32,
    /// Tokens of its prompt (and, after a retraction, its output so far) in the KV cache
    /// in the current admission, cached prefix included.
    prefilled: u32,
}

impl Live {
    fn new(req: Request, submitted_ns: Nanos) -> Live {
        Live {
            req,
            submitted_ns,
            token_times: Vec::new(),
            round_commits: Vec::new(),
            retractions: 0,
            kv_tokens: 0,
            prefilled: 0,
        }
    }
    fn output(&self) -> u32 {
        self.token_times.len() as u32
    }
    fn done(&self) -> bool {
        self.output() >= self.req.output_len()
    }
    /// What a prefill must bring into the KV cache: the prompt, and the output kept
    /// through a retraction.
    fn fill_len(&self) -> u32 {
        self.req.input_len + self.output()
    }
    /// The output tokens admission reserves for it: what it asked for, clipped.
    fn reserve(&self) -> u32 {
        self.req
            .max_tokens
            .saturating_sub(self.output())
            .min(CLIP_MAX_NEW_TOKENS)
    }
    fn into_record(self) -> RequestRecord {
        RequestRecord {
            id: self.req.id,
            warmup: self.req.warmup,
            input_len: self.req.input_len,
            requested_tokens: self.req.max_tokens,
            submitted_ns: self.submitted_ns,
            retractions: Some(self.retractions),
            token_times_ns: self.token_times,
            round_commits: self.round_commits,
            reported_rounds: None,
            error: None,
        }
    }
}

/// The pool's state during a level.
struct KvState {
    /// Slots in use: every live request's own, plus the cached shared prefix.
    used: u64,
    peak: u64,
    /// The shared prefix's length, once it is in the prefix cache.
    prefix: Option<u32>,
    /// SGLang's estimate of the share of their remaining output running requests will
    /// still produce: it decays while decoding goes well and jumps after a retraction.
    new_token_ratio: f64,
}

impl KvState {
    fn take(&mut self, tokens: u32) {
        self.used += tokens as u64;
        self.peak = self.peak.max(self.used);
    }
    fn give_back(&mut self, tokens: u32) {
        self.used -= tokens as u64;
    }
}

struct SimSession<'a> {
    b: &'a SimBackend,
    now: Nanos,
    /// Sent, but still in the API server (parsing, tokenizing): they reach `waiting` at the
    /// time beside them.
    arriving: Vec<(Nanos, Live)>,
    waiting: VecDeque<Live>,
    running: Vec<Live>,
    /// The request whose prompt is being prefilled in chunks (SGLang's `chunked_req`).
    chunked: Option<Live>,
    /// vLLM: admitted requests whose prompts are not all prefilled yet, in admission order.
    partial: Vec<Live>,
    kv: KvState,
    /// When the front end (detokenizer, tokenizer manager, HTTP, client) is free again.
    frontend_free: Nanos,
    /// Finished requests whose last token the front end has not delivered yet.
    delivering: Vec<RequestRecord>,
    /// Streamed chunks, kept only when a caller asked for them (`kbench serve --sim`).
    chunks: Option<Vec<ChunkEvent>>,
}

/// Keeps the chunk a request just streamed, when chunks are recorded.
fn record_chunk(
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

fn fail(e: SimError) -> BackendError {
    BackendError::failed("sim", "cost model", e)
}

impl SimSession<'_> {
    /// The front end handles `chunks` streamed chunks committed at `self.now` (FIFO, after
    /// what it already has queued); returns when they become visible to the client.
    fn deliver(&mut self, chunks: u32) -> Nanos {
        let per_chunk_ns =
            (self.b.cost.engine.host.frontend_per_chunk_us.value * 1e3).round() as u64;
        let start = self.now.max(self.frontend_free);
        self.frontend_free = start + per_chunk_ns * chunks as u64;
        self.frontend_free
    }

    /// Finished requests the client has seen by now (ordered by id).
    fn delivered(&mut self) -> Vec<RequestRecord> {
        let now = self.now;
        let (mut done, rest): (Vec<_>, Vec<_>) = self
            .delivering
            .drain(..)
            .partition(|r| r.finished_ns() <= now);
        self.delivering = rest;
        done.sort_by_key(|r| r.id);
        done
    }

    fn free_slots(&self) -> u64 {
        self.b.kv.tokens.saturating_sub(self.kv.used)
    }

    /// The prompt tokens the prefix cache serves for a request being admitted.
    fn prefix_hit(&self, r: &Live) -> u32 {
        match self.kv.prefix {
            Some(p) if self.b.prefix_caching => {
                p.min(r.req.shared_prefix_len).min(r.fill_len() - 1)
            }
            _ => 0,
        }
    }

    /// A request's whole prompt is in the cache: with prefix caching its shared prefix is
    /// the cache's from now on (one copy for everyone).
    fn prompt_done(&mut self, r: &mut Live) {
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

    /// One prefill forward if anything can be admitted (SGLang's get_new_batch_prefill):
    /// the chunked request's next chunk first, then waiting requests while slots, the
    /// prefill budgets and the KV cache allow. Returns whether a forward ran.
    fn prefill(&mut self) -> Result<bool, BackendError> {
        if self.running.is_empty() && self.chunked.is_none() {
            self.kv.new_token_ratio = INIT_NEW_TOKEN_RATIO;
        }
        let mut chunk_left = self.b.kv.chunked_prefill_size.unwrap_or(u32::MAX);
        let mut input_left = self.b.max_prefill_tokens;
        let reserved: f64 = self
            .running
            .iter()
            .map(|r| r.reserve() as f64 * self.kv.new_token_ratio)
            .sum();
        let mut rem_total = self.free_slots() as f64 - reserved;
        let mut parts = Vec::new();
        let mut whole: Vec<Live> = Vec::new();
        if let Some(mut c) = self.chunked.take() {
            let n = (c.fill_len() - c.prefilled).min(chunk_left);
            parts.push(PrefillPart {
                new_tokens: n,
                cached: c.prefilled,
            });
            c.prefilled += n;
            c.kv_tokens += n;
            self.kv.take(n);
            rem_total -= n as f64;
            chunk_left -= n;
            input_left = input_left.saturating_sub(n);
            if c.prefilled == c.fill_len() {
                rem_total -= c.reserve() as f64;
                whole.push(c);
            } else {
                self.chunked = Some(c);
            }
        }
        while self.chunked.is_none() && chunk_left > 0 {
            let Some(next) = self.waiting.front() else {
                break;
            };
            if self.running.len() + whole.len() >= self.b.max_running as usize {
                break;
            }
            let hit = self.prefix_hit(next);
            let extend = next.fill_len() - hit;
            if (extend + next.reserve()) as f64 >= rem_total {
                break;
            }
            // Always admit one prompt, however long; then stay within the token budget.
            if !parts.is_empty() && extend > input_left {
                break;
            }
            let Some(mut r) = self.waiting.pop_front() else {
                break;
            };
            let n = extend.min(chunk_left);
            parts.push(PrefillPart {
                new_tokens: n,
                cached: hit,
            });
            r.prefilled = hit + n;
            r.kv_tokens += n;
            self.kv.take(n);
            chunk_left -= n;
            input_left = input_left.saturating_sub(n);
            if n < extend {
                // SGLang reserves no output for a prompt still in chunks
                rem_total -= n as f64;
                self.chunked = Some(r);
            } else {
                rem_total -= (extend + r.reserve()) as f64;
                whole.push(r);
            }
        }
        if parts.is_empty() {
            return Ok(false);
        }
        let t = self
            .b
            .cost
            .prefill_parts_ns(&parts, self.b.spec.is_speculative())
            .map_err(fail)?;
        self.now += t;
        let visible = self.deliver(whole.len() as u32);
        for mut r in whole {
            self.prompt_done(&mut r);
            r.token_times.push(visible);
            r.kv_tokens += 1;
            self.kv.take(1);
            record_chunk(&mut self.chunks, &r, visible, 1, false);
            if r.done() {
                self.kv.give_back(r.kv_tokens);
                self.delivering.push(r.into_record());
            } else {
                self.running.push(r);
            }
        }
        Ok(true)
    }

    /// SGLang's check_decode_mem and retract_decode: when the pool cannot give every
    /// running request its slots for one more step, requests go back to the queue (fewest
    /// output tokens first, then the longest prompt) until each survivor has room for
    /// RETRACT_DECODE_STEPS steps; at least one goes, and never the last.
    fn make_room_for_decode(&mut self) {
        let per_request = self.b.kv.decode_slots_per_request as u64;
        if self.free_slots() >= self.running.len() as u64 * per_request {
            let min_ratio = INIT_NEW_TOKEN_RATIO * MIN_NEW_TOKEN_RATIO_FACTOR;
            let decay = (INIT_NEW_TOKEN_RATIO - min_ratio) / NEW_TOKEN_RATIO_DECAY_STEPS;
            self.kv.new_token_ratio = (self.kv.new_token_ratio - decay).max(min_ratio);
            return;
        }
        let spec = if self.b.spec.is_speculative() {
            per_request
        } else {
            0
        };
        let required = |n: usize| n as u64 * (RETRACT_DECODE_STEPS as u64 + spec);
        // victims come off the end: most output first, ties longest prompt last
        self.running.sort_by(|a, b| {
            (b.output(), a.req.input_len, b.req.id).cmp(&(a.output(), b.req.input_len, a.req.id))
        });
        let mut first = true;
        while self.running.len() > 1 && (first || self.free_slots() < required(self.running.len()))
        {
            first = false;
            let Some(mut victim) = self.running.pop() else {
                break;
            };
            self.kv.give_back(victim.kv_tokens);
            victim.kv_tokens = 0;
            victim.prefilled = 0;
            victim.retractions += 1;
            self.waiting.push_front(victim);
        }
        let decoded: u64 = self.running.iter().map(|r| r.output() as u64).sum();
        let asked: u64 = self.running.iter().map(|r| r.req.max_tokens as u64).sum();
        self.kv.new_token_ratio =
            ((decoded + RETRACT_DECODE_STEPS as u64 * self.running.len() as u64) as f64
                / asked.max(1) as f64)
                .min(1.0);
        self.running.sort_by_key(|r| r.req.id);
    }

    fn decode_round(&mut self) -> Result<(), BackendError> {
        self.make_room_for_decode();
        let bs = self.running.len() as u32;
        let speculate = self.b.speculates_at(bs);
        let ctx_sum: u64 = self
            .running
            .iter()
            .map(|r| r.req.input_len as u64 + r.token_times.len() as u64)
            .sum();
        let ctx = ctx_sum as f64 / bs as f64;
        let spec = speculate.then_some(&self.b.spec);
        let t = self.b.cost.round_ns(bs, ctx, spec).map_err(fail)?;
        self.now += t;
        let mut commits = Vec::with_capacity(self.running.len());
        for r in &self.running {
            let committed = r.output();
            let want = match (&self.b.acceptance, speculate) {
                (Some(a), true) => a.round_commit(r.req.id, committed, &self.b.spec).max(1),
                _ => 1,
            };
            commits.push(want.min(r.req.output_len() - committed));
        }
        // One streamed chunk per request: a round's accepted tokens travel together.
        let visible = self.deliver(commits.len() as u32);
        for (r, &n) in self.running.iter_mut().zip(&commits) {
            r.token_times
                .extend(std::iter::repeat_n(visible, n as usize));
            r.kv_tokens += n;
            self.kv.used += n as u64;
            // A round that did not speculate (above disable_batch_threshold) is recorded as a
            // round committing one token, so round commits always sum to tokens - 1.
            if self.b.spec.is_speculative() {
                r.round_commits.push(n);
            }
            record_chunk(&mut self.chunks, r, visible, n, speculate);
        }
        self.kv.peak = self.kv.peak.max(self.kv.used);
        self.retire_finished();
        Ok(())
    }

    /// Running requests that produced their last token leave the batch, their KV freed.
    fn retire_finished(&mut self) {
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
        self.running.is_empty()
            && self.waiting.is_empty()
            && self.chunked.is_none()
            && self.partial.is_empty()
    }

    fn idle(&self) -> bool {
        self.nothing_scheduled() && self.arriving.is_empty()
    }

    /// Requests the API server has handed over by now join the queue, in the order they
    /// got there.
    fn admit_arrivals(&mut self) {
        if self.arriving.is_empty() {
            return;
        }
        let now = self.now;
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

    /// One forward: a prefill if the scheduler would run one (prefill first), else a
    /// decode round.
    fn step(&mut self) -> Result<(), BackendError> {
        self.admit_arrivals();
        if self.nothing_scheduled() {
            // the GPU waits for the API server
            if let Some(t) = self.next_arrival() {
                self.now = self.now.max(t);
                self.admit_arrivals();
            }
            return Ok(());
        }
        if self.b.engine == EngineKind::Vllm {
            return self.vllm_step();
        }
        let can_admit = self.chunked.is_some()
            || (!self.waiting.is_empty() && (self.running.len() as u32) < self.b.max_running);
        if can_admit && self.prefill()? {
            return Ok(());
        }
        if self.running.is_empty() {
            // the pool cannot take the next prompt with nothing running: the fit check
            // before the run rules this out, so say so rather than spin
            return Err(BackendError::msg(
                "sim",
                format!(
                    "the KV cache ({} tokens, {} in use) cannot admit the next request",
                    self.b.kv.tokens, self.kv.used
                ),
            ));
        }
        self.decode_round()
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
        let now = self.now;
        let delay = self.b.cost.engine.admission_delay_ns(request.input_len);
        let live = Live::new(request, now);
        if delay == 0 {
            self.waiting.push_back(live);
        } else {
            self.arriving.push((now + delay, live));
        }
        Ok(())
    }

    fn run_until_completion(&mut self) -> Result<Vec<RequestRecord>, BackendError> {
        loop {
            // The client sees a request finish when the front end has delivered its last
            // token; a request it then sends arrives during the scheduler's current forward
            // and waits for it (checked at forward boundaries).
            let finished = self.delivered();
            if !finished.is_empty() {
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
            self.step()?;
        }
    }

    fn advance_to(&mut self, deadline: Nanos) -> Result<Vec<RequestRecord>, BackendError> {
        while self.now <= deadline && !self.idle() {
            if self.nothing_scheduled() && self.next_arrival().is_some_and(|t| t > deadline) {
                break;
            }
            self.step()?;
        }
        self.now = self.now.max(deadline);
        Ok(self.delivered())
    }

    fn record_chunks(&mut self) {
        self.chunks.get_or_insert_with(Vec::new);
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
        if let Some(i) = self.partial.iter().position(|r| r.req.id == id) {
            let r = self.partial.remove(i);
            self.kv.give_back(r.kv_tokens);
            return true;
        }
        if self.chunked.as_ref().is_some_and(|c| c.req.id == id) {
            if let Some(c) = self.chunked.take() {
                self.kv.give_back(c.kv_tokens);
            }
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
