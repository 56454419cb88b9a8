//! The KV-cache pool as SGLang sizes it (v0.5 `server_args` heuristics and
//! `profile_max_num_token`), and the constants of its admission and retraction policy.
//!
//! - Pool bytes per GPU: `mem_fraction_static * GPU memory - weights per GPU`, under vLLM
//!   less what its profile run holds back (its sampler's peak, the MoE workspace it keeps).
//! - Bytes per token per GPU: MLA keeps one latent of `kv_lora_rank + qk_rope_head_dim`
//!   per layer, replicated on every tensor-parallel rank; MHA/GQA keeps K and V of the
//!   rank's KV heads. The EAGLE-3 draft has its own KV (one layer) over the same token
//!   slots; SGLang sizes the token count from the target alone and takes the draft's KV
//!   from the slack it reserves for speculation, so it is reported, not subtracted.
//! - With speculation the pool gains `max_running * (steps * topk + draft_tokens) + 100`
//!   slots for draft and verify tokens.

use kbench_core::arch::{ArchFamily, DraftArch, ModelArch};
use kbench_core::experiment::{
    ChunkedPrefill, Experiment, KvCacheDtype, ServingEngineKind, SpeculativeConfig,
};
use serde::Serialize;

use crate::engine_profile::ModelRunner;
use crate::error::SimError;
use crate::memory::loaded_weight_footprint;
use crate::profile::HardwareProfile;
use crate::vllm_defaults::{batched_tokens, max_running_requests};

/// SGLang's `CLIP_MAX_NEW_TOKENS`: the most output tokens admission reserves per request.
pub const CLIP_MAX_NEW_TOKENS: u32 = 4096;
/// `SGLANG_INIT_NEW_TOKEN_RATIO` (times schedule_conservativeness 1.0).
pub const INIT_NEW_TOKEN_RATIO: f64 = 0.7;
/// `SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR`.
pub const MIN_NEW_TOKEN_RATIO_FACTOR: f64 = 0.14;
/// `SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS`.
pub const NEW_TOKEN_RATIO_DECAY_STEPS: f64 = 600.0;
/// `SGLANG_RETRACT_DECODE_STEPS`: decode steps of room retraction leaves each survivor.
pub const RETRACT_DECODE_STEPS: u32 = 20;

const GIB: f64 = (1u64 << 30) as f64;

/// The KV pool of one GPU, with how it was sized.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KvPool {
    /// Token slots (every rank holds the same count).
    pub tokens: u64,
    pub mem_fraction_static: f64,
    /// Where mem_fraction_static came from (the file, or SGLang's heuristic).
    pub mem_fraction_origin: &'static str,
    pub gpu_bytes: f64,
    pub weight_bytes: f64,
    /// vLLM's profile run's sampler peak, deducted before the KV cache is sized (0 under
    /// SGLang, whose reserve is inside `mem_fraction_static`).
    pub sampler_profile_bytes: f64,
    /// The fused-MoE workspace vLLM's profile run takes and keeps (0 under SGLang, or for
    /// a dense model).
    pub moe_workspace_bytes: f64,
    /// What memory leaves for the target's KV.
    pub pool_bytes: f64,
    pub target_bytes_per_token: u64,
    pub draft_bytes_per_token: u64,
    /// Slots SGLang adds for draft and verify tokens (speculation under SGLang only).
    pub speculative_slots: u64,
    /// `max_total_tokens` lowered the count.
    pub capped_by_max_total_tokens: bool,
    /// Free slots a decode step needs per request: 1, or with EAGLE
    /// `num_draft_tokens + topk * num_steps`, and 1 + K more under vLLM's async scheduling
    /// with a GPU drafter.
    pub decode_slots_per_request: u32,
    pub chunked_prefill_size: Option<u32>,
}

/// The chunk size an experiment runs with: its own, or SGLang's default for the GPU.
pub fn chunked_prefill_size(exp: &Experiment, profile: &HardwareProfile) -> Option<u32> {
    match exp.kv.chunked_prefill {
        ChunkedPrefill::Off => None,
        ChunkedPrefill::Size(n) => Some(n),
        ChunkedPrefill::Default => Some(crate::sglang_defaults::chunked_prefill_size(profile)),
    }
}

