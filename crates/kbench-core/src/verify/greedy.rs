//! Greedy verification: follow the target's argmax through the tree.

use super::{VerifyError, VerifyOutcome};
use crate::tree::DraftTree;

/// Walks from the root; at each node, accepts the child (in sibling order) whose token
/// equals the target's argmax at that node; stops at the first node without one. The
/// target's argmax at the last accepted node is the bonus token.
pub fn verify_greedy(
    tree: &DraftTree,
    target_argmax_per_node: &[u32],
) -> Result<VerifyOutcome, VerifyError> {
    tree.validate()?;
    if target_argmax_per_node.len() != tree.len() {
        return Err(VerifyError::NodeCount {
            what: "target argmax",
            expected: tree.len(),
            got: target_argmax_per_node.len(),
        });
    }
    let children = tree.child_lists();
    let mut accepted = Vec::new();
    let mut tokens = Vec::new();
    let mut cur = 0;
    loop {
        let want = target_argmax_per_node[cur];
        tokens.push(want);
        match children[cur].iter().find(|&&c| tree.nodes[c].token == want) {
            Some(&c) => {
                accepted.push(c);
                cur = c;
            }
            None => break,
        }
    }
    Ok(VerifyOutcome {
        accepted_nodes: accepted,
        tokens,
    })
}
