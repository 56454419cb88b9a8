//! The engine's CUDA path: the target (MLA + MoE, INT4 experts) and the EAGLE-3 draft on one
//! or more GPUs, and the speculative loop over them.
//!
//! - [`CudaModel`] (`model.rs`): weights uploaded from the checkpoint (sharded for tensor
//!   parallelism, `weights.rs`), a latent KV cache per sequence slot, the batched target pass
//!   (prefill / extend, decode, tree-masked verify; logits, captured hidden states, new KV
//!   entries committed by the caller) and the draft pass (draft KV cache + a per-round pool of
//!   draft-path entries); decode / verify passes replayed from CUDA graphs per token bucket.
//! - `passes.rs`: [`CudaModel`]'s `SpeculativeModel` (sequence caches = a KV slot, commits by pass
//!   row) and [`GpuSequence`], so that `crate::speculative`'s loop ([`prefill`], [`decode_step`],
//!   [`spec_round`], [`run_batch`], the same one the CPU runs) drives the GPU passes.
//! - `backend.rs`: [`CudaEngineBackend`], the `engine` backend (`crate::session`'s scheduler:
//!   continuous batching, KV slots) over the GPU.
//! - `ops.rs` + `engine_f32.cu`: the engine's own kernels (f32 activations over BF16 / INT4
//!   weights, any model dimensions, per-token metadata on the device), compiled by NVRTC
//!   through kbench-cuda's device layer. They mirror the CPU reference's algebra, so greedy
//!   outputs match the CPU token for token.
//! - [`KernelChoice::Tuned`]: for models whose dimensions fit kbench-cuda's tuned kernels
//!   ([`tuned_fit`]), the linears run through `bf16_matmul` and the routed experts through
//!   `moe_route` + `moe_experts` (INT4 fused MoE) on bf16 copies of the activations; attention,
//!   norms, RoPE and the draft stay on the engine's kernels (see docs/gpu.md).
//!
//! Tensor parallelism: one process drives every rank (`TpComm::group`, ncclCommInitAll); rank
//! r holds its share of the attention heads, the MLP / shared-expert intermediate slice, the
//! routed experts and a vocabulary slice of lm_head; partial outputs are summed with a BF16
//! all-reduce after attention and after the MLP (world size 1: no NCCL, no rounding).

pub mod backend;
pub mod model;
pub mod ops;
pub mod passes;
pub(crate) mod weights;

pub use crate::speculative::{decode_step, prefill, run_batch, spec_round};
pub use backend::CudaEngineBackend;
pub use model::{CudaModel, GpuDraftOut, GpuDraftSegment, GpuSegment, GpuSegmentOut};
pub use passes::{GpuCaches, GpuSequence};

use kbench_core::arch::ModelArch;

use crate::error::{EngineError, Result};

/// Where and how big: GPUs (one per tensor-parallel rank), sequence slots, context, tokens
/// per pass, CUDA graph buckets.
#[derive(Debug, Clone, PartialEq)]
pub struct CudaOptions {
    /// Device ordinals, one per rank (`tp_size` = its length).
    pub devices: Vec<usize>,
    /// Sequence slots (KV caches) = the most sequences in flight.
    pub max_batch: usize,
    /// Tokens per sequence (prompt + output + one round's tree).
    pub max_ctx: usize,
    /// Tokens per forward pass (longer prompts are prefilled in chunks).
    pub max_tokens: usize,
    /// Decode / verify passes of at most this many sequences run from CUDA graphs (per padded
    /// token-count bucket, captured on first use); 0 disables graphs. Graphs need tp = 1.
    pub cuda_graph_max_bs: usize,
    /// Draft candidates per sequence and round (the pool of draft-path entries).
    pub max_draft_candidates: usize,
    /// Which kernels run the target's linears and routed experts.
    pub kernels: KernelChoice,
    /// On the tuned kernels, run the dense BF16 linears through cuBLAS when libcublas loads
    /// (as SGLang does); else, or when it does not load, through kbench-cuda's `bf16_matmul`.
    pub cublas: bool,
}

