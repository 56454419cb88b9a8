//! Rotary position embeddings: plain, linear and DeepSeek's YaRN (with its mscale), applied
//! to interleaved pairs (x[2i], x[2i+1]) as DeepSeek-V3 / SGLang (is_neox_style = false).

use kbench_core::arch::RopeScaling;

#[derive(Debug, Clone)]
pub struct Rope {
    pub dim: usize,
    inv_freq: Vec<f64>,
    /// cos/sin multiplier (YaRN's mscale / mscale_all_dim ratio; 1 otherwise).
    mscale: f64,
    /// Pairs (2i, 2i+1) when true; halves (i, i + dim/2) when false (Llama / NeoX).
    interleaved: bool,
}

pub fn yarn_get_mscale(scale: f64, mscale: f64) -> f64 {
    if scale <= 1.0 {
        1.0
    } else {
        0.1 * mscale * scale.ln() + 1.0
    }
}

fn yarn_find_correction_dim(num_rotations: f64, dim: usize, base: f64, max_pos: f64) -> f64 {
    (dim as f64 * (max_pos / (num_rotations * 2.0 * std::f64::consts::PI)).ln()) / (2.0 * base.ln())
}

impl Rope {
    pub fn new(dim: usize, theta: f64, scaling: Option<&RopeScaling>, interleaved: bool) -> Rope {
        let half = dim / 2;
        let pos_freqs: Vec<f64> = (0..half)
            .map(|i| theta.powf((2 * i) as f64 / dim as f64))
            .collect();
        let mut inv_freq: Vec<f64> = pos_freqs.iter().map(|p| 1.0 / p).collect();
        let mut mscale = 1.0;
        if let Some(s) = scaling {
            match s.kind.as_str() {
                "yarn" | "deepseek_yarn" => {
                    let factor = s.factor;
                    let orig = s.original_max_position_embeddings.unwrap_or(4096) as f64;
                    let beta_fast = s.beta_fast.unwrap_or(32.0);
                    let beta_slow = s.beta_slow.unwrap_or(1.0);
                    let low = yarn_find_correction_dim(beta_fast, dim, theta, orig)
                        .floor()
                        .max(0.0);
                    let high = yarn_find_correction_dim(beta_slow, dim, theta, orig)
                        .ceil()
                        .min(dim as f64 - 1.0);
                    let (lo, mut hi) = (low, high);
                    if lo == hi {
                        hi += 0.001;
                    }
                    for (i, f) in inv_freq.iter_mut().enumerate() {
                        let ramp = ((i as f64 - lo) / (hi - lo)).clamp(0.0, 1.0);
                        let extrapolation_mask = 1.0 - ramp;
                        let interp = 1.0 / (factor * pos_freqs[i]);
                        let extrap = 1.0 / pos_freqs[i];
                        *f = interp * (1.0 - extrapolation_mask) + extrap * extrapolation_mask;
                    }
                    mscale = yarn_get_mscale(factor, s.mscale.unwrap_or(1.0))
                        / yarn_get_mscale(factor, s.mscale_all_dim.unwrap_or(0.0));
                }
                "linear" => inv_freq.iter_mut().for_each(|f| *f /= s.factor),
                // dynamic / llama3 scaling: positions used here stay far below the original
                // context, where both equal the unscaled rotation.
                _ => {}
            }
        }
        Rope {
            dim,
            inv_freq,
            mscale,
            interleaved,
        }
    }

    /// (cos, sin) for one position, `dim/2` each.
    pub fn table(&self, pos: u32) -> (Vec<f32>, Vec<f32>) {
        let mut c = Vec::with_capacity(self.inv_freq.len());
        let mut s = Vec::with_capacity(self.inv_freq.len());
        for f in &self.inv_freq {
            let a = pos as f64 * f;
            c.push((a.cos() * self.mscale) as f32);
            s.push((a.sin() * self.mscale) as f32);
        }
        (c, s)
    }

    /// Rotates `x` (`dim` values) in place.
    pub fn apply(&self, x: &mut [f32], cos: &[f32], sin: &[f32]) {
        let half = self.dim / 2;
        for i in 0..half {
            let (a, b) = if self.interleaved {
                (2 * i, 2 * i + 1)
            } else {
                (i, i + half)
            };
            let (x0, x1) = (x[a], x[b]);
            x[a] = x0 * cos[i] - x1 * sin[i];
            x[b] = x1 * cos[i] + x0 * sin[i];
        }
    }
}
