//! Producing a tensor's bytes row by row: seeded random rows, INT4 quantisation, and the
//! draft's tensors derived from the target's.

use super::*;

use rand::RngExt;

use kbench_core::seed::rng_for;

use crate::error::Result;
use crate::st::Dtype;
use kbench_numerics::{bf16, int4};

pub(super) fn rand_row(seed: u64, name: &str, row: usize, n: usize, std: f32) -> Vec<f32> {
    let mut rng = rng_for(seed, name, row as u64);
    let a = std * 3f32.sqrt();
    (0..n).map(|_| rng.random_range(-a..a)).collect()
}

impl Gen {
    /// The draft vocabulary: as real d2t maps are built from token frequency, take the
    /// tokens the target most often predicts after a token (its "bigram" image) first.
    /// For large vocabularies (kimi-slice) the first ids.
    pub(super) fn choose_draft_vocab(&self) -> Vec<u32> {
        let (v, dv, h) = (self.d.vocab, self.d.draft_vocab, self.d.hidden);
        if v * h > (1 << 22) {
            return (0..dv as u32).collect();
        }
        let lm: Vec<Vec<f32>> = (0..v)
            .map(|r| rand_row(self.seed, &self.lm_name(), r, h, self.lm_std()))
            .collect();
        let mut count = vec![0usize; v];
        for x in 0..v {
            let mut e = rand_row(self.seed, &self.embed_name(), x, h, 1.0);
            crate::linalg::rms_norm(&mut e, &vec![1.0; h], 1e-6);
            let logits: Vec<f32> = lm
                .iter()
                .map(|r| r.iter().zip(&e).map(|(a, b)| a * b).sum())
                .collect();
            count[crate::linalg::argmax(&logits)] += 1;
        }
        let mut ids: Vec<usize> = (0..v).collect();
        ids.sort_by(|a, b| count[*b].cmp(&count[*a]).then(a.cmp(b)));
        let mut chosen: Vec<u32> = ids[..dv].iter().map(|&i| i as u32).collect();
        chosen.sort_unstable();
        chosen
    }

    pub(super) fn lm_std(&self) -> f32 {
        self.d.logit_scale / (self.d.hidden as f32).sqrt()
    }

    /// One row of a float tensor.
    pub(super) fn float_row(&self, job: &Job, row: usize) -> Vec<f32> {
        let name = &job.plan.name;
        let cols = if job.plan.shape.len() >= 2 {
            job.plan.shape[1]
        } else {
            job.plan.shape[0]
        };
        match &job.fill {
            Fill::Rand { std } => rand_row(self.seed, name, row, cols, *std),
            Fill::Const(c) => vec![*c; cols],
            Fill::DraftLmHead => {
                // Each draft row is the target's row with probability `quality`, else noise:
                // the draft's top-1 agrees with the target's about `quality` of the time.
                let keep = rng_for(self.seed, "draft-row-kept", row as u64)
                    .random_range(0.0f32..1.0)
                    < self.quality;
                if keep {
                    rand_row(
                        self.seed,
                        &self.lm_name(),
                        self.d2t[row] as usize,
                        cols,
                        self.lm_std(),
                    )
                } else {
                    rand_row(self.seed, name, row, cols, self.lm_std())
                }
            }
            Fill::DraftAttn(part) => self.draft_attn_row(*part, row, cols),
            _ => vec![0.0; cols],
        }
    }

    /// Draft attention that attends to the current position and copies its normalised
    /// token embedding: q = k = c * [I | 0] on the embedding half, v = [I | -I], o = I.
    pub(super) fn draft_attn_row(&self, part: AttnPart, row: usize, cols: usize) -> Vec<f32> {
        let h = self.d.hidden;
        let (nh, nkv, hd) = (
            self.d.draft_heads,
            self.d.draft_kv_heads,
            self.d.draft_head_dim,
        );
        let mut v = vec![0f32; cols];
        let sharp = 3.0f32;
        match part {
            AttnPart::Q => {
                // Query head qh reads the dims its KV head reads.
                let (qh, x) = (row / hd, row % hd);
                let kh = qh / (nh / nkv);
                let dim = kh * hd + x;
                if dim < h {
                    v[dim] = sharp;
                }
            }
            AttnPart::K => {
                if row < h {
                    v[row] = sharp;
                }
            }
            AttnPart::V => {
                // v = norm(embedding) - norm(hidden): with the residual (the hidden, whose
                // rms is ~1 by construction of fc and of this layer) the layer's output is
                // ~ the new token's normalised embedding, whatever came before.
                if row < h {
                    v[row] = 1.0;
                    v[h + row] = -1.0;
                }
            }
            AttnPart::O => {
                // Output dim `row` sums the query heads that carry KV dim `row`.
                let group = nh / nkv;
                if row < nkv * hd {
                    let (kh, x) = (row / hd, row % hd);
                    for g in 0..group {
                        let qh = kh * group + g;
                        v[qh * hd + x] = 1.0 / group as f32;
                    }
                }
            }
        }
        v
    }

    pub(super) fn produce(
        &self,
        job: &Job,
        cache: &mut QuantCache,
        sink: &mut dyn FnMut(&[u8]) -> Result<()>,
    ) -> Result<()> {
        let shape = &job.plan.shape;
        match &job.fill {
            Fill::Int4Packed { base, matrix, std } | Fill::Int4Scale { base, matrix, std } => {
                if cache.key != *base {
                    let group = self.shapes.group;
                    let [out, inp] = *matrix;
                    let (words, scales) = (inp / 8, inp / group);
                    cache.packed = vec![0; out * words];
                    cache.scales = vec![0; out * scales];
                    for r in 0..out {
                        let row = rand_row(self.seed, base, r, inp, *std);
                        int4::quantize_row_into(
                            &row,
                            group,
                            &mut cache.packed[r * words..(r + 1) * words],
                            &mut cache.scales[r * scales..(r + 1) * scales],
                        );
                    }
                    cache.key = base.clone();
                }
                let bytes: Vec<u8> = match &job.fill {
                    Fill::Int4Packed { .. } => {
                        cache.packed.iter().flat_map(|w| w.to_le_bytes()).collect()
                    }
                    _ => cache.scales.iter().flat_map(|w| w.to_le_bytes()).collect(),
                };
                sink(&bytes)
            }
            Fill::Int4Shape { matrix: [out, inp] } => {
                let mut b = Vec::new();
                b.extend((*out as i32).to_le_bytes());
                b.extend((*inp as i32).to_le_bytes());
                sink(&b)
            }
            Fill::D2t => {
                let b: Vec<u8> = self
                    .d2t
                    .iter()
                    .enumerate()
                    .flat_map(|(i, &t)| (t as i64 - i as i64).to_le_bytes())
                    .collect();
                sink(&b)
            }
            Fill::T2d => {
                let mut b = vec![0u8; self.d.vocab];
                for &t in &self.d2t {
                    b[t as usize] = 1;
                }
                sink(&b)
            }
            _ => {
                let rows = if shape.len() >= 2 { shape[0] } else { 1 };
                for r in 0..rows {
                    let row = self.float_row(job, r);
                    let b: Vec<u8> = match job.plan.dtype {
                        Dtype::F32 => row.iter().flat_map(|x| x.to_le_bytes()).collect(),
                        _ => row
                            .iter()
                            .flat_map(|&x| bf16::from_f32(x).to_le_bytes())
                            .collect(),
                    };
                    sink(&b)?;
                }
                Ok(())
            }
        }
    }
}
