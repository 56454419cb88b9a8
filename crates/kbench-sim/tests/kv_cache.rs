//! The KV cache in the simulator: the pool is never overfilled, every request finishes
//! (retracted ones later) with the tokens it should produce, a shared prefix is prefilled
//! once with prefix caching, and long prompts are prefilled in chunks.

use std::path::Path;
use std::sync::Arc;

use kbench_core::acceptance::AcceptanceModel;
use kbench_core::experiment::{load_experiment_str, Experiment};
use kbench_core::harness::{run_levels, LevelResult, NoProgress};
use kbench_sim::acceptance::DepthRateAcceptance;
use kbench_sim::engine_profile::ModelRunner;
use kbench_sim::predict::load_plan;
use kbench_sim::SimBackend;
use proptest::prelude::*;

fn experiment(server: &str, workload: &str, benchmark: &str) -> Experiment {
    let text = format!(
        "name = \"t\"\nseed = 11\n[model]\npreset = \"kimi-k2.5\"\n[hardware]\npreset = \"8x-rtx-pro-6000-server\"\n\
         [server]\ntp_size = 8\n{server}\n[draft]\npreset = \"kimi-k2.5-eagle3\"\n\
         [speculative]\nalgorithm = \"EAGLE3\"\nnum_steps = 2\neagle_topk = 1\nnum_draft_tokens = 3\nspec_v2 = true\n\
         [workload]\n{workload}\n[benchmark]\n{benchmark}\n"
    );
    load_experiment_str(&text, Path::new("test.toml"), &[])
        .unwrap()
        .remove(0)
        .experiment
}

fn run(exp: &Experiment) -> Vec<LevelResult> {
    let acc: Arc<dyn AcceptanceModel> = Arc::new(DepthRateAcceptance::kimi_chat(7));
    let mut b = SimBackend::new(exp, Some(acc)).unwrap();
    run_levels(&mut b, &load_plan(exp).keeping_records(), &mut NoProgress).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    /// However small the pool, it is never overfilled; every request finishes exactly once
    /// with the tokens its lengths say (retracted ones too), and the run is deterministic.
    #[test]
    fn the_pool_is_never_overfilled_and_nothing_is_lost(
        pool in 900u32..6000,
        clients in 1u32..40,
        input in (1u32..400, 0u32..400),
        output in (1u32..120, 0u32..200),
        ignore_eos in any::<bool>(),
        prefix in 0u32..300,
        caching in any::<bool>(),
        chunk in proptest::option::of(64i64..600),
        rate in proptest::option::of(1.0f64..60.0),
    ) {
        let max_tokens = output.0 + output.1;
        let server = format!(
            "max_total_tokens = {pool}\nprefix_caching = {caching}\nchunked_prefill_size = {}\nmem_fraction_static = 0.85",
            chunk.unwrap_or(-1)
        );
        let workload = format!(
            "max_tokens = {max_tokens}\ninput_len_range = [{}, {}]\noutput_len_range = [{}, {max_tokens}]\nignore_eos = {ignore_eos}\nshared_prefix_len = {prefix}",
            input.0, input.0 + input.1, output.0
        );
        let levels = match rate {
            Some(r) => format!("request_rate = [{r}]\nmax_concurrency = {clients}"),
            None => format!("concurrency = [{clients}]"),
        };
        let benchmark = format!("{levels}\nrequests_per_level = 24\nwarmup_requests = 2");
        let exp = experiment(&server, &workload, &benchmark);
        let need = exp.input_len.1 + max_tokens + 5;
        prop_assume!(need <= pool);
        let plan = load_plan(&exp).keeping_records();
        let levels = run(&exp);
        let l = &levels[0];
        let m = &l.metrics;
        prop_assert_eq!(m.kv_cache_tokens, Some(pool as u64));
        let peak = m.peak_kv_cache_usage.unwrap();
        prop_assert!(peak <= 1.0, "peak usage {}", peak);
        prop_assert_eq!(m.completed, 24);
        let mut ids: Vec<u64> = l.records.iter().map(|r| r.id).collect();
        ids.sort_unstable();
        ids.dedup();
        prop_assert_eq!(ids.len(), 26);
        for r in &l.records {
            let lengths = plan.workload.request(plan.seed, r.id);
            prop_assert_eq!(r.input_len, lengths.input_len);
            prop_assert_eq!(r.requested_tokens, lengths.max_tokens);
            prop_assert_eq!(
                r.output_tokens(),
                lengths.stop_at.unwrap_or(lengths.max_tokens),
                "request {}", r.id
            );
            prop_assert!(r.retractions.is_some());
            prop_assert!(r.token_times_ns.windows(2).all(|w| w[0] <= w[1]));
        }
        prop_assert_eq!(
            m.num_retractions,
            Some(l.records.iter().filter(|r| !r.warmup).map(|r| r.retractions.unwrap() as u64).sum())
        );
        let again = run(&exp);
        prop_assert_eq!(&again[0].records, &l.records);
    }
}

