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

/// The most tokens a forward may have and still replay a CUDA graph
/// (`VllmConfig._set_cudagraph_sizes`, vllm/config/vllm.py at 000fc94b): the file's
/// `cuda_graph_max_bs`, which `kbench vllm-args` passes as `--max-cudagraph-capture-size`, or
/// vLLM's default, room for twice `max_num_seqs` uniform decodes of
/// `1 + num_speculative_tokens` tokens each, at most 512 (1,024 on compute capability 10.x,
/// the B200 and B300, since vllm-project/vllm#49390); never more than the token budget. A
/// batch of more tokens runs without a graph (`CudagraphDispatcher` returns
/// `CUDAGraphMode.NONE`).
pub fn cudagraph_capture_size(exp: &Experiment, profile: &HardwareProfile) -> u32 {
    let budget = batched_tokens(exp, profile);
    let query_len = if exp.speculative.is_speculative() {
        1 + exp.speculative.shape.num_steps
    } else {
        1
    };
    match exp.file.server.cuda_graph_max_bs {
        Some(0) => 0,
        Some(size) => {
            let size = size.min(budget);
            // vLLM captures its grid up to the size (and the budget itself where it fits),
            // so a size off the grid falls to the grid step below (vllm-project/vllm#54933)
            if size == budget {
                size
            } else {
                capture_grid_floor(size)
            }
        }
        None => {
            let ceiling = match profile.gpu.compute_capability.as_ref() {
                Some(cc) if cc.value.floor() == 10.0 => 1024,
                _ => 512,
            };
            let widest_decode = max_running_requests(exp, profile).saturating_mul(query_len);
            let size = widest_decode.saturating_mul(2).min(ceiling).min(budget);
            // the default also captures the uniform decode of every running request where it
            // fits, off the grid or not
            capture_grid_floor(size).max(widest_decode.min(size))
        }
    }
}

/// The largest of vLLM's default capture sizes (1, 2, 4, then every 8 tokens below 256 and
/// every 16 from 256) that is at most `size`.
fn capture_grid_floor(size: u32) -> u32 {
    match size {
        0..=7 => [4, 2, 1, 0].into_iter().find(|&g| g <= size).unwrap_or(0),
        8..=255 => size / 8 * 8,
        _ => 256 + (size - 256) / 16 * 16,
    }
}
