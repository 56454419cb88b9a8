#![allow(
    clippy::manual_is_multiple_of,
    clippy::too_many_arguments,
    clippy::needless_range_loop,
    clippy::type_complexity,
    clippy::large_enum_variant
)]
// `x % n != 0` is kept: `is_multiple_of` needs Rust 1.87 (workspace MSRV is 1.85).
//! The engine's CUDA path: the target (MLA + MoE, INT4 experts) and the EAGLE-3 draft on one
//! or more GPUs, and the speculative loop over them.
//!
//! - [`CudaModel`] (`model.rs`): weights uploaded from the checkpoint (sharded for tensor
//!   parallelism, `weights.rs`), a latent KV cache per sequence slot, the batched target pass
//!   (prefill / extend, decode, tree-masked verify; logits, captured hidden states, new KV
//!   entries committed by the caller) and the draft pass (draft KV cache + a per-round pool of
//!   draft-path entries); decode / verify passes replayed from CUDA graphs per token bucket.
//! - `spec.rs`: [`GpuSequence`], [`prefill`], [`decode_step`], [`spec_round`], [`run_batch`]:
//!   the CPU loop of `crate::spec` step for step (kbench_core's tree builder and verifiers,
//!   the same draft choices, commits and draft extends) over the GPU passes.
//! - `backend.rs`: [`CudaEngineBackend`], the `engine` backend (continuous batching, KV slots)
//!   over the GPU loop.
//! - `ops.rs` + `engine_f32.cu`: the engine's own kernels (f32 activations over BF16 / INT4
//!   weights, any model dimensions, per-token metadata on the device), compiled by NVRTC
//!   through kbench-cuda's device layer. They mirror the CPU reference's algebra, so greedy
//!   outputs match the CPU token for token; the tuned bf16 kernels of `kernels/` (mla_decode,
//!   fused_moe, w4a16) are the next step for speed at Kimi-K2.5 width (see docs/gpu.md).
//!
//! Tensor parallelism: one process drives every rank (`TpComm::group`, ncclCommInitAll); rank
//! r holds its share of the attention heads, the MLP / shared-expert intermediate slice, the
//! routed experts and a vocabulary slice of lm_head; partial outputs are summed with a BF16
//! all-reduce after attention and after the MLP (world size 1: no NCCL, no rounding).

pub mod backend;
pub mod model;
pub mod ops;
pub mod spec;
pub(crate) mod weights;

pub use backend::CudaEngineBackend;
pub use model::{CudaModel, GpuDraftOut, GpuDraftSegment, GpuSegment, GpuSegmentOut};
pub use spec::{decode_step, prefill, run_batch, spec_round, GpuSequence};

use crate::error::{EngineError, Result};

/// Converts kbench-cuda's errors ("no CUDA driver found", NVRTC, launch failures).
pub(crate) fn cerr(e: kbench_cuda::CudaError) -> EngineError {
    EngineError::Device(format!("CUDA: {e}"))
}

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
        }
    }

    /// From an experiment: `tp_size` GPUs from `first`, `max_running_requests` slots,
    /// `cuda_graph_max_bs`, a context long enough for its longest prompt, `max_tokens` and
    /// one round's tree.
    pub fn from_experiment(exp: &kbench_core::spec::Experiment, first: usize) -> CudaOptions {
        let mut o = CudaOptions::new(first, exp.tp_size.max(1) as usize);
        o.max_batch = exp.max_running_requests.max(1) as usize;
        o.cuda_graph_max_bs = exp.cuda_graph_max_bs as usize;
        let tree = exp.spec.num_draft_tokens.max(1) as usize;
        o.max_ctx = (exp.input_len.1 as usize + exp.max_tokens as usize + tree + 8).max(64);
        // a verify pass holds every running sequence's tree
        o.max_tokens = o.max_tokens.max(o.max_batch * tree);
        o
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
