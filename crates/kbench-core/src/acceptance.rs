//! What the simulator asks of an acceptance source: how many tokens a round commits.

use crate::experiment::SpeculativeConfig;

pub trait AcceptanceModel: Send + Sync {
    /// Tokens committed (1..=num_steps+1, bonus token included) by the verify round that
    /// starts when `position` output tokens of request `request_id` are already committed.
    /// Must be a pure function of its arguments (determinism).
    fn round_commit(&self, request_id: u64, position: u32, spec: &SpeculativeConfig) -> u32;

    /// Tokens the draft proposes for that round (0..=num_steps): every step drafts a full
    /// chain for EAGLE and MTP; vLLM's n-gram lookup proposes none where no suffix of the
    /// context matches. Pure like `round_commit`.
    fn round_proposal(&self, _request_id: u64, _position: u32, spec: &SpeculativeConfig) -> u32 {
        spec.shape.num_steps
    }

    /// One line for reports: where the acceptance comes from.
    fn describe(&self) -> String;
}