/// The engine's exact f32 kernels or kbench-cuda's tuned bf16 ones for the target pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KernelChoice {
    /// f32 activations, one warp per output: any dimensions, token-equal to the CPU.
    Exact,
    /// bf16 activations into kbench-cuda's `bf16_matmul` and fused INT4 MoE; loading fails
    /// (naming the dimension) when the model does not fit them.
    Tuned,
    /// Tuned when the model fits, else Exact.
    #[default]
    Auto,
}

impl KernelChoice {
    /// `auto`, `exact` or `tuned` (an experiment's `[backend.engine] kernels`).
    pub fn parse(s: &str) -> Result<KernelChoice> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(KernelChoice::Auto),
            "exact" => Ok(KernelChoice::Exact),
            "tuned" => Ok(KernelChoice::Tuned),
            other => Err(EngineError::Invalid(format!(
                "unknown [backend.engine] kernels `{other}` (use `auto`, `exact` or `tuned`)"
            ))),
        }
    }

    /// The kernels a model loads with: `Exact` or `Tuned`, never `Auto`.
    pub fn resolve(self, arch: &ModelArch, tp: usize, int4_experts: bool) -> Result<KernelChoice> {
        match self {
            KernelChoice::Exact => Ok(KernelChoice::Exact),
            KernelChoice::Auto => Ok(match tuned_fit(arch, tp, int4_experts) {
                Ok(()) => KernelChoice::Tuned,
                Err(_) => KernelChoice::Exact,
            }),
            KernelChoice::Tuned => match tuned_fit(arch, tp, int4_experts) {
                Ok(()) => Ok(KernelChoice::Tuned),
                Err(why) => Err(EngineError::Unsupported(format!(
                    "CUDA kernels = Tuned: the model does not fit kbench-cuda's tuned kernels: {why}"
                ))),
            },
        }
    }
}

/// Whether a target fits the tuned kernels at tensor-parallel size `tp` (`int4_experts`: the
/// checkpoint's routed experts are packed INT4). `Err` lists every dimension that does not.
///
/// The rules are kbench-cuda's shape checks plus routing equivalence with the CPU:
/// `bf16_matmul` needs every linear's input width (per rank) to be a multiple of 32;
/// `moe_experts` needs hidden and moe_intermediate multiples of 64 and INT4 group-32 experts;
/// `moe_route` computes sigmoid scores only, always scores a group by its top-2 sum (the CPU
/// does so only with `e_score_correction_bias`, i.e. `noaux_tc`), takes at most 64 groups and
/// keeps 4 rows of E floats in 48 KB of shared memory.
pub fn tuned_fit(
    arch: &ModelArch,
    tp: usize,
    int4_experts: bool,
) -> std::result::Result<(), String> {
    let tp = tp.max(1);
    let mut bad: Vec<String> = Vec::new();
    let h = arch.hidden_size as usize;
    let k32 = |what: &str, k: usize, bad: &mut Vec<String>| {
        if k % 32 != 0 {
            bad.push(format!(
                "{what} {k} is not a multiple of 32 (bf16_matmul K)"
            ));
        }
    };
    k32("hidden_size", h, &mut bad);
    if let Some(m) = &arch.mla {
        if let Some(qr) = m.q_lora_rank {
            k32("q_lora_rank", qr as usize, &mut bad);
        }
        // splits that do not divide are the loader's error, reported there
        if arch.num_heads as usize % tp == 0 {
            let ko = arch.num_heads as usize / tp * m.v_head_dim as usize;
            k32("o_proj input (heads / tp x v_head_dim)", ko, &mut bad);
        }
    }
    let moe_layers = arch.num_moe_layers();
    if moe_layers < arch.num_layers && arch.intermediate_size as usize % tp == 0 {
        let il = arch.intermediate_size as usize / tp;
        k32("dense MLP intermediate_size / tp", il, &mut bad);
    }
    if let (Some(d), true) = (&arch.moe, moe_layers > 0) {
        let (e, k) = (d.n_routed_experts as usize, d.num_experts_per_tok as usize);
        let mi = d.moe_intermediate_size as usize;
        if h % 64 != 0 {
            bad.push(format!(
                "hidden_size {h} is not a multiple of 64 (fused_moe)"
            ));
        }
        if mi % 64 != 0 {
            bad.push(format!(
                "moe_intermediate_size {mi} is not a multiple of 64 (fused_moe)"
            ));
        }
        if d.n_shared_experts > 0 && (mi * d.n_shared_experts as usize) % tp == 0 {
            let sl = mi * d.n_shared_experts as usize / tp;
            k32("shared-expert intermediate / tp", sl, &mut bad);
        }
        if !int4_experts {
            bad.push("routed experts are not INT4 (fused_moe takes INT4 group-32)".into());
        }
        match &arch.quant {
            Some(q) if q.num_bits == 4 && q.group_size == 32 => {}
            Some(q) => bad.push(format!(
                "expert quantization {} bits group {} (fused_moe takes 4 bits, group 32)",
                q.num_bits, q.group_size
            )),
            None if int4_experts => {
                bad.push("no quantization_config for the INT4 experts (group size unknown)".into())
            }
            None => {}
        }
        if d.scoring_func != "sigmoid" {
            bad.push(format!(
                "scoring_func `{}` (moe_route computes sigmoid scores)",
                d.scoring_func
            ));
        }
        let ng = d.n_group.max(1) as usize;
        if ng > 64 || e % ng != 0 || (ng > 1 && d.topk_group as usize > ng) || k == 0 || k > e {
            bad.push(format!(
                "router groups: {e} experts, n_group {ng}, topk_group {}, top-k {k} (moe_route: n_group <= 64 dividing the experts, topk_group <= n_group, 1 <= top-k <= experts)",
                d.topk_group
            ));
        }
        // moe_route would pick a masked expert twice where the kept groups hold fewer than
        // top-k experts; the CPU picks distinct ones
        if ng > 1 && e % ng == 0 && (d.topk_group as usize) * (e / ng) < k {
            bad.push(format!(
                "topk_group {} of {ng} groups keeps fewer than top-k {k} of {e} experts",
                d.topk_group
            ));
        }
        if ng > 1 && d.topk_method != "noaux_tc" {
            bad.push(format!(
                "grouped routing with topk_method `{}` (moe_route scores groups by their top-2 sum, as noaux_tc does)",
                d.topk_method
            ));
        }
        if e > 3072 {
            bad.push(format!(
                "{e} routed experts (moe_route keeps 4 x E floats in 48 KB of shared memory: at most 3072)"
            ));
        }
    }
    if bad.is_empty() {
        Ok(())
    } else {
        Err(bad.join("; "))
    }
}