/// vLLM's `--gpu-memory-utilization` when unset: 0.92 in vLLM 0.32 (`CacheConfig`,
/// vllm/config/cache.py: "If unspecified, will use the default value of 0.92"; earlier
/// releases used 0.9, so a file for one sets `mem_fraction_static`). Its KV cache is that
/// share less the weights, what its profile run allocates and keeps, and that run's
/// transient peak; kbench deducts the fused-MoE workspace the run keeps
/// ([`vllm_moe_workspace_bytes`]) and the sampler's part of the peak
/// ([`vllm_sampler_profile_bytes`]).
pub const VLLM_GPU_MEMORY_UTILIZATION: f64 = 0.92;

/// Bytes per logit (one request's row times the vocabulary) live at the peak of the sampler
/// pass that closes vLLM's profile run (`GPUModelRunner._dummy_sampler_run`, vLLM 0.32): the
/// gathered BF16 logits (2), the sampler's FP32 copy (4), and FlashInfer's top-k mask and
/// probabilities (4 + 4), or on the warm-up's PyTorch path the probabilities and the
/// exponential noise (4 + 4).
pub const SAMPLER_PROFILE_BYTES_PER_LOGIT: f64 = 14.0;

/// The same with speculation: the dummy run then passes twice as many BF16 logit rows to the
/// rejection sampler (4), which keeps its bonus rows (2) and their FP32 raw logits for
/// logprobs (4) while it converts and clones the target rows (4 + 4), then takes their
/// probabilities (4) and the recovery sampler's noise and its reciprocal (4 + 4):
/// `RejectionSampler.forward`, `rejection_sample` and `sample_recovered_tokens`
/// (vllm/v1/sample/rejection_sampler.py).
pub const SPEC_SAMPLER_PROFILE_BYTES_PER_LOGIT: f64 = 30.0;

/// Model Runner V2's profile run makes one sampler call (`GPUModelRunnerV2
/// ._dummy_sampler_run`, vllm/v1/worker/gpu/model_runner.py, vLLM 0.32) whose dummy requests
/// need no logits processing, so the gathered BF16 logits are sampled in place; with
/// speculation it runs no rejection sampler.
pub const V2_SAMPLER_PROFILE_BYTES_PER_LOGIT: f64 = 2.0;

/// The fused-MoE workspace vLLM keeps after its profile run: the modular kernel draws its
/// buffers from the process-wide workspace manager (`current_workspace_manager()
/// .get_simultaneous` in `FusedMoEKernel._allocate_buffers`, vllm-project/vllm#27532), which
/// grows them to the largest request and holds them, so the profile's forward of
/// `max_num_batched_tokens` tokens sizes them. For Marlin's experts (`MarlinExperts
/// .workspace_shapes`, vLLM 0.32) they are `M x topk x max(N, K)` (shared with the output's
/// `M x K`) and `M x topk x max(2N, K)` in BF16, with N the rank's expert intermediate and
/// K the hidden size; kbench takes them for every experts kernel (the Triton experts' are the
/// same; DeepGEMM's, an FP8 buffer over padded rows, and FlashInfer's are not checked).
pub fn vllm_moe_workspace_bytes(exp: &Experiment, profile: &HardwareProfile) -> f64 {
    let Some(moe) = &exp.model.moe else {
        return 0.0;
    };
    let m = batched_tokens(exp, profile) as f64;
    let topk = moe.num_experts_per_tok as f64;
    let k = exp.model.hidden_size as f64;
    let n = (moe.moe_intermediate_size / exp.tp_size.max(1)) as f64;
    // the first buffer also holds the output (M x K), never the larger with topk >= 1
    let first = m * topk * n.max(k);
    let second = m * topk * (2.0 * n).max(k);
    (first + second) * 2.0
}

