//! vLLM's KV cache is what its profile run leaves: the sampler pass that closes it holds
//! 14 bytes per logit of one row per dummy request, 26 with a rejection sampler, and kbench
//! deducts that from the pool (docs/cost-model.md, "What vLLM's profile run holds back").

use std::path::Path;

use kbench_core::experiment::{load_experiment_str, Experiment};
use kbench_sim::kv::{
    kv_pool, vllm_sampler_profile_bytes, SAMPLER_PROFILE_BYTES_PER_LOGIT,
    SPEC_SAMPLER_PROFILE_BYTES_PER_LOGIT,
};
use kbench_sim::presets::resolve_profile;

const GIB: f64 = (1u64 << 30) as f64;

/// MiniMax-M3 at TP8 on 8x H100, as InferenceX's 8k1k arms launch it.
fn m3_on_h100(engine: &str, server: &str, speculative: &str) -> Experiment {
    let text = format!(
        "name = \"t\"\nseed = 5\n[model]\npreset = \"minimax-m3\"\n[hardware]\npreset = \"8x-h100\"\n\
         [engine]\n{engine}\n[draft]\npreset = \"minimax-m3-eagle3\"\n\
         [server]\ntp_size = 8\nmem_fraction_static = 0.9\nmax_model_len = 9472\n{server}\n\
         [speculative]\n{speculative}\n\
         [workload]\nmax_tokens = 1024\ninput_len = 8192\naccept_length = 2.83\n\
         [benchmark]\nconcurrency = [1]\nrequests_per_level = 2\n"
    );
    load_experiment_str(&text, Path::new("t.toml"), &[])
        .unwrap()
        .remove(0)
        .experiment
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
        vllm_sampler_profile_bytes(&plain, &profile),
        1024.0 * vocab * SAMPLER_PROFILE_BYTES_PER_LOGIT
    );
    let eagle = m3_on_h100(VLLM, "", EAGLE3);
    assert_eq!(
        vllm_sampler_profile_bytes(&eagle, &profile),
        1024.0 * vocab * SPEC_SAMPLER_PROFILE_BYTES_PER_LOGIT
    );
    // --max-num-seqs bounds the rows, and so does a token budget below it
    let fewer = m3_on_h100(VLLM, "max_running_requests = 128", PLAIN);
    assert_eq!(
        vllm_sampler_profile_bytes(&fewer, &profile),
        128.0 * vocab * SAMPLER_PROFILE_BYTES_PER_LOGIT
    );
    let small_budget = m3_on_h100("name = \"vllm\"\nmax_num_batched_tokens = 512", "", PLAIN);
    assert_eq!(
        vllm_sampler_profile_bytes(&small_budget, &profile),
        512.0 * vocab * SAMPLER_PROFILE_BYTES_PER_LOGIT
    );
}

#[test]
fn the_pool_is_the_budget_less_weights_and_the_sampler_under_vllm_only() {
    for speculative in [PLAIN, EAGLE3] {
        let e = m3_on_h100(VLLM, "", speculative);
        let profile = resolve_profile(&e.hardware).unwrap();
        let pool = kv_pool(&e, &profile).unwrap();
        assert!(pool.sampler_profile_bytes > 2.0 * GIB, "{pool:?}");
        let left = pool.gpu_bytes * 0.9 - pool.weight_bytes - pool.sampler_profile_bytes;
        assert!((pool.pool_bytes - left).abs() < 1.0, "{pool:?}");
        let per_token = pool.target_bytes_per_token + pool.draft_bytes_per_token;
        assert_eq!(pool.tokens, (pool.pool_bytes / per_token as f64) as u64);
    }
    // SGLang's reserve is inside mem_fraction_static: nothing more comes off
    let sglang = m3_on_h100("name = \"sglang\"", "", "algorithm = \"none\"");
    let profile = resolve_profile(&sglang.hardware).unwrap();
    let pool = kv_pool(&sglang, &profile).unwrap();
    assert_eq!(pool.sampler_profile_bytes, 0.0);
    assert!((pool.pool_bytes - (pool.gpu_bytes * 0.9 - pool.weight_bytes)).abs() < 1.0);
}

/// InferenceX's M3 8k1k arms on 8x H100 held back about 2.6 GB per GPU more with EAGLE-3 than
/// its draft's weights and KV explain (replayed with capped pools: docs/fidelity.md); the
/// rejection sampler's rows are 2.46 GB of it. Without the sampler term the two arms' pools
/// differ by the draft alone.
#[test]
fn eagle3_holds_back_the_rejection_samplers_rows_beyond_its_draft() {
    let plain = m3_on_h100(VLLM, "", PLAIN);
    let eagle = m3_on_h100(VLLM, "", EAGLE3);
    let profile = resolve_profile(&plain.hardware).unwrap();
    let (p, e) = (
        kv_pool(&plain, &profile).unwrap(),
        kv_pool(&eagle, &profile).unwrap(),
    );
    let draft_weights = e.weight_bytes - p.weight_bytes;
    let beyond_draft = p.pool_bytes - e.pool_bytes - draft_weights;
    assert!(
        (beyond_draft - 2.46e9).abs() < 0.01e9,
        "held back beyond the draft: {beyond_draft}"
    );
    // in tokens, the EAGLE-3 pool is the smaller by more than its draft's 4 KB a token
    assert!(e.tokens < p.tokens * 8 / 10, "{} vs {}", e.tokens, p.tokens);
}
