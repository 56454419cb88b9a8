//! The simulator backend: SGLang-like continuous batching in virtual time (integer ns).
//!
//! Scheduling follows SGLang's loop: a waiting queue; whenever a slot is free
//! (running < max_running_requests) the waiting requests are prefilled as their own forward
//! (EAGLE disables mixed chunked prefill), which yields each one's first token; otherwise one
//! decode round runs over every running request. Each round is priced by the [`CostModel`].
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
    Backend, BackendError, ChunkEvent, Nanos, Request, RequestRecord, Session,
};
use kbench_core::spec::{Experiment, SpecConfig};

use crate::cost::{CostModel, RoundBreakdown};
use crate::error::SimError;
use crate::optable::OpTables;
use crate::presets::{load_tables, resolve_profile};
use crate::profile::HardwareProfile;

/// SGLang's default `max_prefill_tokens`: prompt tokens admitted per prefill batch.
pub const PREFILL_TOKEN_BUDGET: u32 = 16384;

pub struct SimBackend {
    cost: CostModel,
    spec: SpecConfig,
    acceptance: Option<Arc<dyn AcceptanceModel>>,
    max_running: u32,
    name: String,
}

impl SimBackend {
    /// Resolves the experiment's hardware (preset or profile file) and its op tables.
    pub fn new(
        exp: &Experiment,
        acceptance: Option<Arc<dyn AcceptanceModel>>,
    ) -> Result<SimBackend, SimError> {
        let profile = resolve_profile(&exp.hardware)?;
        let tables = load_tables(&profile)?;
        Self::with_profile(exp, profile, tables, acceptance)
    }

