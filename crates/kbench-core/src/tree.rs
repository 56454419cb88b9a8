//! SGLang's draft tree: beam expansion by cumulative probability and final selection
//! (`select_top_k_tokens` + `build_tree_kernel_efficient_preprocess`).
//!
//! Candidate indices follow SGLang's concatenated score list: step 0 contributes
//! candidates `0..topk` (the draft's top-k at the root, in the order given), step
//! `i >= 1` contributes `topk + (i-1)*topk^2 + beam*topk + j` for child `j` of beam
//! `beam`, where beams are numbered in the order the previous step selected them
//! (descending score).
//!
//! Ties: `torch.topk` gives no ordering guarantee among equal scores, so kbench fixes
//! one: equal scores are ranked by ascending candidate index. Because a child's score
//! is its parent's score times a probability <= 1 (never larger, also in f32) and a
//! parent's index is always smaller than its children's, this rule guarantees that a
//! selected node's parent is selected too, which SGLang only gets almost surely.

use serde::Serialize;

/// `num_steps`, `eagle_topk`, `num_draft_tokens` as SGLang names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct TreeShape {
    pub num_steps: u32,
    #[serde(rename = "eagle_topk")]
    pub topk: u32,
    /// Nodes verified per round, root included.
    pub num_draft_tokens: u32,
}

impl TreeShape {
    /// Checks the shape can be built. This is looser than SGLang's server rules (those
    /// live in `spec`): any `num_draft_tokens - 1` up to the candidate count is buildable.
    pub fn new(num_steps: u32, topk: u32, num_draft_tokens: u32) -> Result<TreeShape, TreeError> {
        let shape = TreeShape {
            num_steps,
            topk,
            num_draft_tokens,
        };
        shape.validate()?;
        Ok(shape)
    }

    /// The chain SGLang builds for `topk == 1`.
    pub fn chain(num_steps: u32) -> Result<TreeShape, TreeError> {
        TreeShape::new(num_steps, 1, num_steps + 1)
    }

    pub fn validate(&self) -> Result<(), TreeError> {
        if self.num_steps == 0 || self.topk == 0 {
            return Err(TreeError::Shape {
                shape: *self,
                reason: "num_steps and topk must be >= 1".into(),
            });
        }
        if self.num_draft_tokens < 2 {
            return Err(TreeError::Shape {
                shape: *self,
                reason: "num_draft_tokens counts the root and must be >= 2".into(),
            });
        }
        let cands = self.num_candidates_u64();
        // Beyond this the candidate list would not fit in memory anyway.
        if cands > (1 << 24) {
            return Err(TreeError::Shape {
                shape: *self,
                reason: format!("{cands} candidates is too many to build"),
            });
        }
        if u64::from(self.num_draft_tokens - 1) > cands {
            return Err(TreeError::Shape {
                shape: *self,
                reason: format!(
                    "num_draft_tokens - 1 = {} exceeds the {cands} candidates (topk + (num_steps-1)*topk^2)",
                    self.num_draft_tokens - 1
                ),
            });
        }
        Ok(())
    }

    fn num_candidates_u64(&self) -> u64 {
        let k = u64::from(self.topk);
        k + u64::from(self.num_steps.saturating_sub(1)) * k * k
    }

    /// `topk + (num_steps - 1) * topk^2`.
    pub fn num_candidates(&self) -> usize {
        self.num_candidates_u64() as usize
    }

    /// First candidate index of step `step` (0-based).
    pub fn step_offset(&self, step: u32) -> usize {
        if step == 0 {
            0
        } else {
            let k = self.topk as usize;
            k + (step as usize - 1) * k * k
        }
    }
}

/// As the reasons in [`TreeError::Shape`] name the fields, so a message reads the same
/// whether the shape came from a file, `--config 3/1/4` or SGLang's flags.
impl std::fmt::Display for TreeShape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "num_steps {}, topk {}, num_draft_tokens {}",
            self.num_steps, self.topk, self.num_draft_tokens
        )
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TreeError {
    #[error("tree shape ({shape}) is invalid: {reason}")]
    Shape { shape: TreeShape, reason: String },
    #[error("draft step {step}: expected {expected} (token, prob) pairs, got {got}")]
    WrongCount {
        step: u32,
        expected: usize,
        got: usize,
    },
    #[error("draft step {step}: probability {prob} of token {token} is not in [0, 1]")]
    BadProbability { step: u32, token: u32, prob: f32 },
    #[error("draft tree: {call} called at the wrong time: {reason}")]
    Order { call: &'static str, reason: String },
    #[error("draft tree: node {node}: {reason}")]
    Malformed { node: usize, reason: String },
}

/// One verified node. `nodes[0]` is the root (the last verified token, depth 0).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TreeNode {
    pub token: u32,
    /// Index into `DraftTree::nodes`; always smaller than this node's index.
    pub parent: Option<usize>,
    pub depth: u32,
    /// Cumulative draft probability (product along the path); 1 for the root.
    pub score: f32,
    /// SGLang candidate index this node was selected from (None for the root); the
    /// engine uses it to find the draft KV entry that produced the node.
    pub candidate: Option<usize>,
}

