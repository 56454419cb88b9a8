//! CPU kernels: y = x W^T over BF16 and INT4 group-quantised weights with f32 math.
//!
//! Every output element is computed by the same sequence of f32 operations whatever the
//! batch size M, the thread count or the instruction set (Rust never contracts a*b+c
//! into an FMA on its own): batching never changes a request's numbers, and a token's
//! logits are bit-identical in a prefill, a decode step or a tree-verify pass.

use rayon::prelude::*;

use crate::st::Slice;
use kbench_numerics::bf16;

/// Weights of one linear layer, `[out, in]` row-major.
#[derive(Debug, Clone)]
pub enum Weight {
    Bf16(Slice<u16>),
    /// compressed-tensors INT4: packed `[out, in/8]` words, BF16 scales `[out, in/group]`.
    Int4 {
        packed: Slice<u32>,
        scales: Slice<u16>,
        group: usize,
    },
}

#[derive(Debug, Clone)]
pub struct Linear {
    pub out: usize,
    pub inp: usize,
    pub w: Weight,
}

/// Below this many weights a matmul runs on the calling thread.
const PAR_THRESHOLD: usize = 1 << 18;
/// Rows per parallel task.
const ROWS_PER_TASK: usize = 16;

impl Linear {
    pub fn bf16(out: usize, inp: usize, w: Slice<u16>) -> Linear {
        Linear {
            out,
            inp,
            w: Weight::Bf16(w),
        }
    }

    /// Weight bytes read by one pass over the matrix.
    pub fn bytes(&self) -> usize {
        match &self.w {
            Weight::Bf16(_) => self.out * self.inp * 2,
            Weight::Int4 { group, .. } => self.out * self.inp / 2 + self.out * self.inp / group * 2,
        }
    }

    /// `x` is `[m, in]`; returns `[m, out]`.
    pub fn forward(&self, x: &[f32], m: usize) -> Vec<f32> {
        debug_assert_eq!(x.len(), m * self.inp);
        let mut yt = vec![0f32; self.out * m];
        if m == 0 {
            return yt;
        }
        let work = |(chunk_idx, ychunk): (usize, &mut [f32])| {
            let r0 = chunk_idx * ROWS_PER_TASK;
            let rows = ychunk.len() / m;
            rows_kernel(self, x, m, r0, rows, ychunk);
        };
        if self.out * self.inp >= PAR_THRESHOLD && rayon::current_num_threads() > 1 {
            yt.par_chunks_mut(ROWS_PER_TASK * m)
                .enumerate()
                .for_each(work);
        } else {
            yt.chunks_mut(ROWS_PER_TASK * m).enumerate().for_each(work);
        }
        if m == 1 {
            return yt;
        }
        let mut y = vec![0f32; m * self.out];
        for r in 0..self.out {
            for i in 0..m {
                y[i * self.out + r] = yt[r * m + i];
            }
        }
        y
    }
}

fn rows_kernel(lin: &Linear, x: &[f32], m: usize, r0: usize, rows: usize, yt: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if lin.inp % 32 == 0
            && std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the CPU supports AVX2 and FMA (checked just above); slices are indexed
            // within bounds checked by the caller's shapes (inp % 32 == 0).
            unsafe { avx2::rows_kernel(lin, x, m, r0, rows, yt) };
            return;
        }
    }
    rows_kernel_generic(lin, x, m, r0, rows, yt)
}

