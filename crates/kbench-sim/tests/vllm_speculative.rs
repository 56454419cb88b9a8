//! vLLM's speculative decoding in the simulator: the shipped experiment's variants run,
//! EAGLE-3 beats plain decoding at low load, a uniform decode step is priced as a chain
//! round, and n-gram steps without a match decode one token.

use std::path::Path;

use kbench_core::experiment::load_experiment;
use kbench_sim::{acceptance_for, SimBackend};

fn variants() -> Vec<kbench_core::experiment::Variant> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../experiments/vllm_eagle3.toml");
    // one short level keeps the test fast
    let set = [
        "benchmark.concurrency=[1]".to_string(),
        "benchmark.requests_per_level=8".to_string(),
        "workload.max_tokens=256".to_string(),
    ];
    load_experiment(&path, &set).unwrap()
}

/// (output tok/s, accept length) at C=1.
fn at_c1(name: &str) -> (f64, Option<f64>) {
    let e = exp(name);
    let mut b = SimBackend::new(&e, acceptance_for(&e).unwrap()).unwrap();
    let (_, p) = kbench_sim::predict::run(&e, &mut b).unwrap();
    (p.output_throughput[0].1, p.accept_length[0].1)
}

fn exp(name: &str) -> kbench_core::experiment::Experiment {
    variants()
        .into_iter()
        .find(|v| v.name.as_deref() == Some(name))
        .unwrap()
        .experiment
}

#[test]
fn eagle3_beats_plain_at_c1_on_both_boxes() {
    for (plain, spec) in [("plain", "eagle3-k3"), ("h200-plain", "h200-eagle3-k3")] {
        let speedup = at_c1(spec).0 / at_c1(plain).0;
        assert!(
            speedup > 1.3 && speedup < 2.76,
            "{spec}: speedup {speedup:.2} (accept length 2.76 bounds it)"
        );
    }
}

#[test]
fn ngram_proposes_nothing_on_unmatched_steps() {
    let accept = at_c1("ngram-k3").1.unwrap();
    // half the steps match (2.17 tokens each), the others decode one; the accept length
    // counts drafted steps only, as vLLM's 1 + accepted / drafts does (with the undrafted
    // steps counted as rounds it would be about 1.59)
    assert!((accept - 2.17).abs() < 0.12, "accept {accept}");
}

#[test]
fn uniform_vllm_step_is_a_chain_round() {
    let e = exp("eagle3-k3");
    let b = SimBackend::new(&e, acceptance_for(&e).unwrap()).unwrap();
    let cost = b.cost_model();
    let step = kbench_sim::VllmStep {
        decode_requests: 8,
        decode_tokens: 32,
        drafting_requests: 8,
        ctx: 2000.0,
    };
    let vllm = cost.vllm_step_ns(&step, &[], Some(&e.speculative)).unwrap();
    let chain = cost.round_ns(8, 2000.0, Some(&e.speculative)).unwrap();
    assert_eq!(vllm, chain);
}

/// Mean TTFT at C=1 of one variant with prompts of `prompt` tokens and no prefix cache.
fn ttft_ms(name: &str, prompt: u32) -> f64 {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../experiments/vllm_eagle3.toml");
    let set = [
        "benchmark.concurrency=[1]".to_string(),
        "benchmark.requests_per_level=2".to_string(),
        "benchmark.warmup_requests=0".to_string(),
        "workload.max_tokens=4".to_string(),
        format!("workload.input_len={prompt}"),
        "server.prefix_caching=false".to_string(),
        "engine.max_num_batched_tokens=8192".to_string(),
    ];
    let e = load_experiment(&path, &set)
        .unwrap()
        .into_iter()
        .find(|v| v.name.as_deref() == Some(name))
        .unwrap()
        .experiment;
    let mut b = SimBackend::new(&e, acceptance_for(&e).unwrap()).unwrap();
    let (levels, _) = kbench_sim::predict::run(&e, &mut b).unwrap();
    levels[0].metrics.mean_ttft_ms
}

#[test]
fn every_chunk_of_a_long_prompt_pays_the_drafts_prefill() {
    // vLLM's runner proposes on every step that fits the drafter, a step carrying only a
    // prompt's chunk too: the draft needs the chunk's KV (GPUModelRunner.sample_tokens).
    let e = exp("eagle3-k3");
    let b = SimBackend::new(&e, acceptance_for(&e).unwrap()).unwrap();
    let cost = b.cost_model();
    let chunk_only = |drafting: u32| {
        let step = kbench_sim::VllmStep {
            decode_requests: 0,
            decode_tokens: 0,
            drafting_requests: drafting,
            ctx: 0.0,
        };
        let part = kbench_sim::cost::PrefillPart {
            new_tokens: 8192,
            cached: 8192,
        };
        cost.vllm_step_ns(&step, &[part], Some(&e.speculative))
            .unwrap()
    };
    let draft_per_chunk_ms = (chunk_only(1) - chunk_only(0)) as f64 / 1e6;
    assert!(draft_per_chunk_ms > 1.0, "{draft_per_chunk_ms} ms");
    // a 32,768-token prompt is four 8,192-token chunks, and EAGLE-3 adds the draft to each
    let added = ttft_ms("eagle3-k3", 32768) - ttft_ms("plain", 32768);
    assert!(
        added > 3.5 * draft_per_chunk_ms && added < 6.0 * draft_per_chunk_ms,
        "EAGLE-3 adds {added:.1} ms to the TTFT, {draft_per_chunk_ms:.1} ms a chunk"
    );
}