/// The tree a verify pass scores.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DraftTree {
    pub nodes: Vec<TreeNode>,
}

impl DraftTree {
    /// A chain root -> tokens[0] -> tokens[1] ..., each with score 1 (tests and callers
    /// that draft without probabilities).
    pub fn chain(root_token: u32, tokens: &[u32]) -> DraftTree {
        let mut nodes = vec![root(root_token)];
        for (i, &t) in tokens.iter().enumerate() {
            nodes.push(TreeNode {
                token: t,
                parent: Some(i),
                depth: i as u32 + 1,
                score: 1.0,
                candidate: Some(i),
            });
        }
        DraftTree { nodes }
    }

    /// Checks the invariants every consumer relies on: a root at 0, parents before
    /// children, depth = parent depth + 1.
    pub fn validate(&self) -> Result<(), TreeError> {
        let Some(first) = self.nodes.first() else {
            return Err(TreeError::Malformed {
                node: 0,
                reason: "tree has no root".into(),
            });
        };
        if first.parent.is_some() || first.depth != 0 {
            return Err(TreeError::Malformed {
                node: 0,
                reason: "root must have no parent and depth 0".into(),
            });
        }
        for (i, n) in self.nodes.iter().enumerate().skip(1) {
            let Some(p) = n.parent else {
                return Err(TreeError::Malformed {
                    node: i,
                    reason: "only the root may lack a parent".into(),
                });
            };
            if p >= i {
                return Err(TreeError::Malformed {
                    node: i,
                    reason: format!("parent {p} does not precede it"),
                });
            }
            if n.depth != self.nodes[p].depth + 1 {
                return Err(TreeError::Malformed {
                    node: i,
                    reason: format!(
                        "depth {} is not parent depth {} + 1",
                        n.depth, self.nodes[p].depth
                    ),
                });
            }
        }
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Children of node `i` in index order (which is SGLang's sibling order).
    pub fn children(&self, i: usize) -> Vec<usize> {
        self.nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| n.parent == Some(i))
            .map(|(j, _)| j)
            .collect()
    }

    /// Children of every node at once (index order), for walks over the whole tree.
    pub fn child_lists(&self) -> Vec<Vec<usize>> {
        let mut children = vec![Vec::new(); self.nodes.len()];
        for (i, n) in self.nodes.iter().enumerate() {
            if let Some(p) = n.parent {
                children[p].push(i);
            }
        }
        children
    }

    /// Node indices from the root to `i`, both included.
    pub fn path_to(&self, i: usize) -> Vec<usize> {
        let mut path = vec![i];
        let mut cur = i;
        while let Some(p) = self.nodes[cur].parent {
            path.push(p);
            cur = p;
        }
        path.reverse();
        path
    }

    /// Verify attention mask: `mask[i][j]` is true when node `j` is `i` or one of its
    /// ancestors (node `i` may attend to node `j`).
    pub fn ancestor_mask(&self) -> Vec<Vec<bool>> {
        let n = self.nodes.len();
        let mut mask = vec![vec![false; n]; n];
        for i in 0..n {
            mask[i][i] = true;
            if let Some(p) = self.nodes[i].parent {
                // Parents precede children, so the parent's row is already complete.
                let (done, rest) = mask.split_at_mut(i);
                for (dst, &src) in rest[0].iter_mut().zip(done[p].iter()) {
                    *dst |= src;
                }
            }
        }
        mask
    }

    pub fn depths(&self) -> Vec<u32> {
        self.nodes.iter().map(|n| n.depth).collect()
    }

    /// Position ids for the verify pass: the root sits at `base_position`.
    pub fn positions(&self, base_position: u32) -> Vec<u32> {
        self.nodes.iter().map(|n| base_position + n.depth).collect()
    }

    pub fn tokens(&self) -> Vec<u32> {
        self.nodes.iter().map(|n| n.token).collect()
    }

    pub fn max_depth(&self) -> u32 {
        self.nodes.iter().map(|n| n.depth).max().unwrap_or(0)
    }
}

fn root(token: u32) -> TreeNode {
    TreeNode {
        token,
        parent: None,
        depth: 0,
        score: 1.0,
        candidate: None,
    }
}

/// Every scored candidate, as SGLang records it (all `topk^2` per step, not only beams).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Candidate {
    pub token: u32,
    /// The draft's probability of this token given its parent.
    pub prob: f32,
    /// Cumulative product of probabilities from the root.
    pub score: f32,
    /// Parent candidate index; None for step-0 candidates (children of the root).
    pub parent: Option<usize>,
    /// 1 for step 0.
    pub depth: u32,
}