/// The part of vLLM's profile-run peak that its sampler sets: the dummy batch has
/// `min(max_num_seqs, max_num_batched_tokens)` requests, each with one row of logits over the
/// whole vocabulary on every rank (the logits are all-gathered), and the sampler holds
/// [`SAMPLER_PROFILE_BYTES_PER_LOGIT`] per logit, [`SPEC_SAMPLER_PROFILE_BYTES_PER_LOGIT`]
/// with speculation, under the V1 model runner; Model Runner V2 holds
/// [`V2_SAMPLER_PROFILE_BYTES_PER_LOGIT`]. The forward of `max_num_batched_tokens` tokens
/// before it is not priced: for a large vocabulary and 1,024 sequences the sampler's GiBs
/// are the larger.
pub fn vllm_sampler_profile_bytes(
    exp: &Experiment,
    profile: &HardwareProfile,
    runner: ModelRunner,
) -> f64 {
    let rows = max_running_requests(exp, profile).min(batched_tokens(exp, profile)) as f64;
    let per_logit = match runner {
        ModelRunner::V2 => V2_SAMPLER_PROFILE_BYTES_PER_LOGIT,
        ModelRunner::V1 if exp.speculative.is_speculative() => SPEC_SAMPLER_PROFILE_BYTES_PER_LOGIT,
        ModelRunner::V1 => SAMPLER_PROFILE_BYTES_PER_LOGIT,
    };
    rows * exp.model.vocab_size as f64 * per_logit
}

/// SGLang v0.5's `mem_fraction_static` when unset: GPU memory less a reserve for
/// activations (the prefill chunk), CUDA graphs, communication and speculation.
pub fn default_mem_fraction_static(
    exp: &Experiment,
    profile: &HardwareProfile,
    chunk: Option<u32>,
) -> f64 {
    let gpu = crate::sglang_defaults::gpu_mib(profile);
    // the graph bound the server's settings end up with, the file's or its default
    let graph_bs = crate::sglang_defaults::configured_cuda_graph_max_bs(exp, profile);
    let prefill = chunk.unwrap_or(exp.kv.max_prefill_tokens).max(2048) as f64;
    let mut reserved =
        512.0 + prefill * 1.5 + graph_bs as f64 * 2.0 + exp.tp_size as f64 / 8.0 * 1024.0;
    if gpu > 60.0 * 1024.0 {
        reserved = reserved.max(10.0 * 1024.0);
    }
    // an EAGLE or MTP draft and its graphs; the n-gram proposer has neither
    if exp.speculative.algorithm.drafts_on_gpu() {
        reserved += 2.0 * 1024.0;
    }
    ((gpu - reserved) / gpu * 1000.0).round() / 1000.0
}

/// Bytes of target KV per token on one rank, with a block-sparse model's index keys: vLLM
/// keeps them in a cache of their own in every sparse layer, one key of `index_head_dim` per
/// token in BF16 on every rank (MiniMax-M3: `MiniMaxM3IndexerCache`, a key-only
/// `MLAAttentionSpec` in the same block pool, vllm/models/minimax_m3/common/indexer.py).
pub fn target_bytes_per_token(model: &ModelArch, tp: u32, dtype: KvCacheDtype) -> u64 {
    let b = dtype.bytes() as u64;
    let layers = model.num_layers as u64;
    let index_keys = model
        .sparse_attention
        .as_ref()
        .map_or(0, |sa| sa.layers as u64 * sa.index_head_dim as u64 * 2);
    let kv = match (&model.family, &model.mla) {
        (ArchFamily::MlaMoe, Some(m)) => layers * (m.kv_lora_rank + m.qk_rope_head_dim) as u64 * b,
        _ => {
            let kv = (model.num_kv_heads / tp.max(1)).max(1) as u64;
            layers * 2 * kv * model.head_dim as u64 * b
        }
    };
    kv + index_keys
}

/// Bytes of the EAGLE-3 draft's KV (one layer) per token on one rank: its KV heads' share,
/// or, for a latent-attention head, the whole latent on every rank as the target's.
pub fn draft_bytes_per_token(draft: &DraftArch, tp: u32, dtype: KvCacheDtype) -> u64 {
    let b = dtype.bytes() as u64;
    match &draft.mla {
        Some(m) => (m.kv_lora_rank + m.qk_rope_head_dim) as u64 * b,
        None => {
            let kv = (draft.num_kv_heads / tp.max(1)).max(1) as u64;
            2 * kv * draft.head_dim as u64 * b
        }
    }
}

