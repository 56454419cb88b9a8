//! Straightforward f32 CPU references for every kernel (the oracle for the GPU tests), and the
//! host-side helpers the kernels need (INT4 packing, YaRN frequencies, from kbench-numerics).

// Each reference takes its kernel's parameters one for one.
#![allow(clippy::too_many_arguments)]

use crate::bf16;

/// Pack q in [-8, 7] (row-major [N, K]) into compressed-tensors int32 words [N, K/8].
pub fn pack_int4(q: &[i8], n: usize, k: usize) -> Vec<u32> {
    assert_eq!(q.len(), n * k);
    assert!(k % 8 == 0);
    assert!(q.iter().all(|v| (-8..=7).contains(v)));
    kbench_numerics::int4::pack(q)
}

/// Dequantize packed INT4 [N, K/8] with bf16 scales [N, K/32] (the kernels' group) to f32.
pub fn dequant_int4(wq: &[u32], s: &[u16], n: usize, k: usize) -> Vec<f32> {
    kbench_numerics::int4::dequantize(wq, s, n, k, 32)
}

/// y[m, n] = sum_k x[m, k] w[n, k] (f64 accumulation), x [M, K], w [N, K].
pub fn matmul_nt(x: &[f32], w: &[f32], m: usize, n: usize, k: usize) -> Vec<f32> {
    let mut y = vec![0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut a = 0f64;
            for t in 0..k {
                a += x[i * k + t] as f64 * w[j * k + t] as f64;
            }
            y[i * n + j] = a as f32;
        }
    }
    y
}

pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// DeepSeek-V3 routing: returns (ids [T, k], weights [T, k]).
pub fn moe_route(
    logits: &[f32],
    bias: Option<&[f32]>,
    t: usize,
    e: usize,
    top_k: usize,
    n_group: usize,
    topk_group: usize,
    renorm: bool,
    scaling: f32,
) -> (Vec<i32>, Vec<f32>) {
    let mut ids = vec![0i32; t * top_k];
    let mut wts = vec![0f32; t * top_k];
    for tok in 0..t {
        let lg = &logits[tok * e..(tok + 1) * e];
        let score: Vec<f32> = lg.iter().map(|&x| sigmoid(x)).collect();
        let mut ch: Vec<f32> = (0..e)
            .map(|i| score[i] + bias.map_or(0.0, |b| b[i]))
            .collect();
        if n_group > 1 {
            let gs = e / n_group;
            let mut gsc: Vec<(f32, usize)> = (0..n_group)
                .map(|g| {
                    let mut v: Vec<f32> = ch[g * gs..(g + 1) * gs].to_vec();
                    v.sort_by(|a, b| b.partial_cmp(a).unwrap());
                    (if gs >= 2 { v[0] + v[1] } else { v[0] }, g)
                })
                .collect();
            gsc.sort_by(|a, b| b.0.partial_cmp(&a.0).unwrap().then(a.1.cmp(&b.1)));
            let keep: Vec<usize> = gsc[..topk_group].iter().map(|x| x.1).collect();
            for (i, c) in ch.iter_mut().enumerate() {
                if !keep.contains(&(i / gs)) {
                    *c = f32::NEG_INFINITY;
                }
            }
        }
        let mut order: Vec<usize> = (0..e).collect();
        order.sort_by(|&a, &b| ch[b].partial_cmp(&ch[a]).unwrap().then(a.cmp(&b)));
        let sel = &order[..top_k];
        let sum: f32 = sel.iter().map(|&i| score[i]).sum();
        for (j, &i) in sel.iter().enumerate() {
            ids[tok * top_k + j] = i as i32;
            wts[tok * top_k + j] = score[i]
                * if renorm {
                    scaling / (sum + 1e-20)
                } else {
                    scaling
                };
        }
    }
    (ids, wts)
}

/// Routed experts given routing: x [T, H]; w13 dequantized [E][2I, H]; w2 [E][H, I].
/// act is rounded to bf16 as the kernel stores it. Returns f32 [T, H] (before bf16 rounding).
pub fn moe_experts(
    x: &[f32],
    t: usize,
    h: usize,
    i: usize,
    ids: &[i32],
    wts: &[f32],
    top_k: usize,
    w13: &dyn Fn(usize) -> Vec<f32>,
    w2: &dyn Fn(usize) -> Vec<f32>,
    shared: Option<&[f32]>,
) -> Vec<f32> {
    let mut out = vec![0f32; t * h];
    for tok in 0..t {
        let xr = &x[tok * h..(tok + 1) * h];
        for n in 0..h {
            out[tok * h + n] = shared.map_or(0.0, |s| s[tok * h + n]);
        }
        for j in 0..top_k {
            let e = ids[tok * top_k + j] as usize;
            let a = w13(e);
            let b = w2(e);
            let gu = matmul_nt(xr, &a, 1, 2 * i, h);
            let act: Vec<f32> = (0..i)
                .map(|c| bf16::round(silu(gu[c]) * gu[i + c]))
                .collect();
            let d = matmul_nt(&act, &b, 1, h, i);
            for n in 0..h {
                out[tok * h + n] += wts[tok * top_k + j] * d[n];
            }
        }
    }
    out
}