#[test]
fn a_tight_pool_retracts_and_every_request_still_finishes() {
    let exp = experiment(
        "max_total_tokens = 3000",
        "max_tokens = 200\ninput_len = 128",
        "concurrency = [32]\nrequests_per_level = 64\nwarmup_requests = 0",
    );
    let m = &run(&exp)[0].metrics;
    assert!(m.num_retractions.unwrap() > 0, "{m:?}");
    assert_eq!(m.completed, 64);
    assert_eq!(m.total_output_tokens, 64 * 200);
    // a roomy pool admits all 32 at once and never retracts
    let roomy = experiment(
        "",
        "max_tokens = 200\ninput_len = 128",
        "concurrency = [32]\nrequests_per_level = 64\nwarmup_requests = 0",
    );
    let r = &run(&roomy)[0].metrics;
    assert_eq!(r.num_retractions, Some(0));
    assert!(r.output_throughput > m.output_throughput * 1.2);
}

#[test]
fn requests_that_meet_eos_produce_less_than_they_ask() {
    let exp = experiment(
        "",
        "max_tokens = 100\ninput_len = 64\noutput_len_range = [10, 60]\nignore_eos = false",
        "concurrency = [4]\nrequests_per_level = 16\nwarmup_requests = 0",
    );
    let m = &run(&exp)[0].metrics;
    assert_eq!(m.requested_output_tokens, Some(16 * 100));
    assert!(m.total_output_tokens >= 16 * 10 && m.total_output_tokens <= 16 * 60);
    let asks_what_it_gets = experiment(
        "",
        "max_tokens = 100\ninput_len = 64\noutput_len_range = [10, 60]",
        "concurrency = [4]\nrequests_per_level = 16\nwarmup_requests = 0",
    );
    let m2 = &run(&asks_what_it_gets)[0].metrics;
    assert_eq!(m2.requested_output_tokens, None);
    // the same drawn lengths either way
    assert_eq!(m2.total_output_tokens, m.total_output_tokens);
}

#[test]
fn a_cached_shared_prefix_is_prefilled_once() {
    let run_with = |caching: bool| {
        let exp = experiment(
            &format!("prefix_caching = {caching}"),
            "max_tokens = 32\ninput_len = 64\nshared_prefix_len = 8000",
            "concurrency = [1]\nrequests_per_level = 8\nwarmup_requests = 1",
        );
        run(&exp)[0].metrics.clone()
    };
    let (on, off) = (run_with(true), run_with(false));
    // the warm-up request prefilled the prefix: measured prompts prefill 64 tokens
    assert!(
        on.median_ttft_ms * 5.0 < off.median_ttft_ms,
        "{} vs {}",
        on.median_ttft_ms,
        off.median_ttft_ms
    );
    // and the cache holds one copy: 8 requests' worth of prompts would not fit this pool
    let exp = experiment(
        "max_total_tokens = 12000",
        "max_tokens = 32\ninput_len = 64\nshared_prefix_len = 8000",
        "concurrency = [8]\nrequests_per_level = 8\nwarmup_requests = 0",
    );
    let m = &run(&exp)[0].metrics;
    assert_eq!(m.num_retractions, Some(0));
    assert!(m.peak_kv_cache_usage.unwrap() < 0.8, "{m:?}");
}

