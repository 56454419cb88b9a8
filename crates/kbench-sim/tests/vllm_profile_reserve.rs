//! vLLM's KV cache is what its profile run leaves: the sampler pass that closes it holds
//! 14 bytes per logit of one row per dummy request, 30 with a rejection sampler, and the
//! fused-MoE workspace its forward takes is kept; kbench deducts both from the pool
//! (docs/cost-model.md, "What vLLM's profile run holds back").

use std::path::Path;

use kbench_core::experiment::{load_experiment_str, Experiment};
use kbench_sim::engine_profile::EngineProfile;
use kbench_sim::engine_profile::ModelRunner;
use kbench_sim::kv::{
    kv_pool, vllm_moe_workspace_bytes, vllm_sampler_profile_bytes, SAMPLER_PROFILE_BYTES_PER_LOGIT,
    SPEC_SAMPLER_PROFILE_BYTES_PER_LOGIT,
};
use kbench_sim::presets::resolve_profile;

const GIB: f64 = (1u64 << 30) as f64;

/// MiniMax-M3 at TP8 on 8x H100, as InferenceX's 8k1k arms launch it.
fn m3_on_h100(engine: &str, server: &str, speculative: &str) -> Experiment {
    load(&m3_text(engine, server, speculative))
}

fn load(text: &str) -> Experiment {
    load_experiment_str(text, Path::new("t.toml"), &[])
        .unwrap()
        .remove(0)
        .experiment
}

fn m3_text(engine: &str, server: &str, speculative: &str) -> String {
    format!(
        "name = \"t\"\nseed = 5\n[model]\npreset = \"minimax-m3\"\n[hardware]\npreset = \"8x-h100\"\n\
         [engine]\n{engine}\n[draft]\npreset = \"minimax-m3-eagle3\"\n\
         [server]\ntp_size = 8\nmem_fraction_static = 0.9\nmax_model_len = 9472\n{server}\n\
         [speculative]\n{speculative}\n\
         [workload]\nmax_tokens = 1024\ninput_len = 8192\naccept_length = 2.83\n\
         [benchmark]\nconcurrency = [1]\nrequests_per_level = 2\n"
    )
}

const VLLM: &str = "name = \"vllm\"\nmax_num_batched_tokens = 16384";
const EAGLE3: &str = "method = \"eagle3\"\nnum_speculative_tokens = 3";
const PLAIN: &str = "method = \"none\"";

#[test]
fn one_row_per_dummy_request_over_the_whole_vocabulary() {
    let vocab = 200_064.0;
    let plain = m3_on_h100(VLLM, "", PLAIN);
    let profile = resolve_profile(&plain.hardware).unwrap();
    // vLLM's default 1,024 sequences on an 80 GB GPU, fewer than the 16,384 batched tokens
    assert_eq!(
        vllm_sampler_profile_bytes(&plain, &profile, ModelRunner::V1),
        1024.0 * vocab * SAMPLER_PROFILE_BYTES_PER_LOGIT
    );
    let eagle = m3_on_h100(VLLM, "", EAGLE3);
    assert_eq!(
        vllm_sampler_profile_bytes(&eagle, &profile, ModelRunner::V1),
        1024.0 * vocab * SPEC_SAMPLER_PROFILE_BYTES_PER_LOGIT
    );
    // --max-num-seqs bounds the rows, and so does a token budget below it
    let fewer = m3_on_h100(VLLM, "max_running_requests = 128", PLAIN);
    assert_eq!(
        vllm_sampler_profile_bytes(&fewer, &profile, ModelRunner::V1),
        128.0 * vocab * SAMPLER_PROFILE_BYTES_PER_LOGIT
    );
    let small_budget = m3_on_h100("name = \"vllm\"\nmax_num_batched_tokens = 512", "", PLAIN);
    assert_eq!(
        vllm_sampler_profile_bytes(&small_budget, &profile, ModelRunner::V1),
        512.0 * vocab * SAMPLER_PROFILE_BYTES_PER_LOGIT
    );
}

