//! Engine profiles: what the serving engine (SGLang, vLLM, at a version) adds to the GPU
//! time the hardware profile prices: host work per step, per request, per speculative round
//! and per streamed chunk, the cost of launching a forward, and the API server's work before
//! a request reaches the scheduler. The same GPUs under another engine, or another version,
//! get another profile; the hardware profile keeps only the box.
//!
//! A profile is TOML (format in docs/cost-model.md). Every value is a [`Param`] with its
//! provenance; `[[free]]` names the at most four values `kbench calibrate` may fit, each with
//! its prior and physical bounds.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::SimError;
use crate::profile::{param_table, Param, Provenance};

pub const MAX_FREE_PARAMS: usize = 4;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LaunchSection {
    /// Host cost of replaying one CUDA graph (one forward pass), microseconds.
    pub graph_replay_us: Param,
    /// Host cost per operator launched eagerly (the engine's Python dispatch + CUDA launch),
    /// microseconds. Eager passes: batches above cuda_graph_max_bs and prefill.
    pub eager_op_us: Param,
    /// GPU time at each kernel boundary of a forward, per operator, microseconds: the
    /// previous kernel draining its last wave and the next one's blocks reaching the SMs,
    /// which a dependent kernel pays in a replayed graph as in an eager stream and which an
    /// operator's own roofline and floor (measured one kernel at a time) leave out.
    #[serde(default = "zero_kernel_gap")]
    pub kernel_gap_us: Param,
}

fn zero_kernel_gap() -> Param {
    Param::new(
        0.0,
        Provenance::Prior,
        "none beyond each operator's own time (the op tables' and the roofline's floor)",
    )
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostSection {
    /// Scheduler work per plain decode step (batch assembly, sampling sync, output
    /// processing), microseconds; overlapped with GPU work by an overlap scheduler.
    pub decode_step_us: Param,
    /// Per request per plain decode step, microseconds.
    pub decode_per_request_us: Param,
    /// Per prefilled request (tokenized input to scheduled batch, first-token output),
    /// microseconds; serial with the prefill pass.
    pub prefill_per_request_us: Param,
    /// Host work per speculative round (tree building, verify bookkeeping, scheduling),
    /// microseconds. v1 adds it to every round; v2 overlaps it with the next round's GPU work.
    pub spec_round_us: Param,
    /// Per request per speculative round, microseconds.
    pub spec_per_request_us: Param,
    /// What v2's overlap cannot remove per round (the device-to-host sync of accept lengths
    /// and the launch of the next round), microseconds; part of the round's host work, so at
    /// most `spec_round_us`.
    pub v2_sync_us: Param,
    /// Output path outside the GPU loop, per streamed chunk (one per request per forward that
    /// commits tokens: a speculative round streams its accepted tokens as one chunk),
    /// microseconds: detokenizing, the front end's output handling and HTTP/SSE streaming,
    /// and the client parsing what it receives. Pipelined with the GPU (a chunk becomes
    /// visible when the front end has handled it, while the scheduler runs ahead), so it sets
    /// a ceiling of 1e6 / value chunks/s for the whole server rather than a per-step latency.
    #[serde(default = "zero_frontend")]
    pub frontend_per_chunk_us: Param,
    /// From a request's arrival to the scheduler seeing it, per request, microseconds: HTTP
    /// parsing, the chat template, the hand-off from the API server to the engine's
    /// scheduler. Spent in the API server, in parallel with the GPU loop: it delays the
    /// request, not the batch.
    #[serde(default = "zero_admission")]
    pub admission_per_request_us: Param,
    /// The API server tokenizing the prompt, per prompt token, microseconds; like
    /// `admission_per_request_us` it delays the request, not the batch.
    #[serde(default = "zero_tokenize")]
    pub tokenize_per_token_us: Param,
    /// vLLM's CPU n-gram proposer (vllm/v1/spec_decode/ngram_proposer.py, numba, one
    /// thread): its suffix match per request per step, microseconds; serial with the step.
    #[serde(default = "ngram_prior")]
    pub ngram_per_request_us: Param,
}

fn ngram_prior() -> Param {
    Param::new(
        20.0,
        Provenance::Prior,
        "n-gram lookup per request per step: a numba KMP scan of a few thousand tokens plus the Python list hand-off (no measurement yet)",
    )
}

fn zero_frontend() -> Param {
    Param::new(
        0.0,
        Provenance::Prior,
        "no front-end cost (tokens visible at the end of their round)",
    )
}

fn zero_admission() -> Param {
    Param::new(
        0.0,
        Provenance::Prior,
        "no admission delay (a request reaches the scheduler when it is sent)",
    )
}

fn zero_tokenize() -> Param {
    Param::new(0.0, Provenance::Prior, "tokenizing costs nothing")
}

/// The engine's own kernels against the op tables' (measured with SGLang's kernels): the
/// same operator in vLLM (its Marlin MoE, TRITON_MLA or FlashMLA attention) can take longer
/// or shorter. 1 = the tables as measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KernelSection {
    /// Routed-expert (MoE) kernel time in decode and verify passes relative to the op
    /// tables'.
    pub moe_scale: Param,
    /// The same in prefill passes (prefill-sized batches: other kernel configurations).
    #[serde(default = "tables_as_measured")]
    pub moe_prefill_scale: Param,
    /// Attention kernel time (decode, verify and prefill) relative to the op tables'.
    pub attention_scale: Param,
    /// All-reduce time relative to the op tables' NCCL: below 1 where the engine's custom
    /// one-shot all-reduce (NVLink, small messages) beats NCCL's ring.
    #[serde(default = "tables_as_measured")]
    pub all_reduce_scale: Param,
    /// The share of the BF16 tensor rate the engine's weight-only kernels (Marlin's W4A16 /
    /// W8A16: weights dequantized in registers, Ampere's `mma.sync`) reach where a GEMM is
    /// compute-bound; a memory-bound GEMM reads its bytes at the same speed either way.
    #[serde(default = "profile_rate")]
    pub weight_only_rate: Param,
}