#[test]
fn long_prompts_are_prefilled_in_chunks_at_about_the_same_cost() {
    let ttft = |chunk: i64| {
        let exp = experiment(
            // SGLang's default memory fraction reserves a whole unchunked prefill's
            // activations, which leaves Kimi-K2.5 no KV cache on this GPU
            &format!("chunked_prefill_size = {chunk}\nmem_fraction_static = 0.85"),
            "max_tokens = 8\ninput_len = 20000",
            "concurrency = [1]\nrequests_per_level = 2\nwarmup_requests = 0",
        );
        run(&exp)[0].metrics.median_ttft_ms
    };
    let (whole, chunked) = (ttft(-1), ttft(4096));
    // five chunks: the same attention in all (A(p + c) - A(p) sums to A(n)), the GEMMs
    // of five smaller passes
    let ratio = chunked / whole;
    assert!((0.8..1.3).contains(&ratio), "{chunked} vs {whole}");
}

fn plain_experiment(server: &str, engine: &str, workload: &str, benchmark: &str) -> Experiment {
    let text = format!(
        "name = \"t\"\nseed = 11\n[model]\npreset = \"kimi-k2.5\"\n[hardware]\npreset = \"8x-h200\"\n\
         {engine}\n[server]\ntp_size = 8\n{server}\n[workload]\n{workload}\n[benchmark]\n{benchmark}\n"
    );
    load_experiment_str(&text, Path::new("test.toml"), &[])
        .unwrap()
        .remove(0)
        .experiment
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    /// vLLM's steps (one token budget for decodes and prefill chunks, preemption of the
    /// latest admitted): the pool is never overfilled and every request finishes with its
    /// tokens.
    #[test]
    fn vllm_steps_never_overfill_and_lose_nothing(
        pool in 600u32..5000,
        budget in 16u32..1200,
        clients in 1u32..40,
        input in (1u32..300, 0u32..300),
        output in (1u32..100, 0u32..100),
        prefix in 0u32..200,
        caching in any::<bool>(),
    ) {
        let max_tokens = output.0 + output.1;
        let exp = plain_experiment(
            &format!("max_total_tokens = {pool}\nprefix_caching = {caching}"),
            &format!("[engine]\nname = \"vllm\"\nmax_num_batched_tokens = {budget}"),
            &format!(
                "max_tokens = {max_tokens}\ninput_len_range = [{}, {}]\noutput_len_range = [{}, {max_tokens}]\nshared_prefix_len = {prefix}",
                input.0, input.0 + input.1, output.0
            ),
            &format!("concurrency = [{clients}]\nrequests_per_level = 24\nwarmup_requests = 0"),
        );
        prop_assume!(exp.input_len.1 + max_tokens < pool);
        let plan = load_plan(&exp).keeping_records();
        let mut b = SimBackend::new(&exp, None).unwrap();
        let levels = run_levels(&mut b, &plan, &mut NoProgress).unwrap();
        let l = &levels[0];
        prop_assert!(l.metrics.peak_kv_cache_usage.unwrap() <= 1.0);
        prop_assert_eq!(l.metrics.completed, 24);
        for r in &l.records {
            let want = plan.workload.request(plan.seed, r.id);
            prop_assert_eq!(r.output_tokens(), want.max_tokens);
            prop_assert!(r.token_times_ns.windows(2).all(|w| w[0] <= w[1]));
        }
    }
}

#[test]
fn vllm_mixes_prefill_into_decode_steps_where_sglang_stalls_them() {
    // 8 clients decoding while new 8k prompts arrive: SGLang's prefill-first scheduler
    // stalls every running decode for a whole prompt; vLLM with a 2048-token budget runs
    // a quarter of it beside the decodes in each step
    let run_with = |engine: &str| {
        let exp = plain_experiment(
            "",
            engine,
            "max_tokens = 256\ninput_len = 8192\nrange_ratio = 0.5",
            "concurrency = [8]\nrequests_per_level = 48\nwarmup_requests = 0",
        );
        let mut b = SimBackend::new(&exp, None).unwrap();
        run_levels(&mut b, &load_plan(&exp).keeping_records(), &mut NoProgress).unwrap()[0]
            .metrics
            .clone()
    };
    let (sglang, vllm) = (
        run_with(""),
        run_with("[engine]\nname = \"vllm\"\nmax_num_batched_tokens = 2048"),
    );
    assert!(
        vllm.p99_itl_ms * 2.0 < sglang.p99_itl_ms,
        "{} vs {}",
        vllm.p99_itl_ms,
        sglang.p99_itl_ms
    );
    // the prompt now takes four steps, each also carrying the decodes
    assert!(vllm.median_ttft_ms > sglang.median_ttft_ms);
    assert_eq!(vllm.completed, 48);
}

