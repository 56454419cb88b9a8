//! The batch limits `vllm serve` takes where the experiment leaves them unset: its defaults by
//! the GPU it finds (`EngineArgs.get_batch_defaults`, vllm/engine/arg_utils.py, vLLM 0.32),
//! keyed on the total memory PyTorch reads and, between 70 and 160 GiB, on whether the
//! device's name says A100 (vllm-project/vllm#17885: the larger token budget cost the A100
//! throughput, so it keeps the small defaults).

use kbench_core::experiment::{Experiment, ServingEngineKind, DEFAULT_MAX_RUNNING_REQUESTS};

use crate::engine_profile::ModelRunner;
use crate::error::SimError;
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

/// The most tokens a forward may have and still replay a CUDA graph, as vLLM builds its
/// capture sizes (`VllmConfig._set_cudagraph_sizes`, vllm/config/vllm.py @000fc94b): up to
/// the file's `cuda_graph_max_bs`, which `kbench vllm-args` passes as
/// `--max-cudagraph-capture-size`, or vLLM's default, room for twice `max_num_seqs` uniform
/// decodes of `1 + num_speculative_tokens` tokens each, at most 512 (1,024 on compute
/// capability 10.x, the B200 and B300, since vllm-project/vllm#49390); never more than the
/// token budget. The largest size vLLM then captures is the bound: a batch of more tokens
/// runs without a graph (`CudagraphDispatcher` returns `CUDAGraphMode.NONE`). The rule has
/// moved between releases (v0.11 had no `1 + K` factor; vllm-project/vllm#50488 raised the
/// ceiling for a month, #54418 restored it); kbench follows @000fc94b.
pub fn cudagraph_capture_size(exp: &Experiment, profile: &HardwareProfile) -> u32 {
    let budget = batched_tokens(exp, profile);
    let query_len = decode_query_len(exp);
    let (max, uniform_decodes) = match exp.file.server.cuda_graph_max_bs {
        Some(0) => return 0,
        Some(size) => (size.min(budget), Vec::new()),
        None => {
            let ceiling = match profile.gpu.compute_capability.as_ref() {
                Some(cc) if cc.value.floor() == 10.0 => 1024,
                _ => 512,
            };
            let seqs = max_running_requests(exp, profile);
            let max = seqs
                .saturating_mul(query_len)
                .saturating_mul(2)
                .min(ceiling)
                .min(budget);
            // the default also captures uniform decodes of a grid of request counts, so a
            // speculative decode need not land on the token grid
            let decodes = if query_len > 1 {
                request_counts(seqs.min(ceiling))
                    .into_iter()
                    .map(|n| n * query_len)
                    .filter(|&t| t <= max)
                    .collect()
            } else {
                Vec::new()
            };
            (max, decodes)
        }
    };
    let mut sizes = token_grid(max);
    if budget <= max {
        sizes.push(budget);
    }
    sizes.extend(uniform_decodes);
    if query_len > 1 {
        // full decode graphs replay whole uniform decodes only: every size is rounded up to
        // a multiple of 1 + K and those past the bound dropped
        // (`CompilationConfig.adjust_cudagraph_sizes_for_spec_decode`)
        sizes = sizes
            .into_iter()
            .map(|s| s.div_ceil(query_len) * query_len)
            .filter(|&s| s <= max)
            .collect();
    }
    sizes.into_iter().max().unwrap_or(0)
}

/// The tokens a request's decode step verifies: 1 + `num_speculative_tokens` with
/// speculation, else 1 (vLLM's `uniform_decode_query_len`).
pub(crate) fn decode_query_len(exp: &Experiment) -> u32 {
    if exp.speculative.is_speculative() {
        1 + exp.speculative.shape.num_steps
    } else {
        1
    }
}

/// Whether vLLM would start with the file's capture size. With speculation its V1 model
/// runner rounds every capture size up to whole `1 + K`-token decodes, and a maximum below
/// one such decode leaves none: it refuses to start
/// (`CompilationConfig.adjust_cudagraph_sizes_for_spec_decode`, vLLM 0.32; Model Runner V2
/// sizes its graphs elsewhere and does not round).
pub fn check_capture_size(
    exp: &Experiment,
    profile: &HardwareProfile,
    runner: ModelRunner,
) -> Result<(), SimError> {
    if exp.engine.kind != ServingEngineKind::Vllm
        || !exp.speculative.is_speculative()
        || runner != ModelRunner::V1
    {
        return Ok(());
    }
    let query_len = decode_query_len(exp);
    let Some(size) = exp.file.server.cuda_graph_max_bs.filter(|&n| n > 0) else {
        return Ok(());
    };
    let max = size.min(batched_tokens(exp, profile));
    if max >= query_len {
        return Ok(());
    }
    Err(SimError::DoesNotFit(format!(
        "{}: vLLM would not start: No valid cudagraph sizes after rounding to multiple of {query_len} (num_speculative_tokens + 1) please adjust num_speculative_tokens ({}) or max_cudagraph_capture_size ({max}): set server.cuda_graph_max_bs (--max-cudagraph-capture-size) to {query_len} or more, or to 0 for no graphs",
        exp.path.display(),
        query_len - 1
    )))
}

/// vLLM's default capture sizes in tokens up to `max`: 1, 2, 4, then every 8 below 256 and
/// every 16 from 256. An explicit maximum off this grid falls to the step below
/// (vllm-project/vllm#54933).
fn token_grid(max: u32) -> Vec<u32> {
    let mut sizes: Vec<u32> = [1, 2, 4].into_iter().filter(|&s| s <= max).collect();
    sizes.extend((8..=max.min(255)).step_by(8));
    if max >= 256 {
        sizes.extend((256..=max).step_by(16));
    }
    sizes
}

/// The request counts whose uniform decodes vLLM's default captures: 1, 2, 4, every 8 below
/// 256, every 16 from 256, and `max_reqs` itself.
fn request_counts(max_reqs: u32) -> Vec<u32> {
    let mut counts = token_grid(max_reqs);
    counts.push(max_reqs);
    counts
}
