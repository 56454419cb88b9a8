//! Sampling verification of a draft tree.
//!
//! `verify_target_only` is SGLang's `tree_speculative_sampling_target_only` with both
//! thresholds at 1: one uniform coin per depth; siblings are tried in index order and
//! sibling `j` is accepted when `coin < sum of target probs of siblings 0..=j`, which
//! is the same as accepting each in turn with its probability under the target minus
//! the siblings already rejected. On rejection of all siblings (or at a leaf) the token
//! is sampled from the target with the rejected siblings' mass removed, renormalised.
//! This is exact speculative sampling for a draft that proposes tokens
//! deterministically (top-k), so it reproduces the target distribution.
//!
//! `verify_exact` is Leviathan/Chen speculative sampling for drafts that *sample*
//! their tokens from the draft distribution q: accept with `min(1, p(x)/q(x))`, on
//! rejection `p <- norm(max(0, p - q))`. For a node with several children it is
//! SpecInfer's multi-step rejection: children are assumed drawn independently from
//! the same q at their parent and are tried in turn against the shrinking residual.
//! It is lossless under that assumption (and for topk = 1 chains of sampled tokens);
//! it is NOT lossless for SGLang's deterministic top-k trees, where target-only is.

use rand::{Rng, RngExt};

use super::dist::sample_from;
use super::{VerifyError, VerifyOutcome};
use crate::tree::DraftTree;

/// Tolerance on the total mass of a given distribution (they come through f32 softmax).
const MASS_TOLERANCE: f64 = 1e-3;

pub fn verify_target_only(
    tree: &DraftTree,
    target_probs_per_node: &[Vec<f32>],
    rng: &mut impl Rng,
) -> Result<VerifyOutcome, VerifyError> {
    let vocab = check_inputs(tree, target_probs_per_node, "target probabilities")?;
    let children = tree.child_lists();
    let mut accepted = Vec::new();
    let mut tokens = Vec::new();
    let mut cur = 0;
    loop {
        let mut residual = target_probs_per_node[cur].clone();
        let coin: f64 = rng.random();
        let mut acc = 0.0f64;
        let mut next = None;
        for &c in &children[cur] {
            let x = token_index(tree, c, vocab)?;
            // A repeated sibling token was zeroed when first rejected, so it adds nothing.
            acc += f64::from(residual[x]);
            if coin < acc {
                next = Some(c);
                break;
            }
            residual[x] = 0.0;
        }
        match next {
            Some(c) => {
                tokens.push(tree.nodes[c].token);
                accepted.push(c);
                cur = c;
            }
            None => {
                tokens.push(sample_residual(&residual, &target_probs_per_node[cur], rng));
                break;
            }
        }
    }
    Ok(VerifyOutcome {
        accepted_nodes: accepted,
        tokens,
    })
}

pub fn verify_exact(
    tree: &DraftTree,
    target_probs_per_node: &[Vec<f32>],
    draft_probs_per_node: &[Vec<f32>],
    rng: &mut impl Rng,
) -> Result<VerifyOutcome, VerifyError> {
    let vocab = check_inputs(tree, target_probs_per_node, "target probabilities")?;
    let dvocab = check_inputs(tree, draft_probs_per_node, "draft probabilities")?;
    if dvocab != vocab {
        return Err(VerifyError::VocabSize {
            what: "draft probabilities",
            node: 0,
            expected: vocab,
            got: dvocab,
        });
    }
    let children = tree.child_lists();
    let mut accepted = Vec::new();
    let mut tokens = Vec::new();
    let mut cur = 0;
    loop {
        let q = &draft_probs_per_node[cur];
        let mut residual: Vec<f64> = target_probs_per_node[cur]
            .iter()
            .map(|&p| f64::from(p))
            .collect();
        let mut next = None;
        for &c in &children[cur] {
            let x = token_index(tree, c, vocab)?;
            let qx = f64::from(q[x]);
            if qx <= 0.0 {
                return Err(VerifyError::ImpossibleDraft {
                    node: c,
                    token: tree.nodes[c].token,
                });
            }
            let u: f64 = rng.random();
            if u < residual[x] / qx {
                next = Some(c);
                break;
            }
            let mut total = 0.0;
            for (r, &qi) in residual.iter_mut().zip(q) {
                *r = (*r - f64::from(qi)).max(0.0);
                total += *r;
            }
            if total <= 0.0 {
                // Only reachable through rounding (residual == q accepts surely): fall
                // back to the target so a token is still committed.
                residual = target_probs_per_node[cur]
                    .iter()
                    .map(|&p| f64::from(p))
                    .collect();
            } else {
                residual.iter_mut().for_each(|r| *r /= total);
            }
        }
        match next {
            Some(c) => {
                tokens.push(tree.nodes[c].token);
                accepted.push(c);
                cur = c;
            }
            None => {
                let r: Vec<f32> = residual.iter().map(|&r| r as f32).collect();
                tokens.push(sample_residual(&r, &target_probs_per_node[cur], rng));
                break;
            }
        }
    }
    Ok(VerifyOutcome {
        accepted_nodes: accepted,
        tokens,
    })
}

/// Samples from the residual; if rounding left it empty, from the target itself.
fn sample_residual(residual: &[f32], target: &[f32], rng: &mut impl Rng) -> u32 {
    let i = sample_from(residual, rng)
        .or_else(|| sample_from(target, rng))
        // check_inputs guarantees positive target mass, so this default is never used.
        .unwrap_or(0);
    i as u32
}

fn token_index(tree: &DraftTree, node: usize, vocab: usize) -> Result<usize, VerifyError> {
    let token = tree.nodes[node].token;
    if (token as usize) < vocab {
        Ok(token as usize)
    } else {
        Err(VerifyError::TokenOutOfVocab { node, token, vocab })
    }
}

/// Validates the tree and one distribution per node; returns the vocabulary size.
fn check_inputs(
    tree: &DraftTree,
    per_node: &[Vec<f32>],
    what: &'static str,
) -> Result<usize, VerifyError> {
    tree.validate()?;
    if per_node.len() != tree.len() {
        return Err(VerifyError::NodeCount {
            what,
            expected: tree.len(),
            got: per_node.len(),
        });
    }
    let vocab = per_node[0].len();
    for (node, dist) in per_node.iter().enumerate() {
        if dist.len() != vocab {
            return Err(VerifyError::VocabSize {
                what,
                node,
                expected: vocab,
                got: dist.len(),
            });
        }
        let mut total = 0.0f64;
        for (tok, &p) in dist.iter().enumerate() {
            if !(p.is_finite() && p >= 0.0) {
                return Err(VerifyError::BadDistribution {
                    what,
                    node,
                    reason: format!("entry {tok} is {p}"),
                });
            }
            total += f64::from(p);
        }
        if (total - 1.0).abs() > MASS_TOLERANCE {
            return Err(VerifyError::BadDistribution {
                what,
                node,
                reason: format!("entries sum to {total}, not 1"),
            });
        }
    }
    Ok(vocab)
}