fn profile_rate() -> Param {
    Param::new(
        1.0,
        Provenance::Prior,
        "the hardware profile's rate for the weights' math",
    )
}

fn tables_as_measured() -> Param {
    Param::new(
        1.0,
        Provenance::Measured,
        "the op tables' kernels, as measured (SGLang's; NCCL for all-reduce)",
    )
}

impl Default for KernelSection {
    fn default() -> KernelSection {
        KernelSection {
            moe_scale: tables_as_measured(),
            moe_prefill_scale: tables_as_measured(),
            attention_scale: tables_as_measured(),
            all_reduce_scale: tables_as_measured(),
            weight_only_rate: profile_rate(),
        }
    }
}

/// How many times a multi-token query block (verify, draft extend) reads its request's KV
/// cache in the attention backend the engine runs for the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KvReads {
    /// One causal query block per request: the prefix is streamed once per pass (SGLang's
    /// FlashInfer, FA3, Triton, FlashMLA and CUTLASS-MLA paths; vLLM's FlashAttention and
    /// FlashMLA).
    PerRequest,
    /// Every query token is its own decode row over the whole prefix (vLLM 0.34's
    /// TRITON_MLA flattens the block: `block_table.repeat_interleave(query_len)`).
    PerQueryToken,
}

/// Which kernel prices MLA prefill attention (the causal attention over a prompt's own
/// tokens, and a chunk's over what it had cached).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MlaPrefillKernel {
    /// The op tables' `mla_context` kernel, as measured.
    #[default]
    Table,
    /// A kernel the op tables did not measure, priced by its FLOPs and bytes at the GPU's
    /// BF16 rate and the hardware profile's efficiencies: vLLM's FLASH_ATTN MLA prefill on
    /// SM120, where the tables hold SGLang's Triton kernel (about ten times slower).
    Roofline,
}