/// A live beam: the next draft pass runs one token per beam.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Beam {
    pub token: u32,
    /// The candidate this beam is; its children extend it.
    pub candidate: usize,
    pub score: f32,
}

/// Builds the tree one draft step at a time, as the engine drafts.
#[derive(Debug, Clone)]
pub struct TreeBuilder {
    shape: TreeShape,
    root_token: u32,
    candidates: Vec<Candidate>,
    beams: Vec<Beam>,
    steps_done: u32,
}

impl TreeBuilder {
    pub fn new(shape: TreeShape, root_token: u32) -> Result<TreeBuilder, TreeError> {
        shape.validate()?;
        Ok(TreeBuilder {
            shape,
            root_token,
            candidates: Vec::with_capacity(shape.num_candidates()),
            beams: Vec::new(),
            steps_done: 0,
        })
    }

    pub fn shape(&self) -> TreeShape {
        self.shape
    }

    pub fn steps_done(&self) -> u32 {
        self.steps_done
    }

    pub fn candidates(&self) -> &[Candidate] {
        &self.candidates
    }

    /// Step 0: the draft's top-k at the root (from the previous round's draft extend).
    /// Their order defines candidate indices 0..topk; SGLang passes them sorted desc.
    pub fn first_step(&mut self, topk: &[(u32, f32)]) -> Result<(), TreeError> {
        if self.steps_done != 0 {
            return Err(TreeError::Order {
                call: "first_step",
                reason: format!("{} steps already done", self.steps_done),
            });
        }
        let k = self.shape.topk as usize;
        check_pairs(0, topk, k)?;
        for &(token, prob) in topk {
            self.candidates.push(Candidate {
                token,
                prob,
                score: prob,
                parent: None,
                depth: 1,
            });
        }
        self.beams = select_beams(&self.candidates, 0, k);
        self.steps_done = 1;
        Ok(())
    }

    /// Live beams in SGLang's order (descending score, ties by candidate index).
    pub fn beams(&self) -> &[Beam] {
        &self.beams
    }

    /// Token path from the root's child down to `candidate` (root token excluded).
    pub fn path_tokens(&self, candidate: usize) -> Vec<u32> {
        self.path_candidates(candidate)
            .into_iter()
            .map(|c| self.candidates[c].token)
            .collect()
    }

    /// Candidate indices from depth 1 down to `candidate`.
    pub fn path_candidates(&self, candidate: usize) -> Vec<usize> {
        let mut path = vec![candidate];
        let mut cur = candidate;
        while let Some(p) = self.candidates[cur].parent {
            path.push(p);
            cur = p;
        }
        path.reverse();
        path
    }

    /// One draft step: `per_beam_topk[b]` is the draft's top-k after beam `b` (same order
    /// as `beams()`). Records all `topk^2` candidates and keeps the best `topk` as beams.
    pub fn expand(&mut self, per_beam_topk: &[Vec<(u32, f32)>]) -> Result<(), TreeError> {
        let step = self.steps_done;
        if step == 0 {
            return Err(TreeError::Order {
                call: "expand",
                reason: "first_step has not been called".into(),
            });
        }
        if step >= self.shape.num_steps {
            return Err(TreeError::Order {
                call: "expand",
                reason: format!("all {} steps are done", self.shape.num_steps),
            });
        }
        let k = self.shape.topk as usize;
        if per_beam_topk.len() != self.beams.len() {
            return Err(TreeError::WrongCount {
                step,
                expected: self.beams.len(),
                got: per_beam_topk.len(),
            });
        }
        for list in per_beam_topk {
            check_pairs(step, list, k)?;
        }
        let offset = self.candidates.len();
        debug_assert_eq!(offset, self.shape.step_offset(step));
        for (beam, list) in self.beams.iter().zip(per_beam_topk) {
            let parent = &self.candidates[beam.candidate];
            let (pscore, pdepth) = (parent.score, parent.depth);
            for &(token, prob) in list {
                self.candidates.push(Candidate {
                    token,
                    prob,
                    score: pscore * prob,
                    parent: Some(beam.candidate),
                    depth: pdepth + 1,
                });
            }
        }
        self.beams = select_beams(&self.candidates, offset, k);
        self.steps_done += 1;
        Ok(())
    }

