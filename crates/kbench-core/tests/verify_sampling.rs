//! Sampling verification reproduces the target distribution (chi-square, fixed seeds),
//! and the test has the power to see a wrong sampler.

use kbench_core::seed::rng_for;
use kbench_core::tree::{DraftTree, TreeNode};
use kbench_core::verify::{
    sample_from, target_distribution, verify_exact, verify_target_only, SamplingParams, VerifyError,
};

const P: [f32; 6] = [0.35, 0.25, 0.15, 0.12, 0.08, 0.05];
const Q: [f32; 6] = [0.10, 0.40, 0.05, 0.30, 0.10, 0.05];
/// Chi-square critical value, 5 degrees of freedom, p = 0.001.
const CRIT_DF5: f64 = 20.515;
const TRIALS: usize = 20_000;

fn chi_square(counts: &[u64], p: &[f32]) -> f64 {
    let n: u64 = counts.iter().sum();
    counts
        .iter()
        .zip(p)
        .map(|(&c, &pi)| {
            let e = n as f64 * f64::from(pi);
            (c as f64 - e).powi(2) / e
        })
        .sum()
}

/// Root with `children` (tokens) at depth 1, each with one child at depth 2.
fn two_level_tree(children: &[u32]) -> DraftTree {
    let mut nodes = vec![TreeNode {
        token: 0,
        parent: None,
        depth: 0,
        score: 1.0,
        candidate: None,
    }];
    for &t in children {
        nodes.push(TreeNode {
            token: t,
            parent: Some(0),
            depth: 1,
            score: 0.5,
            candidate: None,
        });
    }
    for i in 0..children.len() {
        nodes.push(TreeNode {
            token: 2,
            parent: Some(i + 1),
            depth: 2,
            score: 0.2,
            candidate: None,
        });
    }
    DraftTree { nodes }
}

#[test]
fn target_only_reproduces_target_on_topk_tree() {
    // SGLang drafts the draft's top-2 deterministically: tokens 1 and 3 under Q.
    let tree = two_level_tree(&[1, 3]);
    let probs = vec![P.to_vec(); tree.len()];
    let mut rng = rng_for(1, "chi2-target-only", 0);
    let mut counts = [0u64; 6];
    let mut total_len = 0;
    for _ in 0..TRIALS {
        let out = verify_target_only(&tree, &probs, &mut rng).unwrap();
        counts[out.tokens[0] as usize] += 1;
        total_len += out.tokens.len();
        assert!(out.tokens.len() <= 3);
    }
    let chi = chi_square(&counts, &P);
    assert!(chi < CRIT_DF5, "chi-square {chi} counts {counts:?}");
    // Depth 1 accepts with P[1] + P[3] = 0.37, depth 2 with P[2] = 0.15.
    let mean = total_len as f64 / TRIALS as f64;
    let expect = 1.0 + 0.37 * (1.0 + 0.15);
    assert!(
        (mean - expect).abs() < 0.02,
        "mean accept length {mean} vs {expect}"
    );
}

#[test]
fn exact_reproduces_target_on_sampled_chain_and_tree() {
    let mut rng = rng_for(2, "chi2-exact", 0);
    for width in [1usize, 2, 3] {
        let mut counts = [0u64; 6];
        for _ in 0..TRIALS {
            // Children drawn independently from Q, as verify_exact assumes.
            let kids: Vec<u32> = (0..width)
                .map(|_| sample_from(&Q, &mut rng).unwrap() as u32)
                .collect();
            let tree = two_level_tree(&kids);
            let target = vec![P.to_vec(); tree.len()];
            let draft = vec![Q.to_vec(); tree.len()];
            let out = verify_exact(&tree, &target, &draft, &mut rng).unwrap();
            counts[out.tokens[0] as usize] += 1;
        }
        let chi = chi_square(&counts, &P);
        assert!(
            chi < CRIT_DF5,
            "width {width}: chi-square {chi} counts {counts:?}"
        );
    }
}

#[test]
fn chi_square_detects_a_biased_sampler() {
    // Always keeping the sampled draft token gives Q, not P: the test must reject it.
    let mut rng = rng_for(3, "chi2-power", 0);
    let mut counts = [0u64; 6];
    for _ in 0..TRIALS {
        counts[sample_from(&Q, &mut rng).unwrap()] += 1;
    }
    assert!(chi_square(&counts, &P) > CRIT_DF5);
    // And target-only used on sampled drafts is still exact (draft probs unused), while
    // exact sampling fed the wrong q (the draft is really top-k) is not.
    let tree = two_level_tree(&[1, 3]);
    let target = vec![P.to_vec(); tree.len()];
    let draft = vec![Q.to_vec(); tree.len()];
    let mut counts = [0u64; 6];
    for _ in 0..TRIALS {
        let out = verify_exact(&tree, &target, &draft, &mut rng).unwrap();
        counts[out.tokens[0] as usize] += 1;
    }
    assert!(chi_square(&counts, &P) > CRIT_DF5, "{counts:?}");
}

#[test]
fn sampling_is_deterministic_per_seed() {
    let tree = two_level_tree(&[1, 3]);
    let probs = vec![P.to_vec(); tree.len()];
    let run = |seed| {
        let mut rng = rng_for(seed, "det", 0);
        (0..50)
            .map(|_| verify_target_only(&tree, &probs, &mut rng).unwrap().tokens)
            .collect::<Vec<_>>()
    };
    assert_eq!(run(4), run(4));
    assert_ne!(run(4), run(5));
}

