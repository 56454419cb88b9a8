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
/// graphs' memory is spread over more ranks.
fn default_cuda_graph_max_bs(gpu_mib: f64, tp: u32) -> u32 {
    // (below TP 4, from TP 4)
    let (narrow, wide) = match gpu_mib {
        m if m < 20.0 * 1024.0 => (8, 8),
        m if m < 35.0 * 1024.0 => (24, 80),
        m if m < 60.0 * 1024.0 => (32, 160),
        m if m < 160.0 * 1024.0 => (256, 512),
        _ => (512, 512),
    };
    if tp >= 4 {
        wide
    } else {
        narrow
    }
}

/// The `cuda_graph_max_bs` SGLang's memory settings see: the file's, or its default for the
/// GPU and TP. `--disable-cuda-graph` (the file's 0) leaves the default in place, so the
/// memory reserve still counts it.
pub(crate) fn configured_cuda_graph_max_bs(exp: &Experiment, profile: &HardwareProfile) -> u32 {
    match exp.file.server.cuda_graph_max_bs {
        Some(n) if n > 0 => n,
        _ => default_cuda_graph_max_bs(gpu_mib(profile), exp.tp_size),
    }
}

/// The largest batch SGLang replays from a CUDA graph. Its runner captures the batch sizes of
/// a grid up to `cuda_graph_max_bs` and replays any batch up to the largest
/// (`_generate_cuda_graph_batch_sizes`, `CudaGraphRunner.can_run`), so a value off the grid
/// falls to the grid step below; every default is on both grids. 0 is `--disable-cuda-graph`.
pub fn cuda_graph_max_bs(exp: &Experiment, profile: &HardwareProfile) -> u32 {
    if exp.file.server.cuda_graph_max_bs == Some(0) {
        return 0;
    }
    let max = configured_cuda_graph_max_bs(exp, profile);
    let grid = if exp.speculative.is_speculative() {
        speculative_grid(max)
    } else {
        plain_grid(max)
    };
    grid.into_iter().filter(|&bs| bs <= max).max().unwrap_or(0)
}

/// 1, 2, 4, 8, 12, every 8 to 256, every 16 below 512, every 32 from 512.
fn plain_grid(max: u32) -> Vec<u32> {
    let mut grid = vec![1, 2, 4, 8, 12];
    grid.extend((16..=256).step_by(8));
    grid.extend((272..512).step_by(16));
    grid.extend((512..=max.max(512)).step_by(32));
    grid
}

/// Less padding at small batches with speculation: 1 to 8, every 2 to 32, every 4 to 64,
/// every 8 to 256, every 16 from 272.
fn speculative_grid(max: u32) -> Vec<u32> {
    let mut grid: Vec<u32> = (1..=8).collect();
    grid.extend((10..=32).step_by(2));
    grid.extend((40..=64).step_by(4));
    grid.extend((72..=256).step_by(8));
    grid.extend((272..=max.max(272)).step_by(16));
    grid
}
