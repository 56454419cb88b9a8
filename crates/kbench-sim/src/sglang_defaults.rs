//! What `sglang.launch_server` takes where the experiment leaves it unset and the choice
//! depends on the GPU it finds: `ServerArgs._handle_gpu_memory_settings`
//! (python/sglang/srt/server_args.py, SGLang 0.5), keyed on the GPU's memory in MiB and the
//! tensor-parallel size.

use kbench_core::experiment::Experiment;

use crate::profile::HardwareProfile;

/// The GPU's memory as SGLang reads it, MiB.
pub(crate) fn gpu_mib(profile: &HardwareProfile) -> f64 {
    profile.gpu.memory_gib.value * 1024.0
}

/// `--chunked-prefill-size` when unset.
pub(crate) fn chunked_prefill_size(profile: &HardwareProfile) -> u32 {
    match gpu_mib(profile) {
        m if m < 35.0 * 1024.0 => 2048,
        m if m < 60.0 * 1024.0 => 4096,
        m if m < 160.0 * 1024.0 => 8192,
        _ => 16384,
    }
}

/// `--cuda-graph-max-bs` when unset: larger on larger GPUs, and at TP 4 or more, where the
/// graphs' memory is spread over more ranks. SGLang captures every batch size of its grid up
/// to it (`_generate_cuda_graph_batch_sizes`; 160 and 512 are on both the plain and the
/// speculative grid), so it is the largest batch replayed from a graph.
fn default_cuda_graph_max_bs(gpu_mib: f64, tp: u32) -> u32 {
    let wide = tp >= 4;
    match gpu_mib {
        m if m < 20.0 * 1024.0 => 8,
        m if m < 35.0 * 1024.0 => {
            if wide {
                80
            } else {
                24
            }
        }
        m if m < 60.0 * 1024.0 => {
            if wide {
                160
            } else {
                32
            }
        }
        m if m < 160.0 * 1024.0 => {
            if wide {
                512
            } else {
                256
            }
        }
        _ => 512,
    }
}

/// The largest batch SGLang replays from a CUDA graph: the file's `cuda_graph_max_bs`, or
/// SGLang's default for the GPU and TP.
pub fn cuda_graph_max_bs(exp: &Experiment, profile: &HardwareProfile) -> u32 {
    exp.file
        .server
        .cuda_graph_max_bs
        .unwrap_or_else(|| default_cuda_graph_max_bs(gpu_mib(profile), exp.tp_size))
}
