//! Draft tree construction against SGLang's rules and a brute-force reference.

use std::collections::BTreeSet;

use kbench_core::seed::derive_seed;
use kbench_core::tree::{build_tree, DraftTree, TreeBuilder, TreeError, TreeShape};
use proptest::prelude::*;

/// A deterministic draft: top-k after a path of child positions. Probabilities come from
/// a small set so that equal scores (ties) are common.
fn oracle(seed: u64, topk: u32, path: &[u32]) -> Vec<(u32, f32)> {
    const LEVELS: [f32; 5] = [0.5, 0.25, 0.2, 0.1, 0.05];
    let mut key = seed;
    for &p in path {
        key = derive_seed(key, "path", u64::from(p));
    }
    let mut probs: Vec<f32> = (0..topk)
        .map(|j| LEVELS[(derive_seed(key, "prob", u64::from(j)) % 5) as usize])
        .collect();
    probs.sort_by(|a, b| b.total_cmp(a));
    probs
        .into_iter()
        .enumerate()
        // Token encodes the child position so paths can be recovered from tokens.
        .map(|(j, p)| (j as u32, p))
        .collect()
}

/// Brute force: every path of child positions with its score and SGLang candidate index,
/// enumerating the whole k-ary tree level by level and ranking with a full sort.
fn reference(shape: TreeShape, seed: u64) -> BTreeSet<Vec<u32>> {
    let k = shape.topk as usize;
    // (path, score, candidate index)
    let mut all: Vec<(Vec<u32>, f32, usize)> = Vec::new();
    let mut level: Vec<(Vec<u32>, f32, usize)> = oracle(seed, shape.topk, &[])
        .into_iter()
        .enumerate()
        .map(|(j, (_, p))| (vec![j as u32], p, j))
        .collect();
    for depth in 1..=shape.num_steps {
        all.extend(level.iter().cloned());
        if depth == shape.num_steps {
            break;
        }
        let mut ranked = level.clone();
        ranked.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.2.cmp(&b.2)));
        let offset = k + (depth as usize - 1) * k * k;
        let mut next = Vec::new();
        for (rank, (path, score, _)) in ranked.iter().take(k).enumerate() {
            for (j, (_, p)) in oracle(seed, shape.topk, path).into_iter().enumerate() {
                let mut child = path.clone();
                child.push(j as u32);
                next.push((child, score * p, offset + rank * k + j));
            }
        }
        level = next;
    }
    all.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.2.cmp(&b.2)));
    all.into_iter()
        .take(shape.num_draft_tokens as usize - 1)
        .map(|(p, _, _)| p)
        .collect()
}

fn build(shape: TreeShape, seed: u64) -> DraftTree {
    build_tree::<TreeError>(shape, 99, |path| Ok(oracle(seed, shape.topk, path))).unwrap()
}