/// Where the tensor-parallel all-reduce's time comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AllReducePrice {
    /// The op tables' NCCL measurement.
    #[default]
    Table,
    /// A fixed latency plus the ring's bytes over the bus bandwidth (the section's
    /// `latency_us` and `bus_gbs`, else the hardware profile's link terms): for a box
    /// whose collectives were measured apart from the tables.
    Link,
    /// The engine's own one-shot / two-shot all-reduce over IPC buffers below its size cap
    /// for the group (`custom_max_bytes`), from the op tables' custom all-reduce as a CUDA
    /// graph replays it; NCCL's table above the cap. vLLM's TP all-reduce tries its custom
    /// all-reduce first and falls through to NCCL by message size
    /// (CudaCommunicator.all_reduce, CUSTOM_ALL_REDUCE_MAX_SIZES).
    Custom,
}

/// The engine's collectives, with where their pricing was read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CollectivesSection {
    pub all_reduce: AllReducePrice,
    /// `link`: the all-reduce's fixed latency on the box the profile was measured on.
    #[serde(default)]
    pub latency_us: Option<Param>,
    /// `link`: its bus bandwidth (nccl-tests' busbw), GB/s.
    #[serde(default)]
    pub bus_gbs: Option<Param>,
    /// `custom`: per tensor-parallel size, the engine sends messages smaller than this many
    /// bytes through its custom all-reduce (TOML keys are the sizes: `{ "8" = 262144 }`); a
    /// group size not listed runs NCCL at every size. `kernels.all_reduce_scale` applies to
    /// both kernels' prices.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub custom_max_bytes: BTreeMap<String, f64>,
    #[serde(rename = "ref")]
    pub reference: String,
}

impl CollectivesSection {
    /// (latency us, bus GB/s) when the all-reduce is priced from link terms, falling back
    /// to the hardware profile's.
    pub fn all_reduce_link(
        &self,
        hardware: &crate::profile::HardwareProfile,
    ) -> Option<(f64, f64)> {
        let ic = &hardware.interconnect;
        (self.all_reduce == AllReducePrice::Link).then(|| {
            (
                self.latency_us
                    .as_ref()
                    .map_or(ic.all_reduce_latency_us.value, |p| p.value),
                self.bus_gbs
                    .as_ref()
                    .map_or(ic.all_reduce_bus_gbs.value, |p| p.value),
            )
        })
    }

    /// The size, in bytes, below which the engine's custom all-reduce carries a message
    /// over a group of `tp` GPUs; `None`: NCCL (or the link terms) at every size.
    pub fn custom_all_reduce_below(&self, tp: u32) -> Option<f64> {
        if self.all_reduce != AllReducePrice::Custom {
            return None;
        }
        self.custom_max_bytes.get(&tp.to_string()).copied()
    }

    fn validate(&self) -> Result<(), String> {
        match self.all_reduce {
            AllReducePrice::Custom if self.custom_max_bytes.is_empty() => {
                return Err(
                    "[collectives] all_reduce = \"custom\" needs custom_max_bytes: the engine's size cap per tensor-parallel size, e.g. { \"8\" = 262144 }".into(),
                );
            }
            AllReducePrice::Table | AllReducePrice::Link if !self.custom_max_bytes.is_empty() => {
                return Err(
                    "[collectives] custom_max_bytes is read only with all_reduce = \"custom\""
                        .into(),
                );
            }
            AllReducePrice::Table | AllReducePrice::Custom
                if self.latency_us.is_some() || self.bus_gbs.is_some() =>
            {
                return Err(
                    "[collectives] latency_us and bus_gbs are read only with all_reduce = \"link\""
                        .into(),
                );
            }
            _ => {}
        }
        for (tp, bytes) in &self.custom_max_bytes {
            // the key must read back as the group size it is looked up by
            if !tp
                .parse::<u32>()
                .is_ok_and(|n| n >= 2 && n.to_string() == *tp)
            {
                return Err(format!(
                    "[collectives] custom_max_bytes: key `{tp}` is not a tensor-parallel size of 2 or more"
                ));
            }
            if !(bytes.is_finite() && *bytes > 0.0) {
                return Err(format!(
                    "[collectives] custom_max_bytes.{tp} = {bytes} is not a positive number of bytes"
                ));
            }
        }
        Ok(())
    }
}

