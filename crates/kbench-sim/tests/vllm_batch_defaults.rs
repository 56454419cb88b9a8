//! Where the file leaves `--max-num-seqs` and `--max-num-batched-tokens` to vLLM, vLLM picks
//! them by the GPU it finds (`EngineArgs.get_batch_defaults`, vLLM 0.32): 1,024 sequences and
//! 8,192 tokens from 70 GiB, 16,384 tokens from 160 GiB, and 256 / 2,048 on smaller GPUs and
//! on the A100 at any size. The simulator serves with them, the pool is sized with them and
//! the report's header says them.

use std::path::Path;

use kbench_core::backend::Backend;
use kbench_core::experiment::{load_experiment_str, Experiment};
use kbench_core::report::build_report;
use kbench_sim::engine_profile::ModelRunner;
use kbench_sim::kv::{vllm_moe_workspace_bytes, vllm_sampler_profile_bytes};
use kbench_sim::presets::{resolve_engine_profile, resolve_profile};
use kbench_sim::profile::HardwareProfile;
use kbench_sim::vllm_defaults::{batched_tokens, max_running_requests};
use kbench_sim::SimBackend;

fn llama(engine: &str, engine_extra: &str, server: &str) -> Experiment {
    let text = format!(
        "name = \"t\"\nseed = 5\n[model]\npreset = \"llama-3.1-8b\"\n[hardware]\npreset = \"8x-h100\"\n\
         [engine]\nname = \"{engine}\"\n{engine_extra}\n[server]\ntp_size = 1\n{server}\n\
         [workload]\nmax_tokens = 8\ninput_len = 64\n\
         [benchmark]\nconcurrency = [1]\nrequests_per_level = 1\n"
    );
    load_experiment_str(&text, Path::new("t.toml"), &[])
        .unwrap()
        .remove(0)
        .experiment
}

/// The H100 profile renamed and resized: what a user's own hardware file would say.
fn gpu(name: &str, memory_gib: f64) -> HardwareProfile {
    let mut p = resolve_profile(&llama("vllm", "", "").hardware).unwrap();
    p.gpu.name = name.to_string();
    p.gpu.memory_gib.value = memory_gib;
    p
}

#[test]
fn vllm_picks_its_batch_limits_by_the_gpu() {
    let e = llama("vllm", "", "");
    let cases = [
        ("NVIDIA H100 SXM", 79.2, 1024, 8192),
        ("NVIDIA H200 SXM", 139.8, 1024, 8192),
        ("NVIDIA B200", 178.4, 1024, 16384),
        // the A100 keeps the small defaults whatever its memory (vllm#17885)
        ("NVIDIA A100-SXM4-80GB", 79.1, 256, 2048),
        ("NVIDIA A100-SXM4-40GB", 39.4, 256, 2048),
        ("NVIDIA L40S", 44.4, 256, 2048),
        // 70 GiB is the line, as vLLM draws it
        ("some GPU", 69.9, 256, 2048),
        ("some GPU", 70.0, 1024, 8192),
    ];
    for (name, gib, seqs, tokens) in cases {
        let p = gpu(name, gib);
        assert_eq!(max_running_requests(&e, &p), seqs, "{name} {gib}");
        assert_eq!(batched_tokens(&e, &p), tokens, "{name} {gib}");
    }
}

#[test]
fn the_file_and_sglang_keep_their_own() {
    let a100 = gpu("NVIDIA A100-SXM4-80GB", 79.1);
    let set = llama(
        "vllm",
        "max_num_batched_tokens = 8192",
        "max_running_requests = 1024",
    );
    assert_eq!(max_running_requests(&set, &a100), 1024);
    assert_eq!(batched_tokens(&set, &a100), 8192);
    // unset, vLLM's cap is never more than its token budget, one token per request
    let small_budget = llama("vllm", "max_num_batched_tokens = 512", "");
    let h100 = gpu("NVIDIA H100 SXM", 79.2);
    assert_eq!(max_running_requests(&small_budget, &h100), 512);
    assert_eq!(max_running_requests(&small_budget, &a100), 256);
    let sglang = llama("sglang", "", "");
    assert_eq!(
        max_running_requests(&sglang, &a100),
        sglang.max_running_requests
    );
}

#[test]
fn the_pool_the_server_and_the_report_follow_the_gpu_default() {
    let e = llama("vllm", "", "");
    let h100 = gpu("NVIDIA H100 SXM", 79.2);
    let a100 = gpu("NVIDIA A100-SXM4-80GB", 79.1);
    let vocab = e.model.vocab_size as f64;
    // the profile run's sampler has one row per dummy request: 256 of them on the A100
    assert_eq!(
        vllm_sampler_profile_bytes(&e, &a100, ModelRunner::V1),
        256.0 * vocab * 14.0
    );
    assert_eq!(
        vllm_sampler_profile_bytes(&e, &h100, ModelRunner::V1),
        1024.0 * vocab * 14.0
    );
    // and its MoE workspace is sized by the A100's 2,048-token budget: MiniMax-M3 at TP8,
    // M x topk x max(N, K) twice, K = 6,144 the larger
    let m3 = load_experiment_str(
        "name = \"t\"\nseed = 5\n[model]\npreset = \"minimax-m3\"\n[hardware]\npreset = \"8x-h100\"\n\
         [engine]\nname = \"vllm\"\n[server]\ntp_size = 8\n\
         [workload]\nmax_tokens = 8\ninput_len = 64\n[benchmark]\nconcurrency = [1]\nrequests_per_level = 1\n",
        Path::new("t.toml"),
        &[],
    )
    .unwrap()
    .remove(0)
    .experiment;
    assert_eq!(
        vllm_moe_workspace_bytes(&m3, &a100),
        2.0 * (2048.0 * 4.0 * 6144.0) * 2.0
    );

    let engine = resolve_engine_profile(&e, &a100).unwrap();
    let backend = SimBackend::with_profiles(&e, a100, engine, None, None).unwrap();
    assert_eq!(backend.max_running_requests(), Some(256));
    let report = build_report(&e, None, &backend, &[]);
    assert_eq!(report.experiment.max_running_requests, 256);
    assert!(report.experiment.max_running_requests != e.max_running_requests);
}