#[test]
fn the_pool_is_the_budget_less_weights_and_the_sampler_under_vllm_only() {
    for speculative in [PLAIN, EAGLE3] {
        let e = m3_on_h100(VLLM, "", speculative);
        let profile = resolve_profile(&e.hardware).unwrap();
        let pool = kv_pool(&e, &profile, ModelRunner::V1).unwrap();
        assert!(pool.sampler_profile_bytes > 2.0 * GIB, "{pool:?}");
        let left = pool.gpu_bytes * 0.9
            - pool.weight_bytes
            - pool.sampler_profile_bytes
            - pool.moe_workspace_bytes;
        assert!((pool.pool_bytes - left).abs() < 1.0, "{pool:?}");
        let per_token = pool.target_bytes_per_token + pool.draft_bytes_per_token;
        assert_eq!(pool.tokens, (pool.pool_bytes / per_token as f64) as u64);
    }
    // SGLang's reserve is inside mem_fraction_static: nothing more comes off
    let sglang = m3_on_h100("name = \"sglang\"", "", "algorithm = \"none\"");
    let profile = resolve_profile(&sglang.hardware).unwrap();
    let pool = kv_pool(&sglang, &profile, ModelRunner::V1).unwrap();
    assert_eq!(pool.sampler_profile_bytes, 0.0);
    assert_eq!(pool.moe_workspace_bytes, 0.0);
    assert!((pool.pool_bytes - (pool.gpu_bytes * 0.9 - pool.weight_bytes)).abs() < 1.0);
}

/// InferenceX's M3 8k1k arms on 8x H100 held back about 2.6 GB per GPU more with EAGLE-3 than
/// its draft's weights and KV explain (their C=32 and C=64 points replayed with capped pools:
/// docs/fidelity.md, "The H100 8k1k arms"; the replay brackets it within about 1 GB). Under
/// the V1 runner the rejection sampler's rows account for it; the plain arm and the EAGLE-3
/// arm otherwise keep the same (the MoE workspace is one per process).
#[test]
fn eagle3_holds_back_about_what_the_h100_arms_imply_beyond_its_draft() {
    let plain = m3_on_h100(VLLM, "", PLAIN);
    let eagle = m3_on_h100(VLLM, "", EAGLE3);
    let profile = resolve_profile(&plain.hardware).unwrap();
    let (p, e) = (
        kv_pool(&plain, &profile, ModelRunner::V1).unwrap(),
        kv_pool(&eagle, &profile, ModelRunner::V1).unwrap(),
    );
    let draft_weights = e.weight_bytes - p.weight_bytes;
    let beyond_draft = p.pool_bytes - e.pool_bytes - draft_weights;
    assert!(
        (1.6e9..=3.6e9).contains(&beyond_draft),
        "held back beyond the draft: {beyond_draft}"
    );
    assert_eq!(e.moe_workspace_bytes, p.moe_workspace_bytes);
    // Model Runner V2's profile run samples the BF16 logits once and runs no rejection
    // sampler: nothing is held back for speculation, and little for sampling
    let (p2, e2) = (
        kv_pool(&plain, &profile, ModelRunner::V2).unwrap(),
        kv_pool(&eagle, &profile, ModelRunner::V2).unwrap(),
    );
    assert_eq!(e2.sampler_profile_bytes, p2.sampler_profile_bytes);
    assert!(p2.sampler_profile_bytes < p.sampler_profile_bytes / 5.0);
    assert!(e2.tokens > e.tokens && p2.tokens > p.tokens);
}