#[test]
fn engine_settings_that_do_not_apply_are_refused() {
    let text = |engine: &str, spec: &str| {
        format!(
            "name = \"t\"\n[model]\npreset = \"kimi-k2.5\"\n[hardware]\npreset = \"8x-h200\"\n{engine}\n[server]\ntp_size = 8\n\
             [draft]\npreset = \"kimi-k2.5-eagle3\"\n{spec}\n[workload]\nmax_tokens = 8\ninput_len = 8\n[benchmark]\nconcurrency = [1]\nrequests_per_level = 1\n"
        )
    };
    let eagle = "[speculative]\nalgorithm = \"EAGLE3\"\nnum_steps = 2\neagle_topk = 1\nnum_draft_tokens = 3";
    for (engine, spec, want) in [
        (
            "[engine]\nname = \"vllm\"",
            eagle,
            "are SGLang's; vLLM's --speculative-config names a `method`",
        ),
        (
            "[engine]\nname = \"sglang\"\nmax_num_batched_tokens = 8",
            "",
            "is vLLM's",
        ),
        ("[engine]\nname = \"trtllm\"", "", "unknown engine"),
    ] {
        let e = load_experiment_str(&text(engine, spec), Path::new("t.toml"), &[]).unwrap_err();
        assert!(e.to_string().contains(want), "{want}: {e}");
    }
}

/// vLLM sizes its cache from `--gpu-memory-utilization` (0.92 unless set, vLLM 0.32's
/// `CacheConfig` default), not SGLang's
/// per-GPU default, and will not start unless one request of max_model_len fits it.
#[test]
fn vllm_sizes_its_cache_at_its_own_default_and_needs_room_for_max_model_len() {
    let vllm = "[engine]\nname = \"vllm\"";
    let workload = "max_tokens = 64\ninput_len = 512";
    let benchmark = "concurrency = [1]\nrequests_per_level = 2";
    let profile = kbench_sim::presets::resolve_profile(
        &plain_experiment("", vllm, workload, benchmark).hardware,
    )
    .unwrap();
    let h200 = plain_experiment("", vllm, workload, benchmark);
    let pool = kbench_sim::kv::kv_pool(&h200, &profile, ModelRunner::V1).unwrap();
    assert_eq!(pool.mem_fraction_static, 0.92);
    assert!(
        pool.mem_fraction_origin.contains("vLLM"),
        "{}",
        pool.mem_fraction_origin
    );
    let sglang = plain_experiment("", "", workload, benchmark);
    let sglang_pool = kbench_sim::kv::kv_pool(&sglang, &profile, ModelRunner::V1).unwrap();
    assert!(sglang_pool.mem_fraction_static < 0.9);
    // vLLM's share is the larger before its profile run takes its part
    assert!(pool.pool_bytes + pool.held_back_bytes() > sglang_pool.pool_bytes);
    assert_eq!(sglang_pool.held_back_bytes(), 0.0);

    // Kimi-K2.5's 262,144-token context needs 17 GiB of BF16 KV per GPU on the RTX PRO 6000
    // box, where 0.92 leaves about 13 once vLLM's profile run has held back its part
    let on_rtx = |server: &str| {
        let text = format!(
            "name = \"t\"\nseed = 11\n[model]\npreset = \"kimi-k2.5\"\n[hardware]\npreset = \"8x-rtx-pro-6000-server\"\n\
             {vllm}\n[server]\ntp_size = 8\n{server}\n[workload]\n{workload}\n[benchmark]\n{benchmark}\n"
        );
        load_experiment_str(&text, Path::new("test.toml"), &[])
            .unwrap()
            .remove(0)
            .experiment
    };
    let err = SimBackend::new(&on_rtx(""), None).err().expect("refused");
    let message = err.to_string();
    assert!(
        message.contains("vLLM would not start") && message.contains("max_model_len 262144"),
        "{message}"
    );
    assert!(SimBackend::new(&on_rtx("max_model_len = 131072"), None).is_ok());
    // the rtx6kpro recipe: 0.94 with an FP8 cache and --max-num-seqs 128; in BF16 what the
    // profile run keeps (this box's profile names Model Runner V2, so that is its MoE
    // workspace) leaves too little, and the lever is named
    let err = SimBackend::new(&on_rtx("mem_fraction_static = 0.94"), None)
        .err()
        .expect("refused");
    assert!(
        err.to_string()
            .contains("lower engine.max_num_batched_tokens"),
        "{err}"
    );
    assert!(SimBackend::new(
        &on_rtx(
            "mem_fraction_static = 0.94\nmax_running_requests = 128\nkv_cache_dtype = \"fp8_e4m3\""
        ),
        None
    )
    .is_ok());
    // SGLang caps what it admits instead of refusing to start
    let text = format!(
        "name = \"t\"\nseed = 11\n[model]\npreset = \"kimi-k2.5\"\n[hardware]\npreset = \"8x-rtx-pro-6000-server\"\n\
         [server]\ntp_size = 8\nmem_fraction_static = 0.88\n[workload]\n{workload}\n[benchmark]\n{benchmark}\n"
    );
    let exp = load_experiment_str(&text, Path::new("test.toml"), &[])
        .unwrap()
        .remove(0)
        .experiment;
    assert!(SimBackend::new(&exp, None).is_ok());
}

