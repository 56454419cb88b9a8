//! The cost model: a forward pass is a list of operators per layer, priced once per layer
//! kind and multiplied by the layer count; a round is a sequence of passes plus host work.
//!
//! Context-dependent attention is handled cheaply: per (pass, rows) the attention time is
//! evaluated at two context lengths and used as `a + b * ctx` (attention over a cache is
//! linear in the tokens read), so a round costs a cache hit and two multiply-adds.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;

use kbench_core::arch::{ArchFamily, DraftArch, ModelArch};
use kbench_core::backend::CudaGraphBound;
use kbench_core::experiment::SpeculativeConfig;
use serde::Serialize;

use crate::engine_profile::{EngineProfile, MlaPrefillKernel};
use crate::error::SimError;
use crate::optable::OpTables;
use crate::pricer::{Pricer, Source};
use crate::profile::HardwareProfile;

mod operators;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PassKind {
    /// Plain decode: one token per request.
    TargetDecode,
    /// Tree-masked verify: `num_draft_tokens` per request.
    TargetVerify,
    /// Prompt processing.
    TargetPrefill,
    /// One draft step: `eagle_topk` tokens per request.
    DraftDecode,
    /// Draft extend after verify: `num_steps + 1` tokens per request.
    DraftExtend,
    /// Draft extend over the prompt (EAGLE prefill).
    DraftPrefill,
}

impl PassKind {
    fn is_draft(self) -> bool {
        matches!(
            self,
            PassKind::DraftDecode | PassKind::DraftExtend | PassKind::DraftPrefill
        )
    }
    fn is_prefill(self) -> bool {
        matches!(self, PassKind::TargetPrefill | PassKind::DraftPrefill)
    }
}

/// Contexts at which a pass's attention is priced, joined piecewise-linearly (attention
/// over a cache is close to linear in the tokens it reads, but split-KV kernels change their
/// slope at long contexts). The tables measure contexts 2^n - 1; staying on measured points
/// avoids spurious extrapolation flags.
const CTX_POINTS: [f64; 4] = [256.0, 2047.0, 16383.0, 131071.0];

/// A priced pass, independent of context except through its attention at `CTX_POINTS`.
#[derive(Debug, Clone)]
struct PassPrice {
    fixed_us: f64,
    /// Attention at each of `CTX_POINTS` (made non-decreasing); prefill: one value.
    attn_us: Vec<f64>,
    ops: u32,
    /// Per-operator GPU time at each of `CTX_POINTS` (for breakdowns), before `in_model`.
    items: Vec<BTreeMap<String, f64>>,
    sources: BTreeMap<String, &'static str>,
}

/// The segment of `CTX_POINTS` that prices `ctx` and how far along it `ctx` is (below the
/// first point and past the last the end segments extend).
fn ctx_segment(ctx: f64, points: usize) -> (usize, f64) {
    if points < 2 {
        return (0, 0.0);
    }
    let i = (1..points - 1)
        .find(|&i| ctx <= CTX_POINTS[i])
        .map_or(points - 2, |i| i - 1);
    (
        i,
        (ctx - CTX_POINTS[i]) / (CTX_POINTS[i + 1] - CTX_POINTS[i]),
    )
}

impl PassPrice {
    fn attention_at(&self, ctx: f64) -> f64 {
        let a = &self.attn_us;
        let (i, t) = ctx_segment(ctx, a.len());
        match a.len() {
            0 => 0.0,
            1 => a[0],
            _ => a[i] + (a[i + 1] - a[i]) * t,
        }
    }

    /// Attention at no context: what does not read the cache.
    fn attention_base(&self) -> f64 {
        self.attention_at(0.0).max(0.0)
    }
}

/// One pass of a round, explained.
#[derive(Debug, Clone, Serialize)]
pub struct PassBreakdown {
    pub kind: PassKind,
    pub tokens: u32,
    pub requests: u32,
    pub mean_context: f64,
    /// Replayed from a CUDA graph (else eager).
    pub graph: bool,
    pub operators: u32,
    /// GPU time per operator group over all layers, microseconds, after `in_model`.
    pub gpu_us: BTreeMap<String, f64>,
    /// `table` or `roofline` per operator group.
    pub sources: BTreeMap<String, &'static str>,
    pub gpu_total_us: f64,
    /// Host launch cost: graph replay, or eager dispatch of every operator.
    pub launch_us: f64,
    /// What the pass adds to the round: gpu + replay (graph), max(gpu, dispatch) (eager).
    pub time_us: f64,
}