impl CudaOptions {
    /// `tp` GPUs starting at ordinal `first`, with defaults sized for tests and short runs.
    pub fn new(first: usize, tp: usize) -> CudaOptions {
        CudaOptions {
            devices: (first..first + tp.max(1)).collect(),
            max_batch: 8,
            max_ctx: 2048,
            max_tokens: 256,
            cuda_graph_max_bs: 8,
            max_draft_candidates: 256,
            kernels: KernelChoice::Auto,
            cublas: true,
        }
    }

    /// From an experiment: `tp_size` GPUs from `first`, `max_running_requests` slots,
    /// `cuda_graph_max_bs`, a context long enough for its longest prompt, `max_tokens` and
    /// one round's tree; `[backend.engine] kernels` (default `auto`).
    pub fn from_experiment(
        exp: &kbench_core::experiment::Experiment,
        first: usize,
    ) -> Result<CudaOptions> {
        let mut o = CudaOptions::new(first, exp.tp_size.max(1) as usize);
        o.kernels = crate::settings::EngineSettings::of(exp)?.kernels()?;
        o.max_batch = exp.max_running_requests.max(1) as usize;
        o.cuda_graph_max_bs = exp.cuda_graph_max_bs as usize;
        let tree = exp.speculative.shape.num_draft_tokens.max(1) as usize;
        o.max_ctx = (exp.input_len.1 as usize + exp.max_tokens as usize + tree + 8).max(64);
        // a verify pass holds every running sequence's tree
        o.max_tokens = o.max_tokens.max(o.max_batch * tree);
        Ok(o)
    }