    /// Final selection: the best `num_draft_tokens - 1` candidates, in candidate-index
    /// order (parents before children), below the root.
    pub fn finish(self) -> Result<DraftTree, TreeError> {
        if self.steps_done != self.shape.num_steps {
            return Err(TreeError::Order {
                call: "finish",
                reason: format!(
                    "{} of {} draft steps done",
                    self.steps_done, self.shape.num_steps
                ),
            });
        }
        let m = self.shape.num_draft_tokens as usize - 1;
        let mut selected = top_indices(&self.candidates, 0, m);
        selected.sort_unstable();
        let mut node_of = vec![usize::MAX; self.candidates.len()];
        let mut nodes = Vec::with_capacity(m + 1);
        nodes.push(root(self.root_token));
        for &c in &selected {
            let cand = &self.candidates[c];
            let parent = match cand.parent {
                None => 0,
                Some(p) => {
                    let idx = node_of[p];
                    // Unreachable by the tie rule (module docs); kept as an error, not a panic.
                    if idx == usize::MAX {
                        return Err(TreeError::Malformed {
                            node: nodes.len(),
                            reason: format!("candidate {c} selected without its parent {p}"),
                        });
                    }
                    idx
                }
            };
            node_of[c] = nodes.len();
            nodes.push(TreeNode {
                token: cand.token,
                parent: Some(parent),
                depth: cand.depth,
                score: cand.score,
                candidate: Some(c),
            });
        }
        Ok(DraftTree { nodes })
    }
}

fn check_pairs(step: u32, pairs: &[(u32, f32)], k: usize) -> Result<(), TreeError> {
    if pairs.len() != k {
        return Err(TreeError::WrongCount {
            step,
            expected: k,
            got: pairs.len(),
        });
    }
    for &(token, prob) in pairs {
        // NaN fails this check too; the ordering below relies on finite scores.
        if !(0.0..=1.0).contains(&prob) {
            return Err(TreeError::BadProbability { step, token, prob });
        }
    }
    Ok(())
}

/// Indices (>= `from`) of the `m` best candidates by score, ties by lower index first.
fn top_indices(cands: &[Candidate], from: usize, m: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (from..cands.len()).collect();
    let m = m.min(idx.len());
    let cmp = |a: &usize, b: &usize| {
        cands[*b]
            .score
            .total_cmp(&cands[*a].score)
            .then_with(|| a.cmp(b))
    };
    if m < idx.len() && m > 0 {
        idx.select_nth_unstable_by(m - 1, cmp);
    }
    idx.truncate(m);
    idx.sort_unstable_by(cmp);
    idx
}

fn select_beams(cands: &[Candidate], from: usize, k: usize) -> Vec<Beam> {
    top_indices(cands, from, k)
        .into_iter()
        .map(|c| Beam {
            token: cands[c].token,
            candidate: c,
            score: cands[c].score,
        })
        .collect()
}

/// Builds a whole tree from a draft oracle: `draft(path)` returns the draft's top-k
/// (token, prob) after the token path `path` (root excluded; empty = at the root).
/// For callers that have the draft's outputs up front (trace replay, tests).
pub fn build_tree<E>(
    shape: TreeShape,
    root_token: u32,
    mut draft: impl FnMut(&[u32]) -> Result<Vec<(u32, f32)>, E>,
) -> Result<DraftTree, E>
where
    E: From<TreeError>,
{
    let mut b = TreeBuilder::new(shape, root_token)?;
    let first = draft(&[])?;
    b.first_step(&first)?;
    for _ in 1..shape.num_steps {
        let mut lists = Vec::with_capacity(b.beams().len());
        for beam in b.beams() {
            lists.push(draft(&b.path_tokens(beam.candidate))?);
        }
        b.expand(&lists)?;
    }
    Ok(b.finish()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The message reaches users (`trace stats --config`, engine settings): it names the
    /// fields, never the struct's Debug form.
    #[test]
    fn an_invalid_shape_is_named_by_its_fields() {
        let err = TreeShape::new(3, 1, 9).unwrap_err().to_string();
        assert!(
            err.starts_with("tree shape (num_steps 3, topk 1, num_draft_tokens 9) is invalid: "),
            "{err}"
        );
        assert!(!err.contains("TreeShape"), "{err}");
    }
}