#[test]
fn greedy_target_makes_target_only_greedy() {
    let tree = DraftTree::chain(0, &[1, 2, 3]);
    let one_hot = |t: usize| {
        let mut v = vec![0.0; 6];
        v[t] = 1.0;
        v
    };
    let probs = vec![one_hot(1), one_hot(2), one_hot(5), one_hot(4)];
    let mut rng = rng_for(6, "greedy", 0);
    for _ in 0..100 {
        let out = verify_target_only(&tree, &probs, &mut rng).unwrap();
        assert_eq!(out.tokens, vec![1, 2, 5]);
        assert_eq!(out.accepted_nodes, vec![1, 2]);
    }
}

#[test]
fn target_distribution_cuts() {
    let logits = [2.0f32, 1.0, 0.5, 0.0, -1.0];
    let greedy = target_distribution(&logits, &SamplingParams::GREEDY).unwrap();
    assert_eq!(greedy, vec![1.0, 0.0, 0.0, 0.0, 0.0]);
    let full = target_distribution(&logits, &SamplingParams::temperature(1.0)).unwrap();
    assert!((full.iter().sum::<f32>() - 1.0).abs() < 1e-5);
    assert!(full.windows(2).all(|w| w[0] > w[1]));
    let k2 = target_distribution(
        &logits,
        &SamplingParams {
            temperature: 1.0,
            top_k: 2,
            top_p: 1.0,
        },
    )
    .unwrap();
    assert_eq!(k2.iter().filter(|&&x| x > 0.0).count(), 2);
    assert!((k2[0] / k2[1] - std::f32::consts::E).abs() < 1e-4);
    // full[0] ~ 0.55, full[0]+full[1] ~ 0.75: top_p 0.6 keeps two tokens.
    let p = target_distribution(
        &logits,
        &SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 0.6,
        },
    )
    .unwrap();
    assert_eq!(p.iter().filter(|&&x| x > 0.0).count(), 2);
    let hot = target_distribution(&logits, &SamplingParams::temperature(0.5)).unwrap();
    assert!(hot[0] > full[0]);
    assert!(matches!(
        target_distribution(&[f32::NAN], &SamplingParams::GREEDY),
        Err(VerifyError::Params(_))
    ));
    assert!(matches!(
        target_distribution(
            &logits,
            &SamplingParams {
                temperature: 1.0,
                top_k: 0,
                top_p: 0.0
            }
        ),
        Err(VerifyError::Params(_))
    ));
}

#[test]
fn sampling_rejects_bad_distributions() {
    let tree = DraftTree::chain(0, &[1]);
    let mut rng = rng_for(7, "bad", 0);
    let short = vec![P.to_vec()];
    assert!(matches!(
        verify_target_only(&tree, &short, &mut rng),
        Err(VerifyError::NodeCount {
            expected: 2,
            got: 1,
            ..
        })
    ));
    let unnormalised = vec![vec![0.5; 6], P.to_vec()];
    let err = verify_target_only(&tree, &unnormalised, &mut rng).unwrap_err();
    assert!(
        matches!(err, VerifyError::BadDistribution { node: 0, .. }),
        "{err}"
    );
    let oov = DraftTree::chain(0, &[9]);
    assert!(matches!(
        verify_target_only(&oov, &[P.to_vec(), P.to_vec()], &mut rng),
        Err(VerifyError::TokenOutOfVocab { token: 9, .. })
    ));
    let mut q0 = Q.to_vec();
    q0[1] = 0.0;
    q0[0] += 0.40;
    assert!(matches!(
        verify_exact(
            &tree,
            &[P.to_vec(), P.to_vec()],
            &[q0.clone(), q0],
            &mut rng
        ),
        Err(VerifyError::ImpossibleDraft { node: 1, token: 1 })
    ));
}

/// Target at node 1 (after the first drafted token): a different distribution, so the
/// second committed token must follow it, not the root's.
const P1: [f32; 6] = [0.05, 0.10, 0.40, 0.05, 0.30, 0.10];
const Q1: [f32; 6] = [0.30, 0.10, 0.20, 0.20, 0.10, 0.10];

#[test]
fn second_token_follows_the_target_given_the_first() {
    // Chain root -> a -> b. When the first drafted token is accepted, the second
    // committed token (accepted b, or the residual/bonus sample) must be ~ P1.
    for method in ["target_only", "exact"] {
        let mut rng = rng_for(8, method, 0);
        let mut counts = [0u64; 6];
        while counts.iter().sum::<u64>() < TRIALS as u64 {
            let (a, b) = if method == "exact" {
                (
                    sample_from(&Q, &mut rng).unwrap() as u32,
                    sample_from(&Q1, &mut rng).unwrap() as u32,
                )
            } else {
                (1, 2)
            };
            let tree = DraftTree::chain(0, &[a, b]);
            let target = vec![P.to_vec(), P1.to_vec(), P.to_vec()];
            let out = if method == "exact" {
                let draft = vec![Q.to_vec(), Q1.to_vec(), Q.to_vec()];
                verify_exact(&tree, &target, &draft, &mut rng).unwrap()
            } else {
                verify_target_only(&tree, &target, &mut rng).unwrap()
            };
            if out.accepted_nodes.first() == Some(&1) {
                counts[out.tokens[1] as usize] += 1;
            }
        }
        let chi = chi_square(&counts, &P1);
        assert!(
            chi < CRIT_DF5,
            "{method}: chi-square {chi} counts {counts:?}"
        );
    }
}