/// vLLM's one pool holds the drafter's layers beside the target's, so a token costs both
/// there, and a request's lookahead slots come out of it; SGLang's draft worker has a pool
/// of its own, so its target pool counts the target's KV alone, plus headroom for draft and
/// verify tokens. MiniMax-M3 adds its index keys: one 128-wide BF16 key per token in
/// each of its 57 sparse layers.
#[test]
fn a_pool_token_costs_what_the_engine_keeps_per_token() {
    let text = |engine: &str, draft: &str| {
        format!(
            "name = \"t\"\nseed = 11\n[model]\npreset = \"kimi-k2.5\"\n[hardware]\npreset = \"8x-h200\"\n\
             {engine}\n[server]\ntp_size = 8\nmem_fraction_static = 0.9\n{draft}\n\
             [workload]\nmax_tokens = 64\ninput_len = 512\n[benchmark]\nconcurrency = [1]\nrequests_per_level = 2\n"
        )
    };
    let eagle = "[draft]\npreset = \"kimi-k2.5-eagle3\"\n[speculative]\nalgorithm = \"EAGLE3\"\n\
                 num_steps = 3\neagle_topk = 1\nnum_draft_tokens = 4\nspec_v2 = true";
    let vllm_eagle = "[draft]\npreset = \"kimi-k2.5-eagle3\"\n[speculative]\nmethod = \"eagle3\"\n\
                      num_speculative_tokens = 3";
    let load = |t: String| {
        load_experiment_str(&t, Path::new("test.toml"), &[])
            .unwrap()
            .remove(0)
            .experiment
    };
    let profile = kbench_sim::presets::resolve_profile(&load(text("", "")).hardware).unwrap();
    let pool = |t: String| kbench_sim::kv::kv_pool(&load(t), &profile, ModelRunner::V1).unwrap();
    let vllm = "[engine]\nname = \"vllm\"";
    let (plain, spec) = (pool(text(vllm, "")), pool(text(vllm, vllm_eagle)));
    assert!(spec.draft_bytes_per_token > 0);
    let per_token = (spec.target_bytes_per_token + spec.draft_bytes_per_token) as f64;
    // vLLM takes lookahead slots from the pool itself, adding no headroom
    assert_eq!(spec.speculative_slots, 0);
    assert_eq!(spec.tokens, (spec.pool_bytes / per_token) as u64);
    assert!(spec.tokens < plain.tokens);
    let sglang = pool(text("", eagle));
    // SGLang's draft_runner_cache_size: max_running x (steps x topk + draft tokens) + 100
    assert!(sglang.speculative_slots > 100);
    let expect = (sglang.pool_bytes / sglang.target_bytes_per_token as f64) as u64
        + sglang.speculative_slots;
    assert_eq!(sglang.tokens, expect);

    let m3 = kbench_core::arch::ModelArch::preset("minimax-m3").unwrap();
    let mut dense = m3.clone();
    dense.sparse_attention = None;
    let dtype = kbench_core::experiment::KvCacheDtype::default();
    let with_keys = kbench_sim::kv::target_bytes_per_token(&m3, 8, dtype);
    let without = kbench_sim::kv::target_bytes_per_token(&dense, 8, dtype);
    assert_eq!(with_keys - without, 57 * 128 * 2);
}