fn shapes() -> impl Strategy<Value = TreeShape> {
    (1u32..=5, 1u32..=4).prop_flat_map(|(steps, k)| {
        let cands = k + (steps - 1) * k * k;
        (2..=(cands + 1).min(24)).prop_map(move |n| TreeShape::new(steps, k, n).unwrap())
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn tree_invariants(shape in shapes(), seed in any::<u64>()) {
        let tree = build(shape, seed);
        prop_assert_eq!(tree.len(), shape.num_draft_tokens as usize);
        prop_assert!(tree.validate().is_ok());
        prop_assert_eq!(tree.nodes[0].token, 99);
        let mask = tree.ancestor_mask();
        for (i, n) in tree.nodes.iter().enumerate().skip(1) {
            let p = n.parent.unwrap();
            prop_assert!(p < i);
            prop_assert!(n.depth >= 1 && n.depth <= shape.num_steps);
            // Scores never increase along a path.
            prop_assert!(n.score <= tree.nodes[p].score);
            let path: BTreeSet<usize> = tree.path_to(i).into_iter().collect();
            for (j, &m) in mask[i].iter().enumerate() {
                prop_assert_eq!(m, path.contains(&j), "mask[{}][{}]", i, j);
            }
        }
        let pos = tree.positions(10);
        for (n, p) in tree.nodes.iter().zip(pos) {
            prop_assert_eq!(p, 10 + n.depth);
        }
        // Candidate indices ascend, so parents come first the way SGLang sorts them.
        let cands: Vec<usize> = tree.nodes.iter().skip(1).map(|n| n.candidate.unwrap()).collect();
        prop_assert!(cands.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn matches_brute_force(shape in shapes(), seed in any::<u64>()) {
        let tree = build(shape, seed);
        let got: BTreeSet<Vec<u32>> = (1..tree.len())
            .map(|i| tree.path_to(i).into_iter().skip(1).map(|n| tree.nodes[n].token).collect())
            .collect();
        prop_assert_eq!(got, reference(shape, seed));
    }

    #[test]
    fn topk1_is_a_chain(steps in 1u32..=8, seed in any::<u64>()) {
        let tree = build(TreeShape::chain(steps).unwrap(), seed);
        prop_assert_eq!(tree.len(), steps as usize + 1);
        for (i, n) in tree.nodes.iter().enumerate().skip(1) {
            prop_assert_eq!(n.parent, Some(i - 1));
            prop_assert_eq!(n.depth, i as u32);
        }
    }
}

#[test]
fn sglang_example_topk2() {
    // steps 2, topk 2, 4 draft tokens. Root children a=0.6, b=0.4; a -> (c 0.5, d 0.5),
    // b -> (e 0.9, f 0.1). Scores: a .6, b .4, c .3, d .3, e .36, f .04.
    let shape = TreeShape::new(2, 2, 4).unwrap();
    let mut b = TreeBuilder::new(shape, 7).unwrap();
    b.first_step(&[(10, 0.6), (11, 0.4)]).unwrap();
    assert_eq!(
        b.beams().iter().map(|x| x.token).collect::<Vec<_>>(),
        vec![10, 11]
    );
    assert_eq!(b.path_tokens(b.beams()[1].candidate), vec![11]);
    b.expand(&[vec![(12, 0.5), (13, 0.5)], vec![(14, 0.9), (15, 0.1)]])
        .unwrap();
    // Beams after step 1: e (.36) then c (.3, index 2 before d's 3).
    let beams: Vec<u32> = b.beams().iter().map(|x| x.token).collect();
    assert_eq!(beams, vec![14, 12]);
    assert_eq!(b.path_tokens(b.beams()[0].candidate), vec![11, 14]);
    let tree = b.finish().unwrap();
    // Top 3 of {a .6, b .4, c .3, d .3, e .36, f .04} = a, b, e; sorted by index: a, b, e.
    assert_eq!(tree.tokens(), vec![7, 10, 11, 14]);
    assert_eq!(
        tree.nodes.iter().map(|n| n.parent).collect::<Vec<_>>(),
        vec![None, Some(0), Some(0), Some(2)]
    );
    assert_eq!(tree.children(0), vec![1, 2]);
    assert_eq!(tree.path_to(3), vec![0, 2, 3]);
}

#[test]
fn builder_rejects_bad_input() {
    assert!(matches!(
        TreeShape::new(0, 1, 2),
        Err(TreeError::Shape { .. })
    ));
    assert!(matches!(
        TreeShape::new(2, 2, 8),
        Err(TreeError::Shape { .. })
    ));
    let shape = TreeShape::new(2, 2, 3).unwrap();
    let mut b = TreeBuilder::new(shape, 0).unwrap();
    assert!(matches!(b.expand(&[]), Err(TreeError::Order { .. })));
    assert!(matches!(
        b.first_step(&[(1, 0.5)]),
        Err(TreeError::WrongCount {
            expected: 2,
            got: 1,
            ..
        })
    ));
    assert!(matches!(
        b.first_step(&[(1, 0.5), (2, f32::NAN)]),
        Err(TreeError::BadProbability { .. })
    ));
    b.first_step(&[(1, 0.5), (2, 0.3)]).unwrap();
    assert!(matches!(b.clone().finish(), Err(TreeError::Order { .. })));
    assert!(matches!(
        b.expand(&[vec![(3, 1.5), (4, 0.1)], vec![(5, 0.1), (6, 0.1)]]),
        Err(TreeError::BadProbability { prob, .. }) if prob == 1.5
    ));
    b.expand(&[vec![(3, 0.5), (4, 0.1)], vec![(5, 0.1), (6, 0.1)]])
        .unwrap();
    assert!(matches!(b.expand(&[]), Err(TreeError::Order { .. })));
    assert_eq!(b.finish().unwrap().len(), 3);
}

#[test]
fn malformed_tree_is_reported() {
    let mut t = DraftTree::chain(0, &[1, 2]);
    t.nodes[2].parent = Some(2);
    let err = t.validate().unwrap_err().to_string();
    assert!(err.contains("node 2"), "{err}");
}