/// Sizes the pool; an error says why nothing is left for it. `runner` is the vLLM model
/// runner the engine profile names (unused under SGLang).
pub fn kv_pool(
    exp: &Experiment,
    profile: &HardwareProfile,
    runner: ModelRunner,
) -> Result<KvPool, SimError> {
    let chunk = chunked_prefill_size(exp, profile);
    let (mf, origin) = match (exp.kv.mem_fraction_static, exp.engine.kind) {
        (Some(f), _) => (f, "file"),
        (None, ServingEngineKind::Sglang) => (
            default_mem_fraction_static(exp, profile, chunk),
            "SGLang's default for the GPU",
        ),
        (None, ServingEngineKind::Vllm) => (
            VLLM_GPU_MEMORY_UTILIZATION,
            "vLLM's default gpu_memory_utilization",
        ),
    };
    let gpu_bytes = profile.gpu.memory_gib.value * GIB;
    let loaded = crate::memory::as_loaded(&exp.model, &exp.speculative);
    let weight_bytes = loaded_weight_footprint(
        &exp.model,
        &exp.speculative,
        exp.draft.as_ref(),
        exp.tp_size,
    )
    .per_gpu_bytes;
    let (sampler_profile_bytes, moe_workspace_bytes) = match exp.engine.kind {
        ServingEngineKind::Vllm => (
            vllm_sampler_profile_bytes(exp, profile, runner),
            vllm_moe_workspace_bytes(exp, profile),
        ),
        ServingEngineKind::Sglang => (0.0, 0.0),
    };
    let held_back = sampler_profile_bytes + moe_workspace_bytes;
    let pool_bytes = gpu_bytes * mf - weight_bytes - held_back;
    let dtype = exp.kv.kv_cache_dtype;
    let target = target_bytes_per_token(&loaded, exp.tp_size, dtype);
    let draft = exp
        .draft
        .as_ref()
        .filter(|_| exp.speculative.is_speculative())
        .map(|d| draft_bytes_per_token(d, exp.tp_size, dtype))
        .unwrap_or(0);
    if pool_bytes <= 0.0 {
        return Err(SimError::DoesNotFit(format!(
            "{}: no memory is left for the KV cache: mem_fraction_static {mf} ({origin}) of {:.1} GiB is {:.1} GiB, and the weights take {:.1} GiB per GPU at tp_size {}{}; raise mem_fraction_static or tp_size{}",
            exp.path.display(),
            profile.gpu.memory_gib.value,
            gpu_bytes * mf / GIB,
            weight_bytes / GIB,
            exp.tp_size,
            if held_back > 0.0 {
                format!(
                    " and vLLM's profile run holds back {:.1} GiB",
                    held_back / GIB
                )
            } else {
                String::new()
            },
            held_back_levers(exp, profile, sampler_profile_bytes, moe_workspace_bytes)
        )));
    }
    if exp.engine.kind == ServingEngineKind::Vllm {
        check_vllm_max_model_len(
            exp,
            profile,
            mf,
            pool_bytes,
            target + draft,
            sampler_profile_bytes,
            moe_workspace_bytes,
        )?;
    }
    // vLLM sizes one pool for every attention layer it registered, the drafter's among them
    // (KVCacheConfig over static_forward_context), so a token costs both; SGLang sizes the
    // target's pool from the target's layers alone and gives the draft worker a pool of its
    // own with as many slots (draft_runner_cache_size in ModelRunner.init_memory_pool).
    let per_token = match exp.engine.kind {
        ServingEngineKind::Vllm => target + draft,
        ServingEngineKind::Sglang => target,
    };
    let mut tokens = (pool_bytes / per_token as f64) as u64;
    let s = &exp.speculative;
    // SGLang adds headroom for draft and verify tokens to the pool it profiled
    // (draft_runner_cache_size); vLLM takes a request's lookahead slots from the pool itself
    // (KVCacheManager.allocate_slots with num_lookahead_tokens), adding none.
    let speculative_slots = if s.is_speculative() && exp.engine.kind == ServingEngineKind::Sglang {
        exp.max_running_requests as u64
            * (s.shape.num_steps * s.shape.topk + s.shape.num_draft_tokens) as u64
            + 100
    } else {
        0
    };
    tokens += speculative_slots;
    let capped = exp.kv.max_total_tokens.is_some_and(|m| (m as u64) < tokens);
    if let Some(m) = exp.kv.max_total_tokens {
        tokens = tokens.min(m as u64);
    }
    Ok(KvPool {
        tokens,
        mem_fraction_static: mf,
        mem_fraction_origin: origin,
        gpu_bytes,
        weight_bytes,
        sampler_profile_bytes,
        moe_workspace_bytes,
        pool_bytes,
        target_bytes_per_token: target,
        draft_bytes_per_token: draft,
        speculative_slots,
        capped_by_max_total_tokens: capped,
        decode_slots_per_request: decode_slots_per_request(s) + async_lag_slots(exp),
        chunked_prefill_size: chunk,
    })
}

