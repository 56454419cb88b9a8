//! Acceptance models the simulator can use without a recorded trace.
//!
//! [`DepthRateAcceptance`] draws a round's accept length from per-depth conditional rates,
//! with uniforms derived from (seed, request, position) so a round's outcome is a pure
//! function of its arguments. It stands in until trace replay
//! (`kbench_core::trace::TraceAcceptance`) is wired; its rates are chosen to match published
//! Kimi-K2.5 EAGLE-3 chat accept lengths (about 2.7 at (3,1,4), 2.2-2.3 at (2,1,3)).

use kbench_core::acceptance::AcceptanceModel;
use kbench_core::experiment::SpeculativeConfig;
use kbench_core::seed::derive_seed;

#[derive(Debug, Clone)]
pub struct DepthRateAcceptance {
    pub seed: u64,
    /// P(draft token at depth i accepted | depth i-1 accepted), chain drafting (topk 1).
    pub chain_rates: Vec<f64>,
    /// With topk > 1 the target's token is found among w siblings at a depth with
    /// probability 1 - (1 - a) * sibling_miss^(w - 1).
    pub sibling_miss: f64,
}

impl DepthRateAcceptance {
    /// Chat-like rates: 1 + .70 + .70*.786 + .70*.786*.82 = 2.70 at (3,1,4); 2.25 at (2,1,3).
    pub fn kimi_chat(seed: u64) -> DepthRateAcceptance {
        DepthRateAcceptance {
            seed,
            chain_rates: vec![0.70, 0.786, 0.82, 0.82, 0.82, 0.82, 0.82, 0.82],
            sibling_miss: 0.6,
        }
    }

    /// Per-depth acceptance probabilities for this configuration's tree.
    pub fn depth_rates(&self, spec: &SpeculativeConfig) -> Vec<f64> {
        let steps = spec.shape.num_steps as usize;
        let k = spec.shape.topk.max(1);
        // Tree nodes per depth: one per depth, then the rest to the shallowest depths (at most
        // topk each), as SGLang's probability-ranked selection mostly does.
        let mut width = vec![1u32; steps];
        let mut extra = spec
            .shape
            .num_draft_tokens
            .saturating_sub(1)
            .saturating_sub(steps as u32);
        for w in width.iter_mut() {
            let add = extra.min(k - 1);
            *w += add;
            extra -= add;
        }
        (0..steps)
            .map(|i| {
                let a = self
                    .chain_rates
                    .get(i)
                    .or(self.chain_rates.last())
                    .copied()
                    .unwrap_or(0.0);
                1.0 - (1.0 - a) * self.sibling_miss.powi(width[i] as i32 - 1)
            })
            .collect()
    }

    /// Expected accept length (bonus included) for a configuration.
    pub fn expected_accept_length(&self, spec: &SpeculativeConfig) -> f64 {
        let mut p = 1.0;
        let mut total = 1.0;
        for a in self.depth_rates(spec) {
            p *= a;
            total += p;
        }
        total
    }
}

impl AcceptanceModel for DepthRateAcceptance {
    fn round_commit(&self, request_id: u64, position: u32, spec: &SpeculativeConfig) -> u32 {
        let rates = self.depth_rates(spec);
        let mut committed = 1;
        for (depth, a) in rates.iter().enumerate() {
            let h = derive_seed(
                self.seed,
                "accept",
                request_id ^ ((position as u64) << 40) ^ ((depth as u64) << 60),
            );
            let u = (h >> 11) as f64 / (1u64 << 53) as f64;
            if u < *a {
                committed += 1;
            } else {
                break;
            }
        }
        committed
    }

    fn describe(&self) -> String {
        format!(
            "synthetic per-depth acceptance (chain rates {:?}, sibling miss {}), not a trace",
            self.chain_rates, self.sibling_miss
        )
    }
}

/// Every round drawn to one mean accept length with the least variance, as the engines'
/// simulated acceptance does: vLLM's synthetic rejection sampler turns
/// `synthetic_acceptance_length` L into unconditional per-position rates
/// clamp(L - 1 - i, 0, 1) (`SpeculativeConfig._acceptance_length_to_rates`: 2.6 over 3
/// drafts is [1.0, 0.6, 0.0]), so a round accepts floor(L - 1) drafts, and one more with
/// probability frac(L - 1). For a source that reports only a mean: the rounds' cost does
/// not depend on their spread under a fixed draft length.
#[derive(Debug, Clone)]
pub struct MeanAcceptance {
    pub seed: u64,
    /// Tokens per round, bonus included.
    pub accept_length: f64,
}

impl AcceptanceModel for MeanAcceptance {
    fn round_commit(&self, request_id: u64, position: u32, spec: &SpeculativeConfig) -> u32 {
        let most = spec.shape.num_steps + 1;
        let drafts = (self.accept_length - 1.0).max(0.0);
        let whole = drafts.floor();
        let h = derive_seed(
            self.seed,
            "mean-accept",
            request_id ^ ((position as u64) << 40),
        );
        let u = (h >> 11) as f64 / (1u64 << 53) as f64;
        let extra = u32::from(u < drafts - whole);
        (1 + whole as u32 + extra).clamp(1, most)
    }

    fn describe(&self) -> String {
        format!(
            "every round drawn to accept length {} (the engines' simulated acceptance), not a trace",
            self.accept_length
        )
    }
}

/// Every round commits the same number of tokens (capped at num_steps + 1): for tests.
#[derive(Debug, Clone)]
pub struct ConstantAcceptance(pub u32);

impl AcceptanceModel for ConstantAcceptance {
    fn round_commit(&self, _request_id: u64, _position: u32, spec: &SpeculativeConfig) -> u32 {
        self.0.clamp(1, spec.shape.num_steps + 1)
    }
    fn describe(&self) -> String {
        format!("constant accept length {}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_rates_match_published_accept_lengths() {
        let a = DepthRateAcceptance::kimi_chat(1);
        assert!((a.expected_accept_length(&SpeculativeConfig::eagle(3, 1, 4)) - 2.70).abs() < 0.01);
        let l = a.expected_accept_length(&SpeculativeConfig::eagle(2, 1, 3));
        assert!((2.2..=2.3).contains(&l), "{l}");
        assert!(a.expected_accept_length(&SpeculativeConfig::eagle(3, 4, 8)) > 2.7);
    }

    #[test]
    fn mean_acceptance_draws_rounds_to_its_mean_with_the_least_spread() {
        let s = SpeculativeConfig::eagle(3, 1, 4);
        for (target, allowed) in [(2.155, [2, 3]), (2.6, [2, 3]), (1.0, [1, 1]), (4.0, [4, 4])] {
            let a = MeanAcceptance {
                seed: 11,
                accept_length: target,
            };
            let rounds: Vec<u32> = (0..20_000).map(|p| a.round_commit(3, p, &s)).collect();
            assert!(
                rounds.iter().all(|r| allowed.contains(r)),
                "{target}: {rounds:?}"
            );
            let mean = rounds.iter().sum::<u32>() as f64 / rounds.len() as f64;
            assert!((mean - target).abs() < 0.01, "{target}: mean {mean}");
            assert_eq!(rounds[7], a.round_commit(3, 7, &s));
        }
    }

    #[test]
    fn round_commit_is_pure_and_bounded() {
        let a = DepthRateAcceptance::kimi_chat(7);
        let s = SpeculativeConfig::eagle(3, 1, 4);
        for p in 0..200 {
            let c = a.round_commit(42, p, &s);
            assert!((1..=4).contains(&c));
            assert_eq!(c, a.round_commit(42, p, &s));
        }
    }
}
