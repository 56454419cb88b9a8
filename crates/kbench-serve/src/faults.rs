//! Fault injection (`--fail-rate P --fail-kinds ...`): a seeded fraction of requests is
//! answered with an error in SGLang's or vLLM's shape, or broken mid-stream, so clients can
//! test their own error handling. Which request fails is a pure function of the seed and the
//! request's arrival number.

use std::str::FromStr;

use rand::RngExt;

use crate::error::ApiError;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum FaultKind {
    /// 429.
    RateLimit,
    /// 500.
    ServerError,
    /// 400 with vLLM's context-length message.
    ContextLength,
    /// 401.
    InvalidApiKey,
    /// The connection closes after the first streamed chunk (before any response when not
    /// streaming).
    Drop,
    /// The stream sends its first chunk, then nothing for `stall` before the connection closes.
    Stall,
    /// The stream sends its first chunk, then an event that is not JSON, then ends.
    Malformed,
}

pub const ALL_KINDS: [FaultKind; 7] = [
    FaultKind::RateLimit,
    FaultKind::ServerError,
    FaultKind::ContextLength,
    FaultKind::InvalidApiKey,
    FaultKind::Drop,
    FaultKind::Stall,
    FaultKind::Malformed,
];

impl FaultKind {
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::RateLimit => "rate_limit",
            FaultKind::ServerError => "server_error",
            FaultKind::ContextLength => "context_length",
            FaultKind::InvalidApiKey => "invalid_api_key",
            FaultKind::Drop => "drop",
            FaultKind::Stall => "stall",
            FaultKind::Malformed => "malformed",
        }
    }

    /// The error a fault answers with; `None` for the ones that break a stream instead.
    pub fn response(self, context_len: usize) -> Option<ApiError> {
        match self {
            FaultKind::RateLimit => Some(ApiError::rate_limited()),
            FaultKind::ServerError => {
                Some(ApiError::internal("Internal server error (injected fault)"))
            }
            FaultKind::ContextLength => Some(ApiError::context_length(context_len, context_len, 1)),
            FaultKind::InvalidApiKey => Some(ApiError::unauthorized()),
            FaultKind::Drop | FaultKind::Stall | FaultKind::Malformed => None,
        }
    }
}

impl FromStr for FaultKind {
    type Err = String;
    fn from_str(s: &str) -> Result<FaultKind, String> {
        ALL_KINDS
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| {
                format!(
                    "unknown fault kind `{s}` (expected one of: {})",
                    ALL_KINDS.map(FaultKind::name).join(", ")
                )
            })
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Faults {
    pub rate: f64,
    pub kinds: Vec<FaultKind>,
    pub seed: u64,
    pub stall: std::time::Duration,
}

impl Faults {
    pub fn none() -> Faults {
        Faults {
            rate: 0.0,
            kinds: ALL_KINDS.to_vec(),
            seed: 0,
            stall: std::time::Duration::from_secs(30),
        }
    }

    pub fn validate(&self) -> Result<(), String> {
        if !(0.0..=1.0).contains(&self.rate) {
            return Err(format!("--fail-rate {} must be in [0, 1]", self.rate));
        }
        if self.rate > 0.0 && self.kinds.is_empty() {
            return Err("--fail-kinds is empty".into());
        }
        Ok(())
    }

    /// The fault request number `n` gets, if any.
    pub fn pick(&self, n: u64) -> Option<FaultKind> {
        if self.rate <= 0.0 {
            return None;
        }
        let mut rng = kbench_core::seed::rng_for(self.seed, "serve-fault", n);
        let u: f64 = rng.random_range(0.0..1.0);
        (u < self.rate).then(|| self.kinds[rng.random_range(0..self.kinds.len())])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_are_seeded_and_near_the_rate() {
        let f = Faults {
            rate: 0.25,
            ..Faults::none()
        };
        let a: Vec<_> = (0..2000).map(|n| f.pick(n)).collect();
        let b: Vec<_> = (0..2000).map(|n| f.pick(n)).collect();
        assert_eq!(a, b);
        let hit = a.iter().filter(|p| p.is_some()).count();
        assert!((400..600).contains(&hit), "{hit}");
        for k in ALL_KINDS {
            assert!(a.contains(&Some(k)), "{k:?} never drawn");
        }
        assert!(Faults::none().pick(3).is_none());
        assert!("nope".parse::<FaultKind>().is_err());
    }
}