/// Marlin's experts take `M x topk x max(N, K)` and `M x topk x max(2N, K)` BF16 elements for
/// the profile's M = max_num_batched_tokens tokens: for M3 at TP8 (hidden 6,144, an expert
/// intermediate of 3,072 / 8, top-4) and 16,384 tokens, 1.61 GB, the same with or without a
/// draft; a token budget of 2,048 takes an eighth of it, and a dense model none.
#[test]
fn the_moe_workspace_is_sized_by_the_token_budget() {
    let e = m3_on_h100(VLLM, "", PLAIN);
    let profile = resolve_profile(&e.hardware).unwrap();
    let full = vllm_moe_workspace_bytes(&e, &profile);
    assert_eq!(full, 2.0 * (16384.0 * 4.0 * 6144.0) * 2.0);
    let eagle = m3_on_h100(VLLM, "", EAGLE3);
    assert_eq!(vllm_moe_workspace_bytes(&eagle, &profile), full);
    let small = m3_on_h100("name = \"vllm\"\nmax_num_batched_tokens = 2048", "", PLAIN);
    assert_eq!(vllm_moe_workspace_bytes(&small, &profile), full / 8.0);
    // unset, the budget is vLLM's default for the GPU: 8,192 on an H100, 16,384 from 160 GiB
    let default_h100 = m3_on_h100("name = \"vllm\"", "", PLAIN);
    assert_eq!(
        vllm_moe_workspace_bytes(&default_h100, &profile),
        full / 2.0
    );
    let on_b200 = load(&m3_text("name = \"vllm\"", "", PLAIN).replace("8x-h100", "8x-b200"));
    let b200 = resolve_profile(&on_b200.hardware).unwrap();
    assert_eq!(vllm_moe_workspace_bytes(&on_b200, &b200), full);
    // where a rank's expert intermediate N outgrows the hidden size K, the buffers follow it:
    // M x topk x max(N, K) and M x topk x max(2N, K), N halving as tp doubles
    let mut wide = m3_on_h100(VLLM, "", PLAIN);
    wide.model.moe.as_mut().unwrap().moe_intermediate_size = 32768;
    let pairs = 16384.0 * 4.0;
    assert_eq!(
        vllm_moe_workspace_bytes(&wide, &profile),
        (pairs * 6144.0 + pairs * 8192.0) * 2.0
    );
    wide.tp_size = 4;
    assert_eq!(
        vllm_moe_workspace_bytes(&wide, &profile),
        (pairs * 8192.0 + pairs * 16384.0) * 2.0
    );
    let dense = load(
        "name = \"t\"\nseed = 5\n[model]\npreset = \"llama-3.1-8b\"\n[hardware]\npreset = \"8x-h100\"\n\
         [engine]\nname = \"vllm\"\n[server]\ntp_size = 1\n[workload]\nmax_tokens = 8\ninput_len = 64\n\
         [benchmark]\nconcurrency = [1]\nrequests_per_level = 1\n",
    );
    assert_eq!(vllm_moe_workspace_bytes(&dense, &profile), 0.0);
}

/// A context that no longer fits after what the profile run holds back is refused with both
/// levers named.
#[test]
fn a_refusal_names_the_levers_that_shrink_what_the_profile_run_holds_back() {
    let e =
        load(&m3_text(VLLM, "", EAGLE3).replace("max_model_len = 9472", "max_model_len = 400000"));
    let profile = resolve_profile(&e.hardware).unwrap();
    let err = kv_pool(&e, &profile, ModelRunner::V1).expect_err("refused");
    let message = err.to_string();
    for lever in [
        "vLLM would not start",
        "lower server.max_running_requests (vLLM's --max-num-seqs, now 1024)",
        "lower engine.max_num_batched_tokens",
    ] {
        assert!(message.contains(lever), "{lever}: {message}");
    }
}

/// The engine profile names the runner: a vLLM profile for a Model Runner V2 release sizes
/// the pool with V2's sampler, and an SGLang profile that names one is refused.
#[test]
fn the_engine_profile_names_the_runner_that_sizes_the_pool() {
    let e = m3_on_h100(VLLM, "", PLAIN);
    let hw = resolve_profile(&e.hardware).unwrap();
    let shipped = kbench_sim::presets::engine_preset("vllm-minimax-m3-h200").unwrap();
    let text =
        shipped.to_toml_string().unwrap() + "\n[memory]\nmodel_runner = \"v2\"\nref = \"t\"\n";
    let v2 = EngineProfile::from_toml_str(&text, "v2.toml").unwrap();
    let tables = kbench_sim::presets::load_tables(&hw).unwrap();
    let v1_pool =
        kbench_sim::SimBackend::with_profiles(&e, hw.clone(), shipped, tables.clone(), None)
            .unwrap()
            .kv_pool()
            .clone();
    let v2_pool = kbench_sim::SimBackend::with_profiles(&e, hw, v2, tables, None)
        .unwrap()
        .kv_pool()
        .clone();
    assert_eq!(
        v2_pool.sampler_profile_bytes,
        1024.0 * 200_064.0 * kbench_sim::kv::V2_SAMPLER_PROFILE_BYTES_PER_LOGIT
    );
    assert_eq!(v2_pool.moe_workspace_bytes, v1_pool.moe_workspace_bytes);
    assert!(v2_pool.tokens > v1_pool.tokens);

    let sglang = kbench_sim::presets::engine_preset("sglang").unwrap();
    let text =
        sglang.to_toml_string().unwrap() + "\n[memory]\nmodel_runner = \"v2\"\nref = \"t\"\n";
    let err = EngineProfile::from_toml_str(&text, "s.toml")
        .unwrap_err()
        .to_string();
    assert!(err.contains("model_runner is vLLM's"), "{err}");
}