/// Portable kernel: the same algebra as the AVX2 one (8 lanes, fused multiply-adds, 32-wide
/// blocks summed in two chains, block b into accumulator b % 4, INT4 block sums scaled once
/// per block), so results on one machine never depend on M.
fn rows_kernel_generic(lin: &Linear, x: &[f32], m: usize, r0: usize, rows: usize, yt: &mut [f32]) {
    let inp = lin.inp;
    let mut acc = vec![[[0f32; 8]; 4]; m];
    let mut tail = vec![0f32; m];
    let mut wf = [0f32; 32];
    let full = inp / 32;
    for rr in 0..rows {
        let r = r0 + rr;
        acc.iter_mut().for_each(|a| *a = [[0.0; 8]; 4]);
        tail.iter_mut().for_each(|t| *t = 0.0);
        match &lin.w {
            Weight::Bf16(w) => {
                let row = &w.as_slice()[r * inp..(r + 1) * inp];
                for b in 0..full {
                    for i in 0..32 {
                        wf[i] = bf16::to_f32(row[b * 32 + i]);
                    }
                    for (i, a) in acc.iter_mut().enumerate() {
                        let xs = &x[i * inp + b * 32..i * inp + b * 32 + 32];
                        let g = block_dot(&wf, xs);
                        let a = &mut a[b % 4];
                        for l in 0..8 {
                            a[l] += g[l];
                        }
                    }
                }
                for c in full * 32..inp {
                    let wv = bf16::to_f32(row[c]);
                    for (i, t) in tail.iter_mut().enumerate() {
                        *t = wv.mul_add(x[i * inp + c], *t);
                    }
                }
            }
            Weight::Int4 {
                packed,
                scales,
                group,
            } => {
                let group = *group;
                let words = &packed.as_slice()[r * inp / 8..(r + 1) * inp / 8];
                let sc = &scales.as_slice()[r * inp / group..(r + 1) * inp / group];
                for b in 0..full {
                    let s = bf16::to_f32(sc[b * 32 / group]);
                    for k in 0..4 {
                        let word = words[b * 4 + k];
                        for j in 0..8 {
                            wf[k * 8 + j] = kbench_numerics::int4::nibble(word, j) as f32;
                        }
                    }
                    for (i, a) in acc.iter_mut().enumerate() {
                        let xs = &x[i * inp + b * 32..i * inp + b * 32 + 32];
                        let g = block_dot(&wf, xs);
                        let a = &mut a[b % 4];
                        for l in 0..8 {
                            a[l] = s.mul_add(g[l], a[l]);
                        }
                    }
                }
            }
        }
        for i in 0..m {
            yt[rr * m + i] = hsum_acc(&acc[i]) + tail[i];
        }
    }
}

/// (w0*x0 + w1*x1) + (w2*x2 + w3*x3) over four 8-lane chunks, fused multiply-adds.
#[inline(always)]
fn block_dot(w: &[f32; 32], x: &[f32]) -> [f32; 8] {
    let mut g = [0f32; 8];
    for l in 0..8 {
        let a = w[8 + l].mul_add(x[8 + l], w[l] * x[l]);
        let b = w[24 + l].mul_add(x[24 + l], w[16 + l] * x[16 + l]);
        g[l] = a + b;
    }
    g
}

#[inline(always)]
fn hsum_acc(a: &[[f32; 8]; 4]) -> f32 {
    let mut v = [0f32; 8];
    for l in 0..8 {
        v[l] = (a[0][l] + a[1][l]) + (a[2][l] + a[3][l]);
    }
    hsum8(&v)
}