/// The vLLM model runner whose profile run sizes the KV cache (`VLLM_USE_V2_MODEL_RUNNER`):
/// the V1 runner warms its sampler, and with speculation its rejection sampler, over full
/// rows of FP32 logits; Model Runner V2 makes one sampler call that keeps the BF16 logits
/// (docs/cost-model.md, "What vLLM's profile run holds back"). V2 became vLLM's default for
/// dense models in July 2026 (vllm-project/vllm#44443) and for MoE models after; every
/// shipped profile describes a release from before, so V1 is the default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelRunner {
    #[default]
    V1,
    V2,
}

/// What the engine holds back from the KV cache beside the weights.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemorySection {
    #[serde(default)]
    pub model_runner: ModelRunner,
    #[serde(rename = "ref", default)]
    pub reference: String,
}

impl MemorySection {
    fn is_default(&self) -> bool {
        *self == MemorySection::default()
    }
}

impl Default for CollectivesSection {
    fn default() -> CollectivesSection {
        CollectivesSection {
            all_reduce: AllReducePrice::Table,
            latency_us: None,
            bus_gbs: None,
            custom_max_bytes: BTreeMap::new(),
            reference: "the op tables' NCCL all-reduce".into(),
        }
    }
}

/// What an fp8 KV cache saves the decode kernels the op tables measured with a bf16 cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Fp8Kv {
    /// Half the bytes, so half the context-dependent time: a kernel that streams at the
    /// bandwidth it reaches with one row.
    #[default]
    HalfBytes,
    /// Priced as half as many bf16 rows, never fewer than one: a kernel with a fixed grid
    /// per row (Triton's decode attention: batch x head groups x `num_kv_splits` programs)
    /// is bound by its programs' latency at a few rows, where fp8 loads gain nothing, and
    /// by bandwidth at many, where they halve the time.
    HalfRows,
}

/// The attention backends' KV reads, per attention kind, with where that was read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttentionSection {
    /// MLA models (DeepSeek-V3, Kimi-K2.x): the latent cache.
    pub mla_kv_reads: KvReads,
    /// MHA / GQA models and the EAGLE-3 draft layer.
    pub mha_kv_reads: KvReads,
    /// The sparse layers of a block-sparse model (MiniMax-M3's MSA), where the engine runs
    /// them through a backend of their own; unset, they read as `mha_kv_reads`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sparse_kv_reads: Option<KvReads>,
    /// How an fp8 KV cache is priced against the bf16 tables.
    #[serde(default)]
    pub fp8_kv: Fp8Kv,
    /// Which kernel prices MLA prefill attention.
    #[serde(default)]
    pub mla_prefill: MlaPrefillKernel,
    /// The backend code the two values were read from.
    #[serde(rename = "ref")]
    pub reference: String,
}

impl Default for AttentionSection {
    fn default() -> AttentionSection {
        AttentionSection {
            mla_kv_reads: KvReads::PerRequest,
            mha_kv_reads: KvReads::PerRequest,
            sparse_kv_reads: None,
            fp8_kv: Fp8Kv::HalfBytes,
            mla_prefill: MlaPrefillKernel::Table,
            reference:
                "one causal query block per request (docs/cost-model.md, \"Verify attention\")"
                    .into(),
        }
    }
}

/// A value `kbench calibrate` may fit: its prior and physical bounds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FreeParam {
    /// A profile key ([`ENGINE_PARAM_KEYS`]).
    pub param: String,
    /// The value before any fit, and what the fit is pulled toward.
    pub prior: f64,
    pub min: f64,
    pub max: f64,
    /// Weight of the pull toward the prior (0: none), on (x - prior) / (max - min).
    #[serde(default)]
    pub prior_weight: f64,
}