/// vLLM starts only if one request of `max_model_len` tokens fits the KV cache
/// (check_enough_kv_cache_memory in vllm/v1/core/kv_cache_utils.py), its default length
/// being the model's whole context; SGLang instead caps what it admits to its pool.
fn check_vllm_max_model_len(
    exp: &Experiment,
    profile: &HardwareProfile,
    mf: f64,
    pool_bytes: f64,
    bytes_per_token: u64,
    sampler_profile_bytes: f64,
    moe_workspace_bytes: f64,
) -> Result<(), SimError> {
    let (len, whose) = match exp.kv.max_model_len {
        Some(n) => (n as u64, "server.max_model_len"),
        None => (
            exp.model.max_position_embeddings,
            "the model's context, vLLM's default",
        ),
    };
    let fits = (pool_bytes / bytes_per_token.max(1) as f64) as u64;
    if fits >= len {
        return Ok(());
    }
    let (_, longest) = exp.workload.prompt_bounds();
    let needed = longest as u64 + exp.workload.max_tokens as u64;
    let fix = if fits >= needed {
        format!("set server.max_model_len (vLLM's --max-model-len) to {fits} or less (the longest request here needs {needed}), or raise mem_fraction_static (--gpu-memory-utilization) or tp_size")
    } else {
        format!(
            "the longest request here needs {needed} tokens, more than fit: raise mem_fraction_static (--gpu-memory-utilization) or tp_size{}",
            fp8_kv_lever(exp).map(|l| format!(", or use {l}")).unwrap_or_default()
        )
    };
    let levers = held_back_levers(exp, profile, sampler_profile_bytes, moe_workspace_bytes);
    Err(SimError::DoesNotFit(format!(
        "{}: vLLM would not start: one request of max_model_len {len} ({whose}) needs {:.1} GiB of KV cache per GPU, and {:.1} GiB is left at gpu_memory_utilization {mf}; the longest that fits is {fits} tokens: {fix}{levers}",
        exp.path.display(),
        (len * bytes_per_token) as f64 / GIB,
        pool_bytes / GIB,
    )))
}

/// An FP8 KV cache halves a token's bytes: a lever only where the cache is not FP8 already.
fn fp8_kv_lever(exp: &Experiment) -> Option<&'static str> {
    match exp.kv.kv_cache_dtype {
        KvCacheDtype::Bf16 => Some("kv_cache_dtype = \"fp8_e4m3\""),
        KvCacheDtype::Fp8E4m3 | KvCacheDtype::Fp8E5m2 => None,
    }
}

/// What shrinks what vLLM's profile run holds back, for a refusal (levers a user may not think
/// of: tp_size does not shrink the sampler, whose logits every rank holds whole): each part of
/// half a GiB or more, with its size.
fn held_back_levers(
    exp: &Experiment,
    profile: &HardwareProfile,
    sampler_profile_bytes: f64,
    moe_workspace_bytes: f64,
) -> String {
    let mut levers = Vec::new();
    if sampler_profile_bytes >= 0.5 * GIB {
        levers.push(format!(
            "lower server.max_running_requests (vLLM's --max-num-seqs, now {}): its profile-run sampler takes {:.1} GiB",
            max_running_requests(exp, profile),
            sampler_profile_bytes / GIB
        ));
    }
    if moe_workspace_bytes >= 0.5 * GIB {
        levers.push(format!(
            "lower engine.max_num_batched_tokens (--max-num-batched-tokens): the MoE workspace its profile run keeps takes {:.1} GiB",
            moe_workspace_bytes / GIB
        ));
    }
    if levers.is_empty() {
        String::new()
    } else {
        format!(", or {}", levers.join("; or "))
    }
}

