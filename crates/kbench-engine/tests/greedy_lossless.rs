//! The engine's central property: greedy speculative decoding returns exactly the target's
//! own greedy tokens, for every valid (num_steps, topk, num_draft_tokens), any prompts and
//! batch sizes, on random tiny models.

mod common;

use kbench_core::experiment::VerifyMethod;
use kbench_engine::generate::run_batch;
use kbench_engine::SpeculativeSettings;
use proptest::prelude::*;

fn valid_ndt(steps: u32, topk: u32) -> Vec<u32> {
    if topk == 1 {
        vec![steps + 1]
    } else {
        (2..=topk * steps + 1).collect()
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    /// Each case checks every valid num_draft_tokens for its (steps, topk): 256 cases give
    /// about 1,800 configurations.
    #[test]
    fn greedy_spec_equals_plain_greedy(
        model_seed in 0u64..1000,
        quality in prop_oneof![Just(0.0f32), Just(0.5f32), Just(0.9f32), Just(1.0f32)],
        layers in 2usize..=3,
        vocab in prop_oneof![Just(64usize), Just(128usize)],
        steps in 1u32..=5,
        topk in 1u32..=4,
        batch in 1usize..=3,
        plen in 1usize..=12,
        max_new in 1usize..=12,
    ) {
        let model = common::micro_model(model_seed, quality, layers, vocab);
        let prompts: Vec<(u64, Vec<u32>)> = (0..batch)
            .map(|i| (i as u64, common::prompt(model_seed * 31 + i as u64, plen + i, vocab)))
            .collect();
        let plain = run_batch(&model, prompts.clone(), max_new, 0.0, 0, None).unwrap();
        for ndt in valid_ndt(steps, topk) {
            let cfg = SpeculativeSettings::new(steps, topk, ndt, VerifyMethod::Greedy).unwrap();
            let spec = run_batch(&model, prompts.clone(), max_new, 0.0, 0, Some(&cfg)).unwrap();
            for (p, s) in plain.iter().zip(&spec) {
                prop_assert_eq!(p.output(), s.output(), "steps {} topk {} ndt {}", steps, topk, ndt);
                for &c in &s.round_commits {
                    prop_assert!(c >= 1 && c <= steps + 1);
                }
                prop_assert_eq!(s.round_commits.iter().sum::<u32>() as usize + 1, s.output_len());
            }
        }
    }
}

#[test]
fn tiny_preset_greedy_spec_matches_plain() {
    let model = common::tiny_model(7, 0.9);
    let prompts: Vec<(u64, Vec<u32>)> = (0..4)
        .map(|i| (i, common::prompt(i, 10 + i as usize, 256)))
        .collect();
    let plain = run_batch(&model, prompts.clone(), 40, 0.0, 0, None).unwrap();
    for (steps, topk, ndt) in [(3, 1, 4), (2, 1, 3), (5, 4, 8), (4, 2, 6)] {
        let cfg = SpeculativeSettings::new(steps, topk, ndt, VerifyMethod::Greedy).unwrap();
        let spec = run_batch(&model, prompts.clone(), 40, 0.0, 0, Some(&cfg)).unwrap();
        for (p, s) in plain.iter().zip(&spec) {
            assert_eq!(p.output(), s.output());
        }
    }
}

#[test]
fn draft_quality_spans_acceptance() {
    // Accept length grows with draft quality: unrelated drafts ~1, faithful ones near the max.
    let prompts: Vec<(u64, Vec<u32>)> = (0..4)
        .map(|i| (i, common::prompt(100 + i, 12, 256)))
        .collect();
    let cfg = SpeculativeSettings::new(3, 1, 4, VerifyMethod::Greedy).unwrap();
    let mut prev = 0.0;
    let mut lens = Vec::new();
    for q in [0.0f32, 0.5, 1.0] {
        let model = common::tiny_model(3, q);
        let seqs = run_batch(&model, prompts.clone(), 48, 0.0, 0, Some(&cfg)).unwrap();
        let (sum, n): (u32, usize) = seqs.iter().fold((0, 0), |(s, n), q| {
            (
                s + q.round_commits.iter().sum::<u32>(),
                n + q.round_commits.len(),
            )
        });
        let al = sum as f64 / n as f64;
        lens.push(al);
        assert!(
            al >= prev - 0.05,
            "accept length fell from {prev} to {al} at quality {q}"
        );
        prev = al;
    }
    assert!(lens[0] < 1.5, "{lens:?}");
    assert!(lens[2] > 2.5, "{lens:?}");
}