#[inline(always)]
fn hsum8(a: &[f32; 8]) -> f32 {
    ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]))
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{hsum8, Linear, Weight};

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn block_dot(w: &[__m256; 4], x: &[__m256; 4]) -> __m256 {
        let a = _mm256_fmadd_ps(w[1], x[1], _mm256_mul_ps(w[0], x[0]));
        let b = _mm256_fmadd_ps(w[3], x[3], _mm256_mul_ps(w[2], x[2]));
        _mm256_add_ps(a, b)
    }
    use std::arch::x86_64::*;

    /// Rows per tile: a tile's weight blocks are unpacked once and reused across all M
    /// inputs while the input block is hot in L1.
    const TILE: usize = 4;

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn rows_kernel(
        lin: &Linear,
        x: &[f32],
        m: usize,
        r0: usize,
        rows: usize,
        yt: &mut [f32],
    ) {
        let inp = lin.inp;
        let full = inp / 32;
        let mut acc: Vec<[__m256; 4]> = vec![[_mm256_setzero_ps(); 4]; TILE * m];
        let xp = x.as_ptr();
        let shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
        let nibble = _mm256_set1_epi32(0xF);
        let two23 = _mm256_set1_epi32(0x4B00_0000);
        let two23_plus_8 = _mm256_set1_ps(8_388_616.0);
        let mut t0 = 0;
        while t0 < rows {
            let nt = TILE.min(rows - t0);
            for a in acc.iter_mut() {
                *a = [_mm256_setzero_ps(); 4];
            }
            for b in 0..full {
                let mut wv = [[_mm256_setzero_ps(); 4]; TILE];
                let mut sv = [_mm256_setzero_ps(); TILE];
                for t in 0..nt {
                    let r = r0 + t0 + t;
                    match &lin.w {
                        Weight::Bf16(w) => {
                            let row = w.as_slice().as_ptr().add(r * inp + b * 32);
                            for (c, v) in wv[t].iter_mut().enumerate() {
                                let h = _mm_loadu_si128(row.add(c * 8) as *const __m128i);
                                *v = _mm256_castsi256_ps(_mm256_slli_epi32(
                                    _mm256_cvtepu16_epi32(h),
                                    16,
                                ));
                            }
                        }
                        Weight::Int4 {
                            packed,
                            scales,
                            group,
                        } => {
                            let group = *group;
                            let si = if group == 32 { b } else { b * 32 / group };
                            let sc = scales.as_slice();
                            sv[t] = _mm256_set1_ps(kbench_numerics::bf16::to_f32(
                                *sc.get_unchecked(r * (inp / group) + si),
                            ));
                            // Word k holds columns 8k..8k+7, nibble j at bits 4j. Each lane
                            // shifts its own nibble down and ORs it into the mantissa of 2^23,
                            // so one subtraction of 2^23 + 8 yields q - 8 exactly: no shuffles.
                            let wp =
                                packed.as_slice().as_ptr().add(r * inp / 8 + b * 4) as *const i32;
                            for (k, v) in wv[t].iter_mut().enumerate() {
                                let word = _mm256_set1_epi32(*wp.add(k));
                                let q = _mm256_and_si256(_mm256_srlv_epi32(word, shifts), nibble);
                                *v = _mm256_sub_ps(
                                    _mm256_castsi256_ps(_mm256_or_si256(q, two23)),
                                    two23_plus_8,
                                );
                            }
                        }
                    }
                }
                let int4 = matches!(lin.w, Weight::Int4 { .. });
                for i in 0..m {
                    // Loaded once per input row and reused by every row of the tile.
                    let xs = xp.add(i * inp + b * 32);
                    let xv = [
                        _mm256_loadu_ps(xs),
                        _mm256_loadu_ps(xs.add(8)),
                        _mm256_loadu_ps(xs.add(16)),
                        _mm256_loadu_ps(xs.add(24)),
                    ];
                    for t in 0..nt {
                        let g = block_dot(&wv[t], &xv);
                        let a = &mut acc[t * m + i][b % 4];
                        *a = if int4 {
                            _mm256_fmadd_ps(sv[t], g, *a)
                        } else {
                            _mm256_add_ps(*a, g)
                        };
                    }
                }
            }
            for t in 0..nt {
                for i in 0..m {
                    let a = &acc[t * m + i];
                    let v = _mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3]));
                    let mut lanes = [0f32; 8];
                    _mm256_storeu_ps(lanes.as_mut_ptr(), v);
                    yt[(t0 + t) * m + i] = hsum8(&lanes) + 0.0;
                }
            }
            t0 += nt;
        }
    }
}

/// RMSNorm over each row of `x` (`[m, n]`), in place.
pub fn rms_norm(x: &mut [f32], w: &[f32], eps: f32) {
    let n = w.len();
    for row in x.chunks_exact_mut(n) {
        let ss: f32 = row.iter().map(|v| v * v).sum::<f32>() / n as f32;
        let inv = 1.0 / (ss + eps).sqrt();
        for (v, g) in row.iter_mut().zip(w) {
            *v = *v * inv * g;
        }
    }
}

pub fn rms_norm_to(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let mut y = x.to_vec();
    rms_norm(&mut y, w, eps);
    y
}

#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// SwiGLU: down(silu(gate(x)) * up(x)).
pub fn swiglu(gate: &Linear, up: &Linear, down: &Linear, x: &[f32], m: usize) -> Vec<f32> {
    let g = gate.forward(x, m);
    let u = up.forward(x, m);
    let h: Vec<f32> = g.iter().zip(&u).map(|(a, b)| silu(*a) * b).collect();
    down.forward(&h, m)
}

/// Index of the largest value; ties go to the lowest index (NaN never wins).
pub fn argmax(v: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best
}

/// Stable softmax in place (f32, fixed order).
pub fn softmax_inplace(v: &mut [f32]) {
    let max = v.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f32;
    for x in v.iter_mut() {
        *x = (*x - max).exp();
        sum += *x;
    }
    for x in v.iter_mut() {
        *x /= sum;
    }
}

/// The `k` largest entries as (index, value), descending, ties by lower index.
pub fn topk(v: &[f32], k: usize) -> Vec<(usize, f32)> {
    let mut idx: Vec<usize> = (0..v.len()).collect();
    let cmp = |a: &usize, b: &usize| v[*b].total_cmp(&v[*a]).then(a.cmp(b));
    let k = k.min(v.len());
    if k > 0 && k < idx.len() {
        idx.select_nth_unstable_by(k - 1, cmp);
    }
    idx.truncate(k);
    idx.sort_by(cmp);
    idx.into_iter().map(|i| (i, v[i])).collect()
}
