//! Synthetic traces: per-depth acceptance with bursty easy/hard regimes over positions,
//! and plausible draft top-K probabilities (generator `kbench-synth-v1`, parameters in
//! docs/trace-format.md).
//!
//! Every cell draws the same five uniforms whatever the outcome, so changing an
//! acceptance rate changes only the cells it must (common random numbers): replayed
//! accept length is then monotone in the rates and `calibrate` can bisect on it.

use rand::RngExt;
use serde::{Deserialize, Serialize};

use super::stats::accept_length;
use super::{ProbEncoding, Provenance, Trace, TraceError, TraceHeader, TraceKind};
use crate::seed::rng_for;
use crate::tree::TreeShape;

pub const GENERATOR: &str = "kbench-synth-v1";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SynthParams {
    pub seed: u64,
    pub sequences: u32,
    pub positions: u32,
    /// Recorded depth D (1..=8).
    pub depth: u32,
    /// Recorded top-K (1..=8).
    pub topk: u32,
    /// Per-depth rate at which the target's token is the draft's top-1, averaged over
    /// the two regimes; within a regime depths are independent, so this is the
    /// conditional rate given all shallower depths matched when `contrast` is 0.
    pub accept: Vec<f64>,
    /// Stationary share of positions in the easy regime.
    pub easy_fraction: f64,
    /// Probability that the regime stays the same from one position to the next beyond
    /// what independent draws give (0 = independent positions, near 1 = long bursts).
    pub stickiness: f64,
    /// How far apart the regimes are, 0..=1: easy rate a + c(1-a)(1-pi), hard rate
    /// a - pi*c*(1-a), so the stationary mean stays a.
    pub contrast: f64,
    /// When the top-1 misses, P(target rank = j) for j in 1..K-1 is proportional to
    /// sibling_decay^(j-1).
    pub sibling_decay: f64,
    /// When the top-1 misses, P(target not in the top-K at all).
    pub miss_top_k: f64,
    pub prob_encoding: ProbEncoding,
    pub target: String,
    pub draft: String,
    pub dataset: String,
    pub temperature: f64,
    /// vLLM n-gram traces: the share of steps whose prompt lookup finds a match and so
    /// proposes drafts (the others propose none and decode one token). Absent: every step
    /// drafts (EAGLE, MTP).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub match_rate: Option<f64>,
}

/// Keys of `SynthParams` that go to the provenance fields instead of `params`.
const LABELS: [&str; 4] = ["target", "draft", "dataset", "temperature"];

impl SynthParams {
    pub fn validate(&self) -> Result<(), TraceError> {
        let bad = |message: String| Err(TraceError::Synth { message });
        if self.sequences == 0 || self.positions == 0 {
            return bad("sequences and positions must be >= 1".into());
        }
        if !(1..=8).contains(&self.depth) || !(1..=8).contains(&self.topk) {
            return bad(format!(
                "depth {} and topk {} must be in 1..=8",
                self.depth, self.topk
            ));
        }
        if self.accept.len() != self.depth as usize {
            return bad(format!(
                "accept has {} rates, expected one per depth ({})",
                self.accept.len(),
                self.depth
            ));
        }
        let unit = [
            ("easy_fraction", self.easy_fraction),
            ("stickiness", self.stickiness),
            ("contrast", self.contrast),
            ("sibling_decay", self.sibling_decay),
            ("miss_top_k", self.miss_top_k),
        ];
        for (name, v) in unit
            .into_iter()
            .chain(self.match_rate.map(|m| ("match_rate", m)))
            .chain(self.accept.iter().map(|&a| ("accept", a)))
        {
            if !(0.0..=1.0).contains(&v) {
                return bad(format!("{name} = {v} is not in [0, 1]"));
            }
        }
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return bad(format!(
                "temperature {} must be finite and >= 0",
                self.temperature
            ));
        }
        Ok(())
    }

    /// The parameters a synthetic trace's header stores, to regenerate it.
    pub fn from_provenance(p: &Provenance) -> Result<SynthParams, TraceError> {
        if p.generator != GENERATOR {
            return Err(TraceError::Synth {
                message: format!("generator is `{}`, not `{GENERATOR}`", p.generator),
            });
        }
        let mut map = p.params.clone();
        map.insert("target".into(), p.target.clone().into());
        map.insert("draft".into(), p.draft.clone().into());
        map.insert("dataset".into(), p.dataset.clone().into());
        map.insert("temperature".into(), p.temperature.into());
        serde_json::from_value(serde_json::Value::Object(map)).map_err(|e| TraceError::Synth {
            message: format!("header parameters do not describe a {GENERATOR} trace: {e}"),
        })
    }

    fn provenance(&self) -> Provenance {
        let mut params = match serde_json::to_value(self) {
            Ok(serde_json::Value::Object(m)) => m,
            _ => serde_json::Map::new(),
        };
        for k in LABELS {
            params.remove(k);
        }
        Provenance {
            kind: TraceKind::Synthetic,
            target: self.target.clone(),
            draft: self.draft.clone(),
            dataset: self.dataset.clone(),
            temperature: self.temperature,
            generator: GENERATOR.into(),
            params,
        }
    }

    /// (easy, hard) rates at one depth, clamped into [0, 1].
    fn regime_rates(&self, depth: usize) -> (f64, f64) {
        let a = self.accept[depth];
        let (pi, c) = (self.easy_fraction, self.contrast);
        let easy = a + c * (1.0 - a) * (1.0 - pi);
        let hard = a - pi * c * (1.0 - a);
        (easy.clamp(0.0, 1.0), hard.clamp(0.0, 1.0))
    }
}