/// A round (or prefill), explained: passes, host work, and how they combine.
#[derive(Debug, Clone, Serialize)]
pub struct RoundBreakdown {
    pub what: String,
    pub batch: u32,
    pub passes: Vec<PassBreakdown>,
    pub gpu_us: f64,
    pub host_us: f64,
    /// `serial` (gpu + host), `overlap` (max(gpu, host)), `overlap+sync`.
    pub combine: &'static str,
    pub sync_us: f64,
    pub total_us: f64,
}

impl std::fmt::Display for RoundBreakdown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "{} (batch {}): total {:.1} us = {} of gpu {:.1} us and host {:.1} us{}",
            self.what,
            self.batch,
            self.total_us,
            self.combine,
            self.gpu_us,
            self.host_us,
            if self.sync_us > 0.0 {
                format!(" + sync {:.1} us", self.sync_us)
            } else {
                String::new()
            }
        )?;
        for p in &self.passes {
            writeln!(f, "  {:?}: {} tokens, {} requests, ctx {:.0}, {} ops, {}: gpu {:.1} us, launch {:.1} us -> {:.1} us",
                p.kind, p.tokens, p.requests, p.mean_context, p.operators,
                if p.graph { "graph" } else { "eager" }, p.gpu_total_us, p.launch_us, p.time_us)?;
            for (k, v) in &p.gpu_us {
                writeln!(
                    f,
                    "    {:<28} {:>10.1} us  ({})",
                    k,
                    v,
                    p.sources.get(k).copied().unwrap_or("-")
                )?;
            }
        }
        Ok(())
    }
}

/// Prices rounds for one (model, draft, hardware, parallelism) configuration.
pub struct CostModel {
    pub profile: HardwareProfile,
    /// What the serving engine adds: host work and launch costs.
    pub engine: EngineProfile,
    tables: Option<OpTables>,
    /// The box the op tables were measured on, where its GPU is not `profile`'s.
    tables_gpu: Option<HardwareProfile>,
    pub model: ModelArch,
    pub draft: Option<DraftArch>,
    pub tp: u32,
    /// The largest decode-type pass replayed from a CUDA graph.
    pub graph_bound: CudaGraphBound,
    /// Decode attention reads the KV cache: its context-dependent time scales with the
    /// cache's bytes per element (fp8 halves it; the tables are measured with bf16).
    kv_read_scale: f64,
    /// Bf16 rows one KV row of the cache's dtype is priced as (`Fp8Kv::HalfRows`).
    kv_rows_scale: f64,
    /// The share of the routed experts a batch draws from (the workload's, else the
    /// hardware profile's `efficiency.moe_expert_spread`).
    expert_spread: f64,
    /// The deployment lets the engine run its own all-reduce below its cap.
    custom_all_reduce: bool,
    cache: RefCell<BTreeMap<(PassKind, u32, u32), Rc<PassPrice>>>,
}

/// What a vLLM step decodes: requests, the tokens they verify (1 + drafts each), the
/// requests the proposer drafts for afterwards (every request in the step, those still
/// chunking their prompt included), and the decodes' mean context.
#[derive(Debug, Clone, Copy)]
pub struct VllmStep {
    pub decode_requests: u32,
    pub decode_tokens: u32,
    pub drafting_requests: u32,
    pub ctx: f64,
}

/// Part of a prefill forward: `new_tokens` computed now after `cached` tokens of the same
/// request already in the KV cache (an earlier chunk, a cached prefix, a retracted
/// request's kept output).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefillPart {
    pub new_tokens: u32,
    pub cached: u32,
}

/// Operator groups as the breakdown shows them.
struct Acc<'a> {
    items: &'a mut BTreeMap<String, f64>,
    sources: &'a mut BTreeMap<String, &'static str>,
    ops: u32,
    attn_us: f64,
}

impl Acc<'_> {
    fn add(&mut self, name: &str, times: f64, priced: (f64, Source), ops: u32) {
        *self.items.entry(name.to_string()).or_insert(0.0) += priced.0 * times;
        self.sources.insert(
            name.to_string(),
            match priced.1 {
                Source::Table => "table",
                Source::ScaledTable => "table, moved to this GPU / precision",
                Source::Roofline => "roofline",
            },
        );
        self.ops += ops * times as u32;
    }
}

