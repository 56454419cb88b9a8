//! Greedy verification: accept-length bounds and agreement with the target's argmax.

use kbench_core::seed::derive_seed;
use kbench_core::tree::{build_tree, DraftTree, TreeError, TreeShape};
use kbench_core::verify::{verify_greedy, VerifyError};
use proptest::prelude::*;

const VOCAB: u64 = 6;

fn draft(seed: u64, k: u32, path: &[u32]) -> Vec<(u32, f32)> {
    let mut key = seed;
    for &t in path {
        key = derive_seed(key, "p", u64::from(t));
    }
    // Distinct tokens among siblings, as a real top-k gives.
    let start = derive_seed(key, "start", 0) % VOCAB;
    (0..k)
        .map(|j| {
            (
                ((start + u64::from(j)) % VOCAB) as u32,
                0.5f32.powi(j as i32 + 1),
            )
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn greedy_accepts_the_target_path(
        steps in 1u32..=5, k in 1u32..=3, extra in 0u32..8, seed in any::<u64>(), tseed in any::<u64>()
    ) {
        let cands = k + (steps - 1) * k * k;
        let n = 2 + extra.min(cands - 1);
        let shape = TreeShape::new(steps, k, n).unwrap();
        let tree = build_tree::<TreeError>(shape, 0, |p| Ok(draft(seed, k, p))).unwrap();
        // Target argmax depends on the node's path, like a real model's.
        let argmax: Vec<u32> = (0..tree.len())
            .map(|i| {
                let toks: Vec<u64> = tree.path_to(i).iter().map(|&j| u64::from(tree.nodes[j].token)).collect();
                let h = toks.iter().fold(tseed, |h, &t| derive_seed(h, "t", t));
                (h % VOCAB) as u32
            })
            .collect();
        let out = verify_greedy(&tree, &argmax).unwrap();
        prop_assert!(out.accept_length() >= 1 && out.accept_length() <= steps + 1);
        prop_assert_eq!(out.tokens.len(), out.accepted_nodes.len() + 1);
        let mut parent = 0;
        for (&node, &tok) in out.accepted_nodes.iter().zip(&out.tokens) {
            prop_assert_eq!(tree.nodes[node].parent, Some(parent));
            prop_assert_eq!(tree.nodes[node].token, argmax[parent]);
            prop_assert_eq!(tok, argmax[parent]);
            parent = node;
        }
        // Stopped because no child of the last accepted node matches.
        let last = out.last_node();
        prop_assert!(tree.children(last).iter().all(|&c| tree.nodes[c].token != argmax[last]));
        prop_assert_eq!(*out.tokens.last().unwrap(), argmax[last]);
    }
}

#[test]
fn chain_full_and_partial_acceptance() {
    let tree = DraftTree::chain(5, &[1, 2, 3]);
    let full = verify_greedy(&tree, &[1, 2, 3, 4]).unwrap();
    assert_eq!(full.accepted_nodes, vec![1, 2, 3]);
    assert_eq!(full.tokens, vec![1, 2, 3, 4]);
    let partial = verify_greedy(&tree, &[1, 9, 3, 4]).unwrap();
    assert_eq!(partial.tokens, vec![1, 9]);
    let none = verify_greedy(&tree, &[8, 2, 3, 4]).unwrap();
    assert_eq!(none.tokens, vec![8]);
    assert!(none.accepted_nodes.is_empty());
}

#[test]
fn greedy_rejects_wrong_lengths() {
    let tree = DraftTree::chain(5, &[1, 2]);
    let err = verify_greedy(&tree, &[1, 2]).unwrap_err();
    assert!(matches!(
        err,
        VerifyError::NodeCount {
            expected: 3,
            got: 2,
            ..
        }
    ));
}