    pub fn validate(&self) -> Result<()> {
        if self.devices.is_empty()
            || self.max_batch == 0
            || self.max_ctx == 0
            || self.max_tokens == 0
        {
            return Err(EngineError::Invalid(format!("CUDA options: {self:?}")));
        }
        if self.max_tokens > 65535 || self.max_ctx > i32::MAX as usize / 1024 {
            return Err(EngineError::Invalid(
                "CUDA options: max_tokens <= 65535, max_ctx within i32 rows".into(),
            ));
        }
        Ok(())
    }
}

/// True when a CUDA driver and at least one GPU are present (never panics).
pub fn cuda_available() -> bool {
    kbench_cuda::device::device_count() > 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::init::{plan_checkpoint, Dims, InitOptions, Preset};

    fn arch_of(dims: Dims) -> ModelArch {
        let mut o = InitOptions::new(Preset::Tiny, None, 0, 0.9);
        o.dims = dims;
        let cfg = plan_checkpoint(&o).unwrap().config;
        ModelArch::from_config_value(&cfg, std::path::Path::new("mem/config.json")).unwrap()
    }

    #[test]
    fn tuned_fit_rules() {
        // the tiny model: moe_inter 32 is what keeps it off fused_moe
        let tiny = arch_of(Dims::tiny());
        let why = tuned_fit(&tiny, 1, true).unwrap_err();
        assert!(why.contains("moe_intermediate_size 32"), "{why}");
        assert!(!why.contains("hidden_size"), "{why}");
        assert_eq!(
            KernelChoice::Auto.resolve(&tiny, 1, true).unwrap(),
            KernelChoice::Exact
        );
        let err = KernelChoice::Tuned.resolve(&tiny, 1, true).unwrap_err();
        assert!(err.to_string().contains("moe_intermediate_size"), "{err}");
        assert_eq!(
            KernelChoice::Exact.resolve(&small_arch(), 1, true).unwrap(),
            KernelChoice::Exact
        );

        let kimi = arch_of(Dims::kimi_slice(3));
        for tp in [1, 2, 4, 8] {
            assert_eq!(tuned_fit(&kimi, tp, true), Ok(()), "kimi tp {tp}");
        }
        assert_eq!(
            KernelChoice::Auto.resolve(&kimi, 8, true).unwrap(),
            KernelChoice::Tuned
        );
        assert!(tuned_fit(&kimi, 1, false).unwrap_err().contains("not INT4"));

        let s = small_arch();
        assert_eq!(tuned_fit(&s, 1, true), Ok(()));
        assert_eq!(tuned_fit(&s, 2, true), Ok(()));
        // tp 4: the shared expert's 64 / 4 = 16 columns per rank are too few
        let why = tuned_fit(&s, 4, true).unwrap_err();
        assert!(why.contains("shared-expert intermediate / tp 16"), "{why}");

        let mut a = small_arch();
        a.hidden_size = 96;
        let why = tuned_fit(&a, 1, true).unwrap_err();
        assert!(
            why.contains("hidden_size 96 is not a multiple of 64"),
            "{why}"
        );

        let mut a = small_arch();
        a.moe.as_mut().unwrap().scoring_func = "softmax".into();
        assert!(tuned_fit(&a, 1, true).unwrap_err().contains("scoring_func"));

        let mut a = small_arch();
        a.moe.as_mut().unwrap().topk_method = "group_limited_greedy".into();
        assert!(tuned_fit(&a, 1, true).unwrap_err().contains("topk_method"));
        // one group: no group scores, any topk_method routes the same
        a.moe.as_mut().unwrap().n_group = 1;
        assert_eq!(tuned_fit(&a, 1, true), Ok(()));

        let mut a = small_arch();
        let m = a.moe.as_mut().unwrap();
        m.topk_group = 1;
        m.num_experts_per_tok = 5;
        assert!(tuned_fit(&a, 1, true)
            .unwrap_err()
            .contains("keeps fewer than top-k 5"));

        let mut a = small_arch();
        a.quant.as_mut().unwrap().group_size = 128;
        assert!(tuned_fit(&a, 1, true).unwrap_err().contains("group 128"));

        let mut a = small_arch();
        a.mla.as_mut().unwrap().q_lora_rank = Some(48);
        assert!(tuned_fit(&a, 1, true)
            .unwrap_err()
            .contains("q_lora_rank 48"));
    }

    fn small_arch() -> ModelArch {
        arch_of(Dims::tuned_small())
    }
}
