//! Rotary position embeddings: plain, linear and DeepSeek's YaRN (with its mscale), applied
//! to interleaved pairs (x[2i], x[2i+1]) as DeepSeek-V3 / SGLang (is_neox_style = false).

use kbench_core::arch::RopeScaling;
use kbench_numerics::rope::{frequencies, Scaling};

#[derive(Debug, Clone)]
pub struct Rope {
    pub dim: usize,
    inv_freq: Vec<f64>,
    /// cos/sin multiplier (YaRN's mscale / mscale_all_dim ratio; 1 otherwise).
    mscale: f64,
    /// Pairs (2i, 2i+1) when true; halves (i, i + dim/2) when false (Llama / NeoX).
    interleaved: bool,
}

/// MLA's softmax scale for a `qk_head_dim`-wide head under the config's `rope_scaling`.
pub fn mla_softmax_scale(qk_head_dim: usize, scaling: Option<&RopeScaling>) -> f64 {
    kbench_numerics::rope::mla_softmax_scale(
        qk_head_dim,
        scaling.map(|s| (s.factor, s.mscale_all_dim.unwrap_or(0.0))),
    )
}

impl Rope {
    pub fn new(dim: usize, theta: f64, scaling: Option<&RopeScaling>, interleaved: bool) -> Rope {
        let f = frequencies(
            dim,
            theta,
            scaling.map_or(Scaling::None, RopeScaling::scaling),
        );
        Rope {
            dim,
            inv_freq: f.inv_freq,
            mscale: f.mscale,
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
