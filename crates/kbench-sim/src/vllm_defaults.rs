//! The batch limits `vllm serve` takes where the experiment leaves them unset: its defaults by
//! the GPU it finds (`EngineArgs.get_batch_defaults`, vllm/engine/arg_utils.py, vLLM 0.32),
//! keyed on the total memory PyTorch reads and, between 70 and 160 GiB, on whether the
//! device's name says A100 (vllm-project/vllm#17885: the larger token budget cost the A100
//! throughput, so it keeps the small defaults).

use kbench_core::experiment::{Experiment, ServingEngineKind, DEFAULT_MAX_RUNNING_REQUESTS};

use crate::profile::HardwareProfile;

/// The three rows of vLLM's table, for the API server (`vllm serve`), not the offline `LLM`
/// class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GpuClass {
    /// 160 GiB or more (B200, B300).
    Largest,
    /// 70 GiB or more and not an A100 (H100, H200, the RTX PRO 6000).
    Large,
    /// Everything else, the A100 80GB included.
    Other,
}

impl GpuClass {
    fn of(profile: &HardwareProfile) -> GpuClass {
        let gib = profile.gpu.memory_gib.value;
        if gib >= 160.0 {
            GpuClass::Largest
        } else if gib >= 70.0 && !profile.gpu.name.to_lowercase().contains("a100") {
            GpuClass::Large
        } else {
            GpuClass::Other
        }
    }

    fn max_num_batched_tokens(self) -> u32 {
        match self {
            GpuClass::Largest => 16384,
            GpuClass::Large => 8192,
            GpuClass::Other => 2048,
        }
    }

    fn max_num_seqs(self) -> u32 {
        match self {
            GpuClass::Largest | GpuClass::Large => 1024,
            GpuClass::Other => 256,
        }
    }
}

/// vLLM's token budget, the profile run's forward among its steps: `max_num_batched_tokens`,
/// the file's or vLLM's default for the GPU.
pub fn batched_tokens(exp: &Experiment, profile: &HardwareProfile) -> u32 {
    exp.engine
        .max_num_batched_tokens
        .unwrap_or_else(|| GpuClass::of(profile).max_num_batched_tokens())
}

/// The most requests the server runs at once. Under vLLM with the file silent that is
/// `--max-num-seqs`'s default for the GPU, which the experiment alone cannot know: 1,024, or
/// 256 below 70 GiB and on the A100, and never more than the token budget, one token per
/// request (`_set_default_max_num_seqs_and_batched_tokens_args`). Anything else is the
/// experiment's own.
pub fn max_running_requests(exp: &Experiment, profile: &HardwareProfile) -> u32 {
    let unset = exp.file.server.max_running_requests.is_none()
        && exp.max_running_requests == DEFAULT_MAX_RUNNING_REQUESTS;
    if exp.engine.kind == ServingEngineKind::Vllm && unset {
        GpuClass::of(profile)
            .max_num_seqs()
            .min(batched_tokens(exp, profile))
    } else {
        exp.max_running_requests
    }
}
