//! The `engine` backend on the GPU (`kbench_engine::cuda::CudaEngineBackend`) serves an
//! experiment like the CPU backend and, with greedy verification, commits the same tokens per
//! round for every request (ignored unless asked for with `--include-ignored`); without a GPU
//! the backend's constructor must fail cleanly.

use kbench_core::backend::Backend;
use kbench_core::experiment::load_experiment;
use kbench_core::harness::{run_levels, LoadPlan, NoProgress};
use kbench_engine::cuda::CudaEngineBackend;
use kbench_engine::{ensure_tiny_model, EngineBackend};

fn experiment_text(device: &str) -> String {
    format!(
        r#"
name = "engine_cuda_test"
seed = 7
[model]
config = "models/tiny/config.json"
[hardware]
preset = "h200"
[server]
tp_size = 1
cuda_graph_max_bs = 4
[draft]
config = "models/tiny/draft/config.json"
[speculative]
algorithm = "EAGLE3"
num_steps = 3
eagle_topk = 2
num_draft_tokens = 6
[workload]
max_tokens = 12
input_len = 16
[benchmark]
concurrency = [1, 3]
requests_per_level = 4
warmup_requests = 1
[backend]
kind = "engine"
[backend.engine]
model_dir = "models/tiny"
device = "{device}"
"#
    )
}

fn load(dir: &std::path::Path, device: &str, file: &str) -> kbench_core::experiment::Experiment {
    ensure_tiny_model(&dir.join("models/tiny")).unwrap();
    let path = dir.join(file);
    std::fs::write(&path, experiment_text(device)).unwrap();
    load_experiment(&path, &[]).unwrap().remove(0).experiment
}

#[test]
fn cuda_backend_without_gpu_is_a_clean_error() {
    if kbench_cuda::device::device_count() > 0 {
        eprintln!("skipped: a CUDA device is present (this checks the no-GPU path)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let gexp = load(dir.path(), "cuda:0", "gpu.toml");
    let err = CudaEngineBackend::new(&gexp)
        .err()
        .expect("no GPU: constructor must fail");
    assert!(err.to_string().contains("CUDA"), "{err}");
}

#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-check.sh runs it with --include-ignored)"]
fn cuda_backend_matches_cpu_backend() {
    let dir = tempfile::tempdir().unwrap();
    let gexp = load(dir.path(), "cuda:0", "gpu.toml");
    assert!(
        kbench_cuda::device::device_count() > 0,
        "no CUDA device: this GPU test was run on purpose (--include-ignored) where there is no GPU"
    );
    let cexp = load(dir.path(), "cpu", "cpu.toml");
    let plan = LoadPlan::from_experiment(&cexp).keeping_records();
    let mut cpu = EngineBackend::new(&cexp).unwrap();
    let cpu_levels = run_levels(&mut cpu, &plan, &mut NoProgress).unwrap();
    let mut gpu = CudaEngineBackend::new(&gexp).unwrap();
    assert_eq!(gpu.name(), "engine");
    eprintln!("{}", gpu.describe());
    let gpu_levels = run_levels(&mut gpu, &plan, &mut NoProgress).unwrap();
    assert_eq!(cpu_levels.len(), gpu_levels.len());
    for (c, g) in cpu_levels.iter().zip(&gpu_levels) {
        let mut cr: Vec<_> = c
            .records
            .iter()
            .map(|r| (r.id, r.round_commits.clone()))
            .collect();
        let mut gr: Vec<_> = g
            .records
            .iter()
            .map(|r| (r.id, r.round_commits.clone()))
            .collect();
        cr.sort();
        gr.sort();
        assert_eq!(cr, gr, "per-request round commits, CPU vs GPU");
        for r in &g.records {
            assert_eq!(r.token_times_ns.len(), 12);
        }
    }
}
