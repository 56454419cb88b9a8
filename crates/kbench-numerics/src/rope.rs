//! Rotary frequencies: plain, linear and DeepSeek's YaRN (`DeepseekScalingRotaryEmbedding`
//! in SGLang, `DeepseekV3YarnRotaryEmbedding` in HF), and the MLA softmax scale YaRN
//! changes.

use std::f64::consts::PI;

/// How positions are stretched beyond the pretraining context (HF `rope_scaling`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scaling {
    None,
    Linear { factor: f64 },
    Yarn(Yarn),
}

/// YaRN's parameters, with HF's defaults where a config leaves them out.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Yarn {
    pub factor: f64,
    pub original_max_position: f64,
    pub beta_fast: f64,
    pub beta_slow: f64,
    pub mscale: f64,
    pub mscale_all_dim: f64,
}

/// What rotating a head needs: one inverse frequency per pair, and the factor YaRN puts on
/// cos and sin (1 otherwise).
#[derive(Debug, Clone, PartialEq)]
pub struct Frequencies {
    pub inv_freq: Vec<f64>,
    pub mscale: f64,
}

pub fn yarn_get_mscale(scale: f64, mscale: f64) -> f64 {
    if scale <= 1.0 {
        1.0
    } else {
        0.1 * mscale * scale.ln() + 1.0
    }
}

fn yarn_find_correction_dim(num_rotations: f64, dim: usize, base: f64, max_pos: f64) -> f64 {
    (dim as f64 * (max_pos / (num_rotations * 2.0 * PI)).ln()) / (2.0 * base.ln())
}

/// The frequencies of a `dim`-wide rotary head with base `theta`.
pub fn frequencies(dim: usize, theta: f64, scaling: Scaling) -> Frequencies {
    let pos_freqs: Vec<f64> = (0..dim / 2)
        .map(|i| theta.powf((2 * i) as f64 / dim as f64))
        .collect();
    let extrapolated = pos_freqs.iter().map(|p| 1.0 / p);
    match scaling {
        Scaling::None => Frequencies {
            inv_freq: extrapolated.collect(),
            mscale: 1.0,
        },
        Scaling::Linear { factor } => Frequencies {
            inv_freq: extrapolated.map(|f| f / factor).collect(),
            mscale: 1.0,
        },
        Scaling::Yarn(y) => {
            let low = yarn_find_correction_dim(y.beta_fast, dim, theta, y.original_max_position)
                .floor()
                .max(0.0);
            let mut high =
                yarn_find_correction_dim(y.beta_slow, dim, theta, y.original_max_position)
                    .ceil()
                    .min(dim as f64 - 1.0);
            if low == high {
                high += 0.001;
            }
            let inv_freq = pos_freqs
                .iter()
                .enumerate()
                .map(|(i, &p)| {
                    let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
                    // 1: the original frequency (extrapolation); 0: stretched by the factor
                    let extrapolation = 1.0 - ramp;
                    let interpolated = 1.0 / (y.factor * p);
                    interpolated * (1.0 - extrapolation) + (1.0 / p) * extrapolation
                })
                .collect();
            Frequencies {
                inv_freq,
                mscale: yarn_get_mscale(y.factor, y.mscale)
                    / yarn_get_mscale(y.factor, y.mscale_all_dim),
            }
        }
    }
}

/// MLA's softmax scale: 1/sqrt(qk_head_dim), times mscale(factor, mscale_all_dim)^2 when the
/// model scales its positions (SGLang's DeepseekV2AttentionMLA, for any `rope_scaling`).
/// `rope_scaling`: (factor, mscale_all_dim), the latter 0 where the config leaves it out.
pub fn mla_softmax_scale(qk_head_dim: usize, rope_scaling: Option<(f64, f64)>) -> f64 {
    let base = 1.0 / (qk_head_dim as f64).sqrt();
    match rope_scaling {
        Some((factor, mscale_all_dim)) if mscale_all_dim != 0.0 => {
            let m = yarn_get_mscale(factor, mscale_all_dim);
            base * m * m
        }
        _ => base,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kimi() -> Yarn {
        Yarn {
            factor: 64.0,
            original_max_position: 4096.0,
            beta_fast: 1.0,
            beta_slow: 1.0,
            mscale: 1.0,
            mscale_all_dim: 1.0,
        }
    }

    #[test]
    fn plain_frequencies_fall_geometrically() {
        let f = frequencies(8, 10_000.0, Scaling::None);
        assert_eq!(f.inv_freq[0], 1.0);
        assert!((f.inv_freq[1] - 0.1).abs() < 1e-15);
        assert_eq!(f.mscale, 1.0);
        let l = frequencies(8, 10_000.0, Scaling::Linear { factor: 4.0 });
        assert_eq!(l.inv_freq[0], 0.25);
    }

    #[test]
    fn yarn_keeps_fast_pairs_and_stretches_slow_ones() {
        let plain = frequencies(64, 50_000.0, Scaling::None);
        let y = frequencies(64, 50_000.0, Scaling::Yarn(kimi()));
        // beta_fast = beta_slow = 1: one ramp; the first pairs rotate as before, the last
        // are slowed by the factor
        assert_eq!(y.inv_freq[0], plain.inv_freq[0]);
        assert!((y.inv_freq[31] * 64.0 - plain.inv_freq[31]).abs() < 1e-18);
        // mscale == mscale_all_dim: the ratio is 1
        assert_eq!(y.mscale, 1.0);
    }

    #[test]
    fn the_softmax_scale_grows_with_the_stretch() {
        let plain = mla_softmax_scale(192, None);
        assert!((plain - 1.0 / 192f64.sqrt()).abs() < 1e-15);
        let m = 0.1 * 64f64.ln() + 1.0;
        let scaled = mla_softmax_scale(192, Some((64.0, 1.0)));
        assert!((scaled - plain * m * m).abs() < 1e-15);
        assert_eq!(mla_softmax_scale(192, Some((64.0, 0.0))), plain);
    }
}