    /// With an explicit profile (calibration and what-if studies).
    pub fn with_profile(
        exp: &Experiment,
        profile: HardwareProfile,
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
                SimError::Model(m) => SimError::Model(format!("{}: {m}", exp.path.display())),
                e => e,
            })?;
        let cost = CostModel::new(
            profile,
            tables,
            exp.model.clone(),
            exp.draft.clone(),
            exp.tp_size,
            exp.cuda_graph_max_bs,
        )?;
        Ok(SimBackend {
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

    fn describe(&self) -> String {
        let acc = self
            .acceptance
            .as_ref()
            .map(|a| format!("; acceptance: {}", a.describe()))
            .unwrap_or_default();
        let p = &self.cost.profile;
        format!(
            "sim: `{}` on cost model `{}` ({}){}{}",
            self.name,
            p.name,
            self.cost.tables_origin(),
            p.calibration
                .as_ref()
                .map(|c| format!(", calibrated to {}", c.measurements))
                .unwrap_or_default(),
            acc
        )
    }

    fn start_level(&mut self, _concurrency: u32) -> Result<Box<dyn Session + '_>, BackendError> {
        Ok(Box::new(SimSession {
            b: self,
            now: 0,
            waiting: VecDeque::new(),
            running: Vec::new(),
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
}

impl Live {
    fn done(&self) -> bool {
        self.token_times.len() as u32 >= self.req.max_tokens
    }
    fn into_record(self) -> RequestRecord {
        RequestRecord {
            id: self.req.id,
            warmup: self.req.warmup,
            input_len: self.req.input_len,
            submitted_ns: self.submitted_ns,
            token_times_ns: self.token_times,
            round_commits: self.round_commits,
            reported_rounds: None,
            error: None,
        }
    }
}

struct SimSession<'a> {
    b: &'a SimBackend,
    now: Nanos,
    waiting: VecDeque<Live>,
    running: Vec<Live>,
    /// When the front end (detokenizer, tokenizer manager, HTTP, client) is free again.
    frontend_free: Nanos,
    /// Finished requests whose last token the front end has not delivered yet.
    delivering: Vec<RequestRecord>,
    /// Streamed chunks, kept only when a caller asked for them (`kbench serve --sim`).
    chunks: Option<Vec<ChunkEvent>>,
}

fn fail(e: SimError) -> BackendError {
    BackendError::failed("sim", "cost model", e)
}

impl SimSession<'_> {
    /// The front end handles `chunks` streamed chunks committed at `self.now` (FIFO, after
    /// what it already has queued); returns when they become visible to the client.
    fn deliver(&mut self, chunks: u32) -> Nanos {
        let per_chunk_ns =
            (self.b.cost.profile.host.frontend_per_chunk_us.value * 1e3).round() as u64;
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

    fn prefill(&mut self) -> Result<(), BackendError> {
        let room = self.b.max_running as usize - self.running.len();
        let mut batch = Vec::new();
        let mut tokens = 0u32;
        while batch.len() < room {
            let Some(next) = self.waiting.front() else {
                break;
            };
            // Always admit one prompt, however long; then stay within the token budget.
            if !batch.is_empty() && tokens + next.req.input_len > PREFILL_TOKEN_BUDGET {
                break;
            }
            tokens += next.req.input_len;
            batch.extend(self.waiting.pop_front());
        }
        let t = self
            .b
            .cost
            .prefill_ns(batch.len() as u32, tokens, self.b.spec.is_speculative())
            .map_err(fail)?;
        self.now += t;
        let visible = self.deliver(batch.len() as u32);
        for mut r in batch {
            r.token_times.push(visible);
            if let Some(chunks) = &mut self.chunks {
                chunks.push(ChunkEvent {
                    id: r.req.id,
                    visible_ns: visible,
                    tokens: 1,
                    spec_round: false,
                    finished: r.done(),
                });
            }
            if r.done() {
                self.delivering.push(r.into_record());
            } else {
                self.running.push(r);
            }
        }
        Ok(())
    }

    fn decode_round(&mut self) -> Result<(), BackendError> {
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
            let committed = r.token_times.len() as u32;
            let want = match (&self.b.acceptance, speculate) {
                (Some(a), true) => a.round_commit(r.req.id, committed, &self.b.spec).max(1),
                _ => 1,
            };
            commits.push(want.min(r.req.max_tokens - committed));
        }
        // One streamed chunk per request: a round's accepted tokens travel together.
        let visible = self.deliver(commits.len() as u32);
        for (r, &n) in self.running.iter_mut().zip(&commits) {
            r.token_times
                .extend(std::iter::repeat_n(visible, n as usize));
            // A round that did not speculate (above disable_batch_threshold) is recorded as a
            // round committing one token, so round commits always sum to tokens - 1.
            if self.b.spec.is_speculative() {
                r.round_commits.push(n);
            }
            if let Some(chunks) = &mut self.chunks {
                chunks.push(ChunkEvent {
                    id: r.req.id,
                    visible_ns: visible,
                    tokens: n,
                    spec_round: speculate,
                    finished: r.done(),
                });
            }
        }
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].done() {
                let r = self.running.remove(i).into_record();
                self.delivering.push(r);
            } else {
                i += 1;
            }
        }
        Ok(())
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
        self.waiting.push_back(Live {
            req: request,
            submitted_ns: self.now,
            token_times: Vec::new(),
            round_commits: Vec::new(),
        });
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
            if self.running.is_empty() && self.waiting.is_empty() {
                // The GPU is idle: wait for the front end.
                match self.delivering.iter().map(|r| r.finished_ns()).min() {
                    Some(t) => {
                        self.now = self.now.max(t);
                        continue;
                    }
                    None => return Ok(Vec::new()),
                }
            }
            if !self.waiting.is_empty() && (self.running.len() as u32) < self.b.max_running {
                self.prefill()?;
            } else {
                self.decode_round()?;
            }
        }
    }

    fn advance_to(&mut self, deadline: Nanos) -> Result<Vec<RequestRecord>, BackendError> {
        while self.now <= deadline && !(self.running.is_empty() && self.waiting.is_empty()) {
            if !self.waiting.is_empty() && (self.running.len() as u32) < self.b.max_running {
                self.prefill()?;
            } else {
                self.decode_round()?;
            }
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
        if let Some(i) = self.waiting.iter().position(|r| r.req.id == id) {
            self.waiting.remove(i);
            return true;
        }
        if let Some(i) = self.running.iter().position(|r| r.req.id == id) {
            self.running.remove(i);
            return true;
        }
        false
    }
}
