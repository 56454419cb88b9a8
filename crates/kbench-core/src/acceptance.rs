//! What the simulator asks of an acceptance source: how many tokens a round commits.

use crate::spec::SpecConfig;

pub trait AcceptanceModel: Send + Sync {
    /// Tokens committed (1..=num_steps+1, bonus token included) by the verify round that
    /// starts when `position` output tokens of request `request_id` are already committed.
    /// Must be a pure function of its arguments (determinism).
    fn round_commit(&self, request_id: u64, position: u32, spec: &SpecConfig) -> u32;

    /// One line for reports: where the acceptance comes from.
    fn describe(&self) -> String;
}