/// SGLang's `decode_mem_cache_buf_multiplier`; for a chain it equals vLLM's 1 + K slots
/// plus K lookahead (`num_lookahead_tokens`, GPU drafters only: n-gram writes no draft KV).
pub fn decode_slots_per_request(s: &SpeculativeConfig) -> u32 {
    if s.is_speculative() && !s.algorithm.drafts_on_gpu() {
        s.shape.num_draft_tokens
    } else if s.is_speculative() {
        s.shape.num_draft_tokens + s.shape.topk * s.shape.num_steps
    } else {
        1
    }
}

/// Under vLLM's async scheduling with a GPU drafter, step N + 1 allocates before step N's
/// rejections come back: the request still counts step N's 1 + K tokens as computed
/// (`AsyncScheduler._update_after_schedule` adds them as output placeholders, and
/// `num_computed_tokens` drops by the rejected ones only when the output is processed), so
/// `allocate_slots` wants 1 + K more slots than a synchronous step would.
fn async_lag_slots(exp: &Experiment) -> u32 {
    let s = &exp.speculative;
    let lags = exp.engine.kind == ServingEngineKind::Vllm
        && s.is_speculative()
        && s.algorithm.drafts_on_gpu()
        && s.spec_v2;
    if lags {
        crate::vllm_defaults::decode_query_len(exp)
    } else {
        0
    }
}

impl KvPool {
    /// Refuses, with the numbers, a workload whose longest request cannot fit the pool
    /// alone: SGLang would retract it forever.
    pub fn check_fits(&self, exp: &Experiment) -> Result<(), SimError> {
        let (_, longest) = exp.input_len;
        let need = longest as u64 + exp.max_tokens as u64 + self.decode_slots_per_request as u64;
        if need <= self.tokens {
            return Ok(());
        }
        let sized = if self.capped_by_max_total_tokens {
            "max_total_tokens".to_string()
        } else {
            format!(
                "{:.2} GiB left after {:.1} GiB of weights{} in {} of {:.1} GiB, at {} bytes per token",
                self.pool_bytes / GIB,
                self.weight_bytes / GIB,
                if self.held_back_bytes() > 0.0 {
                    format!(" and {:.1} GiB vLLM's profile run holds back", self.held_back_bytes() / GIB)
                } else {
                    String::new()
                },
                self.mem_fraction_static,
                self.gpu_bytes / GIB,
                self.target_bytes_per_token
            )
        };
        Err(SimError::DoesNotFit(format!(
            "{}: one request does not fit the KV cache: the longest needs {need} tokens ({longest} of prompt + max_tokens {} + {} for a decode step), the pool holds {} ({sized}); use {}a larger mem_fraction_static or tp_size, or a shorter context",
            exp.path.display(),
            exp.max_tokens,
            self.decode_slots_per_request,
            self.tokens,
            fp8_kv_lever(exp).map(|l| format!("{l}, ")).unwrap_or_default(),
        )))
    }

    /// What vLLM's profile run takes from the KV cache's share beyond the weights.
    pub fn held_back_bytes(&self) -> f64 {
        self.sampler_profile_bytes + self.moe_workspace_bytes
    }

    /// One line for the report.
    pub fn describe(&self) -> String {
        format!(
            "KV cache: {} tokens per GPU ({} B/token{}; mem_fraction_static {} from {}{}{})",
            self.tokens,
            self.target_bytes_per_token,
            if self.draft_bytes_per_token > 0 {
                format!(" + draft {} B/token", self.draft_bytes_per_token)
            } else {
                String::new()
            },
            self.mem_fraction_static,
            self.mem_fraction_origin,
            if self.held_back_bytes() > 0.0 {
                format!(
                    ", less {:.2} GiB vLLM's profile run holds back: sampler {:.2}, MoE workspace {:.2}",
                    self.held_back_bytes() / GIB,
                    self.sampler_profile_bytes / GIB,
                    self.moe_workspace_bytes / GIB
                )
            } else {
                String::new()
            },
            if self.capped_by_max_total_tokens {
                ", capped by max_total_tokens"
            } else {
                ""
            }
        )
    }
}