/// MLA attention reference for one request. q [R, 576] (R = q_len * H), kv [kv_len, 576]
/// (prefix then the q_len query tokens), mask[qi] bit j: tree token j visible (None = causal).
pub fn mla_attention(
    q: &[f32],
    kv: &[f32],
    q_len: usize,
    h: usize,
    prefix: usize,
    mask: Option<&[u64]>,
    scale: f32,
) -> Vec<f32> {
    let r = q_len * h;
    let kv_len = prefix + q_len;
    let mut out = vec![0f32; r * 512];
    for row in 0..r {
        let qi = row / h;
        let qr = &q[row * 576..(row + 1) * 576];
        let mut sc = vec![f64::NEG_INFINITY; kv_len];
        for (s, scv) in sc.iter_mut().enumerate() {
            let vis = s < prefix
                || match mask {
                    Some(m) => (m[qi] >> (s - prefix)) & 1 == 1,
                    None => s - prefix <= qi,
                };
            if vis {
                let kr = &kv[s * 576..(s + 1) * 576];
                *scv = qr
                    .iter()
                    .zip(kr)
                    .map(|(a, b)| *a as f64 * *b as f64)
                    .sum::<f64>()
                    * scale as f64;
            }
        }
        let mx = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let p: Vec<f64> = sc
            .iter()
            .map(|&s| {
                if s == f64::NEG_INFINITY {
                    0.0
                } else {
                    (s - mx).exp()
                }
            })
            .collect();
        let z: f64 = p.iter().sum();
        for d in 0..512 {
            let mut a = 0f64;
            for s in 0..kv_len {
                a += p[s] * kv[s * 576 + d] as f64;
            }
            out[row * 512 + d] = (a / z) as f32;
        }
    }
    out
}

pub fn rmsnorm(x: &[f32], w: &[f32], d: usize, eps: f32) -> Vec<f32> {
    let mut y = vec![0f32; x.len()];
    for (r, row) in x.chunks(d).enumerate() {
        let ms: f64 = row.iter().map(|v| (*v as f64) * (*v as f64)).sum::<f64>() / d as f64;
        let inv = 1.0 / (ms + eps as f64).sqrt();
        for c in 0..d {
            y[r * d + c] = (row[c] as f64 * inv * w[c] as f64) as f32;
        }
    }
    y
}

pub use kbench_numerics::rope::Yarn;

/// Kimi-K2.5's RoPE base, from kbench-core's model preset.
pub const KIMI_K25_ROPE_THETA: f64 = 50000.0;

/// Kimi-K2.5's YaRN parameters as kbench-core's model preset gives them (the one place kbench
/// writes them down; the engine reads a real checkpoint's from its config.json).
pub fn kimi_k25_yarn() -> Yarn {
    let arch = kbench_core::arch::ModelArch::preset("kimi-k2.5").expect("a built-in preset");
    debug_assert_eq!(arch.rope_theta, KIMI_K25_ROPE_THETA);
    match arch.rope_scaling.as_ref().map(|s| s.scaling()) {
        Some(kbench_numerics::rope::Scaling::Yarn(y)) => y,
        other => panic!("Kimi-K2.5's preset scales its positions with YaRN, not {other:?}"),
    }
}

/// (inv_freq [dim/2] in f32 as the kernel takes it, cos/sin multiplier) for Kimi-K2.5's
/// base; `factor <= 1` gives plain RoPE.
pub fn yarn_inv_freq(y: &Yarn, dim: usize) -> (Vec<f32>, f32) {
    let f = kbench_numerics::rope::frequencies(
        dim,
        KIMI_K25_ROPE_THETA,
        kbench_numerics::rope::Scaling::Yarn(*y),
    );
    (
        f.inv_freq.iter().map(|&v| v as f32).collect(),
        f.mscale as f32,
    )
}