impl CostModel {
    pub fn new(
        profile: HardwareProfile,
        engine: EngineProfile,
        tables: Option<OpTables>,
        model: ModelArch,
        draft: Option<DraftArch>,
        tp: u32,
        cuda_graph_max_bs: u32,
    ) -> Result<CostModel, SimError> {
        if tp == 0 || tp > profile.gpu.count {
            return Err(SimError::Model(format!(
                "tp_size {tp} does not fit the profile's {} GPUs ({})",
                profile.gpu.count, profile.origin
            )));
        }
        if model.num_heads % tp != 0 {
            return Err(SimError::Model(format!(
                "{} heads do not split over tp {tp}",
                model.num_heads
            )));
        }
        let expert_spread = profile.efficiency.moe_expert_spread.value;
        Ok(CostModel {
            profile,
            engine,
            tables,
            tables_gpu: None,
            model,
            draft,
            tp,
            graph_bound: CudaGraphBound::Requests(cuda_graph_max_bs),
            kv_read_scale: 1.0,
            kv_rows_scale: 1.0,
            expert_spread,
            custom_all_reduce: true,
            cache: RefCell::new(BTreeMap::new()),
        })
    }

    /// The engine's CUDA-graph bound, where it is not SGLang's `cuda_graph_max_bs` requests
    /// given to [`CostModel::new`] (vLLM counts tokens).
    pub fn with_graph_bound(mut self, bound: CudaGraphBound) -> Self {
        self.graph_bound = bound;
        self
    }

    /// The op tables were measured on `home`, another box than this profile's
    /// ([`crate::presets::tables_measured_on`]): every table time is moved to this GPU per
    /// operator.
    pub fn with_tables_measured_on(mut self, home: HardwareProfile) -> CostModel {
        self.tables_gpu = Some(home);
        self
    }

    /// What the report says about the op tables: measured here, or moved from another GPU.
    pub fn tables_scaled_from(&self) -> Option<&str> {
        self.tables_gpu.as_ref().map(|h| h.gpu.name.as_str())
    }

    /// The KV cache's element type (bf16 unless set).
    pub fn with_kv_cache_dtype(
        mut self,
        dtype: kbench_core::experiment::KvCacheDtype,
    ) -> CostModel {
        let scale = dtype.bytes() as f64 / 2.0;
        match self.engine.attention.fp8_kv {
            crate::engine_profile::Fp8Kv::HalfBytes => self.kv_read_scale = scale,
            crate::engine_profile::Fp8Kv::HalfRows => self.kv_rows_scale = scale,
        }
        self.cache.borrow_mut().clear();
        self
    }

    /// The workload's expert spread (`[workload] expert_spread`), where it gives one.
    pub fn with_expert_spread(mut self, spread: Option<f64>) -> CostModel {
        if let Some(s) = spread {
            self.expert_spread = s;
            self.cache.borrow_mut().clear();
        }
        self
    }

    /// `--disable-custom-all-reduce` (false): every all-reduce through NCCL.
    pub fn with_custom_all_reduce(mut self, on: bool) -> CostModel {
        if self.custom_all_reduce != on {
            self.custom_all_reduce = on;
            self.cache.borrow_mut().clear();
        }
        self
    }

    /// Op-table queries outside the measured range so far.
    pub fn flagged_queries(&self) -> Vec<String> {
        self.tables
            .as_ref()
            .map(OpTables::flagged)
            .unwrap_or_default()
    }

    pub fn tables_origin(&self) -> String {
        let scaled = self
            .tables_scaled_from()
            .map(|from| {
                format!(
                    ", measured on {from} and moved to {} per operator by bandwidth, FLOP-at-precision and link ratios",
                    self.profile.gpu.name
                )
            })
            .unwrap_or_default();
        self.tables
            .as_ref()
            .map(|t| format!("{}{scaled}", t.origin()))
            .unwrap_or_else(|| "roofline only".into())
    }