/// Recorded in a calibrated engine profile: what it was fitted to and how well.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineCalibration {
    /// The corpus sources whose `fit` points the profile was fitted to.
    pub sources: Vec<String>,
    pub fit_points: usize,
    pub method: String,
    pub rms_log_error: f64,
    pub max_abs_rel_error: f64,
    /// Held-apart error: `leave-one-source-out` with two sources or more, else
    /// `leave-one-point-out` within the one source.
    pub held_out: String,
    pub held_out_rms_rel_error: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineProfile {
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// `sglang` or `vllm`: the scheduler the profile's terms belong to.
    pub engine: String,
    /// The versions the terms describe.
    pub version: String,
    /// The box the fitted terms were measured on (none: priors for any box).
    #[serde(default)]
    pub hardware: Option<String>,
    pub launch: LaunchSection,
    pub host: HostSection,
    #[serde(default)]
    pub kernels: KernelSection,
    #[serde(default)]
    pub attention: AttentionSection,
    #[serde(default)]
    pub collectives: CollectivesSection,
    #[serde(default, skip_serializing_if = "MemorySection::is_default")]
    pub memory: MemorySection,
    #[serde(default)]
    pub free: Vec<FreeParam>,
    #[serde(default)]
    pub calibration: Option<EngineCalibration>,
    /// Where the profile was read from (not part of the file).
    #[serde(skip)]
    pub origin: String,
}

param_table!(
    /// Dotted names of every value of an engine profile, in file order.
    EngineProfile, ENGINE_PARAM_KEYS, {
    "launch.graph_replay_us" => launch.graph_replay_us,
    "launch.eager_op_us" => launch.eager_op_us,
    "launch.kernel_gap_us" => launch.kernel_gap_us,
    "host.decode_step_us" => host.decode_step_us,
    "host.decode_per_request_us" => host.decode_per_request_us,
    "host.prefill_per_request_us" => host.prefill_per_request_us,
    "host.spec_round_us" => host.spec_round_us,
    "host.spec_per_request_us" => host.spec_per_request_us,
    "host.v2_sync_us" => host.v2_sync_us,
    "host.frontend_per_chunk_us" => host.frontend_per_chunk_us,
    "host.admission_per_request_us" => host.admission_per_request_us,
    "host.tokenize_per_token_us" => host.tokenize_per_token_us,
    "host.ngram_per_request_us" => host.ngram_per_request_us,
    "kernels.moe_scale" => kernels.moe_scale,
    "kernels.moe_prefill_scale" => kernels.moe_prefill_scale,
    "kernels.attention_scale" => kernels.attention_scale,
    "kernels.all_reduce_scale" => kernels.all_reduce_scale,
    "kernels.weight_only_rate" => kernels.weight_only_rate,
});

impl EngineProfile {
    pub fn from_toml_str(text: &str, origin: &str) -> Result<EngineProfile, SimError> {
        let mut p: EngineProfile = toml::from_str(text).map_err(|e| SimError::EngineProfile {
            origin: origin.into(),
            message: e.to_string().trim().to_string(),
        })?;
        p.origin = origin.into();
        p.validate()?;
        Ok(p)
    }

    pub fn from_file(path: &Path) -> Result<EngineProfile, SimError> {
        let text = kbench_core::input::read_text(path).map_err(|source| SimError::Read {
            what: "engine profile",
            path: path.into(),
            source,
        })?;
        Self::from_toml_str(&text, &path.display().to_string())
    }

    pub fn to_toml_string(&self) -> Result<String, SimError> {
        toml::to_string(self).map_err(|e| SimError::EngineProfile {
            origin: self.origin.clone(),
            message: format!("cannot serialize: {e}"),
        })
    }

