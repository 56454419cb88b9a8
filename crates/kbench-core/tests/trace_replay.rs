//! Trace replay: chains exactly as greedy verification on the recorded tree, trees
//! between their documented bounds, requests mapped to sequences deterministically.

mod common;

use std::sync::Arc;

use common::random_trace;
use kbench_core::acceptance::AcceptanceModel;
use kbench_core::experiment::SpeculativeConfig;
use kbench_core::trace::{
    replay_commit, replay_commit_reference, OffPath, ProbEncoding, TraceAcceptance, TraceError,
};
use kbench_core::tree::TreeShape;
use proptest::prelude::*;

fn tree_shapes(d: u32, k: u32) -> impl Strategy<Value = TreeShape> {
    (1..=d, 1..=k).prop_flat_map(|(steps, topk)| {
        let cands = topk + (steps - 1) * topk * topk;
        (2..=cands + 1).prop_map(move |n| TreeShape::new(steps, topk, n).unwrap())
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn chain_replay_is_greedy_verification(seed in any::<u64>(), d in 1u32..=8, k in 1u32..=8, hit in 0.0f64..1.0) {
        let t = random_trace(seed, d, k, 2, 16, ProbEncoding::Log8, hit);
        for steps in 1..=d {
            let shape = TreeShape::chain(steps).unwrap();
            for s in 0..2 {
                for p in 0..20 {
                    let got = replay_commit(&t, s, p, &shape, OffPath::Proxy);
                    prop_assert_eq!(got, replay_commit_reference(&t, s, p, &shape, OffPath::Proxy));
                    prop_assert!((1..=steps + 1).contains(&got));
                    // Exact: one plus the leading depths where the target was the top-1.
                    let lead = (0..steps as usize).take_while(|&dd| t.rank(s, p % 16, dd) == 0).count() as u32;
                    prop_assert_eq!(got, 1 + lead);
                }
            }
        }
    }

    #[test]
    fn tree_replay_matches_reference_and_bounds(
        seed in any::<u64>(), hit in 0.0f64..1.0,
        (d, k, shape) in (1u32..=4, 1u32..=4).prop_flat_map(|(d, k)| (Just(d), Just(k), tree_shapes(d, k)))
    ) {
        let t = random_trace(seed, d, k, 1, 12, ProbEncoding::Log8, hit);
        for p in 0..12 {
            let mid = replay_commit(&t, 0, p, &shape, OffPath::Proxy);
            prop_assert_eq!(mid, replay_commit_reference(&t, 0, p, &shape, OffPath::Proxy));
            prop_assert!((1..=shape.num_steps + 1).contains(&mid));
            let lo = replay_commit(&t, 0, p, &shape, OffPath::Pessimistic);
            let hi = replay_commit(&t, 0, p, &shape, OffPath::Optimistic);
            // The stand-ins bracket the proxy at every position (docs/tree-replay.md).
            prop_assert!(lo <= mid && mid <= hi, "p {}: {} {} {}", p, lo, mid, hi);
            // Never more than the target's run of in-top-k ranks allows.
            let run = (0..shape.num_steps as usize)
                .take_while(|&dd| u32::from(t.rank(0, p, dd)) < shape.topk)
                .count() as u32;
            prop_assert!(mid <= 1 + run && hi <= 1 + run);
        }
    }
}

#[test]
fn acceptance_model_maps_requests_deterministically() {
    let t = Arc::new(random_trace(9, 4, 4, 5, 7, ProbEncoding::Log8, 0.7));
    let a = TraceAcceptance::new(t.clone(), 42).unwrap();
    let b = TraceAcceptance::new(t.clone(), 42).unwrap();
    let c = TraceAcceptance::new(t.clone(), 43).unwrap();
    let spec = SpeculativeConfig::eagle(3, 1, 4);
    let seqs_a: Vec<usize> = (0..64).map(|id| a.sequence_for(id)).collect();
    let seqs_c: Vec<usize> = (0..64).map(|id| c.sequence_for(id)).collect();
    assert_eq!(
        seqs_a,
        (0..64).map(|id| b.sequence_for(id)).collect::<Vec<_>>()
    );
    assert_ne!(seqs_a, seqs_c);
    assert!(seqs_a.iter().all(|&s| s < 5));
    // Every sequence gets used by some request.
    assert!((0..5).all(|s| seqs_a.contains(&s)));
    for id in 0..16 {
        let s = a.sequence_for(id);
        for pos in 0..7u32 {
            let got = a.round_commit(id, pos, &spec);
            assert_eq!(
                got,
                replay_commit(
                    &t,
                    s,
                    pos as usize,
                    &TreeShape::chain(3).unwrap(),
                    OffPath::Proxy
                )
            );
            // Positions wrap around the sequence.
            assert_eq!(got, a.round_commit(id, pos + 7, &spec));
            assert_eq!(got, a.round_commit(id, pos + 700, &spec));
        }
    }
    assert_eq!(a.round_commit(1, 0, &SpeculativeConfig::none()), 1);
    assert!(
        a.describe().contains("engine-recorded trace `test`"),
        "{}",
        a.describe()
    );
}

#[test]
fn config_beyond_the_recording_is_an_error() {
    let t = Arc::new(random_trace(9, 4, 2, 1, 3, ProbEncoding::Log8, 0.7));
    let a = TraceAcceptance::new(t.clone(), 1).unwrap();
    assert!(a.check(&SpeculativeConfig::eagle(4, 2, 6)).is_ok());
    let deep = a
        .check(&SpeculativeConfig::eagle(5, 1, 6))
        .unwrap_err()
        .to_string();
    assert!(
        deep.contains("num_steps = 5 but the trace recorded depth 4"),
        "{deep}"
    );
    let wide =
        TraceAcceptance::for_spec(t.clone(), 1, &SpeculativeConfig::eagle(3, 4, 8)).unwrap_err();
    assert!(matches!(wide, TraceError::Config { .. }));
    assert!(
        wide.to_string()
            .contains("eagle_topk = 4 but the trace recorded the draft's top-2"),
        "{wide}"
    );
    // Clamped rather than panicking if a caller skipped the check.
    let c = a.round_commit(0, 0, &SpeculativeConfig::eagle(9, 9, 20));
    assert!((1..=5).contains(&c));
}

#[test]
fn hand_built_chain() {
    // Depth 3, one position per sequence; ranks 0,0,2 then 1,0,0.
    let mut t = kbench_core::trace::Trace::new(kbench_core::trace::TraceHeader::new(
        common::provenance(),
        3,
        3,
        ProbEncoding::Linear16,
    ));
    let probs = [0.5, 0.2, 0.1].repeat(6);
    t.push_sequence(0, vec![0, 0, 2, 1, 0, 0], &probs).unwrap();
    let chain = |steps| TreeShape::chain(steps).unwrap();
    assert_eq!(replay_commit(&t, 0, 0, &chain(1), OffPath::Proxy), 2);
    assert_eq!(replay_commit(&t, 0, 0, &chain(2), OffPath::Proxy), 3);
    assert_eq!(replay_commit(&t, 0, 0, &chain(3), OffPath::Proxy), 3);
    assert_eq!(replay_commit(&t, 0, 1, &chain(3), OffPath::Proxy), 1);
    // topk 2 drafts the rank-1 token at depth 0 of position 1: candidates score
    // .5, .2 (on path), then .25, .1 under the off-path beam and .1 (on path), .04 under
    // the on-path beam. 4 draft tokens keep .5, .25, .2: the path stops at depth 1.
    let tree = TreeShape::new(2, 2, 4).unwrap();
    assert_eq!(replay_commit(&t, 0, 1, &tree, OffPath::Proxy), 2);
    // With 5 the on-path .1 ties the off-path .1 and loses on candidate index.
    assert_eq!(
        replay_commit(&t, 0, 1, &TreeShape::new(2, 2, 5).unwrap(), OffPath::Proxy),
        2
    );
    assert_eq!(
        replay_commit(&t, 0, 1, &TreeShape::new(2, 2, 6).unwrap(), OffPath::Proxy),
        3
    );
    // Optimistic: off-path children score 0, so 4 draft tokens already reach depth 2.
    assert_eq!(replay_commit(&t, 0, 1, &tree, OffPath::Optimistic), 3);
}

#[test]
fn shapes_beyond_the_recording_are_clamped_not_panicking() {
    let t = random_trace(11, 2, 2, 1, 5, ProbEncoding::Log8, 0.5);
    for p in 0..5 {
        let wide = replay_commit(&t, 0, p, &TreeShape::new(4, 4, 17).unwrap(), OffPath::Proxy);
        let fitted = replay_commit(&t, 0, p, &TreeShape::new(2, 2, 7).unwrap(), OffPath::Proxy);
        assert_eq!(wide, fitted);
    }
}

/// The commits a `for_spec` acceptance remembers are the ones replay gives, for the shape
/// it was built for and for any other shape asked of it, with either stand-in, through
/// clones that share what was remembered.
#[test]
fn remembered_commits_are_replayed_commits() {
    let t = Arc::new(random_trace(11, 4, 4, 3, 9, ProbEncoding::Log8, 0.6));
    let spec = SpeculativeConfig::eagle(3, 4, 8);
    let other = SpeculativeConfig::eagle(2, 2, 4);
    // the same tree cut at fewer draft tokens: answered from the same remembered ranks
    let fewer = SpeculativeConfig::eagle(3, 4, 5);
    for off_path in [OffPath::Proxy, OffPath::Pessimistic, OffPath::Optimistic] {
        let a = TraceAcceptance::for_spec(t.clone(), 5, &spec)
            .unwrap()
            .with_off_path(off_path);
        let clone = a.clone();
        for round in 0..2 {
            for id in 0..12 {
                let s = a.sequence_for(id);
                for pos in 0..20u32 {
                    let m = if round == 0 { &a } else { &clone };
                    for (spec, shape) in [
                        (&spec, TreeShape::new(3, 4, 8).unwrap()),
                        (&other, TreeShape::new(2, 2, 4).unwrap()),
                        (&fewer, TreeShape::new(3, 4, 5).unwrap()),
                    ] {
                        assert_eq!(
                            m.round_commit(id, pos, spec),
                            replay_commit(&t, s, pos as usize, &shape, off_path),
                            "{off_path:?} request {id} position {pos}"
                        );
                    }
                }
            }
        }
    }
}