#[test]
fn vllm_admits_a_long_prompt_only_when_all_of_it_fits() {
    // two 30k-token prompts, a 40k-token pool and an 8k budget: the second one's first chunk
    // fits beside the first prompt, all of it does not, so vLLM 0.32 keeps it waiting
    // (`scheduler_reserve_full_isl`) rather than admit it and preempt it when the cache
    // runs out
    let exp = plain_experiment(
        "max_total_tokens = 40000\nprefix_caching = false",
        "[engine]\nname = \"vllm\"\nmax_num_batched_tokens = 8192",
        "max_tokens = 16\ninput_len = 30000",
        "concurrency = [2]\nrequests_per_level = 4\nwarmup_requests = 0",
    );
    let mut b = SimBackend::new(&exp, None).unwrap();
    let levels = run_levels(&mut b, &load_plan(&exp).keeping_records(), &mut NoProgress).unwrap();
    let m = &levels[0].metrics;
    assert_eq!(m.completed, 4);
    assert_eq!(m.num_retractions, Some(0));
    assert!(m.peak_kv_cache_usage.unwrap() <= 1.0);
}

#[test]
fn vllms_async_steps_hold_one_verify_more_per_request() {
    // step N + 1 allocates before step N's rejections return: 1 + K slots for its tokens,
    // K lookahead, and step N's 1 + K still counted as computed; the synchronous n-gram
    // step holds its 1 + K alone, and SGLang's chain its tokens and drafts
    let slots = |engine: &str, spec: &str| {
        let acceptance = if spec.contains("ngram") {
            let trace = Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../traces/ngram-illustrative.synth.kbt");
            format!("trace = {:?}", trace.display().to_string())
        } else {
            "accept_length = 2".to_string()
        };
        let e = load_experiment_str(
            &format!(
                "name = \"t\"\nseed = 11\n[model]\npreset = \"kimi-k2.5\"\n[hardware]\npreset = \"8x-h200\"\n\
                 {engine}\n[server]\ntp_size = 8\n[draft]\npreset = \"kimi-k2.5-eagle3\"\n[speculative]\n{spec}\n\
                 [workload]\nmax_tokens = 64\ninput_len = 512\n{acceptance}\n\
                 [benchmark]\nconcurrency = [1]\nrequests_per_level = 2\n"
            ),
            Path::new("t.toml"),
            &[],
        )
        .unwrap()
        .remove(0)
        .experiment;
        let profile = kbench_sim::presets::resolve_profile(&e.hardware).unwrap();
        kbench_sim::kv::kv_pool(&e, &profile, ModelRunner::V1)
            .unwrap()
            .decode_slots_per_request
    };
    let vllm = "[engine]\nname = \"vllm\"";
    assert_eq!(
        slots(vllm, "method = \"eagle3\"\nnum_speculative_tokens = 3"),
        11
    );
    assert_eq!(
        slots(
            vllm,
            "method = \"ngram\"\nnum_speculative_tokens = 3\nprompt_lookup_min = 2\nprompt_lookup_max = 4"
        ),
        4
    );
    assert_eq!(
        slots(
            "",
            "algorithm = \"EAGLE3\"\nnum_steps = 3\neagle_topk = 1\nnum_draft_tokens = 4\nspec_v2 = true"
        ),
        7
    );
}