/// Softmax scale of MLA with YaRN.
pub fn mla_softmax_scale(qk_head_dim: usize, y: &Yarn) -> f32 {
    kbench_numerics::rope::mla_softmax_scale(qk_head_dim, Some((y.factor, y.mscale_all_dim))) as f32
}

/// In-place rope on one vector `x[..rot_dim]`.
pub fn rope(x: &mut [f32], pos: i32, inv_freq: &[f32], mscale: f32, interleaved: bool) {
    let half = inv_freq.len();
    for (i, &f) in inv_freq.iter().enumerate() {
        let (i0, i1) = if interleaved {
            (2 * i, 2 * i + 1)
        } else {
            (i, i + half)
        };
        let ang = pos as f64 * f as f64;
        let (s, c) = ang.sin_cos();
        let (c, s) = (c * mscale as f64, s * mscale as f64);
        let (a, b) = (x[i0] as f64, x[i1] as f64);
        x[i0] = (a * c - b * s) as f32;
        x[i1] = (b * c + a * s) as f32;
    }
}

/// Top-k (value desc, index asc), NaN never picked.
pub fn topk(row: &[f32], k: usize) -> Vec<(usize, f32)> {
    let mut idx: Vec<usize> = (0..row.len()).filter(|&i| !row[i].is_nan()).collect();
    idx.sort_by(|&a, &b| row[b].partial_cmp(&row[a]).unwrap().then(a.cmp(&b)));
    idx.into_iter().take(k).map(|i| (i, row[i])).collect()
}

/// Greedy tree walk; returns (accept_len, accepted node indices, output tokens).
pub fn tree_verify_greedy(
    cand: &[i32],
    parent: &[i32],
    target: &[i32],
) -> (usize, Vec<i32>, Vec<i32>) {
    let n = cand.len();
    let (mut cur, mut nodes, mut toks) = (0usize, vec![], vec![]);
    loop {
        let want = target[cur];
        let next = (cur + 1..n).find(|&i| parent[i] == cur as i32 && cand[i] == want);
        match next {
            Some(i) => {
                nodes.push(i as i32);
                toks.push(cand[i]);
                cur = i;
            }
            None => break,
        }
    }
    toks.push(target[cur]);
    (nodes.len() + 1, nodes, toks)
}

/// The kept set and normalised probabilities of sampling.cu (f64 sums): Vec of (index, prob).
pub fn sampling_distribution(
    x: &[f32],
    temperature: f32,
    top_k: i32,
    top_p: f32,
) -> Vec<(usize, f64)> {
    let v = x.len();
    let valid: Vec<usize> = (0..v).filter(|&i| !x[i].is_nan()).collect();
    if temperature <= 0.0 {
        let best = topk(x, 1)[0].0;
        return vec![(best, 1.0)];
    }
    let mx = valid
        .iter()
        .map(|&i| x[i])
        .fold(f32::NEG_INFINITY, f32::max);
    let mut sorted = valid.clone();
    sorted.sort_by(|&a, &b| x[b].partial_cmp(&x[a]).unwrap());
    let kth = if top_k > 0 && (top_k as usize) < v {
        x[sorted[top_k as usize - 1]]
    } else {
        f32::NEG_INFINITY
    };
    let p = |i: usize| (((x[i] - mx) / temperature) as f64).exp();
    let kept: Vec<usize> = valid.iter().cloned().filter(|&i| x[i] >= kth).collect();
    let z: f64 = kept.iter().map(|&i| p(i)).sum();
    let mut thr = kth;
    if top_p < 1.0 {
        // largest value tau with mass(x >= tau) >= top_p * z
        let mut acc = 0.0;
        for &i in sorted.iter().filter(|&&i| x[i] >= kth) {
            acc += p(i);
            if acc >= top_p as f64 * z {
                thr = x[i];
                break;
            }
        }
    }
    let fin: Vec<usize> = valid.into_iter().filter(|&i| x[i] >= thr).collect();
    let zz: f64 = fin.iter().map(|&i| p(i)).sum();
    fin.into_iter().map(|i| (i, p(i) / zz)).collect()
}

/// Relative L2 error ||a - b|| / ||b||; NaN anywhere gives +inf.
pub fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let (mut num, mut den) = (0f64, 0f64);
    for (x, y) in a.iter().zip(b) {
        if !x.is_finite() || !y.is_finite() {
            return f64::INFINITY;
        }
        num += ((x - y) as f64).powi(2);
        den += (*y as f64).powi(2);
    }
    (num / den.max(1e-30)).sqrt()
}
