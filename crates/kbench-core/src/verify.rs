//! Verification of a draft tree against target outputs: greedy, SGLang's target-only
//! tree sampling, and exact speculative sampling.

mod dist;
mod greedy;
mod sampling;

pub use dist::{sample_from, softmax, target_distribution, SamplingParams};
pub use greedy::verify_greedy;
pub use sampling::{verify_exact, verify_target_only};

use serde::Serialize;

/// What one verify round commits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VerifyOutcome {
    /// Accepted tree nodes below the root, in path order (root excluded).
    pub accepted_nodes: Vec<usize>,
    /// Committed tokens: the accepted nodes' tokens then the bonus (or corrected) token;
    /// `len == accepted_nodes.len() + 1`, SGLang's accept length.
    pub tokens: Vec<u32>,
}

impl VerifyOutcome {
    /// Tokens committed this round, bonus included (1..=num_steps+1).
    pub fn accept_length(&self) -> u32 {
        self.tokens.len() as u32
    }

    /// The tree node whose target output produced the last token (the new root's parent
    /// context): the last accepted node, or the root when nothing was accepted.
    pub fn last_node(&self) -> usize {
        self.accepted_nodes.last().copied().unwrap_or(0)
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum VerifyError {
    #[error("verify: the draft tree is malformed")]
    Tree(#[from] crate::tree::TreeError),
    #[error("verify: {what} has {got} entries but the tree has {expected} nodes")]
    NodeCount {
        what: &'static str,
        expected: usize,
        got: usize,
    },
    #[error(
        "verify: {what} at node {node} has {got} entries, expected the vocabulary size {expected}"
    )]
    VocabSize {
        what: &'static str,
        node: usize,
        expected: usize,
        got: usize,
    },
    #[error("verify: node {node} drafts token {token}, outside the vocabulary of {vocab}")]
    TokenOutOfVocab {
        node: usize,
        token: u32,
        vocab: usize,
    },
    #[error("verify: {what} at node {node} is not a probability distribution: {reason}")]
    BadDistribution {
        what: &'static str,
        node: usize,
        reason: String,
    },
    #[error("verify: node {node} drafts token {token} that has draft probability 0 at its parent, so it cannot have been sampled from the draft")]
    ImpossibleDraft { node: usize, token: u32 },
    #[error("sampling parameters: {0}")]
    Params(String),
}
