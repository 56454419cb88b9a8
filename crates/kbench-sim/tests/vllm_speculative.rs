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