pub fn synth(params: &SynthParams) -> Result<Trace, TraceError> {
    params.validate()?;
    let d = params.depth as usize;
    let k = params.topk as usize;
    let rates: Vec<(f64, f64)> = (0..d).map(|i| params.regime_rates(i)).collect();
    // Rank distribution after a top-1 miss: ranks 1..K-1 geometric, K = outside top-K.
    let mut rank_cdf = Vec::with_capacity(k);
    {
        let weights: Vec<f64> = (1..k).map(|j| pow(params.sibling_decay, j - 1)).collect();
        let total: f64 = weights.iter().sum();
        let inside = if k > 1 { 1.0 - params.miss_top_k } else { 0.0 };
        let mut acc = 0.0;
        for w in &weights {
            acc += inside * w / total;
            rank_cdf.push(acc);
        }
    }
    let header = TraceHeader::new(
        params.provenance(),
        params.depth,
        params.topk,
        params.prob_encoding,
    );
    let mut trace = Trace::new(header);
    let stay = params.stickiness;
    let pi = params.easy_fraction;
    for s in 0..params.sequences {
        let mut rng = rng_for(params.seed, "synth", u64::from(s));
        let n = params.positions as usize;
        let mut ranks = Vec::with_capacity(n * d);
        let mut probs = Vec::with_capacity(n * d * k);
        let mut easy = rng.random::<f64>() < pi;
        for p in 0..n {
            // With probability `stay` keep the regime, else redraw it from the
            // stationary distribution: a 2-state chain whose stationary share is pi.
            let (u_stay, u_state): (f64, f64) = (rng.random(), rng.random());
            if p > 0 && u_stay >= stay {
                easy = u_state < pi;
            }
            for (depth, &(re, rh)) in rates.iter().enumerate() {
                let u: [f64; 5] = [
                    rng.random(),
                    rng.random(),
                    rng.random(),
                    rng.random(),
                    rng.random(),
                ];
                let rate = if easy { re } else { rh };
                let accepted = u[0] < rate;
                let rank = if accepted {
                    0
                } else {
                    1 + rank_cdf.iter().take_while(|&&c| u[1] >= c).count()
                };
                ranks.push(rank.min(k) as u8);
                cell_probs(&mut probs, k, accepted, depth, &u[2..]);
            }
        }
        trace.push_sequence(u64::from(s), ranks, &probs)?;
    }
    Ok(trace)
}

/// x^n by repeated multiplication: `powi` may be evaluated differently in debug and
/// release builds, and the shipped traces must regenerate byte for byte in both.
fn pow(x: f64, n: usize) -> f64 {
    (0..n).fold(1.0, |acc, _| acc * x)
}

/// Draft top-K for one cell: a confident top-1 when the target's token is the top-1,
/// a flatter head when it is not; the rest geometric, never above the previous entry.
fn cell_probs(out: &mut Vec<f64>, k: usize, accepted: bool, depth: usize, u: &[f64]) {
    // Deeper drafts are a little less sure of themselves.
    let fade = 1.0 - 0.02 * depth as f64;
    let p0 = if accepted {
        (0.45 + 0.5 * u[0].sqrt()) * fade
    } else {
        (0.12 + 0.45 * u[0]) * fade
    };
    let rest = (1.0 - p0) * (0.55 + 0.4 * u[1]);
    let ratio = 0.3 + 0.45 * u[2];
    let norm: f64 = (1..k).map(|j| pow(ratio, j - 1)).sum();
    out.push(p0);
    let mut prev = p0;
    for j in 1..k {
        let p = (rest * pow(ratio, j - 1) / norm).min(prev);
        out.push(p);
        prev = p;
    }
}

/// Scales `params.accept` (all depths by one factor) so that the replayed accept length
/// per round at `shape` is `target`, by bisection (monotone thanks to common random
/// numbers). Returns the calibrated parameters.
pub fn calibrate(
    params: &SynthParams,
    shape: &TreeShape,
    target: f64,
) -> Result<SynthParams, TraceError> {
    params.validate()?;
    let max_rate = params.accept.iter().copied().fold(0.0, f64::max);
    if max_rate <= 0.0 {
        return Err(TraceError::Synth {
            message: "accept rates are all 0: nothing to scale".into(),
        });
    }
    let scaled = |f: f64| SynthParams {
        accept: params.accept.iter().map(|&a| (a * f).min(1.0)).collect(),
        ..params.clone()
    };
    let eval = |f: f64| -> Result<f64, TraceError> {
        Ok(accept_length(&synth(&scaled(f))?, shape)?.per_round)
    };
    let (mut lo, mut hi) = (0.0, 1.0 / max_rate);
    let (at_lo, at_hi) = (eval(lo)?, eval(hi)?);
    if !(at_lo..=at_hi).contains(&target) {
        return Err(TraceError::Synth {
            message: format!("target accept length {target} is outside what scaling reaches ({at_lo:.3}..{at_hi:.3})"),
        });
    }
    for _ in 0..30 {
        let mid = 0.5 * (lo + hi);
        if eval(mid)? < target {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    // Round the factor so the stored rates print short and regenerate exactly.
    let f = (0.5 * (lo + hi) * 1e6).round() / 1e6;
    let mut out = scaled(f);
    for a in &mut out.accept {
        *a = (*a * 1e6).round() / 1e6;
    }
    Ok(out)
}
