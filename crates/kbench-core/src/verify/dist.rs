//! Target distributions from logits (temperature, top-k, top-p, in SGLang's order) and
//! sampling from an unnormalised weight vector.

use rand::{Rng, RngExt};
use serde::Serialize;

use super::VerifyError;

/// SGLang's per-request sampling settings that shape the target distribution.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SamplingParams {
    /// 0 means greedy (a one-hot at the argmax).
    pub temperature: f32,
    /// 0 means no top-k cut.
    pub top_k: u32,
    /// 1.0 means no top-p cut.
    pub top_p: f32,
}

impl SamplingParams {
    pub const GREEDY: SamplingParams = SamplingParams {
        temperature: 0.0,
        top_k: 0,
        top_p: 1.0,
    };

    pub fn temperature(t: f32) -> SamplingParams {
        SamplingParams {
            temperature: t,
            top_k: 0,
            top_p: 1.0,
        }
    }
}

/// Numerically stable softmax, computed in f64.
pub fn softmax(logits: &[f32]) -> Vec<f32> {
    let max = logits
        .iter()
        .copied()
        .filter(|x| x.is_finite())
        .fold(f32::NEG_INFINITY, f32::max);
    let exps: Vec<f64> = logits
        .iter()
        .map(|&x| {
            if x.is_finite() {
                f64::from(x - max).exp()
            } else {
                0.0
            }
        })
        .collect();
    let total: f64 = exps.iter().sum();
    exps.iter().map(|&e| (e / total) as f32).collect()
}

/// The distribution the target samples from: softmax(logits / T), then the top-k cut,
/// then the top-p cut (smallest set of most likely tokens whose mass reaches top_p),
/// renormalised, as SGLang's sampler does. Ties in rank are broken by token id.
pub fn target_distribution(
    logits: &[f32],
    params: &SamplingParams,
) -> Result<Vec<f32>, VerifyError> {
    if logits.is_empty() {
        return Err(VerifyError::Params("empty logits".into()));
    }
    if logits.iter().any(|x| x.is_nan() || *x == f32::INFINITY) {
        return Err(VerifyError::Params("logits contain NaN or +inf".into()));
    }
    if logits.iter().all(|x| *x == f32::NEG_INFINITY) {
        return Err(VerifyError::Params("every logit is -inf".into()));
    }
    let t = params.temperature;
    if !(t.is_finite() && t >= 0.0) {
        return Err(VerifyError::Params(format!(
            "temperature {t} must be finite and >= 0"
        )));
    }
    let p = params.top_p;
    if !(p > 0.0 && p <= 1.0) {
        return Err(VerifyError::Params(format!("top_p {p} must be in (0, 1]")));
    }
    // SGLang treats temperatures this small as greedy (avoids overflow in logits / T).
    if t < 1e-5 {
        let mut best = 0;
        for (i, &x) in logits.iter().enumerate() {
            if x > logits[best] {
                best = i;
            }
        }
        let mut one_hot = vec![0.0; logits.len()];
        one_hot[best] = 1.0;
        return Ok(one_hot);
    }
    let scaled: Vec<f32> = logits.iter().map(|&x| x / t).collect();
    let mut probs = softmax(&scaled);
    let mut order: Vec<usize> = (0..probs.len()).collect();
    order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]).then(a.cmp(&b)));
    let mut keep = order.len();
    if params.top_k > 0 {
        keep = keep.min(params.top_k as usize);
    }
    if p < 1.0 {
        let total: f64 = order[..keep].iter().map(|&i| f64::from(probs[i])).sum();
        let mut acc = 0.0;
        for (n, &i) in order[..keep].iter().enumerate() {
            acc += f64::from(probs[i]) / total;
            if acc >= f64::from(p) {
                keep = n + 1;
                break;
            }
        }
    }
    for &i in &order[keep..] {
        probs[i] = 0.0;
    }
    let total: f64 = probs.iter().map(|&x| f64::from(x)).sum();
    for x in &mut probs {
        *x = (f64::from(*x) / total) as f32;
    }
    Ok(probs)
}

/// Samples an index with probability proportional to `weights` (which need not sum to
/// 1). None when the total weight is zero.
pub fn sample_from(weights: &[f32], rng: &mut impl Rng) -> Option<usize> {
    let total: f64 = weights.iter().map(|&w| f64::from(w.max(0.0))).sum();
    if total <= 0.0 {
        return None;
    }
    let u = rng.random::<f64>() * total;
    let mut acc = 0.0;
    let mut last = None;
    for (i, &w) in weights.iter().enumerate() {
        if w > 0.0 {
            acc += f64::from(w);
            last = Some(i);
            if u < acc {
                return Some(i);
            }
        }
    }
    // Rounding can leave u just above the running sum: the last positive entry owns it.
    last
}