    fn pricer(&self) -> Pricer<'_> {
        Pricer {
            profile: &self.profile,
            tables: self.tables.as_ref(),
            tables_gpu: self.tables_gpu.as_ref(),
            tp: self.tp,
            kv_rows_scale: self.kv_rows_scale,
            expert_spread: self.expert_spread,
            all_reduce_link: self.engine.collectives.all_reduce_link(&self.profile),
            custom_all_reduce_below: self
                .engine
                .collectives
                .custom_all_reduce_below(self.tp)
                .filter(|_| self.custom_all_reduce),
            weight_only_rate: self.engine.kernels.weight_only_rate.value,
        }
    }

    /// Prices a pass over `tokens` query tokens from `requests` requests, with its attention
    /// at enough of `CTX_POINTS` to reach `ctx`: longer contexts are priced only when a run
    /// reaches them, so a short-context run neither pays for nor is warned about lookups it
    /// never needs.
    fn price(
        &self,
        kind: PassKind,
        tokens: u32,
        requests: u32,
        ctx: f64,
    ) -> Result<Rc<PassPrice>, SimError> {
        let anchors = if kind.is_prefill() {
            1
        } else {
            (2..CTX_POINTS.len())
                .find(|&i| ctx <= CTX_POINTS[i - 1])
                .unwrap_or(CTX_POINTS.len())
        };
        if let Some(p) = self.cache.borrow().get(&(kind, tokens, requests)) {
            if p.attn_us.len() >= anchors {
                return Ok(Rc::clone(p));
            }
        }
        let mut sources = BTreeMap::new();
        let mut items = Vec::with_capacity(anchors);
        let mut attn_us: Vec<f64> = Vec::with_capacity(anchors);
        let mut ops = 0;
        for &ctx in &CTX_POINTS[..anchors] {
            let mut at = BTreeMap::new();
            let mut acc = Acc {
                items: &mut at,
                sources: &mut sources,
                ops: 0,
                attn_us: 0.0,
            };
            self.build(kind, tokens, requests, ctx, &mut acc)?;
            ops = acc.ops;
            // a longer context never reads faster
            let floor = attn_us.last().copied().unwrap_or(f64::MIN);
            attn_us.push(acc.attn_us.max(floor));
            items.push(at);
        }
        let total_first: f64 = items[0].values().sum();
        let price = Rc::new(PassPrice {
            fixed_us: total_first - attn_us[0],
            attn_us,
            ops,
            items,
            sources,
        });
        self.cache
            .borrow_mut()
            .insert((kind, tokens, requests), Rc::clone(&price));
        Ok(price)
    }

    /// GPU time and what the pass adds to a round, microseconds.
    fn pass_time(
        &self,
        kind: PassKind,
        tokens: u32,
        requests: u32,
        ctx: f64,
    ) -> Result<(f64, f64, f64, bool, u32), SimError> {
        let p = self.price(kind, tokens, requests, ctx)?;
        let base = p.attention_base();
        let attention = base + (p.attention_at(ctx) - base) * self.kv_read_scale;
        let gpu = (p.fixed_us + attention) * self.profile.efficiency.in_model.value
            + self.kernel_gaps_us(p.ops);
        // Prefill (extend) is not graphed in SGLang by default; decode-type passes replay a
        // graph up to the engine's bound, in requests (SGLang) or tokens (vLLM).
        let graph = !kind.is_prefill() && self.graph_bound.covers(tokens, requests);
        if graph {
            let launch = self.engine.launch.graph_replay_us.value;
            Ok((gpu, launch, gpu + launch, true, p.ops))
        } else {
            // Eager: the CPU dispatches operators ahead of the GPU; the slower side sets pace.
            let launch = p.ops as f64 * self.engine.launch.eager_op_us.value;
            Ok((gpu, launch, gpu.max(launch), false, p.ops))
        }
    }

    /// The GPU time a pass of `ops` kernels spends at their boundaries.
    fn kernel_gaps_us(&self, ops: u32) -> f64 {
        ops as f64 * self.engine.launch.kernel_gap_us.value
    }

    /// One pass explained: GPU time per operator group, launch cost, what it adds to a round.
    pub fn explain_pass(
        &self,
        kind: PassKind,
        tokens: u32,
        requests: u32,
        ctx: f64,
    ) -> Result<PassBreakdown, SimError> {
        let p = self.price(kind, tokens, requests, ctx)?;
        let (gpu, launch, time, graph, ops) = self.pass_time(kind, tokens, requests, ctx)?;
        let (i, t) = ctx_segment(ctx, p.items.len());
        let f = self.profile.efficiency.in_model.value;
        let mut gpu_us: BTreeMap<String, f64> = p.items[i]
            .iter()
            .map(|(k, lo)| {
                let hi = p
                    .items
                    .get(i + 1)
                    .and_then(|m| m.get(k))
                    .copied()
                    .unwrap_or(*lo);
                (k.clone(), (lo + (hi - lo) * t) * f)
            })
            .collect();
        let mut sources = p.sources.clone();
        let gaps = self.kernel_gaps_us(ops);
        if gaps > 0.0 {
            gpu_us.insert("kernel_gaps".into(), gaps);
            sources.insert("kernel_gaps".into(), "engine profile, per kernel");
        }
        Ok(PassBreakdown {
            kind,
            tokens,
            requests,
            mean_context: ctx,
            graph,
            operators: ops,
            gpu_us,
            sources,
            gpu_total_us: gpu,
            launch_us: launch,
            time_us: time,
        })
    }

    /// The passes of one decode round for `bs` requests.
    fn round_passes(&self, bs: u32, spec: Option<&SpeculativeConfig>) -> Vec<(PassKind, u32, u32)> {
        match spec {
            None => vec![(PassKind::TargetDecode, bs, bs)],
            Some(s) if !s.algorithm.drafts_on_gpu() => {
                // n-gram: the host proposes; the GPU only verifies
                vec![(PassKind::TargetVerify, bs * s.shape.num_draft_tokens, bs)]
            }
            Some(s) => {
                let mut v = Vec::new();
                for _ in 1..s.shape.num_steps {
                    v.push((PassKind::DraftDecode, bs * s.shape.topk, bs));
                }
                v.push((PassKind::TargetVerify, bs * s.shape.num_draft_tokens, bs));
                // SGLang pads the draft extend to num_steps + 1 tokens per request (v2 always;
                // v1's CUDA graph for draft extend is captured at that width too).
                v.push((PassKind::DraftExtend, bs * (s.shape.num_steps + 1), bs));
                v
            }
        }
    }

    /// Time of one decode round for `bs` running requests with mean cached context `ctx`;
    /// `spec` is None for a plain decode round.
    pub fn round_ns(
        &self,
        bs: u32,
        ctx: f64,
        spec: Option<&SpeculativeConfig>,
    ) -> Result<u64, SimError> {
        let mut gpu = 0.0;
        for (kind, tokens, reqs) in self.round_passes(bs, spec) {
            gpu += self.pass_time(kind, tokens, reqs, ctx)?.2;
        }
        let (host, combine, sync) = self.host_round(bs, spec);
        let total = combine_round(gpu, host, combine, sync);
        Ok(to_ns(total))
    }

    fn host_round(&self, bs: u32, spec: Option<&SpeculativeConfig>) -> (f64, &'static str, f64) {
        let b = bs as f64;
        match spec {
            // SGLang's overlap scheduler (on by default without speculation) hides the
            // scheduler's work behind the GPU's.
            None => (
                self.engine.host.decode_step_us.value
                    + b * self.engine.host.decode_per_request_us.value,
                "overlap",
                0.0,
            ),
            Some(s) => {
                let round = self.engine.host.spec_round_us.value;
                if s.spec_v2 {
                    // v2 keeps verification bookkeeping (accept, KV free, output append) in
                    // batched GPU tensors: its per-request host work is the plain scheduler's,
                    // and all of it overlaps the next round's GPU work except one sync.
                    (
                        round + b * self.engine.host.decode_per_request_us.value,
                        "overlap+sync",
                        self.engine.host.v2_sync_us.value,
                    )
                } else {
                    // Spec v1 runs with the overlap scheduler disabled and walks every request
                    // in Python after each verify (accepted tokens, KV frees, finish checks).
                    // vLLM's CPU n-gram proposer runs inside the step too, request by request.
                    let proposer = if s.ngram.is_some() {
                        b * self.engine.host.ngram_per_request_us.value
                    } else {
                        0.0
                    };
                    (
                        round + b * self.engine.host.spec_per_request_us.value + proposer,
                        "serial",
                        0.0,
                    )
                }
            }
        }
    }

    /// A prefill batch: `reqs` prompts with `tokens` prompt tokens in all; with a draft, the
    /// draft's extend over the prompt follows.
    pub fn prefill_ns(&self, reqs: u32, tokens: u32, with_draft: bool) -> Result<u64, SimError> {
        let mut t = self
            .pass_time(PassKind::TargetPrefill, tokens, reqs, 0.0)?
            .2;
        if with_draft {
            t += self.pass_time(PassKind::DraftPrefill, tokens, reqs, 0.0)?.2;
        }
        t += reqs as f64 * self.engine.host.prefill_per_request_us.value;
        Ok(to_ns(t))
    }

    /// A prefill forward over `parts` (one per request). Each part is priced as its own
    /// prompt, plus the attention of its new tokens over what it had cached: for causal
    /// attention over n tokens costing A(n), a chunk of c after p cached costs
    /// A(p + c) - A(p), which is A(c) plus the cross term priced here.
    pub fn prefill_parts_ns(
        &self,
        parts: &[PrefillPart],
        with_draft: bool,
    ) -> Result<u64, SimError> {
        let tokens: u32 = parts.iter().map(|p| p.new_tokens).sum();
        let t = self.prefill_ns(parts.len() as u32, tokens, with_draft)? as f64 / 1e3;
        Ok(to_ns(
            t + self.cached_context_attention_us(parts, with_draft)?,
        ))
    }

    /// What the parts' new tokens add by attending to what each had cached: the cross term
    /// A(p + c) - A(p) - A(c) of causal attention, on top of pricing each part as its own
    /// prompt.
    fn cached_context_attention_us(
        &self,
        parts: &[PrefillPart],
        with_draft: bool,
    ) -> Result<f64, SimError> {
        let a = |n: f64| self.prefill_attention_us(n, with_draft);
        let mut us = 0.0;
        for part in parts.iter().filter(|p| p.cached > 0) {
            let (p, c) = (part.cached as f64, part.new_tokens as f64);
            us += (a(p + c)? - a(p)? - a(c)?).max(0.0);
        }
        Ok(us)
    }

    /// A vLLM step: `decode_bs` running requests decoding one token each (mean context
    /// `ctx`) and the prefill `parts`, in one forward. Without parts it is a plain decode
    /// step. With them the step runs eagerly: its GEMMs and all-reduces cover every row,
    /// the chunks' attention is priced as in [`CostModel::prefill_parts_ns`] (the decode
    /// rows counted into the chunks' prompt length, a small overestimate), and the decode
    /// rows add their attention over their caches.
    pub fn mixed_step_ns(
        &self,
        decode_bs: u32,
        ctx: f64,
        parts: &[PrefillPart],
    ) -> Result<u64, SimError> {
        self.vllm_step_ns(
            &VllmStep {
                decode_requests: decode_bs,
                decode_tokens: decode_bs,
                drafting_requests: 0,
                ctx,
            },
            parts,
            None,
        )
    }

    /// A vLLM V1 step with speculation (vllm/v1/core/sched/scheduler.py, the EAGLE
    /// proposer): the decode requests' `decode_tokens` (1 + their drafts each) are verified
    /// in the target forward beside the prefill `parts`; with a GPU draft the proposer then
    /// runs one pass over the target-shaped batch and K - 1 one-token passes over the
    /// `drafting_requests`. It runs on every step, one that only carries a prompt's chunk
    /// too: the draft needs that chunk's KV, and the drafts of a request still chunking are
    /// computed and thrown away (`GPUModelRunner.sample_tokens` proposes whenever the batch
    /// fits the drafter; the proposer's batch is `common_attn_metadata.batch_size()`, every
    /// request in the step; vLLM 0.32). A uniform decode step (no parts, every request
    /// verifying K + 1 tokens) is exactly a chain round.
    pub fn vllm_step_ns(
        &self,
        step: &VllmStep,
        parts: &[PrefillPart],
        spec: Option<&SpeculativeConfig>,
    ) -> Result<u64, SimError> {
        let VllmStep {
            decode_requests: bs,
            decode_tokens,
            drafting_requests,
            ctx,
        } = *step;
        let drafted = decode_tokens > bs;
        let uniform = parts.is_empty()
            && match spec {
                Some(s) => decode_tokens == bs * (s.shape.num_steps + 1),
                None => decode_tokens == bs,
            };
        if uniform && bs > 0 {
            return self.round_ns(bs, ctx, spec.filter(|_| drafted));
        }
        let chunk: u32 = parts.iter().map(|p| p.new_tokens).sum();
        let gpu_draft = spec.is_some_and(|s| s.is_speculative() && s.algorithm.drafts_on_gpu());
        let mut gpu = 0.0;
        if !parts.is_empty() {
            gpu +=
                self.pass_time(
                    PassKind::TargetPrefill,
                    chunk + decode_tokens,
                    parts.len() as u32,
                    0.0,
                )?
                .2 + self.cached_context_attention_us(parts, gpu_draft)?;
        }
        if bs > 0 {
            let kind = if drafted {
                PassKind::TargetVerify
            } else {
                PassKind::TargetDecode
            };
            if parts.is_empty() {
                gpu += self.pass_time(kind, decode_tokens, bs, ctx)?.2;
            } else {
                let d = self.price(kind, decode_tokens, bs, ctx)?;
                let base = d.attention_base();
                gpu += (base + (d.attention_at(ctx) - base) * self.kv_read_scale)
                    * self.profile.efficiency.in_model.value;
            }
        }
        let spec = spec.filter(|s| s.is_speculative());
        if let Some(s) = spec.filter(|_| gpu_draft && drafting_requests > 0) {
            let rows = chunk + decode_tokens;
            let first = if parts.is_empty() {
                PassKind::DraftExtend
            } else {
                PassKind::DraftPrefill
            };
            gpu += self
                .pass_time(first, rows.max(1), bs + parts.len() as u32, ctx)?
                .2;
            for _ in 1..s.shape.num_steps {
                gpu += self
                    .pass_time(
                        PassKind::DraftDecode,
                        drafting_requests,
                        drafting_requests,
                        ctx,
                    )?
                    .2;
            }
        }
        let (host, combine, sync) = self.host_round(bs, spec);
        let total = combine_round(gpu, host, combine, sync)
            + parts.len() as f64 * self.engine.host.prefill_per_request_us.value;
        Ok(to_ns(total))
    }

    /// Attention of one prompt of `isl` tokens over every layer (and the draft's), after
    /// `in_model`.
    fn prefill_attention_us(&self, isl: f64, with_draft: bool) -> Result<f64, SimError> {
        let p = self.pricer();
        let m = &self.model;
        let tp = self.tp;
        let why = format!("prefill attention over {isl:.0} tokens");
        let heads = m.num_heads / tp;
        let per_layer = match (&m.family, &m.mla) {
            (ArchFamily::MlaMoe, Some(mla)) => {
                let qk = mla.qk_nope_head_dim + mla.qk_rope_head_dim;
                self.mla_prefill_attention(&p, heads, 1, isl, qk, &why)?.0
            }
            _ => {
                let kv = (m.num_kv_heads / tp).max(1);
                self.attention_kernel(p.mha_prefill(heads, kv, m.head_dim, 1, isl, &why)?)
                    .0
            }
        };
        let mut us = per_layer * m.num_layers as f64;
        if with_draft && self.draft.is_none() && m.mtp_layers > 0 {
            // an MTP draft is one more target layer (its draft pass prices it so)
            us += per_layer;
        }
        if let (true, Some(d)) = (with_draft, &self.draft) {
            let heads = d.num_heads / tp.min(d.num_heads).max(1);
            us += match &d.mla {
                // an MLA draft prefills as the target's MLA does (its draft pass prices it so)
                Some(mla) => {
                    let qk = mla.qk_nope_head_dim + mla.qk_rope_head_dim;
                    self.mla_prefill_attention(&p, heads, 1, isl, qk, &why)?.0
                }
                None => {
                    let kv = (d.num_kv_heads / tp).max(1);
                    self.attention_kernel(p.mha_prefill(heads, kv, d.head_dim, 1, isl, &why)?)
                        .0
                }
            };
        }
        Ok(us * self.profile.efficiency.in_model.value)
    }

    /// An attention kernel's op-table time as the engine's own kernel takes it.
    fn attention_kernel(&self, (us, source): (f64, Source)) -> (f64, Source) {
        (us * self.engine.kernels.attention_scale.value, source)
    }

    /// MLA prefill attention by the kernel the engine profile names: the op table's
    /// (scaled as the engine's attention kernels are), or another kernel's roofline.
    fn mla_prefill_attention(
        &self,
        p: &Pricer<'_>,
        heads: u32,
        reqs: u32,
        isl: f64,
        qk: u32,
        why: &str,
    ) -> Result<(f64, Source), SimError> {
        Ok(match self.engine.attention.mla_prefill {
            MlaPrefillKernel::Table => {
                self.attention_kernel(p.mla_prefill(heads, reqs, isl, qk, why)?)
            }
            MlaPrefillKernel::Roofline => (
                p.mla_prefill_roofline(heads, reqs, isl, qk),
                Source::Roofline,
            ),
        })
    }

    /// An all-reduce's op-table (NCCL) time as the engine's own all-reduce takes it.
    fn all_reduce_kernel(&self, (us, source): (f64, Source)) -> (f64, Source) {
        (us * self.engine.kernels.all_reduce_scale.value, source)
    }

    /// The routed experts' op-table time as the engine's own MoE kernel takes it (its
    /// prefill-sized batches run other kernel configurations than decode's).
    fn moe_kernel(&self, prefill: bool, (us, source): (f64, Source)) -> (f64, Source) {
        let k = &self.engine.kernels;
        let scale = if prefill {
            k.moe_prefill_scale.value
        } else {
            k.moe_scale.value
        };
        (us * scale, source)
    }

    /// Explains one decode round (`spec` None: plain decode).
    pub fn explain_round(
        &self,
        bs: u32,
        ctx: f64,
        spec: Option<&SpeculativeConfig>,
    ) -> Result<RoundBreakdown, SimError> {
        let mut passes = Vec::new();
        for (kind, tokens, reqs) in self.round_passes(bs, spec) {
            passes.push(self.explain_pass(kind, tokens, reqs, ctx)?);
        }
        let gpu: f64 = passes.iter().map(|p| p.time_us).sum();
        let (host, combine, sync) = self.host_round(bs, spec);
        let what = match spec {
            None => "plain decode step".to_string(),
            Some(s) => format!(
                "speculative round ({}, {}, {}) {}",
                s.shape.num_steps,
                s.shape.topk,
                s.shape.num_draft_tokens,
                if s.spec_v2 { "v2" } else { "v1" }
            ),
        };
        Ok(RoundBreakdown {
            what,
            batch: bs,
            passes,
            gpu_us: gpu,
            host_us: host,
            combine,
            sync_us: sync,
            total_us: combine_round(gpu, host, combine, sync),
        })
    }

    /// Explains a prefill batch.
    pub fn explain_prefill(
        &self,
        reqs: u32,
        tokens: u32,
        with_draft: bool,
    ) -> Result<RoundBreakdown, SimError> {
        let mut passes = vec![self.explain_pass(PassKind::TargetPrefill, tokens, reqs, 0.0)?];
        if with_draft {
            passes.push(self.explain_pass(PassKind::DraftPrefill, tokens, reqs, 0.0)?);
        }
        let gpu: f64 = passes.iter().map(|p| p.time_us).sum();
        let host = reqs as f64 * self.engine.host.prefill_per_request_us.value;
        Ok(RoundBreakdown {
            what: format!("prefill of {reqs} prompts, {tokens} tokens"),
            batch: reqs,
            passes,
            gpu_us: gpu,
            host_us: host,
            combine: "serial",
            sync_us: 0.0,
            total_us: gpu + host,
        })
    }
}

/// `serial`: gpu + host (v1). `overlap`: max(gpu, host) (plain decode, overlap scheduler).
/// `overlap+sync` (v2): max(gpu, host) + sync, the sync being the gap neither side can fill;
/// it is capped at the shorter side's work (an exposed tail cannot be longer than the work it
/// tails), which with sync <= spec_round_us keeps v2 never slower than v1 per round.
fn combine_round(gpu: f64, host: f64, combine: &str, sync: f64) -> f64 {
    match combine {
        "serial" => gpu + host,
        "overlap" => gpu.max(host),
        _ => gpu.max(host) + sync.min(gpu).min(host),
    }
}

fn to_ns(us: f64) -> u64 {
    (us * 1e3).round().max(1.0) as u64
}