    /// Values a host cannot have, and free parameters the fit could not use.
    pub fn validate(&self) -> Result<(), SimError> {
        let bad = |message: String| SimError::EngineProfile {
            origin: self.origin.clone(),
            message,
        };
        if !["sglang", "vllm"].contains(&self.engine.as_str()) {
            return Err(bad(format!(
                "engine = `{}`: use sglang or vllm",
                self.engine
            )));
        }
        for key in ENGINE_PARAM_KEYS {
            let v = self.param(key).map(|p| p.value).unwrap_or(f64::NAN);
            if !v.is_finite() || v < 0.0 {
                return Err(bad(format!(
                    "{key} = {v} is not a finite non-negative number"
                )));
            }
        }
        for key in [
            "kernels.moe_scale",
            "kernels.moe_prefill_scale",
            "kernels.attention_scale",
            "kernels.all_reduce_scale",
        ] {
            let v = self.param(key).map(|p| p.value).unwrap_or(1.0);
            if !(0.25..=4.0).contains(&v) {
                return Err(bad(format!(
                    "{key} = {v} is outside the physical range [0.25, 4] (a kernel 4x off the measured one is another kernel)"
                )));
            }
        }
        self.collectives.validate().map_err(bad)?;
        if self.engine == "sglang" && self.memory.model_runner != ModelRunner::V1 {
            return Err(bad(
                "[memory] model_runner is vLLM's (which runner's profile run sizes its KV cache); an SGLang profile has none: remove it".into(),
            ));
        }
        let share = self.kernels.weight_only_rate.value;
        if !(0.05..=1.0).contains(&share) {
            return Err(bad(format!(
                "kernels.weight_only_rate = {share} is outside (0.05, 1]: it is the share of the hardware profile's BF16 rate the weight-only kernels reach, never above the datasheet and never nothing"
            )));
        }
        // v2's unremovable sync is part of the per-round host work it otherwise overlaps, and
        // v2 does no more per-request host work than v1: together these make v2 never slower
        // than v1 per round, by construction.
        if self.host.v2_sync_us.value > self.host.spec_round_us.value {
            return Err(bad(format!(
                "host.v2_sync_us = {} exceeds host.spec_round_us = {} (the sync is part of the round's host work)",
                self.host.v2_sync_us.value, self.host.spec_round_us.value
            )));
        }
        if self.host.decode_per_request_us.value > self.host.spec_per_request_us.value {
            return Err(bad(format!(
                "host.decode_per_request_us = {} exceeds host.spec_per_request_us = {} (v1 does at least the plain scheduler's per-request work)",
                self.host.decode_per_request_us.value, self.host.spec_per_request_us.value
            )));
        }
        if self.free.len() > MAX_FREE_PARAMS {
            return Err(bad(format!(
                "{} [[free]] parameters; at most {MAX_FREE_PARAMS} per engine and box",
                self.free.len()
            )));
        }
        let mut seen = std::collections::BTreeSet::new();
        for f in &self.free {
            if !ENGINE_PARAM_KEYS.contains(&f.param.as_str()) {
                return Err(bad(format!(
                    "[[free]] names unknown parameter `{}` (known: {})",
                    f.param,
                    ENGINE_PARAM_KEYS.join(", ")
                )));
            }
            if !seen.insert(f.param.as_str()) {
                return Err(bad(format!("[[free]] names `{}` twice", f.param)));
            }
            let finite = [f.prior, f.min, f.max, f.prior_weight]
                .iter()
                .all(|v| v.is_finite());
            if !(finite && f.min < f.max && f.prior_weight >= 0.0) {
                return Err(bad(format!(
                    "[[free]] `{}`: need finite min < max and prior_weight >= 0",
                    f.param
                )));
            }
            if !(f.min..=f.max).contains(&f.prior) {
                return Err(bad(format!(
                    "[[free]] `{}`: prior {} is outside its bounds [{}, {}]",
                    f.param, f.prior, f.min, f.max
                )));
            }
        }
        Ok(())
    }

    /// How long after it is sent a request of `prompt_tokens` reaches the scheduler.
    pub fn admission_delay_ns(&self, prompt_tokens: u32) -> u64 {
        let us = self.host.admission_per_request_us.value
            + prompt_tokens as f64 * self.host.tokenize_per_token_us.value;
        (us * 1e3).round() as u64
    }
}
